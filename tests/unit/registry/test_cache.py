"""DescriptorCache: last good descriptors, change-only notifications, rate-limited on-demand refreshes."""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import RegistryUnavailableError, SchemaError
from firehose_bq.registry.cache import DescriptorCache, confluent_fetch
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.registry.confluent import ConfluentRegistry
from firehose_bq.registry.stencil import StencilFetcher
from firehose_bq.retrying import Backoff
from tests.unit.registry.fixtures import FakeGet, regtest_set, with_new_field

SOURCE = "http://stencil.test/orders"
# The cache compares fingerprints only, so any bytes will do.
V1, V1_AGAIN, V2 = (Descriptors((blob,), (SOURCE,)) for blob in (b"v1", b"v1", b"v2"))


class Registry:
    """A fetch function whose answer the test sets: Descriptors, or an exception to raise."""

    def __init__(self, answer: Descriptors | Exception) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self) -> Descriptors:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cache(registry: Registry, *, interval: float | None = None, min_on_demand: float = 0.0,
          clock: Clock | None = None) -> DescriptorCache:
    return DescriptorCache(registry, source=SOURCE, refresh_interval_s=interval,
                           min_on_demand_interval_s=min_on_demand, clock=clock or Clock())


def test_a_failing_first_load_is_a_schema_error_saying_there_is_nothing_to_fall_back_on() -> None:
    registry = Registry(SchemaError(f"cannot fetch descriptors from {SOURCE}: HTTP Error 503: down"))
    descriptors = cache(registry)
    with pytest.raises(SchemaError, match=f"cannot load descriptors from {SOURCE}, and there are none to fall "
                                          "back on: cannot fetch .* HTTP Error 503"):
        descriptors.start()
    with pytest.raises(SchemaError, match="not loaded"):
        descriptors.get()
    assert (descriptors.stats().fetches, descriptors.stats().failures) == (1, 1)


def test_get_answers_from_memory_after_the_first_load() -> None:
    registry = Registry(V1)
    descriptors = cache(registry).start()
    registry.answer = OSError("the registry is gone")
    assert [descriptors.get() for _ in range(3)] == [V1] * 3
    assert registry.calls == 1


def test_listeners_hear_content_changes_only() -> None:
    registry = Registry(V1)
    descriptors = cache(registry).start()
    heard: list[Descriptors] = []
    descriptors.add_listener(heard.append)
    registry.answer = V1_AGAIN  # a re-publish: new object, same bytes
    assert descriptors.refresh_now("unknown fields") is False
    registry.answer = V2
    assert descriptors.refresh_now("unknown fields") is True
    assert descriptors.refresh_now("unknown fields") is False
    assert heard == [V2] and descriptors.get() is V2
    stats = descriptors.stats()
    assert (stats.fetches, stats.failures, stats.changes, stats.fingerprint) == (4, 0, 1, V2.fingerprint)


def test_a_failing_listener_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(V1)
    descriptors = cache(registry).start()
    heard: list[Descriptors] = []
    descriptors.add_listener(lambda new: 1 / 0)
    descriptors.add_listener(heard.append)
    registry.answer = V2
    assert descriptors.refresh_now("test") is True
    assert heard == [V2] and "listener" in caplog.text


def test_on_demand_refreshes_are_rate_limited() -> None:
    registry, clock = Registry(V1), Clock()
    descriptors = cache(registry, min_on_demand=30.0, clock=clock).start()
    registry.answer = V2
    assert descriptors.refresh_now("unknown fields") is True
    registry.answer = V1
    clock.now += 29.9
    assert descriptors.refresh_now("unknown fields") is False
    assert registry.calls == 2 and descriptors.get() is V2
    clock.now += 0.1
    assert descriptors.refresh_now("unknown fields") is True
    assert registry.calls == 3


def test_a_registry_that_is_down_keeps_the_last_good_descriptors(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    v1 = regtest_set(tmp_path)
    get = FakeGet({SOURCE: v1})
    config = RegistryConfig(fetch_headers=Secret("Authorization: Bearer s3cr3t"), fetch_retries=1, fetch_backoff_min_ms=1)
    descriptors = DescriptorCache(StencilFetcher([SOURCE], config, get=get).fetch, source=SOURCE,
                                  refresh_interval_s=None, min_on_demand_interval_s=0).start()
    loaded_at = descriptors.stats().last_success_time
    get.routes[SOURCE] = urllib.error.URLError("connection refused")
    with caplog.at_level(logging.WARNING, logger="firehose_bq.registry"):
        assert descriptors.refresh_now("unknown fields") is False
    assert descriptors.get().fingerprint == Descriptors((v1,)).fingerprint
    stats = descriptors.stats()
    assert (stats.fetches, stats.failures, stats.changes, stats.last_success_time) == (2, 1, 0, loaded_at)
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING).getMessage()
    assert SOURCE in warning and "connection refused" in warning and "keeping" in warning
    assert "s3cr3t" not in caplog.text
    get.routes[SOURCE] = with_new_field(v1)  # back up, with a new schema
    assert descriptors.refresh_now("unknown fields") is True


def test_the_background_refresh_picks_up_changes_and_stops() -> None:
    registry = Registry(V1)
    descriptors = cache(registry, interval=0.01).start()
    changed = threading.Event()
    descriptors.add_listener(lambda new: changed.set())
    registry.answer = V2
    assert changed.wait(5)
    descriptors.stop()
    thread = descriptors._thread
    assert thread is not None and not thread.is_alive() and thread.daemon
    calls = registry.calls
    time.sleep(0.05)  # five intervals: a live refresher would have fetched again
    assert registry.calls == calls


def test_for_stencil_reads_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "set.desc"
    path.write_bytes(regtest_set(tmp_path))
    config = RegistryConfig(cache_auto_refresh=False, unknown_fields_refresh_min_interval_ms=0)
    with DescriptorCache.for_stencil([str(path)], config) as descriptors:
        assert descriptors._thread is None  # no auto refresh
        assert "regtest.Order" in descriptors.get().message_names()
        path.write_bytes(with_new_field(path.read_bytes()))
        assert descriptors.refresh_now("file replaced") is True
        assert "added" in descriptors.get().find_message("regtest.Header").fields_by_name


class RecordingStop(threading.Event):
    """Records the backoff waits instead of sleeping through them."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(SOURCE, code, "status", None, None)  # type: ignore[arg-type]


def stencil_cache(get: FakeGet, stop: threading.Event, **backoff: float) -> DescriptorCache:
    """A cache over one Stencil URL whose refreshes retry per `backoff` (quick and patient alike)."""
    schedule = Backoff(**{"attempts": 4, "first_s": 0.5, **backoff})  # type: ignore[arg-type]
    return DescriptorCache(StencilFetcher([SOURCE], RegistryConfig(), get=get).fetch, source=SOURCE,
                           refresh_interval_s=None, min_on_demand_interval_s=0, patient=schedule, quick=schedule,
                           stop=stop)


def test_a_registry_that_does_not_answer_is_retried_with_doubling_backoff(tmp_path: Path) -> None:
    answers = [urllib.error.URLError("refused"), http_error(503), http_error(429), regtest_set(tmp_path)]
    stop = RecordingStop()
    descriptors = stencil_cache(FakeGet({SOURCE: answers}), stop).start()
    assert "regtest.Order" in descriptors.get().message_names()
    assert stop.waits == [0.5, 1.0, 2.0]


def test_the_last_error_is_raised_once_retries_are_spent() -> None:
    get = FakeGet({SOURCE: [TimeoutError("timed out")]})
    with pytest.raises(SchemaError, match="timed out"):
        stencil_cache(get, RecordingStop(), attempts=3).start()
    assert len(get.requests) == 3


def test_client_errors_are_not_retried() -> None:
    get = FakeGet({SOURCE: [http_error(404)]})
    with pytest.raises(SchemaError, match="HTTP Error 404"):
        stencil_cache(get, RecordingStop()).start()
    assert len(get.requests) == 1


def test_stopping_cuts_the_backoff_short() -> None:
    stop = RecordingStop()
    stop.set()
    with pytest.raises(SchemaError, match="stopped while waiting to retry"):
        stencil_cache(FakeGet({SOURCE: [http_error(500)]}), stop, first_s=60).start()


def test_first_load_and_on_demand_retry_quickly_the_background_patiently_and_never_queue() -> None:
    patient, quick = Backoff(attempts=3, first_s=0.001), Backoff(attempts=2, first_s=0.001)
    down = RegistryUnavailableError("the registry does not answer")
    registry = Registry(down)
    with pytest.raises(SchemaError):
        DescriptorCache(registry, source="s", refresh_interval_s=None, min_on_demand_interval_s=0,
                        patient=patient, quick=quick).start()
    assert registry.calls == 2  # the first load: someone is waiting for it

    registry = Registry(V1)
    descriptors = DescriptorCache(registry, source="s", refresh_interval_s=None, min_on_demand_interval_s=0,
                                  patient=patient, quick=quick).start()
    registry.answer = down
    assert descriptors.refresh_now("unknown fields") is False and registry.calls == 1 + 2  # a batch waits
    descriptors._refresh("scheduled", patient)  # what the background thread runs: nobody waits
    assert registry.calls == 3 + 3 and descriptors.get() is V1

    first = Descriptors((b"",), ("a",))
    calls: list[str] = []
    running, release = threading.Event(), threading.Event()

    def slow() -> Descriptors:
        calls.append("fetch")
        if len(calls) > 1:
            running.set()
            release.wait(5)
        return first

    cache = DescriptorCache(slow, source="s", refresh_interval_s=None, min_on_demand_interval_s=0,
                            patient=patient, quick=quick)
    cache.start()
    background = threading.Thread(target=cache._refresh, args=("scheduled", patient))
    background.start()
    assert running.wait(5)
    assert cache.refresh_now("unknown fields") is False  # a refresh is running: no queueing behind it
    release.set()
    background.join()
    assert calls == ["fetch", "fetch"]


def test_settings_give_the_background_refresh_minutes_and_a_waited_for_fetch_one_quick_retry() -> None:
    config = RegistryConfig()
    assert config.backoff() == Backoff(attempts=5, first_s=60)  # 1, 2, 4 and 8 minutes
    assert config.quick_backoff() == Backoff(attempts=2, first_s=1)
    # A dead registry stops the start within two request timeouts and the one wait.
    assert config.quick_backoff().bound_s(config.fetch_timeout_ms / 1000) == 21


def test_schema_ids_count_towards_the_fingerprint_only_when_set_and_survive_pickling() -> None:
    with_ids = Descriptors((b"v1",), (SOURCE,), schema_ids=frozenset({1, 2}))
    assert V1.fingerprint == Descriptors((b"v1",), ("elsewhere",), schema_ids=None).fingerprint
    assert len({V1.fingerprint, with_ids.fingerprint,
                Descriptors((b"v1",), schema_ids=frozenset({1, 2, 3})).fingerprint}) == 3
    assert pickle.loads(pickle.dumps(with_ids)).schema_ids == {1, 2}


def test_a_confluent_subjects_new_version_is_a_change_even_with_the_same_schema_text() -> None:
    """The tasks learn a version's id through the listeners, like a new schema: a producer may register
    the same text under a new id (another subject's version, re-registered after a hard delete)."""
    url = "http://sr.test"
    text = "syntax = 'proto3'; package o; message Order { string id = 1; }"
    schema = json.dumps({"id": 5, "schema": text, "schemaType": "PROTOBUF"}).encode()
    versions = f"{url}/subjects/orders-value/versions"
    get = FakeGet({f"{versions}/latest": schema, f"{url}/schemas/ids/5": schema,
                   # each older version's schema, for its message indexes (Descriptors.moved_indexes)
                   f"{url}/schemas/ids/4": schema, f"{url}/schemas/ids/9": schema,
                   # the first list is older than the latest version: its id is allowed all the same
                   f"{versions}?deleted=true": [b"[1]", b"[1]", b"[1, 2, 3]"],
                   f"{versions}/1?deleted=true": json.dumps({"id": 4, "schema": text}).encode(),
                   f"{versions}/2?deleted=true": schema,
                   f"{versions}/3?deleted=true": json.dumps({"id": 9, "schema": text}).encode()})
    fetch = confluent_fetch(ConfluentRegistry(url, user_info=None, timeout_s=1, get=get), "orders-value")
    first, again, third = fetch(), fetch(), fetch()
    assert (first.schema_ids, third.schema_ids) == ({4, 5}, {4, 5, 9})
    assert first.fingerprint == again.fingerprint != third.fingerprint and first.sets == third.sets
    assert first.message_class("o.Order").DESCRIPTOR.full_name == "o.Order"
    assert third.moved_indexes == {}  # the same text: no message moved


def test_a_confluent_fetch_knows_where_older_versions_declared_a_message() -> None:
    """A writer on an older version names the class by that version's message indexes (batch/rows.py)."""
    url = "http://sr.test"
    texts = {1: "syntax = 'proto3'; package o; message Order { string id = 1; }",
             2: "syntax = 'proto3'; package o; message Order { string id = 1; } message Line { int64 n = 1; }",
             3: "syntax = 'proto3'; package o; message Line { int64 n = 1; } message Order { string id = 1; }"}
    schemas = {i: json.dumps({"id": 10 + i, "schema": t, "schemaType": "PROTOBUF"}).encode() for i, t in texts.items()}
    versions = f"{url}/subjects/orders-value/versions"
    get = FakeGet({f"{versions}/latest": schemas[3], f"{versions}?deleted=true": b"[1, 2, 3, 4]",
                   **{f"{versions}/{v}?deleted=true": schemas.get(v, json.dumps({"id": 14, "schema": "x"}).encode())
                      for v in (1, 2, 3, 4)},
                   **{f"{url}/schemas/ids/{10 + v}": s for v, s in schemas.items()},
                   # version 4 does not compile: logged, and left out
                   f"{url}/schemas/ids/14": json.dumps({"schema": "not proto", "schemaType": "PROTOBUF"}).encode()})
    loaded = confluent_fetch(ConfluentRegistry(url, user_info=None, timeout_s=1, get=get), "orders-value")()
    assert loaded.schema_ids == {11, 12, 13, 14}
    # version 1 does not declare Line: none of its records is one
    assert loaded.moved_indexes == {11: {"o.Order": (0,), "o.Line": ()}, 12: {"o.Order": (0,), "o.Line": (1,)}}
    assert pickle.loads(pickle.dumps(loaded)).moved_indexes == loaded.moved_indexes  # it travels to the tasks

    # an outage while compiling an older version is an outage of the fetch, not a version left out
    get.routes[f"{versions}?deleted=true"] = b"[1, 2, 3, 4, 5]"
    get.routes[f"{versions}/5?deleted=true"] = json.dumps({"id": 15, "schema": "x"}).encode()
    get.routes[f"{url}/schemas/ids/15"] = urllib.error.URLError("refused")
    with pytest.raises(RegistryUnavailableError):
        confluent_fetch(ConfluentRegistry(url, user_info=None, timeout_s=1, get=get), "orders-value")()


def test_an_older_versions_indexes_learnt_on_a_later_refresh_replace_the_descriptors() -> None:
    """A version left out of moved_indexes once (its schema answered 403 on the first load) is learnt on a
    later refresh: the same texts and ids, but its writers' records now land, so that is a change."""
    url = "http://sr.test"
    texts = {1: "syntax = 'proto3'; package o; message Order { string id = 1; }",
             2: "syntax = 'proto3'; package o; message Line { int64 n = 1; } message Order { string id = 1; }"}
    schemas = {v: json.dumps({"id": 10 + v, "schema": t, "schemaType": "PROTOBUF"}).encode() for v, t in texts.items()}
    versions = f"{url}/subjects/orders-value/versions"
    get = FakeGet({f"{versions}/latest": schemas[2], f"{versions}?deleted=true": b"[1, 2]",
                   **{f"{versions}/{v}?deleted=true": s for v, s in schemas.items()},
                   f"{url}/schemas/ids/12": schemas[2],
                   f"{url}/schemas/ids/11": [http_error(403), schemas[1]]})
    registry = ConfluentRegistry(url, user_info=None, timeout_s=1, get=get)
    descriptors = DescriptorCache(confluent_fetch(registry, "orders-value"), source="sr", refresh_interval_s=None,
                                  min_on_demand_interval_s=0).start()
    assert descriptors.get().moved_indexes == {}
    assert descriptors.refresh_now("unknown fields")
    assert descriptors.get().moved_indexes == {11: {"o.Order": (0,), "o.Line": ()}}


@pytest.mark.parametrize("name", ["nul\x00.proto", "bad\ud800.proto"])
def test_an_older_version_whose_files_cannot_be_written_is_left_out_not_the_fetch(name: str) -> None:
    """A version's reference names come from the registry: one that no file can have (a NUL, a lone
    surrogate) is that version's problem, like a schema that does not compile, not a failed fetch
    that would keep every refresh (or the start) from ever succeeding."""
    url = "http://sr.test"
    latest = json.dumps({"id": 12, "schema": "syntax = 'proto3'; package o; message Order { string id = 1; }",
                         "schemaType": "PROTOBUF"}).encode()
    older = json.dumps({"id": 11, "schema": "syntax = 'proto3'; import 'x.proto'; message O { string id = 1; }",
                        "schemaType": "PROTOBUF", "references": [{"name": name, "subject": "x", "version": 1}]})
    versions = f"{url}/subjects/orders-value/versions"
    get = FakeGet({f"{versions}/latest": latest, f"{versions}?deleted=true": b"[1, 2]",
                   f"{versions}/1?deleted=true": older.encode(), f"{versions}/2?deleted=true": latest,
                   f"{url}/schemas/ids/12": latest, f"{url}/schemas/ids/11": older.encode(),
                   f"{url}/subjects/x/versions/1": json.dumps({"schema": "syntax = 'proto3';"}).encode()})
    loaded = confluent_fetch(ConfluentRegistry(url, user_info=None, timeout_s=1, get=get), "orders-value")()
    assert loaded.schema_ids == {11, 12} and loaded.moved_indexes == {}


def test_a_refresh_whose_set_lacks_the_jobs_class_keeps_the_last_good_descriptors(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Before, an empty set replaced the descriptors and the running job stopped on its next batch.
    v1 = regtest_set(tmp_path)
    get = FakeGet({SOURCE: v1})
    descriptors = DescriptorCache(StencilFetcher([SOURCE], RegistryConfig(), get=get, messages=["regtest.Order"]).fetch,
                                  source=SOURCE, refresh_interval_s=None, min_on_demand_interval_s=0).start()
    get.routes[SOURCE] = b""
    with caplog.at_level(logging.WARNING, logger="firehose_bq.registry"):
        assert descriptors.refresh_now("scheduled") is False
    assert descriptors.get().fingerprint == Descriptors((v1,)).fingerprint
    assert descriptors.stats().failures == 1
    assert "keeping" in caplog.text and "'regtest.Order' is not in the descriptors from" in caplog.text
