"""The batch core without Spark: every record ends in the table, the DLQ, or the failed count."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud.bigquery import SchemaField

from firehose_bq import logs
from firehose_bq.batch import core
from firehose_bq.batch.core import ATTEMPT_COLUMN, TaskResult, process_batch
from firehose_bq.batch.rows import KEY_UNKNOWN, TOMBSTONE, Rows, Writable
from firehose_bq.bigquery.client import Clients
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.decode import native_unavailable
from firehose_bq.descriptors import Descriptors
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.errors import DeadLetterError, ErrorType, RowError, SchemaEvolutionError, SinkError, TableChangedError
from firehose_bq.bigquery import file_loads
from firehose_bq.modes import MixedTask, StagingTask, StreamingTask, table_rows
from firehose_bq.policy import ErrorHandling
from firehose_bq.registry.confluent import encode_frame, message_indexes
from firehose_bq.routing import Destination, router_of
from firehose_bq.schema import MetadataColumns
from firehose_bq.sink_schema import CheckedTables, Ensured, SinkSpec
from tests.unit.batch.sources import source_batch


@dataclass
class FakeWriter:
    """Rejects rows whose label is in `bad` (4XX); raises `error` on every write when set."""

    bad: set[str] = field(default_factory=set)
    error: SinkError | None = None
    close_error: SinkError | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    closed: bool = False
    requests: list[int] = field(default_factory=list)  # the rows of each write call

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        self.requests.append(rows.num_rows)
        if self.error:
            raise self.error
        failures = []
        for n, row in enumerate(rows.to_pylist()):
            if row.get("label") in self.bad:
                failures.append(RowError(n, ErrorType.SINK_4XX_ERROR, "invalid"))
            else:
                self.written.append(row)
                self.ids.append(insert_ids[n].as_py())
        return failures

    def close(self) -> None:
        self.closed = True
        if self.close_error:
            raise self.close_error


@dataclass
class FakePlan:
    writer: FakeWriter = field(default_factory=FakeWriter)
    changelog: bool = False
    opened: int = 0
    destinations: list[Destination | None] = field(default_factory=list)

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[Any] | None = None) -> FakeWriter:
        self.opened += 1
        self.destinations.append(destination)
        return self.writer

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        return table_rows(rows, ids), []

    def writes_to_table(self, destination: Destination | None) -> bool:
        return True

    def report(self, destination: Destination | None, writer: FakeWriter) -> str:
        return f"{len(writer.written)} rows"


def spec(descriptors: Descriptors, **changes: Any) -> SinkSpec:
    return replace(SinkSpec(descriptors, "testdata.Inner", MetadataColumns(columns=("message_offset",))), **changes)


def handling(**env: str) -> ErrorHandling:
    cfg = Config.from_env({"SOURCE_KAFKA_BROKERS": "b", "SOURCE_KAFKA_TOPIC": "t", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
                           "INPUT_SCHEMA_PROTO_CLASS": "x.Y", "SCHEMA_REGISTRY_STENCIL_URLS": "/d",
                           "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "p", "SINK_BIGQUERY_DATASET_NAME": "d",
                           "SINK_BIGQUERY_TABLE_NAME": "t", "SPARK_CHECKPOINT_LOCATION": "/c",
                           "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "LOG", **env})
    return ErrorHandling(cfg.errors, cfg.dlq)


@pytest.fixture
def letters(monkeypatch: pytest.MonkeyPatch) -> list[DeadLetter]:
    stored: list[DeadLetter] = []
    monkeypatch.setattr(core, "dead_letter", lambda cfg, batch: stored.extend(batch))
    return stored


def values(descriptors: Descriptors, *labels: str | None) -> list[bytes | None]:
    cls = descriptors.message_class("testdata.Inner")
    return [None if label is None else cls(label=label).SerializeToString() for label in labels]


def test_every_record_is_written_dead_lettered_or_failed_once(test_descriptors: Descriptors,
                                                              letters: list[DeadLetter]) -> None:
    plan = FakePlan(FakeWriter(bad={"bad"}))
    first = source_batch(values(test_descriptors, "a", "bad", None), offsets=[10, 11, 12],
                         keys=[b"k0", b"k1", b"k2"], headers=[[("h", b"1")]] * 3, timestamp_types=[0, 1, 0],
                         leader_epochs=[4, 5, 6])
    second = source_batch([*values(test_descriptors, "c"), b"\xff"], offsets=[13, 14])
    result = process_batch([first, second], spec(test_descriptors), plan, handling())
    s = result.stats
    assert (s.messages, s.rows_written, s.dead_lettered, s.failed) == (5, 2, 3, 0)
    assert dict(s.errors_by_type) == {"SINK_4XX_ERROR": 1, "INVALID_MESSAGE_ERROR": 1, "DESERIALIZATION_ERROR": 1}
    assert [r["label"] for r in plan.writer.written] == ["a", "c"] and plan.writer.ids == ["t_0_10", "t_0_13"]
    assert plan.opened == 1 and plan.writer.closed and result.reports == ["2 rows"] and result.fatal is None
    by_offset = {x.error.offset: x for x in letters}
    assert sorted(by_offset) == [11, 12, 14]
    assert by_offset[11].key == b"k1" and by_offset[11].headers == (("h", b"1"),) and by_offset[11].attempt == 1
    assert (by_offset[11].timestamp_type, by_offset[11].leader_epoch) == (1, 5)
    assert by_offset[12].value is None and by_offset[11].timestamp_ms == 1000
    # What failed each: the exception raised for it, or the component that refused it (seed 004).
    assert by_offset[14].exception_class == "google.protobuf.message.DecodeError"
    assert by_offset[11].exception_class == "google.cloud.bigquery.RowError"
    assert by_offset[11].route == "" and by_offset[12].error.error_type is ErrorType.INVALID_MESSAGE_ERROR


def test_dlq_off_makes_them_failures_with_samples(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    result = process_batch([source_batch(values(test_descriptors, "a", "bad"))], spec(test_descriptors),
                           FakePlan(FakeWriter(bad={"bad"})), handling(DLQ_SINK_ENABLE="false"))
    assert result.stats.failed == 1 and not letters
    assert [(e.error_type, e.offset) for e in result.stats.sample_errors] == [(ErrorType.SINK_4XX_ERROR, 1)]


def test_a_replayed_letter_counts_one_more_attempt(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    batch = source_batch(values(test_descriptors, "bad"))
    batch = pa.RecordBatch.from_arrays([*batch.columns, pa.array([3], pa.int32())],
                                       schema=batch.schema.append(pa.field(ATTEMPT_COLUMN, pa.int32())))
    process_batch([batch], spec(test_descriptors), FakePlan(FakeWriter(bad={"bad"})), handling())
    assert [x.attempt for x in letters] == [4]


def test_unknown_fields_written_or_rejected_by_policy(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    newer = values(test_descriptors, "x")[0] + b"\xa0\x06\x01"
    batch = source_batch([*values(test_descriptors, "a"), newer])
    plan = FakePlan()
    result = process_batch([batch], spec(test_descriptors), plan, handling())
    assert result.stats.rows_written == 2 and result.stats.unknown_fields == 1

    plan = FakePlan()
    strict = handling(INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false")
    result = process_batch([batch], spec(test_descriptors), plan, strict)
    assert [r["label"] for r in plan.writer.written] == ["a"]
    assert [(x.error.error_type, x.error.offset) for x in letters] == [(ErrorType.UNKNOWN_FIELDS_ERROR, 1)]


def test_unknown_fields_count_only_the_rows_that_were_written(test_descriptors: Descriptors,
                                                               letters: list[DeadLetter]) -> None:
    """The count says "written": a row with unknown fields that the sink refuses is a dead letter, not one."""
    newer = values(test_descriptors, "x")[0] + NEWER
    batch = source_batch([*values(test_descriptors, "a"), newer, newer])
    plan = FakePlan(FakeWriter(bad={"x"}))
    result = process_batch([batch], spec(test_descriptors, additional_properties=True), plan, handling())
    assert (result.stats.rows_written, result.stats.dead_lettered, result.stats.unknown_fields) == (1, 2, 0)


def test_additional_properties_keep_unknown_fields_whatever_the_policy(test_descriptors: Descriptors,
                                                                        letters: list[DeadLetter]) -> None:
    newer = values(test_descriptors, "x")[0] + b"\xa0\x06\x01"
    batch = source_batch([*values(test_descriptors, "a"), newer])
    for policy in (handling(), handling(INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false")):
        plan = FakePlan()
        result = process_batch([batch], spec(test_descriptors, additional_properties=True), plan, policy)
        assert result.stats.rows_written == 2 and result.stats.unknown_fields == 1 and not letters
        assert [(r["label"], r["additional_properties"]) for r in plan.writer.written] == [
            ("a", None), ("x", '{"100":[1]}')]


NEWER = b"\xa0\x06\x01"  # field 100 = 1: in no version of the test protos


def keyed_batch(descriptors: Descriptors) -> pa.RecordBatch:
    """a: nothing unknown; b: the key has unknown fields; c: key and value; d: the value alone; e: a
    tombstone whose key has them (an error anywhere: appended it is a NULL value, in a changelog a delete)."""
    key = descriptors.message_class("testdata.Key")(id="k").SerializeToString()
    a, b, c, d = values(descriptors, "a", "b", "c", "d")
    return source_batch([a, b, c + NEWER, d + NEWER, None], keys=[key, key + NEWER, key + NEWER, key, key + NEWER])


def keyed(descriptors: Descriptors, decoder: str, **changes: Any) -> SinkSpec:
    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    return spec(descriptors, key_class="testdata.Key", decoder=decoder, **changes)


def outcome(result: TaskResult, plan: FakePlan, letters: list[DeadLetter]) -> tuple[list[str], list[tuple[int, str]]]:
    """The labels written, and (offset, message) of each dead letter; every record in exactly one place."""
    s = result.stats
    assert s.rows_written + s.dead_lettered + s.failed == s.messages == 5
    assert len({x.error.offset for x in letters}) == len(letters)
    return [r["label"] for r in plan.writer.written], sorted((x.error.offset, x.error.message) for x in letters)


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_keys_unknown_fields_follow_the_values_rule_when_appended(test_descriptors: Descriptors, decoder: str,
                                                                    letters: list[DeadLetter]) -> None:
    batch = keyed_batch(test_descriptors)
    plan = FakePlan()
    result = process_batch([batch], keyed(test_descriptors, decoder), plan, handling())
    # Allowed: written without them, counted once per record (c's key and value: one).
    assert outcome(result, plan, letters) == (["a", "b", "c", "d"], [(4, TOMBSTONE)])
    assert result.stats.unknown_fields == 3
    assert [r["message_key"] for r in plan.writer.written] == [{"id": "k", "day": None}] * 4

    letters.clear()
    plan = FakePlan()
    strict = handling(INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false")
    result = process_batch([batch], keyed(test_descriptors, decoder), plan, strict)
    assert outcome(result, plan, letters) == (["a"], [(1, core.KEY_UNKNOWN_FIELDS), (2, core.KEY_UNKNOWN_FIELDS),
                                                      (3, core.UNKNOWN_FIELDS), (4, TOMBSTONE)])
    assert {x.error.error_type for x in letters[:3]} == {ErrorType.UNKNOWN_FIELDS_ERROR}
    assert result.stats.unknown_fields == 0 and result.stats.errors_by_type["UNKNOWN_FIELDS_ERROR"] == 3


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_additional_properties_keep_only_the_values_unknown_fields(test_descriptors: Descriptors, decoder: str,
                                                                   letters: list[DeadLetter]) -> None:
    """The column holds the value's unknown fields: a key's follow INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE."""
    batch = keyed_batch(test_descriptors)
    plan = FakePlan()
    strict = handling(INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false")
    result = process_batch([batch], keyed(test_descriptors, decoder, additional_properties=True), plan, strict)
    assert outcome(result, plan, letters) == (["a", "d"], [(1, core.KEY_UNKNOWN_FIELDS), (2, core.KEY_UNKNOWN_FIELDS),
                                                           (4, TOMBSTONE)])
    assert [r["additional_properties"] for r in plan.writer.written] == [None, '{"100":[1]}']
    assert result.stats.unknown_fields == 1

    letters.clear()
    plan = FakePlan()
    result = process_batch([batch], keyed(test_descriptors, decoder, additional_properties=True), plan, handling())
    assert outcome(result, plan, letters) == (["a", "b", "c", "d"], [(4, TOMBSTONE)])
    assert [r["additional_properties"] for r in plan.writer.written] == [None, None, '{"100":[1]}', '{"100":[1]}']
    assert result.stats.unknown_fields == 3


@pytest.mark.parametrize("decoder", ["native", "python"])
@pytest.mark.parametrize("env", [{}, {"INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE": "false"},
                                 {"SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE": "true"}], ids=["allowed", "strict", "ap"])
def test_a_changelogs_key_with_unknown_fields_is_an_error_whatever_the_policy(
        test_descriptors: Descriptors, decoder: str, env: dict[str, str], letters: list[DeadLetter]) -> None:
    """Merged by its known fields only, b's and c's rows would overwrite the row of key `k` (a's), and e
    would delete it: they are dead-lettered, once each; d (the value's unknown fields) follows the policy."""
    plan = FakePlan(changelog=True)
    additional = env.get("SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE") == "true"
    result = process_batch([keyed_batch(test_descriptors)],
                           keyed(test_descriptors, decoder, additional_properties=additional), plan, handling(**env))
    d_kept = env.get("INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE") != "false" or additional
    keys = [(1, KEY_UNKNOWN), (2, KEY_UNKNOWN), (4, KEY_UNKNOWN)]
    expected = (["a", "d"], keys) if d_kept else (["a"], sorted([*keys, (3, core.UNKNOWN_FIELDS)]))
    assert outcome(result, plan, letters) == expected
    assert result.stats.unknown_fields == (1 if d_kept else 0)
    assert all(x.error.error_type is ErrorType.UNKNOWN_FIELDS_ERROR for x in letters)


@pytest.mark.parametrize("changelog", [False, True])
def test_a_keys_unknown_fields_hold_the_task_for_a_refresh(test_descriptors: Descriptors, changelog: bool,
                                                           letters: list[DeadLetter]) -> None:
    """The refresh may bring the key class's new version: nothing of the batch is settled before it."""
    key = test_descriptors.message_class("testdata.Key")(id="k").SerializeToString()
    batch = source_batch(values(test_descriptors, "a", "b"), keys=[key, key + NEWER], offsets=[7, 8])
    plan = FakePlan(changelog=changelog)
    result = process_batch([batch], keyed(test_descriptors, "python", hold_on_unknown_fields=True), plan, handling())
    assert result.held == "unknown fields at t/0@8" and result.resume == [("t", 0, 7)]
    assert not plan.writer.written and not letters and result.stats.messages == 0


def test_holding_on_unknown_fields_settles_what_came_before_and_says_where_to_resume(
        test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    newer = values(test_descriptors, "x")[0] + b"\xa0\x06\x01"
    first = source_batch(values(test_descriptors, "a", "bad"), offsets=[1, 2])
    held = source_batch([*values(test_descriptors, "b"), newer], offsets=[3, 4])
    after = source_batch(values(test_descriptors, "c"), offsets=[5])
    plan = FakePlan(FakeWriter(bad={"bad"}))
    result = process_batch([first, held, after], spec(test_descriptors, hold_on_unknown_fields=True), plan,
                           handling())
    # The first source batch is settled (its row written, its bad record dead-lettered); nothing of the
    # held one is, and the second run starts at its first offset.
    assert result.held == "unknown fields at t/0@4" and result.resume == [("t", 0, 3)]
    assert [r["label"] for r in plan.writer.written] == ["a"] and [x.error.offset for x in letters] == [2]
    assert (result.stats.messages, result.stats.rows_written, result.stats.dead_lettered) == (2, 1, 1)


def test_a_sink_failure_is_fatal_and_the_writer_is_closed(test_descriptors: Descriptors,
                                                           letters: list[DeadLetter]) -> None:
    plan = FakePlan(FakeWriter(error=SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")))
    result = process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan, handling())
    assert result.fatal == "SINK_4XX_ERROR: Not found: Table p:d.t" and plan.writer.closed and not letters


class CountingClients(Clients):
    """A process's clients as a task sees them: how often they were reset and closed."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = self.closes = 0

    def reset(self) -> None:
        self.resets += 1
        super().reset()

    def close(self) -> None:
        self.closes += 1
        super().close()


@dataclass
class BorrowingPlan(FakePlan):
    """A plan whose writers are opened on the clients the task lends."""

    lent: list[Clients] = field(default_factory=list)

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[Any] | None = None) -> FakeWriter:
        self.lent.append(clients)
        return super().open_writer(destination, clients, schema)


def test_the_callers_clients_are_lent_to_the_writers_and_kept(test_descriptors: Descriptors,
                                                               letters: list[DeadLetter]) -> None:
    clients = CountingClients()
    for _ in range(2):  # two tasks of one worker
        plan = BorrowingPlan()
        result = process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan,
                               handling(), clients)
        assert result.stats.rows_written == 1 and plan.lent == [clients] and plan.writer.closed
    assert (clients.resets, clients.closes) == (0, 0), "kept for the next task"


def test_a_request_that_fails_as_a_whole_drops_the_clients(test_descriptors: Descriptors,
                                                           letters: list[DeadLetter]) -> None:
    clients = CountingClients()
    plan = BorrowingPlan(FakeWriter(error=SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")))
    result = process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan,
                           handling(), clients)
    assert result.fatal is not None and plan.writer.closed
    assert (clients.resets, clients.closes) == (1, 0), "the next task makes new ones"


def test_without_clients_a_task_makes_its_own_and_closes_them(test_descriptors: Descriptors,
                                                              letters: list[DeadLetter],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[CountingClients] = []
    monkeypatch.setattr(core, "Clients", lambda: made.append(CountingClients()) or made[-1])
    plan = BorrowingPlan()
    process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan, handling())
    assert plan.lent == made and made[0].closes == 1


def test_a_writer_that_cannot_finish_on_close_is_fatal(test_descriptors: Descriptors,
                                                       letters: list[DeadLetter]) -> None:
    """File loads store their staged file when the writer closes: failing there stops the batch cleanly."""
    plan = FakePlan(FakeWriter(close_error=SinkError(ErrorType.SINK_5XX_ERROR, "staging rows failed: 503")))
    result = process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan, handling())
    assert result.fatal == "SINK_5XX_ERROR: staging rows failed: 503" and result.reports == ["1 rows"]


def test_decode_only_opens_no_writer(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    plan = FakePlan()
    result = process_batch([source_batch(values(test_descriptors, "a", "b"))], spec(test_descriptors, write=False),
                           plan, handling())
    assert plan.opened == 0 and result.stats.messages == 2 and result.stats.rows_written == 0


def test_task_results_travel_as_json() -> None:
    result = TaskResult(fatal="x", held="t/0@1", reports=['{"path": "p"}'], resume=[("t", 0, 1)])
    result.stats.messages = 3
    result.stats.add_table("d.t", written=2)
    again = TaskResult.from_json(result.to_json())
    assert (again.fatal, again.held, again.reports, again.resume, again.stats.messages) == (
        "x", "t/0@1", ['{"path": "p"}'], [("t", 0, 1)], 3)
    assert again.stats.tables == {"d.t": {"written": 2}}


@dataclass
class FakeTables:
    ensured: list[Destination] = field(default_factory=list)
    conflicting: set[str] = field(default_factory=set)  # table names whose ensure fails
    asked: list[str] = field(default_factory=list)  # every ensure call, failed or not
    lent: list[Clients] = field(default_factory=list)  # the clients each ensure call was given
    dataset_ready: list[bool] = field(default_factory=list)  # whether each call was told its dataset is ensured
    kept: list[CheckedTables | None] = field(default_factory=list)  # the worker's checks each call was given
    outage: SinkError | None = None  # what every ensure call raises, if set
    trusting: set[str] = field(default_factory=set)  # tables whose check comes from the worker's kept ones
    forgotten: list[str] = field(default_factory=list)

    def ensure(self, loaded: Descriptors, destination: Destination, clients: Clients,
               dataset_ready: bool = False, kept: CheckedTables | None = None) -> Ensured:
        self.asked.append(destination.name)
        self.lent.append(clients)
        self.kept.append(kept)
        if destination.name in self.trusting:
            return Ensured([SchemaField("label", "STRING")], kept=True)
        self.dataset_ready.append(dataset_ready)
        if self.outage is not None:
            raise self.outage
        if destination.name in self.conflicting:
            raise SchemaEvolutionError(f"column label of {destination.name} is INTEGER, the proto says STRING")
        self.ensured.append(destination)
        return Ensured([SchemaField("label", "STRING"), SchemaField("checked_as", "STRING",
                                                                    description=destination.name)])

    def forget(self, loaded: Descriptors, destination: Destination, kept: CheckedTables) -> None:
        self.forgotten.append(destination.name)
        self.trusting.discard(destination.name)


@dataclass
class RoutingPlan(FakePlan):
    """A writer per destination, recording what each was given."""

    by_table: dict[str, FakeWriter] = field(default_factory=dict)
    schemas: list[list[Any] | None] = field(default_factory=list)  # what each open_writer was given

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[Any] | None = None) -> FakeWriter:
        assert destination is not None
        self.destinations.append(destination)
        self.schemas.append(schema)
        return self.by_table.setdefault(destination.name, FakeWriter())


def routed(descriptors: Descriptors, tables: FakeTables, **changes: Any) -> SinkSpec:
    router = router_of("ds", "${header.type}_v1", None, "type", "inner=testdata.Inner,legacy=testdata.Legacy")
    return spec(descriptors, router=replace(router, **changes), tables=tables, proto_class="")


def test_records_are_decoded_with_their_class_and_written_per_table(test_descriptors: Descriptors,
                                                                    letters: list[DeadLetter]) -> None:
    legacy = test_descriptors.message_class("testdata.Legacy")
    batch = source_batch([*values(test_descriptors, "a"), legacy(id="L").SerializeToString(),
                          *values(test_descriptors, "b"), b"x"],
                         headers=[[("type", b"inner")], [("type", b"legacy")], [("type", b"inner")], []],
                         offsets=[1, 2, 3, 4])
    tables, plan = FakeTables(), RoutingPlan()
    result = process_batch([batch], routed(test_descriptors, tables), plan, handling())
    assert [d.name for d in tables.ensured] == ["ds.inner_v1", "ds.legacy_v1"]  # once each, before writing
    assert [r["label"] for r in plan.by_table["ds.inner_v1"].written] == ["a", "b"]
    assert plan.by_table["ds.inner_v1"].ids == ["t_0_1", "t_0_3"]
    assert [r["id"] for r in plan.by_table["ds.legacy_v1"].written] == ["L"]
    s = result.stats
    assert (s.messages, s.rows_written, s.dead_lettered) == (4, 3, 1)
    assert s.tables == {"ds.inner_v1": {"messages": 2, "written": 2, "retried": 0, "dlq": 0, "failed": 0},
                        "ds.legacy_v1": {"messages": 1, "written": 1, "retried": 0, "dlq": 0, "failed": 0}}
    [letter] = letters
    assert (letter.error.error_type, letter.error.offset, letter.route) == (ErrorType.ROUTING_ERROR, 4, "")
    assert letter.exception_class == "firehose_bq.routing.NoRouteError"


def test_a_tables_rows_from_many_source_batches_go_in_one_request(test_descriptors: Descriptors,
                                                                   letters: list[DeadLetter]) -> None:
    """Routed over many tables, a read batch brings each a few rows: they wait, and each table gets one
    request for the task's source batches (partitions too), every record still settled where it belongs."""
    legacy = test_descriptors.message_class("testdata.Legacy")
    inner, old = [("type", b"inner")], [("type", b"legacy")]
    batches = [source_batch([*values(test_descriptors, "a"), legacy(id="L1").SerializeToString()],
                            headers=[inner, old], offsets=[1, 2]),
               source_batch([*values(test_descriptors, "bad"), b"\xff"], headers=[inner, inner], offsets=[3, 4]),
               source_batch([legacy(id="L2").SerializeToString(), *values(test_descriptors, "c")],
                            headers=[old, inner], offsets=[7, 8], partition=1)]
    plan = RoutingPlan(by_table={"ds.inner_v1": FakeWriter(bad={"bad"})})
    result = process_batch(batches, routed(test_descriptors, FakeTables()), plan, handling())
    writers = plan.by_table
    assert writers["ds.inner_v1"].requests == [3] and writers["ds.legacy_v1"].requests == [2]
    assert [r["label"] for r in writers["ds.inner_v1"].written] == ["a", "c"]
    assert writers["ds.inner_v1"].ids == ["t_0_1", "t_1_8"] and writers["ds.legacy_v1"].ids == ["t_0_2", "t_1_7"]
    assert sorted((x.error.error_type.name, x.error.partition, x.error.offset, x.route) for x in letters) == [
        ("DESERIALIZATION_ERROR", 0, 4, "ds.inner_v1"), ("SINK_4XX_ERROR", 0, 3, "ds.inner_v1")]
    s = result.stats
    assert (s.messages, s.rows_written, s.dead_lettered, s.failed) == (6, 4, 2, 0)
    assert s.tables["ds.inner_v1"] == {"messages": 4, "written": 2, "retried": 0, "dlq": 2, "failed": 0}


def test_rows_wait_only_up_to_a_request_per_table_and_a_bound_per_task(test_descriptors: Descriptors,
                                                                        letters: list[DeadLetter],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = test_descriptors.message_class("testdata.Legacy")
    inner, old = [("type", b"inner")], [("type", b"legacy")]

    def both(offset: int) -> pa.RecordBatch:
        return source_batch([*values(test_descriptors, f"i{offset}"), legacy(id=f"L{offset}").SerializeToString()],
                            headers=[inner, old], offsets=[offset, offset + 1])

    def inner_only(offset: int) -> pa.RecordBatch:
        return source_batch(values(test_descriptors, f"i{offset}"), headers=[inner], offsets=[offset])

    monkeypatch.setattr(core, "WRITE_ROWS", 3)  # a table's rows go once it has 3
    plan = RoutingPlan()
    process_batch([inner_only(0), inner_only(1), inner_only(2), inner_only(3)], routed(test_descriptors, FakeTables()),
                  plan, handling())
    assert plan.by_table["ds.inner_v1"].requests == [3, 1]  # the last one at the end of the task

    monkeypatch.setattr(core, "WAITING_ROWS", 4)  # every table's rows go once the task holds 4 records
    plan = RoutingPlan()
    process_batch([both(0), both(2), inner_only(4)], routed(test_descriptors, FakeTables()), plan, handling())
    assert plan.by_table["ds.inner_v1"].requests == [2, 1] and plan.by_table["ds.legacy_v1"].requests == [2]
    assert not letters


def test_rows_whose_columns_differ_are_written_apart(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    """A mode may shape a later source batch's rows with more columns (the table grew during the task): those
    go in a request of their own, each with its own records."""

    class Growing(FakePlan):
        def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
            shaped = table_rows(rows, ids)
            if source["offset"][0].as_py() < 2:
                return shaped, []
            grown = shaped.rows.append_column("extra", pa.array([1] * shaped.rows.num_rows, pa.int64()))
            return Writable(grown, shaped.insert_ids, shaped.sources), []

    plan = Growing(FakeWriter(bad={"bad"}))
    result = process_batch([source_batch(values(test_descriptors, "a"), offsets=[0]),
                            source_batch(values(test_descriptors, "b"), offsets=[1]),
                            source_batch(values(test_descriptors, "bad", "c"), offsets=[2, 3])],
                           spec(test_descriptors), plan, handling())
    assert plan.writer.requests == [2, 2] and [r["label"] for r in plan.writer.written] == ["a", "b", "c"]
    assert [x.error.offset for x in letters] == [2] and result.stats.rows_written == 3


def test_a_routed_tables_writer_starts_from_the_columns_its_check_read(test_descriptors: Descriptors,
                                                                        letters: list[DeadLetter]) -> None:
    """The task's check of a routed table reads its live columns; the writer is handed them (conform.LiveTable
    then reads them again only for rows holding a column they lack), not a second `tables.get`."""
    legacy = test_descriptors.message_class("testdata.Legacy")
    batch = source_batch([*values(test_descriptors, "a"), legacy(id="L").SerializeToString()],
                         headers=[[("type", b"inner")], [("type", b"legacy")]], offsets=[1, 2])
    plan = RoutingPlan()
    process_batch([batch], routed(test_descriptors, FakeTables()), plan, handling())
    assert [d.name for d in plan.destinations] == ["ds.inner_v1", "ds.legacy_v1"]
    assert [[f.description for f in schema or []][-1:] for schema in plan.schemas] == [["ds.inner_v1"], ["ds.legacy_v1"]]


def test_tables_are_ensured_with_the_clients_the_writers_borrow(test_descriptors: Descriptors,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Per task, micro-batch and table: a client of its own there cost new credentials, a token and a connection.
    batch = source_batch(values(test_descriptors, "a", "b"), headers=[[("type", b"inner")], [("type", b"legacy")]])
    tables, clients, kept = FakeTables(), Clients(), CheckedTables()
    process_batch([batch], routed(test_descriptors, tables), RoutingPlan(), handling(), clients, kept)
    assert tables.asked == ["ds.inner_v1", "ds.legacy_v1"] and all(c is clients for c in tables.lent)
    assert all(k is kept for k in tables.kept)  # the worker's checks, kept between its tasks
    # One dataset check per task and dataset, not one per table (200 tables: 199 datasets.get calls fewer).
    assert tables.dataset_ready == [False, True]
    # A request that failed as a whole (an outage, after the client's retries): as after a write's, the
    # clients are dropped, so that the next task does not wait out a broken channel's backoff, and so are
    # the worker's checks (the table, or its dataset, may be gone: the next task creates it again).
    resets: list[bool] = []
    monkeypatch.setattr(clients, "reset", lambda: resets.append(True))
    kept.put("a check", Ensured([]), 60)
    outage = FakeTables(outage=SinkError(ErrorType.SINK_5XX_ERROR, "creating or evolving table ds.inner_v1 failed"))
    result = process_batch([batch], routed(test_descriptors, outage), RoutingPlan(), handling(), clients, kept)
    assert result.fatal is not None and "ds.inner_v1 failed" in result.fatal and resets == [True]
    assert len(kept) == 0


def test_a_write_that_fails_as_a_whole_drops_the_workers_table_checks(test_descriptors: Descriptors) -> None:
    """A routed table deleted under a running job: its writes fail (NOT_FOUND) until a check creates it again."""
    batch = source_batch(values(test_descriptors, "a"), headers=[[("type", b"inner")]])
    kept = CheckedTables()
    kept.put("a check", Ensured([]), 60)
    gone = SinkError(ErrorType.SINK_4XX_ERROR, "AppendRows into p.ds.inner_v1 failed: 404 Not found: Table")
    plan = RoutingPlan(by_table={"ds.inner_v1": FakeWriter(error=gone)})
    result = process_batch([batch], routed(test_descriptors, FakeTables()), plan, handling(), Clients(), kept)
    assert result.fatal is not None and "404" in result.fatal
    assert len(kept) == 0
    # A task whose requests all went through keeps them.
    kept.put("a check", Ensured([]), 60)
    process_batch([batch], routed(test_descriptors, FakeTables()), RoutingPlan(), handling(), Clients(), kept)
    assert len(kept) == 1


def _one_written_one_dead_one_unrouted(descriptors: Descriptors) -> TaskResult:
    """A routed batch: one record written, one refused by its table (for the DLQ topic `dlq`), one without
    a route (for the fallback topic `unrouted`)."""
    fallback = replace(handling().dlq, writer_type="KAFKA", kafka_topic="unrouted")
    with_fallback = replace(handling(DLQ_KAFKA_TOPIC="dlq"), fallback=fallback)
    batch = source_batch([*values(descriptors, "a", "bad"), b"x"],
                         headers=[[("type", b"inner")], [("type", b"inner")], [("type", b"nope")]])
    plan = RoutingPlan(by_table={"ds.inner_v1": FakeWriter(bad={"bad"})})
    return process_batch([batch], routed(descriptors, FakeTables()), plan, with_fallback)


def test_unrouted_records_go_to_the_fallback_not_the_dlq(test_descriptors: Descriptors,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    stored: dict[str, list[DeadLetter]] = {}
    monkeypatch.setattr(core, "dead_letter", lambda cfg, batch: stored.setdefault(cfg.kafka_topic, []).extend(batch))
    result = _one_written_one_dead_one_unrouted(test_descriptors)
    assert (result.stats.rows_written, result.stats.dead_lettered, result.stats.fallback) == (1, 1, 1)
    assert [(x.error.offset, x.route) for x in stored["dlq"]] == [(1, "ds.inner_v1")]
    assert [(x.error.offset, x.error.error_type) for x in stored["unrouted"]] == [(2, ErrorType.ROUTING_ERROR)]


@pytest.mark.parametrize("refused", ["dlq", "unrouted"])
def test_letters_a_failed_dlq_write_did_not_store_count_as_failed(test_descriptors: Descriptors,
                                                                  monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    # The DLQ (or the fallback topic) refused the task's letters: the batch stops uncommitted, and its counts
    # (the batch's log line, the run summary, the DLQ metrics) must not claim them stored there.
    def store(cfg: object, batch: list[DeadLetter]) -> None:
        if batch and cfg.kafka_topic == refused:
            raise DeadLetterError(f"{len(batch)} letter(s) to {refused} failed: MessageSizeTooLarge")

    monkeypatch.setattr(core, "dead_letter", store)
    result = _one_written_one_dead_one_unrouted(test_descriptors)
    s = result.stats
    assert "MessageSizeTooLarge" in result.fatal
    if refused == "dlq":
        assert (s.rows_written, s.dead_lettered, s.fallback, s.failed) == (1, 0, 1, 1)
        assert s.tables["ds.inner_v1"]["dlq"] == 0 and s.tables["ds.inner_v1"]["failed"] == 1
        assert s.errors_by_outcome.get(("SINK_4XX_ERROR", "dlq"), 0) == 0
    else:  # the fallback is stored first: the DLQ is never reached, so its letter is not stored either
        assert (s.rows_written, s.fallback, s.dead_lettered, s.failed) == (1, 0, 0, 2)
        assert s.errors_by_outcome[("ROUTING_ERROR", "failed")] == 1
        assert s.errors_by_outcome.get(("SINK_4XX_ERROR", "dlq"), 0) == 0
        assert s.tables["ds.inner_v1"]["dlq"] == 0 and s.tables["ds.inner_v1"]["failed"] == 1
    assert sorted(e.offset for e in s.sample_errors) == ([1] if refused == "dlq" else [1, 2])


def test_letters_of_a_task_a_sink_failure_stops_count_as_failed(test_descriptors: Descriptors,
                                                                 letters: list[DeadLetter]) -> None:
    # The task stops before it stores its letters (BigQuery down after retries): none is in the DLQ, so the
    # batch's line, the run summary and the DLQ counter must not say they are; a restart dead-letters them.
    plan = FakePlan(FakeWriter(error=SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")))
    bad, good = source_batch([b"\xff not a message"], offsets=[1]), source_batch(values(test_descriptors, "a"), offsets=[2])
    result = process_batch([bad, good], spec(test_descriptors), plan, handling())
    assert result.fatal is not None and "Not found" in result.fatal and not letters
    s = result.stats
    assert (s.dead_lettered, s.failed) == (0, 1)
    assert s.errors_by_outcome.get(("DESERIALIZATION_ERROR", "dlq"), 0) == 0
    assert s.errors_by_outcome[("DESERIALIZATION_ERROR", "failed")] == 1


def test_records_past_the_destination_cap_fail_as_routing_errors(test_descriptors: Descriptors,
                                                                letters: list[DeadLetter]) -> None:
    # A producer's headers can spread a template over any number of tables: past the cap, those records go
    # to the error policy (here the DLQ), and the batch goes on. A stop would meet them again on every restart.
    batch = source_batch(values(test_descriptors, "a", "b", "c", "d"),
                         headers=[[("type", b"inner"), ("n", bytes([48 + i % 3]))] for i in range(4)], offsets=[1, 2, 3, 4])
    router = router_of("ds", "t_${header.n}", "testdata.Inner", None, "")
    plan = RoutingPlan()
    tables = FakeTables()
    result = process_batch([batch], spec(test_descriptors, router=replace(router, max_destinations=2),
                                         tables=tables), plan, handling())
    assert result.fatal is None
    assert len(tables.ensured) == 2  # the third table is never created: the cap comes first
    assert sorted(plan.by_table) == ["ds.t_0", "ds.t_1"]
    assert [(x.error.error_type, x.error.offset, x.route) for x in letters] == [(ErrorType.ROUTING_ERROR, 3, "ds.t_2")]
    message = letters[0].error.message
    assert "already met 2 destination tables" in message and "SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK" in message
    assert (result.stats.messages, result.stats.rows_written, result.stats.dead_lettered) == (4, 3, 1)


def test_the_destination_cap_counts_per_kafka_partition_when_a_task_reads_several(
        test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    # SPARK_MAX_TASKS_PER_BATCH makes one task read several partitions in turn. Each partition here names two
    # tables of its own, under a cap of 2: read one task per partition they all landed, so grouping the
    # partitions into one task must not send half of them to the error policy (or stop the job, DLQ off).
    batches = [source_batch(values(test_descriptors, f"a{p}", f"b{p}"), partition=p, offsets=[1, 2],
                            headers=[[("type", b"inner"), ("n", f"{p}{i}".encode())] for i in range(2)])
               for p in range(3)]
    router = router_of("ds", "t_${header.n}", "testdata.Inner", None, "")
    plan, tables = RoutingPlan(), FakeTables()
    result = process_batch(batches, spec(test_descriptors, router=replace(router, max_destinations=2), tables=tables),
                           plan, handling())
    assert result.fatal is None and letters == []
    assert sorted(plan.by_table) == [f"ds.t_{p}{i}" for p in range(3) for i in range(2)]
    assert (result.stats.messages, result.stats.rows_written, result.stats.dead_lettered) == (6, 6, 0)
    # Past the cap within one partition still fails, naming the partition; a table an earlier partition
    # brought costs nothing more (no new table, no new writer) and is not counted again.
    over = source_batch(values(test_descriptors, "w", "x", "y", "z"), partition=7, offsets=[5, 6, 7, 8],
                        headers=[[("type", b"inner"), ("n", n)] for n in (b"00", b"97", b"98", b"99")])
    result = process_batch([*batches, over], spec(test_descriptors, router=replace(router, max_destinations=2),
                                                   tables=FakeTables()), RoutingPlan(), handling())
    assert [(x.error.error_type, x.error.partition, x.error.offset, x.route) for x in letters] == [
        (ErrorType.ROUTING_ERROR, 7, 8, "ds.t_99")]
    assert "t/7" in letters[0].error.message and "already met 2 destination tables" in letters[0].error.message
    # A replay's batches of dead letters are no partition's (one may hold a single partition's by chance):
    # the cap counts over the whole replay, as before.
    letters.clear()
    replayed = [b.append_column(ATTEMPT_COLUMN, pa.array([1] * b.num_rows, pa.int32())) for b in batches]
    process_batch(replayed, spec(test_descriptors, router=replace(router, max_destinations=2), tables=FakeTables()),
                  RoutingPlan(), handling())
    assert [x.route for x in letters] == [f"ds.t_{p}{i}" for p in (1, 2) for i in range(2)]


def test_unusable_destinations_count_towards_the_cap_and_not_as_metric_tables(test_descriptors: Descriptors,
                                                                              letters: list[DeadLetter]) -> None:
    # A producer spreading names BigQuery refuses: one create call per name would stall the task, and one
    # per-table count (a metric label) per name would grow without bound.
    batch = source_batch(values(test_descriptors, *"abcde"),
                         headers=[[("type", b"inner"), ("n", bytes([48 + i]))] for i in range(5)], offsets=[1, 2, 3, 4, 5])
    router = router_of("ds", "t_${header.n}", "testdata.Inner", None, "")
    tables = FakeTables(conflicting={f"ds.t_{i}" for i in range(5)})
    result = process_batch([batch], spec(test_descriptors, router=replace(router, max_destinations=2),
                                         tables=tables), RoutingPlan(), handling())
    assert result.fatal is None and tables.asked == ["ds.t_0", "ds.t_1"]
    assert [(x.error.offset, x.route) for x in letters] == [(i + 1, f"ds.t_{i}") for i in range(5)]
    assert "INTEGER" in letters[0].error.message and "already met 2 destination tables" in letters[4].error.message
    assert result.stats.dead_lettered == 5 and result.stats.tables == {}


def test_a_table_that_cannot_be_used_fails_its_records_alone(test_descriptors: Descriptors,
                                                             letters: list[DeadLetter]) -> None:
    legacy = test_descriptors.message_class("testdata.Legacy")
    batch = source_batch([*values(test_descriptors, "a"), legacy(id="L").SerializeToString(),
                          legacy(id="M").SerializeToString()],
                         headers=[[("type", b"inner")], [("type", b"legacy")], [("type", b"legacy")]],
                         offsets=[1, 2, 3])
    tables, plan = FakeTables(conflicting={"ds.legacy_v1"}), RoutingPlan()
    result = process_batch([batch, batch], routed(test_descriptors, tables), plan, handling())
    assert result.fatal is None
    assert [r["label"] for r in plan.by_table["ds.inner_v1"].written] == ["a", "a"]
    assert "ds.legacy_v1" not in plan.by_table  # no writer for it
    assert [(x.error.error_type, x.error.offset, x.route) for x in letters] == [
        (ErrorType.ROUTING_ERROR, 2, "ds.legacy_v1"), (ErrorType.ROUTING_ERROR, 3, "ds.legacy_v1")] * 2
    assert "column label of ds.legacy_v1 is INTEGER" in letters[0].error.message
    assert (result.stats.messages, result.stats.rows_written, result.stats.dead_lettered) == (6, 2, 4)


def framed(descriptors: Descriptors, schema_id: int, label: str) -> bytes:
    cls = descriptors.message_class("testdata.Inner")
    return encode_frame(schema_id, message_indexes(cls.DESCRIPTOR), cls(label=label).SerializeToString())


def confluent_spec(descriptors: Descriptors, ids: set[int], **changes: Any) -> SinkSpec:
    return spec(replace(descriptors, schema_ids=frozenset(ids)), confluent_framed=True, schema_subject="orders-value",
                **changes)


def test_an_unknown_schema_id_holds_the_task_like_unknown_fields(test_descriptors: Descriptors,
                                                                 letters: list[DeadLetter]) -> None:
    first = source_batch([framed(test_descriptors, 1, "a")], offsets=[1])
    held = source_batch([framed(test_descriptors, 2, "b"), framed(test_descriptors, 9, "c")], offsets=[2, 3])
    plan = FakePlan()
    result = process_batch([first, held], confluent_spec(test_descriptors, {1, 2}, hold_on_unknown_fields=True),
                           plan, handling())
    assert result.held == "unknown schema id 9 at t/0@3" and result.resume == [("t", 0, 2)]
    assert [r["label"] for r in plan.writer.written] == ["a"] and not letters


def test_a_schema_id_still_unknown_is_dead_lettered_and_lands_once_the_version_is_known(
        test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    batch = source_batch([framed(test_descriptors, 1, "a"), framed(test_descriptors, 9, "c")], offsets=[1, 2])
    plan = FakePlan()
    result = process_batch([batch], confluent_spec(test_descriptors, {5, 1, 2}), plan, handling())
    assert result.held is None and [r["label"] for r in plan.writer.written] == ["a"]
    assert [(x.error.offset, x.error.error_type, x.error.message) for x in letters] == [
        (2, ErrorType.DESERIALIZATION_ERROR, "schema id 9 is not a version of subject orders-value (known: 1, 2, 5)")]
    # replay-dlq's spec: fresh descriptors, whose subject has version 9 by now
    again = FakePlan()
    process_batch([source_batch([letters[0].value], offsets=[2])], confluent_spec(test_descriptors, {1, 2, 5, 9}),
                  again, handling())
    assert [r["label"] for r in again.writer.written] == ["c"]


def test_a_write_of_several_partitions_records_logs_where_its_first_failure_is(
        test_descriptors: Descriptors, letters: list[DeadLetter], caplog: pytest.LogCaptureFixture) -> None:
    """Rows wait across source batches, so one write may hold several partitions' records: the policy's line
    names its first failing record by its Kafka coordinates, and has their topic and partition as context."""
    import logging

    plan = FakePlan(FakeWriter(bad={"bad"}))
    with caplog.at_level(logging.WARNING, logger="firehose_bq.policy"):
        process_batch([source_batch(values(test_descriptors, "a"), offsets=[5]),
                       source_batch(values(test_descriptors, "b", "bad"), offsets=[7, 8], partition=1)],
                      spec(test_descriptors), plan, handling())
    assert plan.writer.requests == [3]
    [line] = [r for r in caplog.records if "go to the DLQ" in r.getMessage()]
    assert "first t/1@8" in line.getMessage() and (line.topic, line.partition) == ("t", 1)  # type: ignore[attr-defined]


@dataclass
class MeetingWriter(FakeWriter):
    """A writer whose write waits at `barrier` until as many writes are in flight as it has parties (a task
    writing one table after another never gets there: BrokenBarrierError), counting how many were at once."""

    barrier: threading.Barrier | None = None
    flight: list[int] = field(default_factory=lambda: [0, 0])  # in flight now, most at once (shared)
    lock: threading.Lock = field(default_factory=threading.Lock)
    contexts: list[dict[str, Any]] = field(default_factory=list)

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        with self.lock:
            self.flight[0] += 1
            self.flight[1] = max(self.flight)
        self.contexts.append(dict(logs._context.get()))
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=30)
            return super().write(rows, insert_ids)
        finally:
            with self.lock:
                self.flight[0] -= 1


def many_tables(descriptors: Descriptors, tables: int) -> pa.RecordBatch:
    """A record (label `aN`) for each of `tables` tables ds.t_N, by header `n`."""
    return source_batch(values(descriptors, *(f"a{i}" for i in range(tables))),
                        headers=[[("n", str(i).encode())] for i in range(tables)], offsets=list(range(tables)))


def test_a_routed_task_writes_its_tables_at_once_up_to_the_limit(test_descriptors: Descriptors) -> None:
    """A task routed to many tables wrote them one after another at its end: tens of ms a request on BigQuery,
    seconds for 200 tables. Now SINK_BIGQUERY_CONCURRENT_TABLE_WRITES (here 3) of them go at once, never more,
    each table's log lines still naming it and the task's batch."""
    barrier, flight, lock = threading.Barrier(3), [0, 0], threading.Lock()
    plan = RoutingPlan(by_table={f"ds.t_{i}": MeetingWriter(barrier=barrier, flight=flight, lock=lock)
                                 for i in range(9)})
    router = replace(router_of("ds", "t_${header.n}", "testdata.Inner", None, ""), concurrent_writes=3)
    with logs.log_context(batch_id=7):
        result = process_batch([many_tables(test_descriptors, 9)], spec(test_descriptors, router=router,
                                                                          tables=FakeTables()), plan, handling())
    assert result.fatal is None and result.stats.rows_written == 9 and not barrier.broken
    assert flight[1] == 3  # the limit, reached and kept
    assert {name: [r["label"] for r in w.written] for name, w in plan.by_table.items()} == {
        f"ds.t_{i}": [f"a{i}"] for i in range(9)}
    for name, writer in plan.by_table.items():
        assert [(c["batch_id"], c["table"]) for c in writer.contexts] == [(7, name)]  # type: ignore[attr-defined]
    # One at a time when so configured (a barrier of two would never be met).
    one = replace(router, concurrent_writes=1)
    plan = RoutingPlan(by_table={f"ds.t_{i}": MeetingWriter(flight=[0, 0]) for i in range(3)})
    process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=one, tables=FakeTables()), plan,
                  handling())
    assert all(w.flight[1] == 1 for w in plan.by_table.values())  # type: ignore[attr-defined]


def not_found(table: str) -> SinkError:
    """A write's failure as the writers raise it for a table that is gone (from BigQuery's NOT_FOUND)."""
    try:
        raise api_exceptions.NotFound(f"Table {table} not found")
    except api_exceptions.NotFound as cause:
        try:
            raise SinkError(ErrorType.SINK_4XX_ERROR, f"AppendRows into {table} failed: 404") from cause
        except SinkError as error:
            return error


@dataclass
class GoneOnceWriter(FakeWriter):
    """Its table is gone at the first write (NOT_FOUND), there again after."""

    gone: int = 1

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        if self.gone:
            self.gone -= 1
            self.requests.append(rows.num_rows)
            raise not_found("p.ds.t_1")
        return super().write(rows, insert_ids)


@pytest.mark.parametrize("at_once", [1, 4])
def test_a_table_gone_since_the_workers_kept_check_is_created_again_and_written(
        test_descriptors: Descriptors, at_once: int, caplog: pytest.LogCaptureFixture) -> None:
    """A kept check (CheckedTables) saves the task its tables.get, but the table may have been deleted since:
    the write's NOT_FOUND then makes the task check it again (which creates it) and write its rows again,
    as a check of its own would have. Without a kept check, NOT_FOUND is the task's failure, as before."""
    router = replace(router_of("ds", "t_${header.n}", "testdata.Inner", None, ""), concurrent_writes=at_once)
    tables = FakeTables(trusting={"ds.t_1"})
    plan = RoutingPlan(by_table={"ds.t_1": GoneOnceWriter()})
    result = process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=router, tables=tables),
                           plan, handling())
    assert result.fatal is None and result.stats.rows_written == 3
    assert tables.forgotten == ["ds.t_1"] and tables.asked.count("ds.t_1") == 2
    assert plan.by_table["ds.t_1"].requests == [1, 1] and [r["label"] for r in plan.by_table["ds.t_1"].written] == ["a1"]
    assert "table ds.t_1 was not found although this worker checked it" in caplog.text
    # The task's own check was the one it wrote after: the table is gone again, or never was, for a reason.
    plan = RoutingPlan(by_table={"ds.t_1": GoneOnceWriter()})
    result = process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=router,
                                                                      tables=FakeTables()), plan, handling())
    assert result.fatal is not None and "p.ds.t_1 failed: 404" in result.fatal


@dataclass
class ShrunkOnceWriter(FakeWriter):
    """Its table lost columns since the kept check its writer started from, at the first write."""

    shrunk: int = 1
    closes: int = 0

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        if self.shrunk:
            self.shrunk -= 1
            self.requests.append(rows.num_rows)
            raise TableChangedError(ErrorType.SINK_4XX_ERROR, "table p.ds.t_1 has no column(s) label any more",
                                    tuple(range(rows.num_rows)))
        return super().write(rows, insert_ids)

    def close(self) -> None:
        self.closes += 1


@pytest.mark.parametrize("at_once", [1, 4])
def test_a_table_that_lost_columns_since_the_workers_kept_check_is_evolved_and_written(
        test_descriptors: Descriptors, at_once: int, caplog: pytest.LogCaptureFixture) -> None:
    """A table dropped and created again by hand with fewer columns while a worker's kept check of it stands:
    the write finds columns missing (TableChangedError); the task checks the table again (which adds them back)
    and writes by a new writer, from the columns of that check, instead of stopping the job or dropping values."""
    router = replace(router_of("ds", "t_${header.n}", "testdata.Inner", None, ""), concurrent_writes=at_once)
    tables = FakeTables(trusting={"ds.t_1"})
    writer = ShrunkOnceWriter()
    plan = RoutingPlan(by_table={"ds.t_1": writer})
    result = process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=router, tables=tables),
                           plan, handling())
    assert result.fatal is None and result.stats.rows_written == 3
    assert tables.forgotten == ["ds.t_1"] and tables.asked.count("ds.t_1") == 2
    assert writer.requests == [1, 1] and [r["label"] for r in writer.written] == ["a1"]
    opened = [schema for d, schema in zip(plan.destinations, plan.schemas, strict=True) if d.name == "ds.t_1"]
    assert [[f.name for f in s or []] for s in opened] == [["label"], ["label", "checked_as"]]  # the new check's
    assert writer.closes == 2  # the stale one closed when replaced, the new one at the task's end
    assert "table ds.t_1 was refusing its rows although this worker checked it" in caplog.text
    # Without a kept check the writer's columns were the task's own check's: a change under it stops the task.
    plan = RoutingPlan(by_table={"ds.t_1": ShrunkOnceWriter()})
    result = process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=router,
                                                                      tables=FakeTables()), plan, handling())
    assert result.fatal is not None and "has no column(s) label any more" in result.fatal


@pytest.mark.parametrize("at_once", [1, 4])
def test_a_table_that_cannot_be_evolved_when_checked_again_fails_its_records_not_the_task(
        test_descriptors: Descriptors, letters: list[DeadLetter], at_once: int) -> None:
    """The check made again after a kept one went stale finds the table unusable (created again by hand with
    another type for a column): its records fail as ROUTING_ERRORs for the policy (the DLQ here), as a check of
    the task's own would have had them, and the other tables' rows are written; stopping the job would only meet
    the same table on the restart."""
    router = replace(router_of("ds", "t_${header.n}", "testdata.Inner", None, ""), concurrent_writes=at_once)
    tables = FakeTables(trusting={"ds.t_1"}, conflicting={"ds.t_1"})
    plan = RoutingPlan(by_table={"ds.t_1": ShrunkOnceWriter()})
    result = process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, router=router, tables=tables),
                           plan, handling())
    assert result.fatal is None
    assert (result.stats.rows_written, result.stats.dead_lettered) == (2, 1)
    [letter] = letters
    assert (letter.error.error_type, letter.route) == (ErrorType.ROUTING_ERROR, "ds.t_1")
    assert "destination table ds.t_1 cannot be used: column label of ds.t_1 is INTEGER" in letter.error.message


@dataclass
class RefusingWriter(FakeWriter):
    """Its table refuses every request as invalid, no row alone (the policy's stop when the table is at fault)."""

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        self.requests.append(rows.num_rows)
        raise SinkError(ErrorType.SINK_4XX_ERROR, "AppendRows into p.ds.t_1 failed: 400 invalid (the table, not a row, "
                        "refuses it)", invalid_request=True)


def test_a_table_refusing_every_row_since_the_workers_kept_check_is_checked_before_the_job_stops(
        test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    """Created again by hand with another type for a column while a worker's kept check stood: BigQuery refuses
    the requests as invalid, no row alone, and the policy would stop the job (the table is at fault), whose restart
    would find the table unusable. The task checks it first: unusable, its records are ROUTING_ERRORs (the DLQ);
    a table that checks fine and still refuses stops the task, as before."""
    router = router_of("ds", "t_${header.n}", "testdata.Inner", None, "")
    # Two rows for t_1: one row alone refused is that row's failure (policy.py), two are the table's.
    batch = source_batch(values(test_descriptors, "a0", "a1", "b1"), headers=[[("n", b"0")], [("n", b"1")],
                                                                            [("n", b"1")]], offsets=[0, 1, 2])
    tables = FakeTables(trusting={"ds.t_1"}, conflicting={"ds.t_1"})
    result = process_batch([batch], spec(test_descriptors, router=router, tables=tables),
                           RoutingPlan(by_table={"ds.t_1": RefusingWriter()}), handling())
    assert result.fatal is None and (result.stats.rows_written, result.stats.dead_lettered) == (1, 2)
    assert [x.error.error_type for x in letters] == [ErrorType.ROUTING_ERROR] * 2
    tables = FakeTables(trusting={"ds.t_1"})
    writer = RefusingWriter()
    result = process_batch([batch], spec(test_descriptors, router=router, tables=tables),
                           RoutingPlan(by_table={"ds.t_1": writer}), handling())
    assert result.fatal is not None and "the table, not a row, refuses it" in result.fatal
    assert tables.asked.count("ds.t_1") == 2 and len(writer.requests) >= 2  # checked again, written again: refused


def test_a_dataset_is_checked_again_when_only_a_kept_check_of_another_table_vouches_for_it(
        test_descriptors: Descriptors) -> None:
    tables = FakeTables(trusting={"ds.t_0"})
    process_batch([many_tables(test_descriptors, 3)], spec(test_descriptors, tables=tables,
                                                            router=router_of("ds", "t_${header.n}", "testdata.Inner",
                                                                             None, "")), RoutingPlan(), handling())
    assert tables.asked == ["ds.t_0", "ds.t_1", "ds.t_2"]
    assert tables.dataset_ready == [False, True]  # t_1 checks the dataset (t_0's check was kept), t_2 need not


@dataclass
class SlowWriter(FakeWriter):
    """A write that meets the others at `barrier`, then takes `pause` s (so that a failure elsewhere is seen first)."""

    barrier: threading.Barrier | None = None
    pause: float = 0.0

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        time.sleep(self.pause)
        return super().write(rows, insert_ids)


def test_a_write_that_fails_for_good_stops_the_tasks_other_writes(test_descriptors: Descriptors) -> None:
    """BigQuery down: each table's write would retry for its whole budget (2 minutes), 8 at a time, so a task
    routed to 200 tables would take most of an hour to stop. The first write that fails for good stops the
    others: those not started never start, those waiting to retry stop waiting. What went in is counted."""
    barrier = threading.Barrier(3)
    down = SinkError(ErrorType.SINK_4XX_ERROR, "AppendRows into p.ds.t_0 failed: 403 denied")
    flaky = SinkError(ErrorType.SINK_5XX_ERROR, "AppendRows into p.ds.t_2 failed: 503")
    plan = RoutingPlan(by_table={"ds.t_0": SlowWriter(barrier=barrier, error=down),
                                 "ds.t_1": SlowWriter(barrier=barrier, pause=1.0),
                                 "ds.t_2": SlowWriter(barrier=barrier, error=flaky),
                                 **{f"ds.t_{i}": SlowWriter() for i in range(3, 8)}})
    router = replace(router_of("ds", "t_${header.n}", "testdata.Inner", None, ""), concurrent_writes=3)
    result = process_batch([many_tables(test_descriptors, 8)], spec(test_descriptors, router=router,
                                                                      tables=FakeTables()),
                           plan, handling(RETRY_MAX_ATTEMPTS="1000", SINK_BIGQUERY_RETRY_DEADLINE_MS="600000"))
    assert result.fatal is not None and "403 denied" in result.fatal
    writers = plan.by_table
    assert [r["label"] for r in writers["ds.t_1"].written] == ["a1"]  # under way when t_0 failed: it went in
    assert result.stats.tables["ds.t_1"]["written"] == 1
    assert all(not writers[f"ds.t_{i}"].requests for i in range(3, 8))  # never started
    assert len(writers["ds.t_2"].requests) < 50  # its retries were cut short, not run for 10 minutes


def test_rows_staged_for_the_drivers_load_never_trust_a_kept_check(test_descriptors: Descriptors) -> None:
    """A staged file finds no missing table (the driver's load job would, and stop the job): such a
    destination's task checks its table itself, every micro-batch, as without kept checks."""

    @dataclass
    class StagingPlan(RoutingPlan):
        def writes_to_table(self, destination: Destination | None) -> bool:
            return False

    tables, kept = FakeTables(), CheckedTables()
    process_batch([many_tables(test_descriptors, 2)], spec(test_descriptors, tables=tables,
                                                            router=router_of("ds", "t_${header.n}", "testdata.Inner",
                                                                             None, "")),
                  StagingPlan(), handling(), Clients(), kept)
    assert tables.kept == [None, None]
    # The modes' own plans: streamed tables are written by the task, staged ones loaded by the driver.
    bq = BigQueryConfig(project_id="p", dataset="d", table="t")
    staging = file_loads.StagingArea("/tmp/staging")
    assert StreamingTask(bq, "storage_write").writes_to_table(Destination("d", "a"))
    assert not StagingTask(bq, staging, "b0/").writes_to_table(Destination("d", "a"))
    mixed = MixedTask(bq, staging, "b0/")
    assert mixed.writes_to_table(Destination("d", "a", streaming=True))
    assert not mixed.writes_to_table(Destination("d", "a"))
