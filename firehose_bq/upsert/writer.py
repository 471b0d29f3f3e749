"""The executor side of upsert/delete: changelog records → rows of this run's intermediate table.

Runs inside a Spark task (one per Kafka partition and micro-batch), like the plain path's
`write_partition`, and yields the same one-row stats record to the driver.

`i`, the order MERGE keeps the latest row of a key by, is the record's Kafka offset. All records of
one key live in one partition (the changelog contract, seed 002), where offsets grow strictly and keep
growing across micro-batches; a MERGE compares only rows of one batch, so within it the highest
offset of a key is its latest record, whatever task wrote it. (Two partitions carrying one key break
the changelog contract: Kafka gives no order between them, and neither can the sink.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.convert import ConvertedBatch, KafkaRecords, RowConverter, millis_to_rfc3339
from firehose_bq.errors import ErrorType, MessageError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.schema import KEY_COLUMN
from firehose_bq.sink_schema import SinkSpec
from firehose_bq.upsert.sql import BATCH, KEY, ORDER, PARTITION_TIME, VALUE

DELETES_OFF = "null value (a tombstone), but SINK_BIGQUERY_DELETE_ENABLED is false: the delete cannot be applied"


@dataclass(frozen=True)
class ChangelogTask:
    """What a task needs besides the sink spec: pickled to the Python workers with each micro-batch."""

    spec: SinkSpec
    intermediate_table: str  # table name in the destination's dataset
    batch: int
    deletes: bool


def to_intermediate(converted: ConvertedBatch, records: KafkaRecords, batch: int, load_time: str,
                    deletes: bool) -> tuple[ConvertedBatch, list[MessageError]]:
    """Reshape converted rows to the intermediate schema; tombstones without deletes become errors."""
    out = ConvertedBatch()
    errors = []
    tombstones = set(converted.deletes)
    for position, row in enumerate(converted.rows):
        source = converted.sources[position]
        if position in tombstones and not deletes:
            errors.append(MessageError(ErrorType.INVALID_MESSAGE_ERROR, records.topics[source],
                                       records.partitions[source], records.offsets[source], DELETES_OFF))
            continue
        value = dict(row)
        key = value.pop(KEY_COLUMN)
        millis = records.timestamps_ms[source]
        out.rows.append({
            KEY: key,
            VALUE: None if position in tombstones else value,
            # The record's time picks the destination partition; Kafka's "no timestamp" (-1) takes the load time.
            PARTITION_TIME: millis_to_rfc3339(millis) if millis is not None and millis >= 0 else load_time,
            ORDER: records.offsets[source],
            BATCH: batch,
        })
        out.insert_ids.append(converted.insert_ids[position])
        out.sources.append(source)
    return out, errors


def write_changelog_partition(task: ChangelogTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Decode, convert and stage one task's records in the intermediate table; yield one stats row."""
    from firehose_bq.pipeline import kafka_records  # the pipeline imports this package: import late

    spec = task.spec
    key_class = spec.descriptors.message_class(spec.key_class) if spec.key_class else None
    converter = RowConverter(spec.descriptors.message_class(spec.proto_class), spec.metadata, spec.options,
                             key_class, detect_unknown_fields=True, confluent_framed=spec.confluent_framed,
                             changelog=True)
    wanted = set(spec.metadata.columns) if spec.metadata.enabled else set()
    writer: InsertAllWriter | None = None
    stats = BatchStats()
    fatal = held = None
    try:
        for batch in batches:
            records = kafka_records(batch, keys=True, wanted=wanted)
            load_time = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            converted = converter.convert(records, load_time=load_time)
            if converted.unknown_fields and spec.hold_on_unknown_fields:
                i = converted.unknown_fields[0]
                held = f"{records.topics[i]}/{records.partitions[i]}@{records.offsets[i]}"
                break
            stats.messages += len(records)
            stats.unknown_fields += len(converted.unknown_fields)
            stats.add_errors(converted.errors)
            staged, refused = to_intermediate(converted, records, task.batch, load_time, task.deletes)
            stats.add_errors(refused)
            if staged.rows and spec.write:
                if writer is None:
                    # Always insertAll: rows must be queryable by the MERGE right after the task ends.
                    cfg = dataclasses.replace(spec.bigquery, table=task.intermediate_table)
                    writer = InsertAllWriter(make_client(cfg), cfg)
                failures = writer.write(staged, records)
                stats.rows_written += len(staged.rows) - len(failures)
                stats.add_errors(failures)
    except SinkError as exc:
        fatal = str(exc)
    finally:
        if writer is not None:
            writer.close()
    # `staged` (pipeline.STATS_SCHEMA): only file loads stage files; upserts write the intermediate table.
    yield pa.RecordBatch.from_pydict({"stats": [stats.to_json()], "fatal": [fatal], "held": [held],
                                      "staged": [None]})
