"""The executor side of upsert/delete: changelog rows → rows of this run's intermediate table.

A ChangelogTask is the upsert mode's TaskPlan: the batch core decodes the records as a changelog
(tombstones kept as deletes) and this reshapes them, in Arrow, into the intermediate table's columns,
so staged rows get the same error policy, retries and dead-lettering as every other mode.

`i`, the order MERGE keeps the latest row of a key by, is the record's Kafka offset. All records of
one key live in one partition (the changelog contract, seed 002), where offsets grow strictly and keep
growing across micro-batches; a MERGE compares only rows of one batch, so within it the highest
offset of a key is its latest record, whatever task wrote it. Two partitions carrying one key break
that contract (producers with different partitioners, partitions added to the topic): Kafka gives no
order between them, and neither can the sink; the highest offset wins, ties by the higher partition.
`kafkaPartition` is staged so that two such records sharing an offset stay two records (delete-only
appends both) and the tie-break is the same on every run of the MERGE; `kafkaTopic` likewise for a job
reading several topics, whose partitions share numbers and offsets.

Each task reports how many rows it staged: the driver merges only a batch that staged rows
(`upsert/flush.py`). The MERGE job id comes from the batch's plan (bigquery/jobs.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.cloud import bigquery

from firehose_bq.arrow_schema import TIMESTAMP
from firehose_bq.batch.rows import Rows, Writable
from firehose_bq.bigquery.client import Clients
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType, PartialWriteError, RowError
from firehose_bq.routing import Destination
from firehose_bq.upsert.sql import BATCH, KEY, ORDER, PARTITION, PARTITION_TIME, TOPIC, VALUE

DELETES_OFF = "null value (a tombstone), but SINK_BIGQUERY_DELETE_ENABLED is false: the delete cannot be applied"


@dataclass(frozen=True)
class ChangelogTask:
    """How a task stages a changelog batch: pickled to the Python workers with each micro-batch."""

    bigquery: BigQueryConfig
    intermediate_table: str  # table name in the destination's dataset
    batch: int
    deletes: bool
    changelog: bool = True

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[bigquery.SchemaField] | None = None) -> ChangelogWriter:
        # One destination (Config refuses templates and class routes with upsert): always None here.
        # Always insertAll, whatever SINK_BIGQUERY_WRITE_METHOD says: rows must be queryable by the
        # MERGE right after the task ends.
        target = dataclasses.replace(self.bigquery, table=self.intermediate_table)
        return ChangelogWriter(clients.bigquery_client(target), target)

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        """The rows as intermediate-table rows; tombstones without deletes enabled are refused."""
        refused: list[RowError] = []
        if not self.deletes and rows.deletes.any():
            refused = [RowError(int(i), ErrorType.INVALID_MESSAGE_ERROR, DELETES_OFF) for i in rows.sources[rows.deletes]]
            rows = rows.take(np.flatnonzero(~rows.deletes))
        return Writable(intermediate_rows(rows, source, self.batch), ids.take(pa.array(rows.sources)),
                        rows.sources), refused

    def report(self, destination: Destination | None, writer: object) -> str | None:
        return writer.report() if isinstance(writer, ChangelogWriter) else None

    def writes_to_table(self, destination: Destination | None) -> bool:
        return False  # the intermediate table, for the driver's MERGE (one destination: never routed)


class ChangelogWriter(InsertAllWriter):
    """insertAll into the intermediate table, counting the rows it wrote (not those that failed: a batch
    whose every record was dead-lettered has nothing to merge)."""

    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig) -> None:
        super().__init__(client, cfg)
        self.staged = 0

    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        try:
            failures = super().write(rows, insert_ids)
        except PartialWriteError as exc:
            self.staged += rows.num_rows - len({*exc.unsent, *(f.index for f in exc.failures)})
            raise
        self.staged += rows.num_rows - len({f.index for f in failures})
        return failures

    def report(self) -> str | None:
        return json.dumps({"staged": self.staged}) if self.staged else None


def staged_rows(reports: Iterable[str]) -> int:
    """The rows the tasks' ChangelogWriters staged, in all."""
    return sum(int(json.loads(report)["staged"]) for report in reports)


def intermediate_rows(rows: Rows, source: pa.RecordBatch, batch: int) -> pa.RecordBatch:
    """key, value (the row without its key; NULL for a delete), partitionTime, i, kafkaPartition, kafkaTopic,
    batchNumber."""
    take = pa.array(rows.sources)
    columns = rows.columns(with_key=False)
    value = pa.StructArray.from_arrays([c for _, c in columns], [n for n, _ in columns],
                                       mask=pa.array(rows.deletes))
    # The record's time picks the destination partition; Kafka's "no timestamp" (-1) takes the load time.
    stamps = source["timestamp"].take(take)
    partition_time = pc.if_else(pc.fill_null(pc.less(stamps.cast(pa.int64()), 0), True),
                                pa.scalar(rows.load_time_us, TIMESTAMP), stamps.cast(TIMESTAMP))
    n = len(rows)
    return pa.RecordBatch.from_arrays(
        [rows.key, value, partition_time, source["offset"].take(take).cast(pa.int64()),
         source["partition"].take(take).cast(pa.int64()), source["topic"].take(take).cast(pa.string()),
         pa.array(np.full(n, batch, dtype=np.int64))],
        names=[KEY, VALUE, PARTITION_TIME, ORDER, PARTITION, TOPIC, BATCH])
