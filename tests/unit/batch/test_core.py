"""The batch core without Spark: every record ends in the table, the DLQ, or the failed count."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pytest

from firehose_bq.batch import core
from firehose_bq.batch.core import ATTEMPT_COLUMN, TaskResult, process_batch
from firehose_bq.batch.rows import Rows, Writable
from firehose_bq.config import Config
from firehose_bq.descriptors import Descriptors
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.errors import ErrorType, RowError, SinkError
from firehose_bq.modes import table_rows
from firehose_bq.policy import ErrorHandling
from firehose_bq.schema import MetadataColumns
from firehose_bq.sink_schema import SinkSpec
from tests.unit.batch.sources import source_batch


@dataclass
class FakeWriter:
    """Rejects rows whose label is in `bad` (4XX); raises `error` on every write when set."""

    bad: set[str] = field(default_factory=set)
    error: SinkError | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    closed: bool = False

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        if self.error:
            raise self.error
        failures = []
        for n, row in enumerate(rows.to_pylist()):
            if row["label"] in self.bad:
                failures.append(RowError(n, ErrorType.SINK_4XX_ERROR, "invalid"))
            else:
                self.written.append(row)
                self.ids.append(insert_ids[n].as_py())
        return failures

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePlan:
    writer: FakeWriter = field(default_factory=FakeWriter)
    changelog: bool = False
    opened: int = 0

    def open_writer(self) -> FakeWriter:
        self.opened += 1
        return self.writer

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        return table_rows(rows, ids), []

    def report(self, writer: FakeWriter) -> str:
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
                         keys=[b"k0", b"k1", b"k2"], headers=[[("h", b"1")]] * 3)
    second = source_batch([*values(test_descriptors, "c"), b"\xff"], offsets=[13, 14])
    result = process_batch([first, second], spec(test_descriptors), plan, handling())
    s = result.stats
    assert (s.messages, s.rows_written, s.dead_lettered, s.failed) == (5, 2, 3, 0)
    assert dict(s.errors_by_type) == {"SINK_4XX_ERROR": 1, "INVALID_MESSAGE_ERROR": 1, "DESERIALIZATION_ERROR": 1}
    assert [r["label"] for r in plan.writer.written] == ["a", "c"] and plan.writer.ids == ["t_0_10", "t_0_13"]
    assert plan.opened == 1 and plan.writer.closed and result.report == "2 rows" and result.fatal is None
    by_offset = {x.error.offset: x for x in letters}
    assert sorted(by_offset) == [11, 12, 14]
    assert by_offset[11].key == b"k1" and by_offset[11].headers == (("h", b"1"),) and by_offset[11].attempt == 1
    assert by_offset[12].value is None and by_offset[11].timestamp_ms == 1000


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


def test_holding_on_unknown_fields_stops_before_writing_and_letters_nothing(
        test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    newer = values(test_descriptors, "x")[0] + b"\xa0\x06\x01"
    first = source_batch(values(test_descriptors, "bad"), offsets=[1])
    held = source_batch([newer], offsets=[2])
    plan = FakePlan(FakeWriter(bad={"bad"}))
    result = process_batch([first, held], spec(test_descriptors, hold_on_unknown_fields=True), plan, handling())
    assert result.held == "t/0@2" and not letters  # the whole batch runs again after the refresh
    assert result.stats.messages == 1


def test_a_sink_failure_is_fatal_and_the_writer_is_closed(test_descriptors: Descriptors,
                                                           letters: list[DeadLetter]) -> None:
    plan = FakePlan(FakeWriter(error=SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")))
    result = process_batch([source_batch(values(test_descriptors, "a"))], spec(test_descriptors), plan, handling())
    assert result.fatal == "SINK_4XX_ERROR: Not found: Table p:d.t" and plan.writer.closed and not letters


def test_decode_only_opens_no_writer(test_descriptors: Descriptors, letters: list[DeadLetter]) -> None:
    plan = FakePlan()
    result = process_batch([source_batch(values(test_descriptors, "a", "b"))], spec(test_descriptors, write=False),
                           plan, handling())
    assert plan.opened == 0 and result.stats.messages == 2 and result.stats.rows_written == 0


def test_task_results_travel_as_json() -> None:
    result = TaskResult(fatal="x", held="t/0@1", report='{"path": "p"}')
    result.stats.messages = 3
    again = TaskResult.from_json(result.to_json())
    assert (again.fatal, again.held, again.report, again.stats.messages) == ("x", "t/0@1", '{"path": "p"}', 3)
