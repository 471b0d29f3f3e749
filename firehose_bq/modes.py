"""Write modes: how a job's rows reach BigQuery, chosen once from configuration, each one object.

A mode owns everything that differs between the ways of writing: the writer its tasks open and the
shape of the rows they write (`task()` → a picklable TaskPlan), the step the driver runs after every
task of a batch succeeded (`finish`: a load job, a MERGE), what it drops when a batch fails (`abort`),
its trigger, and the schema object that keeps its tables in step with the descriptors. The Spark
pipeline and `replay-dlq` both drive a mode the same way, through `settle`.

- insertall / storage_write: streaming; rows are in the table when the task ends.
- file_loads: tasks stage files, the driver loads them in one job per batch (bigquery/file_loads.py).
- upsert: tasks stage a changelog in an intermediate table, the driver MERGEs it (upsert/).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from firehose_bq.batch.core import TaskPlan, TaskResult
from firehose_bq.batch.rows import Rows, Writable
from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.writers import RowWriter
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.errors import BatchFailedError, FirehoseError, RowError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.sink_schema import DescriptorSource, SinkSchema

log = logging.getLogger(__name__)

INSERT_ALL, STORAGE_WRITE, FILE_LOADS, UPSERT = "insertall", "storage_write", "file_loads", "upsert"


def table_rows(rows: Rows, ids: pa.Array) -> Writable:
    """The rows in the destination table's columns, as the streaming and file-loads modes write them."""
    return Writable(rows.table(), ids.take(pa.array(rows.sources)), rows.sources)


class _DestinationTask:
    """Tasks that write the destination table's own rows (not a changelog's intermediate shape)."""

    changelog = False

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        return table_rows(rows, ids), []

    def report(self, writer: RowWriter) -> str | None:
        return None


@dataclass(frozen=True)
class StreamingTask(_DestinationTask):
    """insertAll or Storage Write into the destination table, from the task itself."""

    bigquery: BigQueryConfig
    method: str

    def open_writer(self) -> RowWriter:
        if self.method == INSERT_ALL:
            from firehose_bq.bigquery.insert_all import InsertAllWriter

            return InsertAllWriter(make_client(self.bigquery), self.bigquery)
        from firehose_bq.bigquery.storage_write import StorageWriteWriter, make_write_client

        return StorageWriteWriter(make_client(self.bigquery), make_write_client(self.bigquery), self.bigquery)


@dataclass(frozen=True)
class StagingTask(_DestinationTask):
    """Stage the rows in the batch's directory, for the driver's one load job."""

    bigquery: BigQueryConfig
    directory: str

    def open_writer(self) -> RowWriter:
        return file_loads.StagingWriter(dataclasses.replace(self.bigquery, file_loads_staging_uri=self.directory))

    def report(self, writer: RowWriter) -> str | None:
        return file_loads.staged_json(writer)


class WriteMode:
    """The streaming modes' behaviour, which the others extend: tasks write, the driver has no step."""

    name = INSERT_ALL

    def __init__(self, config: Config, schema: SinkSchema) -> None:
        self.config = config
        self.schema = schema

    def trigger_interval_ms(self) -> int:
        return self.config.spark.trigger_interval_ms

    def max_offsets_per_trigger(self) -> int:
        return self.config.spark.max_offsets_per_trigger

    def task(self, batch: int) -> TaskPlan:
        """What each task of batch `batch` needs from this mode (picklable)."""
        return StreamingTask(self.config.bigquery, self.name)

    def finish(self, batch: int, results: Sequence[TaskResult]) -> None:
        """The driver's step once every task of `batch` wrote its rows; raises to leave it uncommitted."""

    def abort(self, batch: int) -> None:
        """Drop what a failed `batch` left behind; its replay does the work again."""

    def close(self) -> None:
        """Release what the mode holds for the run (called once, when the job or replay ends)."""


class StorageWriteMode(WriteMode):
    name = STORAGE_WRITE


class FileLoadsMode(WriteMode):
    """Tasks stage files in the batch's directory; the driver loads them in one job per batch, its id
    derived from `identity()` (what makes a replay of the same batch find its job), the batch and the
    Kafka offsets staged."""

    name = FILE_LOADS

    def __init__(self, config: Config, schema: SinkSchema, staging_root: Path, identity: Callable[[], str]) -> None:
        super().__init__(config, schema)
        self.staging_root = staging_root
        self._identity = identity

    def trigger_interval_ms(self) -> int:
        # One load job per table per trigger: the trigger is paced by the load-job quota.
        return self.config.bigquery.file_loads_trigger_ms

    def task(self, batch: int) -> StagingTask:
        return StagingTask(self.config.bigquery, str(file_loads.batch_dir(self.staging_root, batch)))

    def finish(self, batch: int, results: Sequence[TaskResult]) -> None:
        with make_client(self.config.bigquery) as client:
            loader = file_loads.FileLoader(client, self.config.bigquery, self.staging_root, self._identity())
            loader.load(batch, file_loads.parse_staged(r.report for r in results))

    def abort(self, batch: int) -> None:
        file_loads.discard_batch_dir(self.staging_root, batch)


class UpsertMode(WriteMode):
    """Changelog: tasks stage rows in this run's intermediate table, the driver MERGEs each batch."""

    name = UPSERT

    def __init__(self, config: Config, descriptor_source: DescriptorSource | None) -> None:
        from firehose_bq.upsert.flush import UpsertSession

        self.session = UpsertSession(config, descriptor_source)
        super().__init__(config, self.session.schema)

    def trigger_interval_ms(self) -> int:
        return self.session.trigger_interval_ms

    def max_offsets_per_trigger(self) -> int:
        return self.session.max_offsets_per_trigger

    def task(self, batch: int) -> TaskPlan:
        return self.session.task(batch)

    def finish(self, batch: int, results: Sequence[TaskResult]) -> None:
        self.session.flush(batch)

    def close(self) -> None:
        self.session.close()  # drops this run's intermediate table


def write_mode(config: Config, descriptor_source: DescriptorSource | None = None, *,
               staging_root: Path | None = None, identity: Callable[[], str] | None = None) -> WriteMode:
    """The configured mode. `staging_root` and `identity` (file loads) default to the streaming job's:
    the checkpoint's staging directory and its query id."""
    if config.upsert.enabled:  # whatever the write method: upserts go through their intermediate table
        return UpsertMode(config, descriptor_source)
    schema = SinkSchema(config, descriptor_source)
    method = config.bigquery.effective_write_method
    if method == FILE_LOADS:
        checkpoint = config.spark.checkpoint_location
        return FileLoadsMode(config, schema, staging_root or file_loads.staging_root(config),
                             identity or (lambda: file_loads.checkpoint_identity(checkpoint)))
    return StorageWriteMode(config, schema) if method == STORAGE_WRITE else WriteMode(config, schema)


def batch_stats(results: Sequence[TaskResult]) -> BatchStats:
    stats = BatchStats()
    for result in results:
        stats.merge(result.stats)
    return stats


def settle(mode: WriteMode, batch: int, results: Sequence[TaskResult], stats: BatchStats) -> None:
    """The driver's end of a batch, the same for the Spark job and the replay (`stats`: the results'
    `batch_stats`): stop, letting the mode drop the batch's leftovers, if a record failed or a task could
    not finish; else run the mode's driver step. Returns only when every record is in the table or the
    DLQ, which is when the caller may commit the batch's offsets."""
    fatal = next((r.fatal for r in results if r.fatal), None)
    if fatal or stats.failed:
        mode.abort(batch)
        if fatal:
            raise FirehoseError(f"batch {batch} stopped, offsets not committed: {fatal}")
        raise BatchFailedError(batch, stats.sample_errors, stats.failed)
    try:
        mode.finish(batch, results)
    except SinkError as exc:
        raise FirehoseError(f"batch {batch} stopped, offsets not committed: {exc}") from exc
