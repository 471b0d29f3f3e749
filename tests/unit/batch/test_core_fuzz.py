"""The batch core's promise, fuzzed: every record ends in exactly one place (a table row, a dead letter, a
fallback record, or a failed record whose batch is not committed) and the counts the task reports are
what happened.

Hypothesis draws a task: records mixing good values, undecodable ones, tombstones, unknown fields (value
and key), keys a changelog cannot use, routing headers that are missing or name an unusable table; rows
the fake writers refuse per row (each ErrorType the policy's lists tell apart), poison rows whose request
BigQuery refuses as a whole, writers that are down for some calls, a staged file that cannot be stored, a
DLQ that fails some attempts; one of the write modes' real task plans (their row shape and changelog
rule); and the error policy's settings. It runs `process_batch` on it and checks the outcome against a
model of each record's possible fates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from firehose_bq.batch import core
from firehose_bq.batch.core import TaskPlan, TaskResult, process_batch
from firehose_bq.batch.rows import Rows, Writable
from firehose_bq.bigquery.client import Clients
from firehose_bq.bigquery.file_loads import StagingArea
from firehose_bq.config import BigQueryConfig
from firehose_bq.decode import native_unavailable
from firehose_bq.descriptors import Descriptors
from firehose_bq.dlq import writers as dlq_writers
from firehose_bq.dlq.config import DlqConfig
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.errors import ErrorType, RowError, SinkError
from firehose_bq.modes import MixedTask, StagingTask, StreamingTask, reaches_driver_step
from firehose_bq.policy import DLQ, FAILED, TRANSIENT, ErrorHandling, IsolationBudget
from firehose_bq.registry.confluent import encode_frame, message_indexes
from firehose_bq.routing import Destination, NameTemplate, router_of
from firehose_bq.upsert.writer import ChangelogTask
from tests.unit.batch.sources import source_batch
from tests.unit.batch.test_core import NEWER, FakeTables, handling, spec
from tests.unit.test_poison_rows import PoisonWriter
from tests.unit.test_policy import batch
from tests.unit.test_policy import handling as policy_handling
from tests.unit.test_policy import run as run_policy

MODES = ("insertall", "storage_write", "file_loads", "mixed", "upsert")
SINK_TYPES = (ErrorType.SINK_4XX_ERROR, ErrorType.SINK_5XX_ERROR, ErrorType.SINK_RETRYABLE_ERROR,
              ErrorType.SINK_UNKNOWN_ERROR)
FIRST_OFFSET = 100  # offsets are not source indices: a mix-up of the two shows
UNUSABLE = "c"  # the header value whose table cannot be used (FakeTables.conflicting)
STREAMED = "a"  # in `mixed`, the table streamed; the others are staged
UNROUTED_TOPIC = "unrouted"
# What the fake writers do with a record's row: always refused with a type, refused for the first n writes
# (5XX), or refused as a whole request (`poison`); `ok` goes in.
ROW_REFUSALS = {"bad": ErrorType.SINK_4XX_ERROR, "payload": ErrorType.PAYLOAD_TOO_LARGE,
                "unknown_err": ErrorType.SINK_UNKNOWN_ERROR, "retryable": ErrorType.SINK_RETRYABLE_ERROR}
FLAKY = {"flaky1": 1, "flaky99": 99}
DOWN_ERRORS = {"retryable": SinkError(ErrorType.SINK_RETRYABLE_ERROR, "Connection refused"),
               "5xx": SinkError(ErrorType.SINK_5XX_ERROR, "backendError"),
               "notfound": SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")}


@dataclass(frozen=True)
class Record:
    value: str  # good | undecodable | null | unknown; framed values also unknown_id | bad_frame | unframed
    key: str  # good | null | undecodable | unknown (decoded only when the spec has a key class)
    header: str | None  # the routing header's value (routed jobs); None: absent
    row: str  # ok | poison | a ROW_REFUSALS or FLAKY kind


@dataclass(frozen=True)
class Scenario:
    mode: str
    records: tuple[Record, ...]
    cuts: tuple[int, ...]  # where the records split into source batches
    env: tuple[tuple[str, str], ...]
    routed: bool
    fallback: bool
    keyed: bool
    deletes: bool
    additional: bool
    hold: bool
    framed: bool  # values in Confluent's wire format, schema id 1 the subject's one version
    decoder: str
    chunk: int
    down: int  # the first calls of each writer fail as a whole
    down_error: str
    outages: tuple[int, ...]  # requests of each streaming writer that fail part-way through a call
    close_error: bool
    dlq_failures: int

    @property
    def changelog(self) -> bool:
        return self.mode == "upsert"

    def policy(self) -> ErrorHandling:
        h = handling(**dict(self.env))
        if self.fallback:
            h = replace(h, fallback=replace(h.dlq, enabled=True, writer_type="KAFKA", kafka_topic=UNROUTED_TOPIC))
        return h

    def staged(self, destination: str) -> bool:
        """Whether the rows for `destination` are staged (file loads) rather than streamed."""
        return self.mode == "file_loads" or (self.mode == "mixed" and destination != f"ds.{STREAMED}_v1")


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    mode = draw(st.sampled_from(MODES))
    changelog = mode == "upsert"
    routed = not changelog and draw(st.booleans())  # upsert has one destination (Config refuses templates)
    keyed = changelog or draw(st.booleans())
    n = draw(st.integers(1, 24))
    framed = draw(st.booleans())
    frame_kinds = ("unknown_id", "bad_frame", "unframed") if framed else ()
    records = tuple(draw(st.builds(
        Record,
        value=st.sampled_from(("good", "good", "good", "undecodable", "null", "unknown", *frame_kinds)),
        key=st.sampled_from(("good", "good", "good", "null", "undecodable", "unknown")) if keyed else st.just("good"),
        header=st.sampled_from(("a", "b", UNUSABLE, None)) if routed else st.just("a"),
        row=st.sampled_from(("ok",) * 8 + ("poison", *ROW_REFUSALS, *FLAKY)))) for _ in range(n))
    cuts = tuple(sorted(draw(st.sets(st.integers(1, n - 1), max_size=2)))) if n > 1 else ()
    # Mostly the defaults' shape (every type to the DLQ), often enough every other.
    sometimes = st.sampled_from((True, False, False, False))
    failing = draw(st.sets(st.sampled_from(list(ErrorType)), max_size=2)) if draw(sometimes) else set()
    dlq_types = (",".join(t.value for t in draw(st.sets(st.sampled_from(list(ErrorType)))) - failing)
                 if draw(sometimes) else "*")
    retry = draw(st.sets(st.sampled_from(SINK_TYPES))) if draw(sometimes) else set(TRANSIENT)
    env = {"DLQ_SINK_ENABLE": str(not draw(sometimes)).lower(),
           "ERROR_TYPES_FOR_FAILING": ",".join(t.value for t in failing), "ERROR_TYPES_FOR_DLQ": dlq_types,
           "ERROR_TYPES_FOR_RETRY": ",".join(t.value for t in retry),
           "RETRY_MAX_ATTEMPTS": str(draw(st.integers(1, 4))),
           "RETRY_FAIL_AFTER_MAX_ATTEMPTS_ENABLE": str(draw(st.booleans())).lower(),
           "INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE": str(draw(st.booleans())).lower(),
           "RETRY_EXPONENTIAL_BACKOFF_INITIAL_MS": "0", "RETRY_EXPONENTIAL_BACKOFF_MAX_MS": "0",
           "DLQ_RETRY_MAX_ATTEMPTS": str(draw(st.integers(1, 3))), "DLQ_RETRY_BACKOFF_MS": "0"}
    decoders = ["python"] if native_unavailable() else ["python", "native"]
    return Scenario(
        mode=mode, records=records, cuts=cuts, env=tuple(sorted(env.items())), routed=routed,
        fallback=routed and draw(st.booleans()), keyed=keyed, deletes=changelog and draw(st.booleans()),
        additional=draw(st.booleans()), hold=draw(sometimes), framed=framed, decoder=draw(st.sampled_from(decoders)),
        chunk=draw(st.sampled_from((0, 0, 1, 3))), down=draw(st.sampled_from((1, 2, 5))) if draw(sometimes) else 0,
        down_error=draw(st.sampled_from(sorted(DOWN_ERRORS))),
        outages=tuple(sorted(draw(st.sets(st.integers(1, 8), min_size=1, max_size=2)))) if draw(sometimes) else (), close_error=draw(sometimes),
        dlq_failures=draw(st.sampled_from((0, 0, 0, 0, 0, 1, 2, 3))))


class OffsetWriter(PoisonWriter):
    """PoisonWriter over the batch core's rows: a row's id is its Kafka offset (a table row's
    `message_offset`, a changelog row's `i`). A staged destination's writer (`close_error`) stores its
    file when it closes."""

    def __init__(self, close_error: SinkError | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.close_error = close_error

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        column = "message_offset" if "message_offset" in rows.schema.names else "i"
        return super().write(pa.RecordBatch.from_pydict({"id": [str(o) for o in rows[column].to_pylist()]}),
                             insert_ids)

    def close(self) -> None:
        if self.close_error is not None:
            raise self.close_error


@dataclass
class FuzzPlan:
    """A write mode's real TaskPlan (its row shape and changelog rule), its writers fakes, one per destination."""

    real: TaskPlan
    open: Callable[[str], OffsetWriter]
    writers: dict[str, OffsetWriter] = field(default_factory=dict)

    @property
    def changelog(self) -> bool:
        return self.real.changelog

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: object = None) -> OffsetWriter:
        name = destination.name if destination is not None else ""
        assert name not in self.writers, "one writer per destination and task"
        self.writers[name] = self.open(name)
        return self.writers[name]

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        return self.real.shape(rows, source, ids)

    def report(self, destination: Destination | None, writer: OffsetWriter) -> str | None:
        return self.real.report(destination, writer)

    def writes_to_table(self, destination: Destination | None) -> bool:
        return self.real.writes_to_table(destination)


def real_plan(sc: Scenario) -> TaskPlan:
    bq = BigQueryConfig(project_id="p", dataset="d", table="t")
    if sc.mode in ("insertall", "storage_write"):
        return StreamingTask(bq, sc.mode)
    if sc.mode == "upsert":
        return ChangelogTask(bq, "t_tmp", batch=9, deletes=sc.deletes)
    return (MixedTask if sc.mode == "mixed" else StagingTask)(bq, StagingArea("/nowhere"), "batch-9/")


def writer_for(sc: Scenario, destination: str) -> OffsetWriter:
    offsets = {str(FIRST_OFFSET + i): r.row for i, r in enumerate(sc.records)}
    staged = sc.staged(destination)
    return OffsetWriter(
        # A staging writer fits rows to the live table (per-row refusals) and never sends a request that
        # BigQuery could refuse as a whole; it can fail as a whole reading the table's schema (`down`).
        poison=set() if staged else {o for o, kind in offsets.items() if kind == "poison"},
        chunk=0 if staged else sc.chunk, outages=set() if staged else set(sc.outages), down=sc.down,
        down_error=DOWN_ERRORS[sc.down_error],
        bad={o for o, kind in offsets.items() if kind == "bad"},
        refused={o: ROW_REFUSALS[kind] for o, kind in offsets.items() if kind in ROW_REFUSALS and kind != "bad"},
        flaky={o: FLAKY[kind] for o, kind in offsets.items() if kind in FLAKY},
        close_error=SinkError(ErrorType.SINK_5XX_ERROR, "staging rows failed: 503") if staged and sc.close_error
        else None)


def sources(sc: Scenario, descriptors: Descriptors) -> list[pa.RecordBatch]:
    inner, key_class = descriptors.message_class("testdata.Inner"), descriptors.message_class("testdata.Key")
    frame = partial(encode_frame, message_indexes=message_indexes(inner.DESCRIPTOR))
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    for i, r in enumerate(sc.records):
        good = inner(label=f"r{i}").SerializeToString()
        value = {"good": good, "undecodable": b"\xff", "null": None, "unknown": good + NEWER}.get(r.value)
        if sc.framed and value is not None:
            value = frame(1, payload=value)
        elif sc.framed:
            value = {"unknown_id": frame(9, payload=good), "bad_frame": b"\x00\x00\x00", "unframed": good}.get(r.value)
        values.append(value)
        key = key_class(id=f"k{i}").SerializeToString()
        keys.append({"good": key, "undecodable": b"\xff", "null": None, "unknown": key + NEWER}[r.key])
    headers = [[("type", r.header.encode())] if r.header is not None else [] for r in sc.records]
    bounds = [0, *sc.cuts, len(sc.records)]
    return [source_batch(values[a:b], keys=keys[a:b], headers=headers[a:b],
                         offsets=[FIRST_OFFSET + i for i in range(a, b)]) for a, b in zip(bounds, bounds[1:])]


@dataclass
class Fate:
    """What may become of one record: where it may end, and with which error types."""

    destination: str  # its table's name ("" when the job has one table, or the record has no route)
    places: set[str]  # table | dlq | failed | fallback
    types: set[ErrorType] = field(default_factory=set)
    unknown: bool = False  # written, it counts as a message with unknown fields
    holds: bool = False  # with hold_on_unknown_fields, its source batch holds the task
    refused: bool = False  # its destination cannot be used: its letter names it, the per-table counts do not

    @property
    def counted_in(self) -> str:
        """The per-table counts it is in ("": none)."""
        return "" if self.refused else self.destination


def fate(sc: Scenario, h: ErrorHandling, r: Record) -> Fate:
    policy = h.policy
    key_class = sc.keyed
    if sc.routed and r.header is None:
        if sc.fallback:
            return Fate("", {"fallback"})
        return Fate("", {h.final_outcome(ErrorType.ROUTING_ERROR, False)}, {ErrorType.ROUTING_ERROR})
    destination = route(sc, r)
    if sc.routed and r.header == UNUSABLE:
        return Fate(destination, {h.final_outcome(ErrorType.ROUTING_ERROR, False)}, {ErrorType.ROUTING_ERROR},
                    refused=True)
    value_unknown, key_unknown = r.value == "unknown", key_class and r.key == "unknown"
    holds = value_unknown or key_unknown or r.value == "unknown_id"  # a refresh may bring either
    hard: set[ErrorType] = set()
    if r.value in ("undecodable", "unknown_id", "bad_frame", "unframed"):
        hard.add(ErrorType.DESERIALIZATION_ERROR)
    if r.value == "null" and (not sc.changelog or not sc.deletes):
        hard.add(ErrorType.INVALID_MESSAGE_ERROR)
    if key_class and r.key == "undecodable":
        hard.add(ErrorType.DESERIALIZATION_ERROR)
    if sc.changelog and r.key == "null":
        hard.add(ErrorType.INVALID_MESSAGE_ERROR)
    if sc.changelog and key_unknown:
        hard.add(ErrorType.UNKNOWN_FIELDS_ERROR)
    if hard:
        return Fate(destination, {h.final_outcome(t, False) for t in hard}, hard, holds=holds)
    rejected = (key_unknown or (value_unknown and not sc.additional)) and not policy.allow_unknown_fields
    if rejected:
        return Fate(destination, {h.final_outcome(ErrorType.UNKNOWN_FIELDS_ERROR, False)},
                    {ErrorType.UNKNOWN_FIELDS_ERROR}, holds=holds)
    out = Fate(destination, set(), unknown=value_unknown or key_unknown, holds=holds)
    staged = sc.staged(destination)
    row = "ok" if r.row == "poison" and staged else r.row
    # Another row's poison makes its request refused as a whole; past the isolation budget the pieces still
    # refused fail together, whatever their rows are.
    poisoned = not staged and any(x.row == "poison" and route(sc, x) == destination for x in sc.records)
    if poisoned:
        out.places |= {h.final_outcome(ErrorType.SINK_4XX_ERROR, was) for was in (False, True)}
        out.types.add(ErrorType.SINK_4XX_ERROR)
    if row == "ok":
        out.places.add("table")
        return out
    error = {"poison": ErrorType.SINK_4XX_ERROR, **ROW_REFUSALS}.get(row, ErrorType.SINK_5XX_ERROR)
    out.types.add(error)
    retried = error in policy.retry_types
    out.places.add(h.final_outcome(error, retried))
    if row == "flaky1" and retried and policy.max_attempts > 1:
        # Its second write goes in, unless outages took the attempts it needed.
        outage = sc.down > 0 or (not staged and bool(sc.outages))
        out.places = (out.places if outage else out.places - {h.final_outcome(error, retried)}) | {"table"}
    return out


def route(sc: Scenario, r: Record) -> str:
    """The table a record is routed to ("" when the job has one, or the record none)."""
    return f"ds.{r.header}_v1" if sc.routed and r.header is not None else ""


@dataclass
class Outcome:
    result: TaskResult
    plan: FuzzPlan
    letters: list[DeadLetter]
    unrouted: list[DeadLetter]


def run(sc: Scenario, descriptors: Descriptors) -> Outcome:
    h = sc.policy()
    letters: list[DeadLetter] = []
    unrouted: list[DeadLetter] = []
    failures_left = [sc.dlq_failures]

    class FailingDlq:
        """Stores the letters, after failing the scenario's first `dlq_failures` attempts."""

        def __init__(self, cfg: DlqConfig) -> None:
            self.stored = unrouted if cfg.kafka_topic == UNROUTED_TOPIC else letters

        def write(self, batch: Sequence[DeadLetter]) -> None:
            if failures_left[0]:
                failures_left[0] -= 1
                raise ConnectionError("the DLQ is unreachable")
            self.stored.extend(batch)

        def close(self) -> None:
            pass

    router = router_of("ds", "${header.type}_v1", "testdata.Inner", None, "")
    if sc.mode == "mixed":
        router = replace(router, streaming=(NameTemplate(f"{STREAMED}_v1"),))
    if sc.framed:
        descriptors = replace(descriptors, schema_ids=frozenset({1}))
    task_spec = spec(descriptors, confluent_framed=sc.framed, schema_subject="orders-value" if sc.framed else None,
                     key_class="testdata.Key" if sc.keyed else None, hold_on_unknown_fields=sc.hold,
                     additional_properties=sc.additional, decoder=sc.decoder,
                     router=router if sc.routed else None,
                     tables=FakeTables(conflicting={f"ds.{UNUSABLE}_v1"}) if sc.routed else None)
    plan = FuzzPlan(real_plan(sc), partial(writer_for, sc))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core, "dead_letter", partial(dlq_writers.dead_letter, opener=FailingDlq, sleep=lambda s: None))
        result = process_batch(sources(sc, descriptors), task_spec, plan, h)
    return Outcome(result, plan, letters, unrouted)


def check(sc: Scenario, out: Outcome) -> None:
    h = sc.policy()
    result, s = out.result, out.result.stats
    event(f"mode {sc.mode}")
    event(("fatal: DLQ" if "dead-letter write" in result.fatal else f"fatal: {result.fatal.split(':')[0]}")
          if result.fatal else "held" if result.held else "failed records" if s.failed else "committed")
    event("dead letters" if out.letters else "no dead letters")
    fates = {FIRST_OFFSET + i: fate(sc, h, r) for i, r in enumerate(sc.records)}
    table = Counter(int(o) for w in out.plan.writers.values() for o in w.stored)
    assert not [o for o, n in table.items() if n > 1], "a row is in its table twice"
    dead = Counter(x.error.offset for x in out.letters)
    fallback = Counter(x.error.offset for x in out.unrouted)
    assert not [o for o, n in (dead + fallback).items() if n > 1], "a record was dead-lettered twice"
    assert not (set(table) & set(dead + fallback)), "a record is in its table and in the DLQ"
    assert not (set(table) - set(fates)), "a row that is no record's"

    # Where the task held (hold_on_unknown_fields), what it settled and reports ends before `settled_up_to`.
    bounds = [FIRST_OFFSET + c for c in (0, *sc.cuts, len(sc.records))]
    holding = [a for a, b in zip(bounds, bounds[1:]) if sc.hold and any(fates[o].holds for o in range(a, b))]
    settled_up_to = holding[0] if holding else bounds[-1]
    beyond = [o for o in (*table, *dead, *fallback) if o >= settled_up_to]
    assert not beyond, f"records past where the task held were settled: {beyond}"

    expect_fatal = (sc.down or sc.outages or sc.close_error or sc.dlq_failures
                    or any(r.row == "poison" for r in sc.records))
    if not expect_fatal:
        assert result.fatal is None, result.fatal
    # What the driver hears (the result travels as JSON) and whether it may go on to commit the batch.
    heard = TaskResult.from_json(result.to_json())
    assert heard.stats.to_json() == s.to_json() and (heard.fatal, heard.held) == (result.fatal, result.held)
    assert reaches_driver_step([heard], heard.stats) == (result.fatal is None and s.failed == 0)
    if result.fatal is not None:
        if not (sc.close_error and "staging rows failed" in result.fatal):
            assert not out.letters and not out.unrouted, "a stopped task stored dead letters"
        return  # nothing of the batch is committed: the rerun reads it all again
    if holding:
        assert result.held is not None and result.resume == [("t", 0, settled_up_to)], result.held
    else:
        assert result.held is None and result.resume == []

    settled = [o for o in fates if o < settled_up_to]
    failed = [o for o in settled if o not in table and o not in dead and o not in fallback]
    for offset in settled:
        f = fates[offset]
        place = ("table" if offset in table else "dlq" if offset in dead else "fallback" if offset in fallback
                 else "failed")
        assert place in f.places, (offset, place, f, sc.records[offset - FIRST_OFFSET])
    for letter in out.letters:
        f = fates[letter.error.offset]
        assert letter.error.error_type in f.types, (letter.error, f)
        assert letter.route == f.destination and letter.attempt == 1
    for letter in out.unrouted:
        assert letter.error.error_type is ErrorType.ROUTING_ERROR and letter.route == ""

    # The counts the task reports.
    assert s.messages == len(settled)
    assert (s.rows_written, s.dead_lettered, s.fallback, s.failed) == (len(table), len(dead), len(fallback),
                                                                        len(failed))
    assert s.rows_written + s.dead_lettered + s.fallback + s.failed == s.messages
    assert sum(s.errors_by_type.values()) == s.dead_lettered + s.failed
    by_outcome = s.errors_by_outcome
    assert {t: n for (t, o), n in by_outcome.items() if o == DLQ} == dict(
        Counter(x.error.error_type.value for x in out.letters))
    assert sum(n for (t, o), n in by_outcome.items() if o == FAILED) == len(failed)
    possible = {t.value for o in failed for t in fates[o].types}
    assert {t for (t, o) in by_outcome if o == FAILED} <= possible
    assert {(e.offset, e.error_type) for e in s.sample_errors} <= {(o, t) for o in failed for t in fates[o].types}
    assert len(s.sample_errors) == min(len(failed), 5)
    assert s.unknown_fields == sum(1 for o in table if fates[o].unknown)
    # Retried: the records the task handed a writer more than once.
    handed = Counter(int(o) for w in out.plan.writers.values() for call in w.calls for o in call)
    assert s.retried == sum(1 for n in handed.values() if n > 1)
    if sc.routed:
        for name, counts in s.tables.items():
            mine = [o for o in settled if fates[o].counted_in == name]
            assert counts["messages"] == len(mine), name
            assert counts["written"] == sum(1 for o in mine if o in table), name
            assert counts["dlq"] == sum(1 for o in mine if o in dead), name
            assert counts["failed"] == sum(1 for o in mine if o in failed), name
        assert set(s.tables) == {fates[o].counted_in for o in settled if fates[o].counted_in}
    else:
        assert not s.tables


class Loaded:
    """The test descriptors under a short name: Hypothesis prints a failing example's arguments, and the
    descriptor set's repr is 80 kB of bytes."""

    def __init__(self, descriptors: Descriptors) -> None:
        self.descriptors = descriptors

    def __repr__(self) -> str:
        return "test_descriptors"


@pytest.fixture(scope="module")
def loaded(test_descriptors: Descriptors) -> Loaded:
    return Loaded(test_descriptors)


def scenario(records: Sequence[Record], **changes: object) -> Scenario:
    """A scenario written out: the defaults' policy, one table, a healthy sink and DLQ."""
    env = {"RETRY_EXPONENTIAL_BACKOFF_INITIAL_MS": "0", "RETRY_EXPONENTIAL_BACKOFF_MAX_MS": "0",
           "DLQ_RETRY_BACKOFF_MS": "0", **changes.pop("env", {})}  # type: ignore[dict-item]
    base = Scenario(mode="insertall", records=tuple(records), cuts=(), env=tuple(sorted(env.items())), routed=False,
                    fallback=False, keyed=False, deletes=False, additional=False, hold=False, framed=False, decoder="python",
                    chunk=0, down=0, down_error="retryable", outages=(), close_error=False, dlq_failures=0)
    return replace(base, **changes)  # type: ignore[arg-type]


# Counterexamples the fuzzing found, kept (each with the fix's commit).
# unknown_fields counted a kept row with unknown fields that the sink then refused (it is no written row).
@example(sc=scenario([Record("good", "good", "a", "ok"), Record("unknown", "good", "a", "poison")],
                     additional=True, env={"INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE": "false"}))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_every_record_ends_in_exactly_one_place_and_the_counts_say_so(loaded: Loaded, sc: Scenario) -> None:
    check(sc, run(sc, loaded.descriptors))


@dataclass(frozen=True)
class Refusal:
    """A request of `n` rows, some of them poison (refused as a whole), for the policy alone."""

    n: int
    poison: frozenset[int]
    bad: frozenset[int]  # refused per row (4XX)
    flaky: frozenset[int]  # refused once (5XX, retried)
    chunk: int
    outages: frozenset[int]


@st.composite
def refusals(draw: st.DrawFn) -> Refusal:
    n = draw(st.integers(2, 300))
    rows = st.integers(0, n - 1)
    poison = set(draw(st.sets(rows, max_size=12)))
    if draw(st.booleans()):  # a producer's burst: a run of adjacent poison rows
        start, length = draw(rows), draw(st.integers(1, 16))
        poison |= set(range(start, min(n, start + length)))
    return Refusal(n, frozenset(poison), frozenset(draw(st.sets(rows, max_size=4)) - poison),
                   frozenset(draw(st.sets(rows, max_size=4)) - poison), draw(st.sampled_from((0, 0, 7, 64))),
                   frozenset(draw(st.sets(st.integers(1, 40), max_size=2))) if draw(st.booleans()) else frozenset())


# A poison row beside a row BigQuery answered on its own (here a transient 5XX) was taken for a refusing table.
@example(case=Refusal(2, frozenset({0}), frozenset(), frozenset({1}), 0, frozenset()))
# A writer sending in parts of 7 got rows 0-20 in, then its last part, both rows poison, was refused whole:
# taken for a refusing table, it stopped the job (and every restart).
@example(case=Refusal(23, frozenset({21, 22}), frozenset(), frozenset(), 7, frozenset()))
@settings(max_examples=150, deadline=None)
@given(case=refusals())
def test_isolating_poison_rows_puts_every_row_in_one_place_at_a_bounded_cost(case: Refusal) -> None:
    """Large requests, many poison rows (past the isolation budget), runs of them, chunked writers, outages
    meanwhile: the policy alone (the batch core above keeps requests small)."""
    flaky = {str(i): 1 for i in case.flaky}
    writer = PoisonWriter(poison={str(i) for i in case.poison}, bad={str(i) for i in case.bad}, flaky=flaky,
                          chunk=case.chunk, outages=set(case.outages))
    try:
        done, _ = run_policy(policy_handling(), writer, batch([str(i) for i in range(case.n)]))
    except SinkError as stopped:
        event("stopped")
        assert stopped.error_type in (ErrorType.SINK_4XX_ERROR, ErrorType.SINK_RETRYABLE_ERROR)
        assert case.poison or case.outages, stopped
        # Without an outage, only what looks like a refusing table stops it: every part refused as a whole,
        # none taken (no row in, none answered on its own). (A run of poison rows filling most of a small
        # request can look so within the 2L+2 refusals the rule allows: IsolationBudget.)
        if not case.outages:
            poison = {str(i) for i in case.poison}
            assert not writer.stored and all(poison & set(call[:case.chunk or len(call)]) for call in writer.calls)
        assert len(writer.stored) == len(set(writer.stored)), "a row written twice"
        return
    event("settled")
    stored = [int(i) for i in writer.stored]
    assert len(stored) == len(set(stored)), "a row written twice"
    dead, failed = [e.index for e in done.dead], [e.index for e in done.failed]
    assert not failed  # the defaults: every type to the DLQ
    assert sorted(stored + dead) == list(range(case.n)) and done.written == len(stored)
    for e in done.dead:
        if e.index in case.poison:
            assert e.error_type is ErrorType.SINK_4XX_ERROR and "rejected as a whole" in e.message
        elif e.index in case.bad:
            assert e.error_type is ErrorType.SINK_4XX_ERROR
        else:  # a good row only when more bad rows than the budget isolates left it in a refused part
            assert e.error_type is ErrorType.SINK_4XX_ERROR and "not told apart" in e.message, e
    handed = Counter(i for call in writer.calls for i in call)
    assert done.retried == sum(1 for n in handed.values() if n > 1)
    if not case.flaky and not case.outages:  # one attempt: the documented cost bound
        budget = IsolationBudget.of(case.n)
        depth = max(1, case.n - 1).bit_length()
        assert len(writer.calls) <= 1 + budget.requests + 2 * depth + 2
