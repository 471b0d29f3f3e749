"""The streaming job: Kafka offset ranges → the batch core in each Spark task → the write mode's driver step.

Each micro-batch runs `process_batch` (batch/core.py) in the Python workers, one task per Kafka
partition or per group of them (SPARK_MAX_TASKS_PER_BATCH): the task reads its partitions' ranges of
records itself, in turn (the source plans the ranges, see source/kafka_source.py; the tasks take them
from the micro-batch's plan, `_run_tasks`), the rows are written from there, and only a small TaskResult
per task comes back to the driver. The driver's `foreachBatch` handler returns normally only when every
message of the batch is in BigQuery or the DLQ (`modes.settle`); otherwise it raises, Spark does not
commit the batch, and a restart replays it (at-least-once).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from firehose_bq import logs
from firehose_bq.batch.core import UNKNOWN_ENUM_NUMBER_AT, UNKNOWN_FIELDS_AT, UNKNOWN_SCHEMA_ID, TaskResult
from firehose_bq.batch.task import RESULT_SCHEMA, Resume, run_groups, run_task
from firehose_bq.config import Config
from firehose_bq.errors import FirehoseError, query_error, worker_error
from firehose_bq.metrics import BatchStats, RunSummary
from firehose_bq.telemetry import Telemetry
from firehose_bq.modes import WriteMode, batch_stats, handling_of, planned_ranges, settle, write_mode
from firehose_bq.registry.cache import CacheStats
from firehose_bq.sink_schema import DescriptorSource, SinkSchema, SinkSpec
from firehose_bq.source.kafka_client import RangeReader, resolve_client
from firehose_bq.source.kafka_source import FORMAT_NAME, KafkaDataSource
from firehose_bq.spark import (checkpoint_query_id, choose_checkpoint_manager, clear_unfinished_writes,
                               planned_partitions, task_slots)

log = logging.getLogger(__name__)

# How often the run loop looks at the stop flag and the query's state.
POLL_SECONDS = 0.5




class Pipeline:
    """One configured streaming job: `prepare()` checks descriptors and tables, `run()` streams."""

    def __init__(self, config: Config, spark: SparkSession, descriptor_source: DescriptorSource | None = None,
                 refresh: Callable[[str], bool] | None = None, write: bool = True,
                 telemetry: Telemetry | None = None, registry_stats: Callable[[], CacheStats] | None = None) -> None:
        """`refresh(reason)` asks the registry for new descriptors now (True if they changed); it is
        called when a batch holds fields the descriptors lack, before that batch is written.
        `write=False`: decode only, through a streaming mode that writes nothing (benchmarks).
        `telemetry` gets every batch's counts; `registry_stats` (the descriptor cache's) its refreshes."""
        self.config = config
        self.telemetry = telemetry
        self._registry_stats = registry_stats
        self.spark = spark
        location = config.spark.checkpoint_location
        self.mode: WriteMode = (write_mode(config, descriptor_source,
                                           identity=functools.cache(lambda: checkpoint_query_id(spark, location)))
                                if write
                                else WriteMode(config, SinkSchema(config, descriptor_source)))
        self.schema = self.mode.schema
        self.summary = RunSummary()
        self._refresh = refresh
        self._write_rows = write
        # After a refresh that did not explain the unknown fields, write such messages as they are
        # until this moment: a producer ahead of its registry must not cost a re-run per batch.
        self._accept_unknown_until = 0.0
        self._failure: Exception | None = None
        self._scan_warned = False  # `_run_tasks`: the slower way round is logged once per run
        # The last micro-batch `_batch` ran: Spark's progress reports of later ids are idle ones, without data.
        self._last_batch = -1
        # Created when a run is asked to stop: the source then plans no further batch (kafka_source.py). Its
        # planner runs on the driver's machine (Spark's source runner), so a local file reaches it.
        self._stop_file = ""
        self._handling = handling_of(config)
        src = config.source
        self._reader = RangeReader(src.brokers, resolve_client(src.client), src.stall_timeout_ms,
                                   isolation_level=src.isolation_level, security=config.kafka_security,
                                   request_timeout_ms=src.request_timeout_ms)
        # Now rather than when the query starts: Spark looks the session's Python data sources up on the
        # first registration (a process of its own), which then overlaps the table's preparation.
        spark.dataSource.register(KafkaDataSource)

    def prepare(self) -> SinkSpec:
        return self.schema.current()

    def source(self) -> DataFrame:
        src = self.config.source
        return (
            self.spark.readStream.format(FORMAT_NAME)
            .option("brokers", src.brokers)
            .option("topics", ",".join(src.topics))
            .option("group_id", src.consumer_group_id)
            .option("starting_offsets", src.auto_offset_reset)
            .option("max_offsets_per_trigger", str(self.mode.max_offsets_per_trigger()))
            .option("max_tasks", str(self._max_tasks()))
            .option("isolation_level", src.isolation_level)  # the planner's, as self._reader's
            .option("stop_file", self._stop_file)
            .option("stall_timeout_ms", str(src.stall_timeout_ms))  # how long its planner waits for the broker
            .option("request_timeout_ms", str(src.request_timeout_ms))  # and for each of its requests
            .options(**self.config.kafka_security.to_options())  # likewise
            .load()
        )

    def _max_tasks(self) -> int:
        """Spark tasks per micro-batch at most (SPARK_MAX_TASKS_PER_BATCH), as the source's option (0: no limit)."""
        chosen = self.config.spark.max_tasks_per_batch
        if chosen == 0:
            context = self.spark.sparkContext
            return task_slots(context.master, dict(context.getConf().getAll()), context.defaultParallelism)
        return max(chosen, 0)

    def run(self, *, available_now: bool, stop: threading.Event | None = None) -> RunSummary:
        """Stream until the topic is drained (available_now) or `stop` is set; raise on failure."""
        stop_dir = tempfile.mkdtemp(prefix="firehose-bq-stop-")
        self._stop_file = os.path.join(stop_dir, "stop")
        try:
            return self._run(available_now=available_now, stop=stop)
        finally:
            shutil.rmtree(stop_dir, ignore_errors=True)
            self.mode.close()  # e.g. drops an upsert run's intermediate table

    def _run(self, *, available_now: bool, stop: threading.Event | None) -> RunSummary:
        self.prepare()
        stop = stop or threading.Event()
        writer = self.source().writeStream.foreachBatch(self._on_batch).option(
            "checkpointLocation", self.config.spark.checkpoint_location
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.mode.trigger_interval_ms()} milliseconds")
        choose_checkpoint_manager(self.spark, self.config.spark.checkpoint_location)
        clear_unfinished_writes(self.spark, self.config.spark.checkpoint_location)
        started = time.monotonic()
        query = writer.queryName(f"firehose-bq-{self.config.bigquery.table}").start()
        logged = -1
        try:
            while not query.awaitTermination(POLL_SECONDS):
                logged = self._log_progress(query.recentProgress, logged)
                if stop.is_set():
                    # Let the running micro-batch finish so its offsets are committed, then stop: with the stop
                    # file the source plans nothing more, so the trigger goes idle even with a backlog.
                    try:
                        open(self._stop_file, "w").close()
                    except OSError as exc:  # a full or read-only /tmp: stop once the backlog is read, as before
                        log.warning("cannot tell the source to plan no further batch (%s): stopping once idle", exc)
                    while query.isActive and query.status.get("isTriggerActive"):
                        time.sleep(0.1)
                    query.stop()
                    break
        except StreamingQueryException as exc:
            failure = self._failure or FirehoseError(query_error(exc))
            self.summary.failure = str(failure).splitlines()[0]
            raise failure from None
        finally:
            self.summary.seconds = time.monotonic() - started
            self._log_progress(query.recentProgress, logged)  # batches that ended with the query
        return self.summary

    def _log_progress(self, progress: list[Any], logged: int) -> int:
        """One line per micro-batch from Spark's progress reports newer than batch `logged`: the lag
        (records on the broker, as seen when the batch was planned, that it did not read). Messages and
        their rate are the batch's own line (`_count`): Spark's input rows are none (its scan does not run,
        `_run_tasks`) or offset ranges."""
        for p in progress:
            if p.batchId <= logged or p.batchId > self._last_batch:
                continue  # seen already, or a no-data report (Spark emits those while idle)
            logged = p.batchId
            per_partition = partition_lag(p.sources)
            lag = None if per_partition is None else sum(per_partition.values())
            if per_partition is not None:
                self.summary.lag = lag
                if self.telemetry is not None:
                    self.telemetry.observe_lag(per_partition)
            log.info("batch %d: lag %s", p.batchId, "unknown" if lag is None else f"{lag} records")
        return logged

    def _spec(self, batch_id: int, hold: bool = False) -> SinkSpec:
        try:
            spec = self.schema.current()
        except FirehoseError as exc:
            # New descriptors the table cannot take (e.g. a type change): stop before writing.
            self._failure = FirehoseError(f"batch {batch_id} stopped, offsets not committed: {exc}")
            raise self._failure from exc
        return dataclasses.replace(spec, hold_on_unknown_fields=hold, write=self._write_rows)

    def _tasks(self, df: DataFrame, batch_id: int, spec: SinkSpec, resume: Resume | None = None) -> list[TaskResult]:
        try:
            args = (spec, self.mode.task(batch_id), self._handling, logs.for_workers(batch_id=batch_id), self._reader,
                    resume)
            return [TaskResult.from_json(result) for result in self._run_tasks(df, args)]
        except Exception as exc:
            # A task died (source unreachable, a bug): Spark's error wraps the worker's traceback in
            # pages of JVM frames; keep the worker's own last line as the reason.
            self.mode.abort(batch_id)
            self._failure = FirehoseError(f"batch {batch_id} failed, offsets not committed: {worker_error(exc)}")
            raise self._failure from exc

    def _run_tasks(self, df: DataFrame, args: tuple[Any, ...]) -> list[str]:
        """Each task's result (JSON): one task per input partition the source planned, each running `args`'s
        batch core over its ranges. Those come straight from the micro-batch's plan into an RDD of one
        partition per task, so each task runs in one Python worker; where Spark's plan does not show them
        (another Spark version), the source's scan hands them to the tasks (`mapInArrow`), one Python
        worker more per task."""
        planned = planned_partitions(df)
        if planned is None:
            if not self._scan_warned:
                self._scan_warned = True
                log.warning("this Spark version's micro-batch plan does not show the source's planned ranges: "
                            "each task gets them through the source's scan, a Python worker more per task")
            return [row.result for row in df.mapInArrow(functools.partial(run_task, *args), RESULT_SCHEMA).collect()]
        groups = [part.ranges for part in planned]
        if not groups:
            return []
        rdd = self.spark.sparkContext.parallelize(groups, len(groups))
        return rdd.mapPartitions(functools.partial(run_groups, *args)).collect()

    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        with logs.log_context(batch_id=batch_id):
            self._batch(df, batch_id)

    def _batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self._last_batch = batch_id
        hold = self._refresh is not None and time.monotonic() >= self._accept_unknown_until
        results = self._tasks(df, batch_id, self._spec(batch_id, hold))
        held = [r.held for r in results if r.held]
        if held:
            # Some task met fields (or a Confluent schema id) its descriptors lack and stopped before that
            # source batch: refresh, then run again from where each held task stopped. What the first run
            # settled stays settled (its rows, letters and staged files count), so nothing is written twice,
            # whatever the write mode.
            assert self._refresh is not None
            changed = self._refresh(held[0])
            log.info("batch %d: %s; registry refresh %s", batch_id, held[0],
                     "brought new descriptors" if changed else f"brought nothing new: {self._held_fate(held)}")
            if not changed:
                interval = self.config.registry.unknown_fields_refresh_min_interval_ms / 1000
                self._accept_unknown_until = time.monotonic() + interval
            resume = {(topic, partition): offset for r in results for topic, partition, offset in r.resume}
            settled = [dataclasses.replace(r, held=None, resume=[]) for r in results]
            results = settled + self._tasks(df, batch_id, self._spec(batch_id), resume)
        stats = batch_stats(results)
        self._count(batch_id, stats, time.monotonic() - started)
        step = time.monotonic()
        try:
            settle(self.mode, batch_id, results, stats, planned_ranges(results))
        except FirehoseError as exc:
            self._failure = exc
            self._observe(stats, started, ok=False)
            raise
        if self.telemetry is not None:
            self.telemetry.observe_driver_step(self.mode.name, time.monotonic() - step)
        self._observe(stats, started, ok=True)

    def _observe(self, stats: BatchStats, started: float, ok: bool) -> None:
        if self.telemetry is None:
            return
        self.telemetry.observe_batch(stats, time.monotonic() - started, ok, stats.write_seconds)
        if self._registry_stats is not None:
            cache = self._registry_stats()
            self.telemetry.observe_refreshes(cache.fetches, cache.failures, cache.changes)
        self.telemetry.observe_table_updates(self.schema.table_updates)

    def _count(self, batch_id: int, stats: BatchStats, elapsed: float) -> None:
        self.summary.batches += 1
        self.summary.largest_batch = max(self.summary.largest_batch, stats.messages)
        self.summary.totals.merge(stats)
        log.info("batch %d: %d messages, %d rows written, %d dead-lettered, %d failed, %d retried, %.1f s "
                 "(%.0f messages/s)", batch_id, stats.messages, stats.rows_written, stats.dead_lettered, stats.failed,
                 stats.retried, elapsed, stats.messages / max(elapsed, 1e-9))
        if stats.unknown_fields:
            log.warning("batch %d: %d message(s) carry fields that no known descriptor version has: %s",
                        batch_id, stats.unknown_fields, self._unknown_fate())

    def _held_fate(self, held: list[str]) -> str:
        """What becomes of the records a batch held for (core.py `_held`: unknown fields, unknown schema ids)
        when the refresh brought nothing new."""
        fates = [self._unknown_fate()] if any(h.startswith(UNKNOWN_FIELDS_AT) for h in held) else []
        if any(h.startswith(UNKNOWN_SCHEMA_ID) for h in held):
            fates.append("schema ids still unknown: DESERIALIZATION_ERROR")
        if any(h.startswith(UNKNOWN_ENUM_NUMBER_AT) for h in held):
            fates.append("enum numbers still unnamed: written as their decimal text")
        return "; ".join(fates)

    def _unknown_fate(self) -> str:
        """What becomes of fields no descriptor knows, for the log lines about them."""
        # A changelog never merges on a key cut short (batch/rows.py), whatever the settings below say.
        keys = "; in a key: UNKNOWN_FIELDS_ERROR (upsert/delete)" if self.config.upsert.enabled else ""
        # JSON input's columns come from its table's schema file, protobuf's from the registry.
        fix = ("add the columns to the table or its schema file" if self.config.input_schema.data_type == "JSON"
               else "publish the new proto to the registry")
        if self.config.bigquery.additional_properties:
            return f"their values are kept in additional_properties ({fix}){keys}"
        if self._handling.policy.allow_unknown_fields:
            return f"written without them ({fix}, then replay to fill them){keys}"
        return "UNKNOWN_FIELDS_ERROR"


def partition_lag(sources: list[Any]) -> dict[tuple[str, int], int] | None:
    """Records between each source's end offset and the broker's latest offset, per topic partition;
    None when a source does not report its latest offset. Offsets are the source's JSON
    `{topic: {partition: n}}`."""
    lag: dict[tuple[str, int], int] = {}
    for source in sources:
        if not source.latestOffset or source.latestOffset == "null":
            return None
        end, latest = json.loads(source.endOffset), json.loads(source.latestOffset)
        for topic, parts in latest.items():
            for partition, offset in parts.items():
                lag[(topic, int(partition))] = max(0, offset - end.get(topic, {}).get(partition, 0))
    return lag
