"""The write paths behind one small interface, chosen by SINK_BIGQUERY_WRITE_METHOD.

A writer runs inside a Spark task (or the DLQ replay). It takes one Arrow batch of rows at a time, in the
table's Arrow types (`arrow_schema.py`), and returns the rows that could not be written as RowFailures:
per-row failures are data, identified by their position in that batch. A call that fails as a whole
raises SinkError. The caller closes the writer once, whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType


@dataclass(frozen=True)
class RowFailure:
    """Row `position` (its index in the batch given to `write`) did not reach the table, and why."""

    position: int
    error_type: ErrorType
    message: str


class RowWriter(Protocol):
    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowFailure]:
        """Write every row of `rows`; return those that failed, ordered by position.

        `insert_ids`: one per row (`topic_partition_offset`), or None to send none."""

    def close(self) -> None:
        """Release clients, streams and files; called once per task."""


def open_writer(cfg: BigQueryConfig) -> RowWriter:
    method = cfg.effective_write_method
    if method == "insertall":
        from firehose_bq.bigquery.insert_all import InsertAllWriter

        return InsertAllWriter(make_client(cfg), cfg)
    if method == "storage_write":
        from firehose_bq.bigquery.storage_write import StorageWriteWriter, make_write_client

        return StorageWriteWriter(make_client(cfg), make_write_client(cfg), cfg)
    from firehose_bq.bigquery.file_loads import StagingWriter

    assert method == "file_loads", method  # config allows only WRITE_METHODS
    # Stages rows in the batch's directory (set by the driver); the driver loads them in one job.
    return StagingWriter(make_client(cfg), cfg)
