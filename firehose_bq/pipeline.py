"""The streaming job: Kafka source → decode + convert → write to BigQuery → commit.

Each micro-batch runs `write_partition` in the Python workers, one task per Kafka partition: the
rows are written from there, and only a small stats record per task comes back to the driver. The
driver's `foreachBatch` handler returns normally only when every message of the batch is in BigQuery;
otherwise it raises, Spark does not commit the batch, and a restart replays it (at-least-once).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.writers import RowWriter, open_writer
from firehose_bq.config import Config
from firehose_bq.convert import JSON, STORAGE, KafkaRecords, RowConverter
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.writers import dead_letter
from firehose_bq.errors import BatchFailedError, DeadLetterError, FirehoseError, SinkError
from firehose_bq.metrics import BatchStats, RunSummary
from firehose_bq.policy import ErrorHandling, apply_policy
from firehose_bq.sink_schema import DescriptorSource, SinkSchema, SinkSpec
from firehose_bq.source.kafka_source import FORMAT_NAME
from firehose_bq.upsert.writer import ChangelogTask

log = logging.getLogger(__name__)

# `staged`: with file loads, the file a task staged for the driver's load job (file_loads.StagedFile JSON).
STATS_SCHEMA = "stats STRING, fatal STRING, held STRING, staged STRING"
# How often the run loop looks at the stop flag and the query's state.
POLL_SECONDS = 0.5


def write_partition(spec: SinkSpec, batches: Iterator[pa.RecordBatch],
                    handling: ErrorHandling = ErrorHandling(),
                    changelog: ChangelogTask | None = None) -> Iterator[pa.RecordBatch]:
    """Decode, convert and write one task's records, failed ones as `handling` says; yield a stats row.

    With `changelog` (upsert/delete), records are read as a changelog and staged in the run's
    intermediate table instead of the destination; the driver merges them after the batch."""
    key_class = spec.descriptors.message_class(spec.key_class) if spec.key_class else None
    # The Storage Write API takes proto-native values (micros, days, raw bytes); the others take JSON's.
    # Staged changelog rows always go by insertAll: the MERGE must see them as soon as the task ends.
    encoding = STORAGE if spec.bigquery.effective_write_method == "storage_write" and not changelog else JSON
    converter = RowConverter(spec.descriptors.message_class(spec.proto_class), spec.metadata, spec.options,
                             key_class, detect_unknown_fields=True, confluent_framed=spec.confluent_framed,
                             changelog=changelog is not None, encoding=encoding)
    wanted = set(spec.metadata.columns) if spec.metadata.enabled else set()
    writer: RowWriter | None = None
    stats = BatchStats()
    fatal = held = staged = None
    letters: list[DeadLetter] = []

    def current_writer() -> RowWriter:
        nonlocal writer
        writer = writer or (changelog.open_writer(spec.bigquery) if changelog else open_writer(spec.bigquery))
        return writer

    try:
        for batch in batches:
            records = kafka_records(batch, keys=key_class is not None or handling.keeps_records, wanted=wanted,
                                    all_headers=handling.keeps_records)
            load_time = _now()
            converted = converter.convert(records, load_time=load_time)
            if converted.unknown_fields and spec.hold_on_unknown_fields:
                i = converted.unknown_fields[0]
                held = f"{records.topics[i]}/{records.partitions[i]}@{records.offsets[i]}"
                break
            stats.messages += len(records)
            if handling.policy.allow_unknown_fields:
                stats.unknown_fields += len(converted.unknown_fields)
            if changelog:
                converted = changelog.stage(converted, records, load_time)
            letters.extend(apply_policy(handling, converted, records, current_writer if spec.write else None, stats))
        if held is None:
            # Only now: a held batch is written again after the refresh, and must not be dead-lettered twice.
            dead_letter(handling.dlq, letters)
    except (SinkError, DeadLetterError) as exc:
        # Reported as data so the driver can show one clean reason; the batch is not committed.
        fatal = str(exc)
    finally:
        if writer is not None:
            writer.close()  # Spark reuses Python workers: an unclosed client per task would pile up
            staged = file_loads.staged_json(writer)
    yield pa.RecordBatch.from_pydict({"stats": [stats.to_json()], "fatal": [fatal], "held": [held],
                                      "staged": [staged]})


def kafka_records(batch: pa.RecordBatch, *, keys: bool, wanted: set[str], all_headers: bool = False) -> KafkaRecords:
    """The source's Arrow batch as KafkaRecords; optional columns only when something uses them."""

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist()

    return KafkaRecords(
        topics=column("topic"),
        partitions=column("partition"),
        offsets=column("offset"),
        timestamps_ms=_millis(batch.column("timestamp")),
        values=column("value"),
        keys=column("key") if keys else None,
        headers=([[(h["key"], h["value"]) for h in hs] for hs in column("headers")]
                 if "message_headers" in wanted or all_headers else None),
        timestamp_types=column("timestamp_type") if "message_timestamp_type" in wanted else None,
        leader_epochs=column("leader_epoch") if "message_leader_epoch" in wanted else None,
    )


def _millis(column: pa.Array) -> list[int | None]:
    micros = column.cast(pa.int64()).to_pylist()  # the source's timestamp[us, UTC]
    return [None if m is None else m // 1000 for m in micros]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Pipeline:
    """One configured streaming job: `prepare()` checks descriptors and tables, `run()` streams."""

    def __init__(self, config: Config, spark: SparkSession, descriptor_source: DescriptorSource | None = None,
                 refresh: Callable[[str], bool] | None = None, write: bool = True) -> None:
        """`refresh(reason)` asks the registry for new descriptors now (True if they changed); it is
        called when a batch holds fields the descriptors lack, before that batch is written."""
        self.config = config
        self.spark = spark
        self.upsert = None
        if config.upsert.enabled:  # changelog: rows go through an intermediate table and a MERGE per batch
            from firehose_bq.upsert.flush import UpsertSession

            self.upsert = UpsertSession(config, descriptor_source)
        self.schema = self.upsert.schema if self.upsert else SinkSchema(config, descriptor_source)
        self.summary = RunSummary()
        self._refresh = refresh
        self._write_rows = write  # False: decode and convert only (benchmarks)
        # After a refresh that did not explain the unknown fields, write such messages as they are
        # until this moment: a producer ahead of its registry must not cost a re-run per batch.
        self._accept_unknown_until = 0.0
        self._failure: Exception | None = None
        self._handling = ErrorHandling(config.errors, config.dlq.with_brokers(config.source.brokers))

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
            .option("max_offsets_per_trigger", str(self.upsert.max_offsets_per_trigger if self.upsert
                                                   else self.config.spark.max_offsets_per_trigger))
            .option("stall_timeout_ms", str(src.stall_timeout_ms))
            .option("client", src.client)
            .load()
        )

    def run(self, *, available_now: bool, stop: threading.Event | None = None) -> RunSummary:
        """Stream until the topic is drained (available_now) or `stop` is set; raise on failure."""
        try:
            return self._run(available_now=available_now, stop=stop)
        finally:
            if self.upsert:
                self.upsert.close()  # drops this run's intermediate table

    def _run(self, *, available_now: bool, stop: threading.Event | None) -> RunSummary:
        self.prepare()
        stop = stop or threading.Event()
        writer = self.source().writeStream.foreachBatch(self._on_batch).option(
            "checkpointLocation", self.config.spark.checkpoint_location
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self._trigger_interval_ms()} milliseconds")
        started = time.monotonic()
        query = writer.queryName(f"firehose-bq-{self.config.bigquery.table}").start()
        logged = -1
        try:
            while not query.awaitTermination(POLL_SECONDS):
                logged = self._log_progress(query.recentProgress, logged)
                if stop.is_set():
                    # Let the running micro-batch finish so its offsets are committed, then stop.
                    while query.isActive and query.status.get("isTriggerActive"):
                        time.sleep(0.1)
                    query.stop()
                    break
        except StreamingQueryException as exc:
            failure = self._failure or FirehoseError(worker_error(exc))
            self.summary.failure = str(failure).splitlines()[0]
            raise failure from None
        finally:
            self.summary.seconds = time.monotonic() - started
            self._log_progress(query.recentProgress, logged)  # batches that ended with the query
        return self.summary

    def _file_loads(self) -> bool:
        # Upserts write through their own intermediate table and MERGE, whatever the write method.
        return self._write_rows and not self.upsert and self.config.bigquery.effective_write_method == "file_loads"

    def _trigger_interval_ms(self) -> int:
        if self.upsert:
            return self.upsert.trigger_interval_ms
        # File loads: one load job per table per trigger, so the trigger is paced by the load-job quota.
        if self._file_loads():
            return self.config.bigquery.file_loads_trigger_ms
        return self.config.spark.trigger_interval_ms

    def _log_progress(self, progress: list[Any], logged: int) -> int:
        """One line per micro-batch from Spark's progress reports newer than batch `logged`: rows/s and
        the lag (records on the broker, as seen when the batch was planned, that it did not read)."""
        for p in progress:
            if p.batchId <= logged or not p.numInputRows:
                continue  # seen already, or a no-data report (Spark emits those while idle)
            logged = p.batchId
            lag = source_lag(p.sources)
            if lag is not None:
                self.summary.lag = lag
            log.info("batch %d progress: %d rows at %.0f rows/s, lag %s", p.batchId, p.numInputRows,
                     p.processedRowsPerSecond, "unknown" if lag is None else f"{lag} records")
        return logged

    def _spec(self, batch_id: int) -> SinkSpec:
        try:
            spec = self.schema.current()
            if self._file_loads():  # tasks stage their rows in this batch's directory
                spec = dataclasses.replace(spec, bigquery=file_loads.for_batch(
                    spec.bigquery, file_loads.staging_root(self.config), batch_id))
            return spec
        except FirehoseError as exc:
            # New descriptors the table cannot take (e.g. a type change): stop before writing.
            self._failure = FirehoseError(f"batch {batch_id} stopped, offsets not committed: {exc}")
            raise self._failure from exc

    def _write(self, df: DataFrame, batch_id: int, spec: SinkSpec) -> list[Any]:
        try:
            changelog = self.upsert.task(batch_id) if self.upsert else None
            task = functools.partial(write_partition, spec, handling=self._handling, changelog=changelog)
            return df.mapInArrow(task, STATS_SCHEMA).collect()
        except Exception as exc:
            # A task died (source unreachable, a bug): Spark's error wraps the worker's traceback in
            # pages of JVM frames; keep the worker's own last line as the reason.
            self._failure = FirehoseError(f"batch {batch_id} failed, offsets not committed: {worker_error(exc)}")
            raise self._failure from exc

    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        stats = BatchStats()
        fatal = []
        hold = self._refresh is not None and time.monotonic() >= self._accept_unknown_until
        spec = dataclasses.replace(self._spec(batch_id), hold_on_unknown_fields=hold, write=self._write_rows)
        results = self._write(df, batch_id, spec)
        held = [row.held for row in results if row.held]
        if held:
            # Some task met fields its descriptors lack and wrote nothing more: refresh, then write the
            # whole batch again (rows already written carry the same insertIds, so they are not doubled).
            assert self._refresh is not None
            changed = self._refresh(f"unknown fields in {held[0]}")
            log.info("batch %d: unknown fields at %s; registry refresh %s", batch_id, held[0],
                     "brought new descriptors" if changed else "brought nothing new: writing without them")
            if not changed:
                interval = self.config.registry.unknown_fields_refresh_min_interval_ms / 1000
                self._accept_unknown_until = time.monotonic() + interval
            results = self._write(df, batch_id, dataclasses.replace(self._spec(batch_id), write=self._write_rows))
        for row in results:
            stats.merge(BatchStats.from_json(row.stats))
            if row.fatal:
                fatal.append(row.fatal)
        elapsed = time.monotonic() - started
        self.summary.batches += 1
        self.summary.largest_batch = max(self.summary.largest_batch, stats.messages)
        self.summary.totals.merge(stats)
        log.info("batch %d: %d messages, %d rows written, %d dead-lettered, %d failed, %d retried, %.1f s "
                 "(%.0f messages/s)", batch_id, stats.messages, stats.rows_written, stats.dead_lettered, stats.failed,
                 stats.retried, elapsed, stats.messages / max(elapsed, 1e-9))
        if stats.unknown_fields:
            log.warning("batch %d: %d message(s) carry fields that no known descriptor version has; written "
                        "without them (publish the new proto to the registry, then replay to fill them)",
                        batch_id, stats.unknown_fields)
        if self._file_loads() and (fatal or stats.failed):
            file_loads.discard_batch(self.config, batch_id)  # the replay stages the rows again
        if fatal:
            self._failure = FirehoseError(f"batch {batch_id} stopped, offsets not committed: {fatal[0]}")
            raise self._failure
        if stats.failed:
            self._failure = BatchFailedError(batch_id, stats.sample_errors, stats.failed)
            raise self._failure
        if self._file_loads():
            try:
                file_loads.load_batch(self.config, batch_id, [row.staged for row in results])
            except SinkError as exc:
                self._failure = FirehoseError(f"batch {batch_id} stopped, offsets not committed: {exc}")
                raise self._failure from exc
        if self.upsert:
            # Before returning: Spark commits the batch's offsets only after its merge succeeded.
            try:
                self.upsert.flush(batch_id)
            except FirehoseError as exc:
                self._failure = exc
                raise


def source_lag(sources: list[Any]) -> int | None:
    """Records between each source's end offset and the broker's latest offset, summed; None when a
    source does not report its latest offset. Offsets are the source's JSON `{topic: {partition: n}}`."""
    total = 0
    for source in sources:
        if not source.latestOffset or source.latestOffset == "null":
            return None
        end, latest = json.loads(source.endOffset), json.loads(source.latestOffset)
        total += sum(max(0, o - end.get(t, {}).get(p, 0)) for t, parts in latest.items() for p, o in parts.items())
    return total


_PYTHON_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$")


def worker_error(exc: BaseException) -> str:
    """The last `SomeError: message` line of a Python worker's traceback inside a Spark error."""
    matches = [m for m in map(_PYTHON_ERROR_LINE.match, str(exc).splitlines()) if m]
    return f"{matches[-1].group(1)}: {matches[-1].group(2)}" if matches else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
