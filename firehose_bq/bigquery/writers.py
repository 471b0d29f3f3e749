"""The write paths behind one small interface, chosen by SINK_BIGQUERY_WRITE_METHOD.

A writer runs inside a Spark task: it takes one converted batch at a time and returns the rows that
BigQuery rejected as MessageErrors (per-row failures are data). A call that fails as a whole raises
SinkError. The pipeline closes the writer when the task ends, whatever happened.
"""

from __future__ import annotations

from typing import Protocol

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.errors import MessageError


class RowWriter(Protocol):
    def write(self, batch: ConvertedBatch, records: KafkaRecords) -> list[MessageError]:
        """Write every row of `batch`; return those BigQuery rejected."""

    def close(self) -> None:
        """Release clients and streams; called once per task."""


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
    return StagingWriter(cfg)
