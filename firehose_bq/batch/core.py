"""The batch core: one task's Kafka records → table, DLQ, or a reason to stop. Free of Spark.

`process_batch` is the whole task: decode (rows.py) → the write mode's shaping → write with retries
and the error policy (policy.py) → dead letters. The Spark job runs it in each task (pipeline.py) and
`replay-dlq` runs it on dead letters (dlq/replay.py): there is no second copy of this loop. What the
write mode does per task (which writer, what shape of rows, what to tell the driver) comes in as a
`TaskPlan`; what it does per batch on the driver (a load job, a MERGE) is `modes.WriteMode.finish`.

A task never raises for a message: every record ends in the table, the DLQ or the result's `failed`
count. States it cannot go on from (BigQuery down after retries, a DLQ that cannot be written) come
back as `TaskResult.fatal`, so the driver can stop with one clean reason; offsets are then not committed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from firehose_bq.batch.rows import RowBuilder, Rows, Writable, insert_ids
from firehose_bq.bigquery.writers import RowWriter
from firehose_bq.convert import _collector_paused
from firehose_bq.decode import make_value_decoder
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.writers import dead_letter
from firehose_bq.errors import DeadLetterError, ErrorType, MessageError, RowError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.policy import DLQ, FAILED, RETRIED, ErrorHandling, write_with_policy
from firehose_bq.sink_schema import SinkSpec

log = logging.getLogger(__name__)

# A source batch may carry this column: how often each record was dead-lettered before (replay-dlq).
ATTEMPT_COLUMN = "dlq_attempt"
UNKNOWN_FIELDS = "fields that no known descriptor version has (INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE=false)"


class TaskPlan(Protocol):
    """The write mode's part inside a task; small and picklable (Spark ships it to every task)."""

    @property
    def changelog(self) -> bool:
        """Records are a changelog: a NULL value is a delete of its key, and every record needs a key."""

    def open_writer(self) -> RowWriter: ...

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        """The rows as this mode writes them, and the records it refuses (by source index)."""

    def report(self, writer: RowWriter) -> str | None:
        """What the driver needs from this task once its writer is closed (e.g. the file it staged)."""


@dataclass
class TaskResult:
    """What a task tells the driver: counts, and why it could not finish, if it could not."""

    stats: BatchStats = field(default_factory=BatchStats)
    fatal: str | None = None  # the task stopped: nothing of its batch may be committed
    # `topic/partition@offset` of the first record carrying fields the descriptors lack, when the task
    # was told to hold there (the driver refreshes the descriptors and runs the batch again).
    held: str | None = None
    report: str | None = None  # the mode's TaskPlan.report

    def to_json(self) -> str:
        return json.dumps({"stats": json.loads(self.stats.to_json()), "fatal": self.fatal, "held": self.held,
                           "report": self.report})

    @classmethod
    def from_json(cls, text: str) -> TaskResult:
        data = json.loads(text)
        return cls(BatchStats.from_json(json.dumps(data["stats"])), data["fatal"], data["held"], data["report"])


def row_builder(spec: SinkSpec, changelog: bool) -> RowBuilder:
    """The decoders for `spec`'s message (and key) types: built once per task, used for all its batches."""
    values = make_value_decoder(spec.descriptors.message_class(spec.proto_class), 1, spec.options,
                                confluent_framed=spec.confluent_framed, detect_unknown_fields=True,
                                prefer=spec.decoder)
    key = (make_value_decoder(spec.descriptors.message_class(spec.key_class), 2, spec.options,
                              confluent_framed=False, detect_unknown_fields=False, prefer=spec.decoder)
           if spec.key_class else None)
    return RowBuilder(values, spec.metadata, key, changelog=changelog)


def process_batch(sources: Iterable[pa.RecordBatch], spec: SinkSpec, plan: TaskPlan,
                  handling: ErrorHandling) -> TaskResult:
    """Decode, write and settle every record of `sources` (one task's share of a batch)."""
    builder = row_builder(spec, plan.changelog)
    result = TaskResult()
    writer: RowWriter | None = None
    letters: list[DeadLetter] = []

    def current_writer() -> RowWriter:
        nonlocal writer
        writer = writer or plan.open_writer()
        return writer

    try:
        for source in sources:
            with _collector_paused():
                rows = builder.build(source, time.time_ns() // 1000)
            if rows.unknown_fields and spec.hold_on_unknown_fields:
                result.held = _where(source, rows.unknown_fields[0])
                break
            result.stats.messages += source.num_rows
            ids = insert_ids(source)
            pending, refused = plan.shape(_without_unknown(rows, handling, result.stats), source, ids)
            failures = sorted(rows.failures + refused + _unknown_errors(rows, handling), key=lambda f: f.index)
            done = write_with_policy(handling, pending, failures, current_writer if spec.write else None)
            _count(result.stats, done.written, done.retried, source, done.dead, done.failed)
            letters.extend(_letter(source, f) for f in done.dead)
        if result.held is None:
            # Only now: a held batch is written again after the refresh and must not be dead-lettered twice.
            dead_letter(handling.dlq, letters)
    except (SinkError, DeadLetterError) as exc:
        result.fatal = str(exc)
    finally:
        if writer is not None:
            writer.close()  # Spark reuses Python workers: an unclosed client per task would pile up
            result.report = plan.report(writer)
    return result


def _without_unknown(rows: Rows, handling: ErrorHandling, stats: BatchStats) -> Rows:
    """With unknown fields allowed, such rows are written without them (and counted); otherwise they
    leave the rows and become UNKNOWN_FIELDS_ERRORs (`_unknown_errors`)."""
    if not rows.unknown_fields:
        return rows
    if handling.policy.allow_unknown_fields:
        stats.unknown_fields += len(rows.unknown_fields)
        return rows
    return rows.take(np.flatnonzero(~np.isin(rows.sources, rows.unknown_fields)))


def _unknown_errors(rows: Rows, handling: ErrorHandling) -> list[RowError]:
    if handling.policy.allow_unknown_fields:
        return []
    written = set(rows.sources.tolist())
    return [RowError(i, ErrorType.UNKNOWN_FIELDS_ERROR, UNKNOWN_FIELDS) for i in rows.unknown_fields if i in written]


def _count(stats: BatchStats, written: int, retried: int, source: pa.RecordBatch, dead: list[RowError],
           failed: list[RowError]) -> None:
    stats.rows_written += written
    dead_errors = [message_error(source, f) for f in dead]
    failed_errors = [message_error(source, f) for f in failed]
    stats.add_errors(dead_errors + failed_errors)
    stats.add_outcome(RETRIED, retried)
    stats.add_outcome(DLQ, dead_errors)
    stats.add_outcome(FAILED, failed_errors)


def _coordinates(source: pa.RecordBatch, index: int) -> tuple[str, int, int]:
    return source["topic"][index].as_py(), source["partition"][index].as_py(), source["offset"][index].as_py()


def _where(source: pa.RecordBatch, index: int) -> str:
    topic, partition, offset = _coordinates(source, index)
    return f"{topic}/{partition}@{offset}"


def message_error(source: pa.RecordBatch, failure: RowError) -> MessageError:
    """The failure with the Kafka coordinates of its record, for reports and dead letters."""
    return MessageError(failure.error_type, *_coordinates(source, failure.index), failure.message)


def _letter(source: pa.RecordBatch, failure: RowError) -> DeadLetter:
    i = failure.index
    micros = source["timestamp"][i].cast(pa.int64()).as_py() if source["timestamp"][i].is_valid else None
    headers = source["headers"][i].as_py() or []
    attempt = source[ATTEMPT_COLUMN][i].as_py() + 1 if ATTEMPT_COLUMN in source.schema.names else 1
    return DeadLetter(message_error(source, failure), source["key"][i].as_py(), source["value"][i].as_py(),
                      tuple((h["key"], h["value"]) for h in headers),
                      micros // 1000 if micros is not None and micros >= 0 else None, attempt,
                      int(time.time() * 1000))
