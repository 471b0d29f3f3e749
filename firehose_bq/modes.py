"""Write modes: how a job's rows reach BigQuery, chosen once from configuration, each one object.

A mode owns everything that differs between the ways of writing: the writer its tasks open and the
shape of the rows they write (`task()` → a picklable TaskPlan), the step the driver runs after every
task of a batch succeeded (`finish`: a load job, a MERGE), what it drops when a batch fails (`abort`),
its trigger, and the schema object that keeps its tables in step with the descriptors. The Spark
pipeline and `replay-dlq` both drive a mode the same way, through `settle`.

- insertall / storage_write: streaming; rows are in the table when the task ends.
- file_loads: tasks stage files, the driver loads them in one job per table per batch (bigquery/file_loads.py).
- mixed: the tables listed for streaming by Storage Write, the others by file loads.
- upsert: tasks stage a changelog in an intermediate table, the driver MERGEs it (upsert/).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from google.cloud import bigquery

from firehose_bq.batch.core import TaskPlan, TaskResult
from firehose_bq.batch.rows import Rows, Writable
from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.client import Clients, concurrently, make_client, shared_credentials
from firehose_bq.bigquery.jobs import BatchPlan
from firehose_bq.bigquery.writers import RowWriter
from firehose_bq.blobstore import BlobStore
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.dlq.config import KAFKA
from firehose_bq.errors import BatchFailedError, FirehoseError, RowError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.policy import ErrorHandling
from firehose_bq.redact import Redactor
from firehose_bq.routing import Destination
from firehose_bq.sink_schema import DescriptorSource, SinkSchema

log = logging.getLogger(__name__)

INSERT_ALL, STORAGE_WRITE, FILE_LOADS, MIXED, UPSERT = "insertall", "storage_write", "file_loads", "mixed", "upsert"


def table_rows(rows: Rows, ids: pa.Array) -> Writable:
    """The rows in the destination table's columns, as the streaming and file-loads modes write them."""
    return Writable(rows.table(), ids.take(pa.array(rows.sources)), rows.sources)


def destination_config(cfg: BigQueryConfig, destination: Destination | None) -> BigQueryConfig:
    """The BigQuery settings of `destination`'s table (None: the configured one)."""
    if destination is None:
        return cfg
    return dataclasses.replace(cfg, dataset=destination.dataset, table=destination.table)


class _DestinationTask:
    """Tasks that write the destination tables' own rows (not a changelog's intermediate shape)."""

    changelog = False

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        return table_rows(rows, ids), []

    def report(self, destination: Destination | None, writer: RowWriter) -> str | None:
        return None

    def writes_to_table(self, destination: Destination | None) -> bool:
        return True


def _streaming_writer(cfg: BigQueryConfig, method: str, clients: Clients,
                      schema: list[bigquery.SchemaField] | None) -> RowWriter:
    if method == INSERT_ALL:  # insertAll's rows go as JSON, fitted by BigQuery itself: the schema only tells
        from firehose_bq.bigquery.insert_all import InsertAllWriter  # a table that lost columns since

        return InsertAllWriter(clients.bigquery_client(cfg), cfg, schema, clients.request_slots(cfg))
    from firehose_bq.bigquery.storage_write import StorageWriteWriter

    return StorageWriteWriter(clients.bigquery_client(cfg), clients.write_client(cfg), cfg, schema)


@dataclass(frozen=True)
class StreamingTask(_DestinationTask):
    """insertAll or Storage Write into each destination table, from the task itself."""

    bigquery: BigQueryConfig
    method: str

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[bigquery.SchemaField] | None = None) -> RowWriter:
        return _streaming_writer(destination_config(self.bigquery, destination), self.method, clients, schema)


@dataclass(frozen=True)
class StagingTask(_DestinationTask):
    """Stage each destination's rows under the batch's prefix, for the driver's load job per table."""

    bigquery: BigQueryConfig
    staging: file_loads.StagingArea
    prefix: str  # the batch's

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[bigquery.SchemaField] | None = None) -> RowWriter:
        table = destination_config(self.bigquery, destination)
        prefix = self.prefix + (f"{table.dataset}.{table.table}/" if destination is not None else "")
        # Staged rows are fitted to the live table (rows it cannot take fail here): `schema`, else read.
        return file_loads.StagingWriter(clients.bigquery_client(table), table, self.staging.store(), prefix, schema)

    def writes_to_table(self, destination: Destination | None) -> bool:
        return False

    def report(self, destination: Destination | None, writer: RowWriter) -> str | None:
        staged = file_loads.staged_json(writer)  # None for a mixed task's streaming writers
        if staged is None:
            return None
        return json.dumps({"table": destination.name if destination else "", "staged": json.loads(staged)})


@dataclass(frozen=True)
class MixedTask(StagingTask):
    """`mixed`: the destinations marked streaming go by Storage Write, the others are staged."""

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[bigquery.SchemaField] | None = None) -> RowWriter:
        if destination is not None and destination.streaming:
            return _streaming_writer(destination_config(self.bigquery, destination), STORAGE_WRITE, clients, schema)
        return super().open_writer(destination, clients, schema)

    def writes_to_table(self, destination: Destination | None) -> bool:
        return destination is not None and destination.streaming


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

    def finish(self, batch: int, results: Sequence[TaskResult], plan: BatchPlan) -> None:
        """The driver's step once every task of `batch` wrote its rows; raises to leave it uncommitted.
        `plan`: what the batch was planned to read, the same on every run of it (its jobs' identity)."""

    def abort(self, batch: int) -> None:
        """Drop what a failed `batch` left behind; its replay does the work again."""

    def close(self) -> None:
        """Release what the mode holds for the run (called once, when the job or replay ends)."""


class StorageWriteMode(WriteMode):
    name = STORAGE_WRITE


class FileLoadsMode(WriteMode):
    """Tasks stage files under the batch's prefix of the staging area; the driver loads each table's files
    in one job per batch, its id derived from `identity()`, the batch and its plan (what makes a replay of
    the same batch find its job, however each run staged it)."""

    name = FILE_LOADS

    def __init__(self, config: Config, schema: SinkSchema, staging: file_loads.StagingArea,
                 identity: Callable[[], str]) -> None:
        super().__init__(config, schema)
        self.staging = staging
        self._identity = identity
        # Part of every load job's plan: which table a record goes to. A batch whose job for one table ran
        # and whose job for another failed, replayed after the routing changed, could otherwise move a
        # record of the failed table into the done one, whose job (same plan, same id) is not run again.
        bq, ins = config.bigquery, config.input_schema
        self._routing = ["routing", bq.dataset, bq.table, ins.class_header, ins.class_routes, ins.proto_class]

    def trigger_interval_ms(self) -> int:
        # One load job per table per trigger: the trigger is paced by the load-job quota.
        return self.config.bigquery.file_loads_trigger_ms

    def task(self, batch: int) -> TaskPlan:
        return StagingTask(self.config.bigquery, self.staging, self.staging.batch(batch))

    def finish(self, batch: int, results: Sequence[TaskResult], plan: BatchPlan) -> None:
        by_table: dict[str, list[str]] = {}
        for report in (json.loads(r) for result in results for r in result.reports):
            by_table.setdefault(report["table"], []).append(json.dumps(report["staged"]))
        identity = self._identity()
        bq = self.config.bigquery
        creds = shared_credentials(bq)  # one token for every thread's client

        def load(opened: tuple[bigquery.Client, BlobStore], table: str) -> None:
            client, store = opened
            cfg = bq
            if table:
                dataset, name = table.split(".", 1)
                cfg = dataclasses.replace(cfg, dataset=dataset, table=name)
            loader = file_loads.FileLoader(client, cfg, store, identity, handling_of(self.config))
            loader.load(batch, file_loads.parse_staged(by_table[table]), [*plan, self._routing])

        # One job per table; on BigQuery each takes seconds, so a batch routed to many tables runs several at
        # once. A failure leaves the others running to their end: the batch's replay finds those done.
        concurrently(load, sorted(by_table), bq.file_loads_concurrent_jobs,
                     lambda: (make_client(bq, creds), self.staging.store()), lambda opened: opened[0].close())
        # Only when every table's rows are in: a failure above leaves the files for the batch's replay.
        file_loads.discard(self.staging.store(), self.staging.batch(batch))

    def abort(self, batch: int) -> None:
        file_loads.discard(self.staging.store(), self.staging.batch(batch))


class MixedMode(FileLoadsMode):
    """`mixed` (seed 004): the tables in SINK_BIGQUERY_MIXED_STREAMING_TABLES are streamed by Storage Write
    from the tasks, the others loaded from files by the driver. A batch is committed only after both are
    done, so its trigger is the file loads' (the load-job quota paces the batch)."""

    name = MIXED

    def task(self, batch: int) -> TaskPlan:
        return MixedTask(self.config.bigquery, self.staging, self.staging.batch(batch))


class UpsertMode(WriteMode):
    """Changelog: tasks stage rows in this run's intermediate table, the driver MERGEs each batch."""

    name = UPSERT

    def __init__(self, config: Config, descriptor_source: DescriptorSource | None,
                 identity: Callable[[], str]) -> None:
        from firehose_bq.upsert.flush import UpsertSession

        self.session = UpsertSession(config, descriptor_source, handling_of(config), identity=identity)
        super().__init__(config, self.session.schema)

    def trigger_interval_ms(self) -> int:
        return self.session.trigger_interval_ms

    def max_offsets_per_trigger(self) -> int:
        return self.session.max_offsets_per_trigger

    def task(self, batch: int) -> TaskPlan:
        return self.session.task(batch)

    def finish(self, batch: int, results: Sequence[TaskResult], plan: BatchPlan) -> None:
        self.session.flush(batch, [report for result in results for report in result.reports], plan)

    def merged(self, batch: int, plan: BatchPlan) -> bool:
        """Whether an earlier run's MERGE of `batch` (this identity, this plan) is done."""
        return self.session.merged(batch, plan)

    def close(self) -> None:
        self.session.close()  # drops this run's intermediate table


def write_mode(config: Config, descriptor_source: DescriptorSource | None = None, *,
               staging: file_loads.StagingArea | None = None, identity: Callable[[], str] | None = None) -> WriteMode:
    """The configured mode. `staging` (file loads) defaults to the configured staging area. `identity`:
    what batch ids count in, part of the load and MERGE job ids: the streaming job's checkpoint query id
    (`spark.checkpoint_query_id`), a replay's DLQ; the modes that run jobs need it."""
    identity = identity or _no_identity
    if config.upsert.enabled:  # whatever the write method: upserts go through their intermediate table
        return UpsertMode(config, descriptor_source, identity)
    schema = SinkSchema(config, descriptor_source)
    method = config.bigquery.effective_write_method
    if method in (FILE_LOADS, MIXED):
        kind = MixedMode if method == MIXED else FileLoadsMode
        return kind(config, schema, staging or file_loads.staging_area(config), identity)
    return StorageWriteMode(config, schema) if method == STORAGE_WRITE else WriteMode(config, schema)


def _no_identity() -> str:
    raise FirehoseError("this write mode runs BigQuery jobs per batch and was given no identity for their ids")


def handling_of(config: Config) -> ErrorHandling:
    """The error policy, DLQ and fallback output of a job (or replay), as its tasks apply them."""
    dlq = config.dlq.with_brokers(config.source.brokers, config.kafka_security)
    fallback = None
    if config.bigquery.route_fallback_topic:
        # Written like dead letters (the original record plus why), with the DLQ's retry settings.
        fallback = dataclasses.replace(dlq, enabled=True, writer_type=KAFKA, kafka_brokers=config.source.brokers,
                                       kafka_topic=config.bigquery.route_fallback_topic)
    return ErrorHandling(config.errors, dlq, fallback, config.bigquery.retry_deadline_ms,
                         Redactor.of(config.secret_values()))


def batch_stats(results: Sequence[TaskResult]) -> BatchStats:
    stats = BatchStats()
    for result in results:
        stats.merge(result.stats)
    return stats


def reaches_driver_step(results: Sequence[TaskResult], stats: BatchStats) -> bool:
    """Whether `settle` gets to the mode's driver step (a load job, a MERGE) for this batch, rather than
    stopping it first: no task gave up and no record failed."""
    return not stats.failed and not any(r.fatal for r in results)


def planned_ranges(results: Sequence[TaskResult]) -> list[tuple[str, int, int, int]]:
    """The Spark job's plan of a batch: the Kafka ranges its tasks were given, each once (a batch run again
    around a descriptor refresh reports them from both runs)."""
    return sorted({tuple(r) for result in results for r in result.planned})  # type: ignore[misc]


def settle(mode: WriteMode, batch: int, results: Sequence[TaskResult], stats: BatchStats, plan: BatchPlan) -> None:
    """The driver's end of a batch, the same for the Spark job and the replay (`stats`: the results'
    `batch_stats`; `plan`: what the batch was planned to read, bigquery/jobs.py `BatchPlan`): stop, letting the mode drop the batch's leftovers, if a record failed or a task could
    not finish; else run the mode's driver step. Returns only when every record is in the table or the
    DLQ, which is when the caller may commit the batch's offsets."""
    if not reaches_driver_step(results, stats):
        fatal = next((r.fatal for r in results if r.fatal), None)
        mode.abort(batch)
        if fatal:
            raise FirehoseError(f"batch {batch} stopped, offsets not committed: {fatal}")
        raise BatchFailedError(batch, stats.sample_errors, stats.failed)
    try:
        mode.finish(batch, results, plan)
    except SinkError as exc:
        raise FirehoseError(f"batch {batch} stopped, offsets not committed: {exc}") from exc
