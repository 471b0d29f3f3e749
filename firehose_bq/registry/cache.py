"""DescriptorCache: the last good descriptors, refreshed in the background and on demand.

`get()` only reads memory once the first load is done, so decoding never waits on a registry. A
refresh that fails keeps the last good descriptors (a registry outage must not stop the job); only the
first load has nothing to fall back on, so its failure is raised.

The cache is the one layer that retries a registry that does not answer (the fetchers make one request
per URL): a background refresh patiently (SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES, minutes of backoff,
cut short by `stop()`), the first load and on-demand refreshes quickly, since someone waits for them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from firehose_bq import redact
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import RegistryUnavailableError, SchemaError
from firehose_bq.registry.config import RegistryConfig
from firehose_bq.registry.confluent import NOT_DECLARED, ConfluentRegistry, ConfluentSchema
from firehose_bq.registry.stencil import StencilFetcher
from firehose_bq.retrying import Backoff, retry_call

log = logging.getLogger(__name__)

# Fetches the current descriptors, once: RegistryUnavailableError when another try may succeed.
Fetch = Callable[[], Descriptors]
Listener = Callable[[Descriptors], None]
NO_RETRIES = Backoff(attempts=1, first_s=0)


def fetch_retrying(fetch: Fetch, backoff: Backoff, what: str,
                   sleep: Callable[[float], None] = time.sleep) -> Descriptors:
    """`fetch()`, retried per `backoff` while the registry does not answer."""
    return retry_call(fetch, backoff, retry_on=lambda e: isinstance(e, RegistryUnavailableError), what=what,
                      sleep=sleep)


def confluent_fetch(registry: ConfluentRegistry, subject: str) -> Fetch:
    """Fetches `subject`'s latest schema, with the ids of all its versions (`Descriptors.schema_ids`): a
    version registered since is a change of descriptors, so it reaches the tasks like a new schema does."""
    def fetch() -> Descriptors:
        latest = registry.latest(subject)
        # The latest id too: a version registered between the two requests is in one of them.
        ids = registry.subject_ids(subject) | {latest.schema_id}
        return dataclasses.replace(latest.descriptors, schema_ids=ids,
                                   moved_indexes=_moved_indexes(registry, latest, ids))

    return fetch


def _moved_indexes(registry: ConfluentRegistry, latest: ConfluentSchema, ids: frozenset[int]) \
        -> dict[int, dict[str, tuple[int, ...]]]:
    """`Descriptors.moved_indexes`: an older version's writers name a message by its indexes in that
    version, which differ from the latest's once a message was declared above it. Each version is
    compiled once (the registry keeps it); one that does not compile is left out, its frames then
    checked against the latest's indexes as before. A message the version does not declare yet is
    NOT_DECLARED there: its frames name another message, even at the latest's indexes of this one."""
    current = latest.indexes_by_name()
    moved: dict[int, dict[str, tuple[int, ...]]] = {}
    for schema_id in sorted(ids - {latest.schema_id}):
        try:
            older = registry.schema(schema_id).indexes_by_name()
        except RegistryUnavailableError:
            raise  # an outage: the fetch is retried, the descriptors kept
        except SchemaError as exc:
            log.warning("schema id %d: its message indexes are unknown (%s); its records must name the latest's",
                        schema_id, exc)
            continue
        changed = {name: path for name, path in older.items() if current.get(name, path) != path}
        # A message the version does not declare: none of its frames names it (NOT_DECLARED), whatever indexes.
        changed.update((name, NOT_DECLARED) for name in current.keys() - older.keys())
        if changed:
            moved[schema_id] = changed
    return moved


@dataclass(frozen=True)
class CacheStats:
    fetches: int = 0  # refresh attempts, including the first load (retries inside one are not counted)
    failures: int = 0
    changes: int = 0  # refreshes that replaced the descriptors with different content
    last_success_time: float | None = None  # time.time() of the last fetch that succeeded
    fingerprint: str | None = None


class DescriptorCache:
    """Thread-safe holder of the current descriptors. `start()` loads them, `stop()` ends the refresher."""

    def __init__(self, fetch: Fetch, *, source: str, refresh_interval_s: float | None,
                 min_on_demand_interval_s: float, clock: Callable[[], float] = time.monotonic,
                 patient: Backoff = NO_RETRIES, quick: Backoff = NO_RETRIES, stop: threading.Event | None = None) -> None:
        """`patient`: how the background refresh retries; `quick`: the first load and on-demand refreshes,
        which someone is waiting for. `stop` (set by `stop()`) ends a retry's wait."""
        self._fetch = fetch
        self._patient, self._quick = patient, quick
        self._source = source  # for messages: the URLs, never the headers
        self._interval = refresh_interval_s
        self._min_on_demand = min_on_demand_interval_s
        self._clock = clock
        self._fetching = threading.Lock()  # one fetch at a time, so listeners see changes in order
        self._lock = threading.Lock()  # guards the fields below; never held during a fetch
        self._current: Descriptors | None = None
        self._stats = CacheStats()
        self._listeners: list[Listener] = []
        self._last_on_demand: float | None = None
        self._stop = stop or threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_stencil(cls, urls: Sequence[str], config: RegistryConfig, messages: Sequence[str] = ()) -> DescriptorCache:
        """`messages`: the job's classes; a fetched set without one of them is a failed fetch."""
        fetcher = StencilFetcher(urls, config, messages=messages)
        return cls._configured(fetcher.fetch, ", ".join(redact.url(u) for u in fetcher.urls), config)

    @classmethod
    def for_confluent(cls, registry: ConfluentRegistry, subject: str, config: RegistryConfig) -> DescriptorCache:
        """The subject's latest schema, refreshed like Stencil URLs are (a new version = new descriptors)."""
        return cls._configured(confluent_fetch(registry, subject), f"{redact.url(registry.url)} subject {subject}",
                               config)

    @classmethod
    def _configured(cls, fetch: Fetch, source: str, config: RegistryConfig) -> DescriptorCache:
        return cls(fetch, source=source, patient=config.backoff(), quick=config.quick_backoff(),
                   refresh_interval_s=config.cache_ttl_ms / 1000 if config.cache_auto_refresh else None,
                   min_on_demand_interval_s=config.unknown_fields_refresh_min_interval_ms / 1000)

    def start(self) -> DescriptorCache:
        """Load the descriptors (SchemaError if that fails) and start the background refresh, if any."""
        if self._current is None:
            self._refresh("first load", self._quick)
        with self._lock:
            if self._interval is not None and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="descriptor-refresh", daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # an HTTP request in flight ends within its own timeout

    def __enter__(self) -> DescriptorCache:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def get(self) -> Descriptors:
        with self._lock:
            if self._current is None:
                raise SchemaError(f"descriptors from {self._source} are not loaded: start() the cache first")
            return self._current

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(new)` after each refresh that changed the content, in the refreshing thread.

        Listeners run one change at a time, in order; they must not call `refresh_now`.
        """
        with self._lock:
            self._listeners.append(listener)

    def refresh_now(self, reason: str) -> bool:
        """Fetch at once (e.g. a message has unknown fields); True if this call changed the descriptors.

        At most one on-demand refresh per min interval: a call within it returns False without fetching.
        """
        with self._lock:
            now = self._clock()
            if self._last_on_demand is not None and now - self._last_on_demand < self._min_on_demand:
                log.debug("on-demand descriptor refresh (%s) skipped: rate limited", reason)
                return False
            self._last_on_demand = now
        # A refresh already running answers the same question: do not queue behind its retries.
        return self._refresh(f"on demand: {reason}", self._quick, wait=False)

    def stats(self) -> CacheStats:
        with self._lock:
            return self._stats

    def _run(self) -> None:
        assert self._interval is not None
        while not self._stop.wait(self._interval):
            self._refresh("scheduled", self._patient)

    def _refresh(self, reason: str, backoff: Backoff, wait: bool = True) -> bool:
        if not self._fetching.acquire(blocking=wait):
            log.debug("descriptor refresh (%s) skipped: another one is running", reason)
            return False
        try:
            try:
                loaded = fetch_retrying(self._fetch, backoff, f"descriptor refresh ({reason}) from {self._source}",
                                        self._wait_unless_stopped)
            except Exception as exc:  # whatever broke, the last good descriptors stay in use
                return self._failed(reason, exc)
            with self._lock:
                previous = self._current
                changed = previous is not None and previous.fingerprint != loaded.fingerprint
                current = loaded if previous is None or changed else previous
                self._current = current
                self._stats = dataclasses.replace(
                    self._stats, fetches=self._stats.fetches + 1, changes=self._stats.changes + int(changed),
                    last_success_time=time.time(), fingerprint=current.fingerprint,
                )
                listeners = list(self._listeners)
            if changed:
                assert previous is not None
                log.info("descriptors from %s changed (%s): %s → %s", self._source, reason,
                         previous.fingerprint, loaded.fingerprint)
                for listener in listeners:
                    self._notify(listener, loaded)
            return changed
        finally:
            self._fetching.release()

    def _wait_unless_stopped(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise SchemaError(f"descriptor refresh from {self._source}: stopped while waiting to retry")

    def _failed(self, reason: str, exc: Exception) -> bool:
        with self._lock:
            self._stats = dataclasses.replace(
                self._stats, fetches=self._stats.fetches + 1, failures=self._stats.failures + 1
            )
            current = self._current
        if current is None:
            raise SchemaError(f"cannot load descriptors from {self._source}, and there are none to fall "
                              f"back on: {exc}") from exc
        log.warning("descriptor refresh (%s) from %s failed; keeping %s: %s", reason, self._source,
                    current.fingerprint, exc)
        return False

    def _notify(self, listener: Listener, new: Descriptors) -> None:
        try:
            listener(new)
        except Exception:  # one broken listener must neither stop the others nor the refresh thread
            log.exception("descriptor change listener %r failed", listener)
