"""What happens to a message that failed: retry it, dead-letter it, or stop the job.

Every message of a batch ends in exactly one place: the table (`written`), the dead-letter queue
(`dlq`), or a stopped job whose offsets are not committed (`failed`). Retrying comes first for the
error types in ERROR_TYPES_FOR_RETRY: only the rows that failed are sent again, through the same
RowWriter, with exponential backoff. What still fails then goes to the DLQ when its type is in
ERROR_TYPES_FOR_DLQ and the DLQ is enabled; anything else fails the job. No type is ever dropped.

A request that fails as a whole (SinkError: the table is gone, BigQuery is unreachable) says nothing
about the messages in it: it is retried like a row, and when retries run out the job stops with that
reason rather than dead-letter a whole batch because the sink was down.

One kind of whole failure can be a message's fault: BigQuery refusing the request itself as invalid
(`SinkError.invalid_request`: every reason `invalid`, HTTP 400/413, gRPC INVALID_ARGUMENT naming no row
and no stream; never notFound, permissions, a stream's state, quotas or 5xx; bigquery/classify.py), of a
type not retried. Stopping on it would stop again on every restart, for one row the writers' checks did
not catch. So its rows are isolated, within the attempt: the rows the request left unsent are written in
two halves, a half refused the same way in two halves again (depth first; once a row is alone before any
went in, the request's other half next, and while it is refused too its far end first, as a run of
adjacent bad rows, or bad rows at the front of each piece tried, would otherwise look like a refusing
table), until a row that is refused alone is the only one left of its piece. Such a row becomes a
RowError of the refusal's type, saying the request was rejected as a whole and it was isolated, and then
follows the lists above (the DLQ by default); every other row is written once (a half that went in is never sent again), keeping its
insertId, and rows a half's write rejected on their own are handled like any row failure (retried when
their type is). The rule that keeps a fault of the table from costing 2n requests or a dead-lettered
batch (IsolationBudget, for a request of n rows, L = ⌈log2 n⌉):

- a row is isolated only if a row of the same request went in without it (or was answered on its own, a
  row BigQuery rejects by itself); until one did, at most 2L+2 refused requests (one bad row is alone
  after L+1): more, or none going in at all, and the original error stops the job as before: every row
  is refused, so the table is at fault;
- a request of one row has nothing to tell its row from the table: the row fails as isolated, its
  message saying so. Stopping would stop again on every restart (the replayed batch holds that row
  alone again), which a quiet partition, one record per micro-batch, makes the common case; and a table
  that refuses every row still stops the job at its first request of two or more;
- 16·(L+1) requests isolate 8 bad rows wherever they are; with more, the pieces still to be written are
  then sent once each (at most 2L+2 more requests), and the rows of those refused fail together, their
  message saying so (the DLQ by default, whose replay, in smaller batches, isolates them again): stopping
  would stop again on every restart, writing the pieces that went in once more each time;
- an error of another kind meanwhile (an outage) ends the isolation: the rows not yet in the table are
  owed, and the policy retries them or stops, as for any whole failure.

The policy is the only layer that retries a write (retrying.py): the writers make one attempt per call
(the BigQuery client's own retry is off inside them), and the retries of one write end after
RETRY_MAX_ATTEMPTS attempts or SINK_BIGQUERY_RETRY_DEADLINE_MS, whichever comes first.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from firehose_bq.dlq.config import DlqConfig
from firehose_bq.errors import ConfigError, ErrorType, FirehoseError, PartialWriteError, RowError, SinkError
from firehose_bq.redact import Redactor
from firehose_bq.retrying import Backoff, retry_call
from firehose_bq.settings import setting

if TYPE_CHECKING:  # the policy is configuration too (config.py imports it): no Arrow at import time
    from firehose_bq.batch.rows import Writable
    from firehose_bq.bigquery.writers import RowWriter

log = logging.getLogger(__name__)

# ERROR_TYPES_FOR_DLQ's default: every type that ERROR_TYPES_FOR_FAILING does not name.
ALL_OTHER_TYPES = "*"
# Conversion is deterministic: sending the same bytes through the same descriptors again cannot help.
NOT_RETRYABLE = frozenset({ErrorType.DESERIALIZATION_ERROR, ErrorType.INVALID_MESSAGE_ERROR,
                           ErrorType.UNKNOWN_FIELDS_ERROR, ErrorType.PAYLOAD_TOO_LARGE, ErrorType.ROUTING_ERROR})
TRANSIENT = (ErrorType.SINK_5XX_ERROR, ErrorType.SINK_RETRYABLE_ERROR)
# With the backoff defaults (10 ms doubling up to 60 s), 15 attempts would wait 10 ms, 20 ms, ... 41 s,
# 60 s: 142 s in all. The deadline below ends them first.
DEFAULT_MAX_ATTEMPTS = 15
# SINK_BIGQUERY_RETRY_DEADLINE_MS: how long a failed write is retried. Two minutes ride out the short
# outages BigQuery has (a minute or two) and keep a dead BigQuery from holding a task much longer: the
# last attempt starts by then, and ends within one request timeout.
DEFAULT_RETRY_DEADLINE_MS = 120_000
# A request refused as invalid is split to isolate the rows at fault for at most this many bad rows' cost
# (IsolationBudget); a request with more stops the job.
ISOLATION_ROWS = 8


def _type_list(env: str, raw: str, problems: list[str]) -> frozenset[ErrorType]:
    names = [n.strip().upper() for n in raw.split(",") if n.strip()]
    known = {t.value for t in ErrorType}
    for name in names:
        if name not in known:
            problems.append(f"{env}: unknown error type {name!r} (known: {', '.join(sorted(known))})")
    return frozenset(ErrorType(n) for n in names if n in known)


@dataclass(frozen=True)
class ErrorPolicyConfig:
    """Firehose's error-handling settings. A list set to the empty string means no type at all."""

    failing: str = setting(
        "ERROR_TYPES_FOR_FAILING",
        "Error types that stop the job (offsets not committed), comma-separated; never dead-lettered. A type "
        "in no list also stops the job: nothing is dropped.",
        "",
    )
    dlq: str = setting(
        "ERROR_TYPES_FOR_DLQ",
        "Error types sent to the dead-letter queue when DLQ_SINK_ENABLE=true (else they stop the job); `*` = "
        "every type not in ERROR_TYPES_FOR_FAILING.",
        ALL_OTHER_TYPES,
        empty_ok=True,
    )
    retry: str = setting(
        "ERROR_TYPES_FOR_RETRY",
        "Sink error types whose rows are sent again with backoff before the DLQ or failing list applies.",
        ",".join(t.value for t in TRANSIENT),
        empty_ok=True,
    )
    backoff_initial_ms: int = setting(
        "RETRY_EXPONENTIAL_BACKOFF_INITIAL_MS", "Wait before the first retry.", 10, minimum=0
    )
    backoff_rate: int = setting(
        "RETRY_EXPONENTIAL_BACKOFF_RATE", "Factor by which the wait grows with each retry.", 2, minimum=1
    )
    backoff_max_ms: int = setting(
        "RETRY_EXPONENTIAL_BACKOFF_MAX_MS", "Longest wait between two retries.", 60_000, minimum=0
    )
    max_attempts: int = setting(
        "RETRY_MAX_ATTEMPTS",
        "Attempts (the first write included) for a retryable failure, within SINK_BIGQUERY_RETRY_DEADLINE_MS "
        "of the first: whichever runs out first ends the retries. With the defaults the deadline does (the "
        "waits would add up to 142 s), so a failed write is retried for 2 minutes.",
        DEFAULT_MAX_ATTEMPTS,
        minimum=1,
    )
    fail_after_max_attempts: bool = setting(
        "RETRY_FAIL_AFTER_MAX_ATTEMPTS_ENABLE",
        "true: a row still failing after RETRY_MAX_ATTEMPTS stops the job; false: it follows "
        "ERROR_TYPES_FOR_DLQ (and stops the job when the DLQ is off).",
        False,
    )
    allow_unknown_fields: bool = setting(
        "INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE",
        "Write messages with fields no descriptor knows (after a registry refresh found nothing newer) "
        "without those fields; false = they are UNKNOWN_FIELDS_ERROR. SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE "
        "overrides both for the value: it is written with those fields in `additional_properties`. The Kafka key "
        "(INPUT_SCHEMA_PROTO_KEY_CLASS) follows this setting alone when appended; in upsert/delete a key with "
        "such fields is always UNKNOWN_FIELDS_ERROR (merged without them, distinct keys would become one row).",
        True,
    )

    def __post_init__(self) -> None:
        problems: list[str] = []
        failing, dlq, retry = self._parse(problems)
        both = sorted(t.value for t in failing & dlq) if self.dlq.strip() != ALL_OTHER_TYPES else []
        if both:
            problems.append(f"ERROR_TYPES_FOR_FAILING / ERROR_TYPES_FOR_DLQ: {', '.join(both)} in both lists; "
                            "a type either stops the job or goes to the DLQ")
        pointless = sorted(t.value for t in retry & NOT_RETRYABLE)
        if pointless:
            problems.append(f"ERROR_TYPES_FOR_RETRY: {', '.join(pointless)} cannot be retried: the same bytes "
                            "convert the same way every time")
        if problems:
            raise ConfigError(problems)

    def _parse(self, problems: list[str]) -> tuple[frozenset[ErrorType], frozenset[ErrorType], frozenset[ErrorType]]:
        failing = _type_list("ERROR_TYPES_FOR_FAILING", self.failing, problems)
        retry = _type_list("ERROR_TYPES_FOR_RETRY", self.retry, problems)
        dlq = (frozenset(ErrorType) - failing if self.dlq.strip() == ALL_OTHER_TYPES
               else _type_list("ERROR_TYPES_FOR_DLQ", self.dlq, problems))
        return failing, dlq, retry

    # Parsed once per instance (validated in __post_init__); cached_property writes the instance's
    # __dict__ directly, which a frozen dataclass allows.
    @functools.cached_property
    def failing_types(self) -> frozenset[ErrorType]:
        return self._parse([])[0]

    @functools.cached_property
    def dlq_types(self) -> frozenset[ErrorType]:
        return self._parse([])[1]

    @functools.cached_property
    def retry_types(self) -> frozenset[ErrorType]:
        return self._parse([])[2]

    def backoff(self, deadline_ms: int) -> Backoff:
        """The RETRY_* schedule, its retries ending `deadline_ms` after the first attempt."""
        return Backoff(self.max_attempts, self.backoff_initial_ms / 1000, self.backoff_rate,
                       self.backoff_max_ms / 1000, deadline_ms / 1000)


@dataclass(frozen=True)
class ErrorHandling:
    """Policy + DLQ settings, shipped to each Spark task next to the SinkSpec."""

    policy: ErrorPolicyConfig = field(default_factory=ErrorPolicyConfig)
    dlq: DlqConfig = field(default_factory=DlqConfig)
    # Where unrouted records go (SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC, written like dead letters);
    # None: they are ROUTING_ERRORs for the policy.
    fallback: DlqConfig | None = None
    retry_deadline_ms: int = DEFAULT_RETRY_DEADLINE_MS  # SINK_BIGQUERY_RETRY_DEADLINE_MS
    # Masks the job's secrets and URL credentials in what leaves the job with a dead letter (its error's
    # message), as the log handler does in log lines.
    redactor: Redactor = field(default_factory=Redactor, repr=False)

    def write_backoff(self) -> Backoff:
        """How a failed write is retried: RETRY_* within SINK_BIGQUERY_RETRY_DEADLINE_MS."""
        return self.policy.backoff(self.retry_deadline_ms)

    def retries(self, error: BaseException) -> bool:
        """A whole write that failed with `error` is worth another attempt (its type is in ERROR_TYPES_FOR_RETRY)."""
        return isinstance(error, SinkError) and error.error_type in self.policy.retry_types

    def final_outcome(self, error_type: ErrorType, retried: bool) -> str:
        """`dlq` or `failed` for a message whose error (after any retries) is `error_type`."""
        if error_type in self.policy.failing_types:
            return FAILED
        if retried and self.policy.fail_after_max_attempts:
            return FAILED
        if error_type in self.policy.dlq_types and self.dlq.enabled:
            return DLQ
        return FAILED


# `fallback`: unrouted records sent to the fallback output (not errors: they had no table to go to).
WRITTEN, RETRIED, DLQ, FAILED, FALLBACK = "written", "retried", "dlq", "failed", "fallback"


@dataclass
class Handled:
    """What became of one batch's records (each in exactly one of written/dead/failed), by source index."""

    written: int = 0
    retried: int = 0  # records sent again at least once (they also count in one of the others)
    dead: list[RowError] = field(default_factory=list)
    failed: list[RowError] = field(default_factory=list)

    @property
    def errors(self) -> list[RowError]:
        """Every record that did not get written."""
        return sorted(self.dead + self.failed, key=lambda f: f.index)


def write_with_policy(handling: ErrorHandling, pending: Writable, failures: Sequence[RowError],
                      writer: Callable[[], RowWriter] | None, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic,
                      where: Callable[[int], tuple[str, int, int]] | None = None) -> Handled:
    """Write `pending`, retry what the policy retries, and sort every record into written/dead/failed.

    `failures`: the records that never became rows (decoding, the mode's own checks); they take no retry.
    `writer()` opens (or returns the open) writer; None = decode only (no row counts as written).
    `where(i)`: record i's Kafka topic, partition and offset, for the log lines.
    Raises SinkError when a whole request still fails after its retries."""
    final: list[tuple[RowError, bool]] = [(f, False) for f in failures]
    done = Handled()
    if writer is not None and len(pending):
        write = _Write(pending, writer, handling.policy.retry_types)
        try:
            retry_call(write, handling.write_backoff(), what="write", give_up=gave_up, sleep=sleep, clock=clock,
                       retry_on=lambda e: isinstance(e, _RowsFailed) or handling.retries(e))
        except _RowsFailed as exc:
            final.extend((f, True) for f in exc.rows)  # their retries ran out
        final.extend(write.settled)
        done.retried = len(write.retried)
        done.written = len(pending) - len({f.index for f, _ in final} & set(pending.sources.tolist()))
    for failure, was_retried in final:
        outcome = handling.final_outcome(failure.error_type, was_retried)
        (done.dead if outcome == DLQ else done.failed).append(failure)
    _log_outcomes(done, where)
    return done


def _log_outcomes(done: Handled, where: Callable[[int], tuple[str, int, int]] | None) -> None:
    """A line per error type and outcome (its `error_type` in the JSON line's context), naming the first record
    (with `where`, by its Kafka coordinates, whose topic and partition are the line's context too: the records
    of one write may come from several partitions)."""
    for outcome, failures in (("go to the DLQ", done.dead), ("fail the batch", done.failed)):
        by_type: dict[ErrorType, list[RowError]] = {}
        for failure in failures:
            by_type.setdefault(failure.error_type, []).append(failure)
        for error_type, group in by_type.items():
            first, extra = f"record {group[0].index} of the batch", {"error_type": error_type}
            if where is not None:
                topic, partition, offset = where(group[0].index)
                first, extra = f"{topic}/{partition}@{offset}", {**extra, "topic": topic, "partition": partition}
            log.warning("%d record(s) %s with %s, first %s: %s", len(group), outcome, error_type.value, first,
                        group[0].message, extra=extra)


def gave_up(error: BaseException, attempts: int, seconds: float) -> BaseException:
    """A write's SinkError as the reason the job stops once its retries ran out: it says how long it tried."""
    if not isinstance(error, SinkError) or attempts == 1:
        return error
    return SinkError(error.error_type, f"{error.message} (gave up after {attempts} attempts in {seconds:.1f} s)")


class _RowsFailed(FirehoseError):
    """Rows of a write failed with a type the policy retries: the write goes again with only them."""

    def __init__(self, rows: list[RowError]) -> None:
        super().__init__(rows)
        self.rows = rows
        self.error_type = rows[0].error_type  # the retry's log line names it

    def __str__(self) -> str:
        return f"{len(self.rows)} row(s) failed, first: {self.rows[0].error_type.value}: {self.rows[0].message}"


class _Write:
    """One write, an attempt per call: the first sends every row, each retry only the rows still owed:
    those that failed with a retried type, and those a failed request did not get into the table. A request
    BigQuery refused as invalid (`SinkError.invalid_request`, a type not retried) has its rows isolated
    within the attempt (`_isolate`, the rule in the module's docstring)."""

    def __init__(self, pending: Writable, writer: Callable[[], RowWriter], retry_types: frozenset[ErrorType]) -> None:
        self.pending, self.owed = pending, pending
        self.writer = writer
        self.retry_types = retry_types
        self.settled: list[tuple[RowError, bool]] = []  # failed for good, by source index
        self.retried: set[int] = set()  # source indices sent more than once
        self.attempts = 0
        self.calls = 0  # writer calls, isolation's included

    def __call__(self) -> None:
        batch = self.owed
        if self.attempts:
            self.retried.update(batch.sources.tolist())
        self.attempts += 1
        rejected, unsent, request_error = self._send(batch)
        if request_error is not None and self._isolates(request_error):
            # Rows of the request that went in before it was refused (a writer sending in parts): the table
            # takes this request's rows. (Rows rejected are left out: a writer may refuse rows before sending.)
            went_in = len(batch) - len(unsent) - len(rejected) > 0
            more, unsent, request_error = self._isolate(unsent, request_error, went_in)
            rejected += more
        if request_error is not None and request_error.error_type not in self.retry_types:
            raise request_error
        # Rows that failed for good stay failed; only the retryable ones (and the unsent) go out again.
        self.settled.extend((f, False) for f in rejected if f.error_type not in self.retry_types)
        again = [f for f in rejected if f.error_type in self.retry_types]
        self.owed = self.pending.of_sources(sorted({f.index for f in again} | set(unsent)))
        if request_error is not None and len(self.owed):
            raise request_error  # when retries run out, the job stops with it: an outage is no message's fault
        if again:
            raise _RowsFailed(again)

    def _send(self, batch: Writable) -> tuple[list[RowError], list[int], SinkError | None]:
        """One writer call: the rows it rejected, the rows a failed request left unsent (by source index) and
        that request's error; every other row is in the table."""
        self.calls += 1
        request_error: SinkError | None = None
        unsent: list[int] = []
        try:
            rejected = [_at_source(batch, f) for f in self.writer().write(batch.rows, batch.insert_ids)]
        except PartialWriteError as exc:
            request_error, rejected = exc, [_at_source(batch, f) for f in exc.failures]
            unsent = [int(batch.sources[p]) for p in exc.unsent]
        except SinkError as exc:
            request_error, rejected, unsent = exc, [], batch.sources.tolist()
        return rejected, unsent, request_error

    def _isolates(self, error: SinkError) -> bool:
        return error.invalid_request and error.error_type not in self.retry_types

    def _isolate(self, unsent: list[int], error: SinkError,
                 accepted: bool = False) -> tuple[list[RowError], list[int], SinkError | None]:
        """The rows a request BigQuery refused as invalid left unsent, written in halves, and the halves that
        are refused the same way in halves again, depth first, until each row that still is refused is alone:
        it becomes a RowError of the refusal's type (then the policy's lists decide: the DLQ by default).

        `accepted`: rows of the request went in before it was refused.

        Returns the rows the halves' writes rejected (the isolated ones among them), the rows still owed, and
        the request error that ended it: None when every row was written or failed on its own; another
        (an outage meanwhile: the policy retries what is owed, or stops); or `error` itself, as the job's
        reason to stop, when the rule (module docstring) finds the table, not a row, at fault."""
        if len(unsent) == 1:  # nothing to tell the row from the table (module docstring): the row fails
            log.warning("a write request of one row was rejected as a whole (%s); the row fails as isolated",
                        error, extra={"error_type": error.error_type})
            return [RowError(unsent[0], error.error_type, "BigQuery rejected as a whole a request holding only this "
                             f"row (a refused row cannot be told from a refusing table): {error.message}")], [], None
        if not unsent:
            return [], [], _not_isolated(error, 0, 0)
        budget = IsolationBudget.of(len(unsent))
        first_call = self.calls
        stack = list(reversed(_halves(unsent)))  # depth first, each piece's first half before its second
        rejected: list[RowError] = []
        alone: list[tuple[int, SinkError]] = []  # rows refused as invalid when written alone
        # Rows of pieces refused after the budget ran out, with the piece's size and error: not isolated.
        unresolved: list[tuple[int, int, SinkError]] = []
        refused = 0  # isolation requests refused as invalid
        # A part of the refused request was taken without the others: its rows went in, or BigQuery answered
        # them row by row (a row it rejects on its own, a transient 5XX): the table takes its requests. (Rows
        # a writer refuses before sending never reach `unsent`, so every row answered here was sent.)
        while stack:
            spent = self.calls - first_call
            if refused >= budget.until_accepted and not accepted:
                return [], [], _not_isolated(error, len(unsent), spent)
            # Past the budget, the pieces left are sent once each, no longer halved (at most one per level of
            # each half of the request).
            exhausted = spent >= budget.requests
            piece = stack.pop()
            self.retried.update(piece)  # sent again: the refused request had them (the summary counts them)
            more, left, piece_error = self._send(self.pending.of_sources(piece))
            rejected += more
            accepted = accepted or len(left) < len(piece)
            if piece_error is None:
                continue
            if not self._isolates(piece_error):  # an outage meanwhile: what is not in the table yet is owed
                owed = (left + [i for rest in stack for i in rest] + [i for i, _ in alone]
                        + [i for i, _, _ in unresolved])
                return rejected, sorted(owed), piece_error
            refused += 1
            if len(left) == 1:
                alone.append((left[0], piece_error))
                if not accepted and stack:
                    # Depth first, a run of adjacent bad rows has piece after piece of it refused before any
                    # row goes in, as a refusing table would: the farthest piece (the other half of the
                    # request) tells them apart now, in one request.
                    stack.append(stack.pop(0))
            elif exhausted:
                unresolved.extend((i, len(left), piece_error) for i in left)
            elif alone and not accepted:
                # The farthest piece is refused too (a run goes on into it, or it begins with a bad row): its
                # far end first, so a part that goes in is found within the refusals the rule allows.
                stack.extend(_halves(left))
            else:
                stack.extend(reversed(_halves(left)))
        spent = self.calls - first_call
        if not accepted:  # every part was refused as a whole: nothing says it is the rows, not the table
            return [], [], _not_isolated(error, len(unsent), spent)
        isolated = [RowError(i, e.error_type, f"BigQuery rejected as a whole the request of {len(unsent)} row(s) this "
                             f"row was in; written alone, it is rejected: {e.message}") for i, e in alone]
        # More bad rows than the budget isolates: the rows of the pieces still refused fail together (the
        # DLQ by default, where a replay, in smaller batches, isolates them again). Stopping instead would
        # stop again on every restart, and write the pieces that went in once more each time.
        isolated += [RowError(i, e.error_type, f"BigQuery rejected as a whole the request of {len(unsent)} row(s) this "
                              f"row was in, and then a part of {size} row(s) holding it; the rows at fault were not "
                              f"told apart within {budget.requests} requests (more than {ISOLATION_ROWS} bad rows), "
                              f"so this part fails together: {e.message}") for i, size, e in unresolved]
        log.warning("%d row(s) isolated from a write request BigQuery rejected as a whole (%s) in %d more "
                    "request(s)%s; the other %d row(s) were written or failed on their own", len(alone), error, spent,
                    f", and {len(unresolved)} more failed in parts not told apart within the budget"
                    if unresolved else "", len(unsent) - len(isolated), extra={"error_type": error.error_type})
        return rejected + isolated, [], None


@dataclass(frozen=True)
class IsolationBudget:
    """How many writer calls isolating the rows of one refused request of `n` rows may take: `requests` in
    all, 16·(⌈log2 n⌉+1), enough for 8 bad rows wherever they are (each costs at most 2·⌈log2 n⌉); and
    `until_accepted` refused ones, 2·⌈log2 n⌉+2, while no row of the request got in: a bad row is alone after
    at most ⌈log2 n⌉ refusals and a piece without it goes in next, so more say that every row is refused
    (the table, not a row, is at fault)."""

    requests: int
    until_accepted: int

    @classmethod
    def of(cls, n: int) -> IsolationBudget:
        depth = max(1, n - 1).bit_length()  # ⌈log2 n⌉, at least 1
        return cls(ISOLATION_ROWS * 2 * (depth + 1), 2 * depth + 2)


def _halves(rows: list[int]) -> list[list[int]]:
    middle = len(rows) // 2
    return [half for half in (rows[:middle], rows[middle:]) if half]


def _not_isolated(error: SinkError, rows: int, spent: int) -> SinkError:
    """The refused request's error as the reason the job stops: no row of it went in without the others."""
    return SinkError(error.error_type, f"{error.message} (the request's {rows} row(s) were written in parts to find "
                     f"the rows it fails on, but no part of it was written in {spent} request(s): the table, not a "
                     "row, refuses it)", error.invalid_request)


def _at_source(batch: Writable, failure: RowError) -> RowError:
    """A writer's failure (by position in what it was given) as the failure of its source record."""
    return RowError(int(batch.sources[failure.index]), failure.error_type, failure.message, failure.exception)
