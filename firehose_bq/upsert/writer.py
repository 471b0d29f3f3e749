"""The executor side of upsert/delete: changelog records → rows of this run's intermediate table.

Runs inside the pipeline's Spark tasks (`write_partition` with a ChangelogTask), so staged rows get
the same error policy, retries and dead-lettering as the plain path.

`i`, the order MERGE keeps the latest row of a key by, is the record's Kafka offset. All records of
one key live in one partition (the changelog contract, seed 002), where offsets grow strictly and keep
growing across micro-batches; a MERGE compares only rows of one batch, so within it the highest
offset of a key is its latest record, whatever task wrote it. (Two partitions carrying one key break
the changelog contract: Kafka gives no order between them, and neither can the sink.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import ConvertedBatch, KafkaRecords, millis_to_rfc3339
from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.schema import KEY_COLUMN
from firehose_bq.upsert.sql import BATCH, KEY, ORDER, PARTITION_TIME, VALUE

DELETES_OFF = "null value (a tombstone), but SINK_BIGQUERY_DELETE_ENABLED is false: the delete cannot be applied"


@dataclass(frozen=True)
class ChangelogTask:
    """How a task stages a changelog batch: pickled to the Python workers with each micro-batch."""

    intermediate_table: str  # table name in the destination's dataset
    batch: int
    deletes: bool

    def stage(self, converted: ConvertedBatch, records: KafkaRecords, load_time: str) -> ConvertedBatch:
        """The converted rows as intermediate-table rows; refused tombstones join the batch's errors."""
        staged, refused = to_intermediate(converted, records, self.batch, load_time, self.deletes)
        staged.errors = converted.errors + refused
        return staged

    def open_writer(self, cfg: BigQueryConfig) -> InsertAllWriter:
        # Always insertAll, whatever SINK_BIGQUERY_WRITE_METHOD says: rows must be queryable by the
        # MERGE right after the task ends.
        target = dataclasses.replace(cfg, table=self.intermediate_table)
        return InsertAllWriter(make_client(target), target)


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
