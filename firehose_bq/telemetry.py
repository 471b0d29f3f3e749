"""Metrics a dashboard or an alert can read: Prometheus on the driver, and/or StatsD as Firehose sends.

Everything is counted on the driver from what the tasks report (TaskResult): the tasks never talk to
a metrics backend, so a Spark cluster needs nothing more than the driver's port (or its StatsD agent).
The names below are the contract the Grafana dashboard in `dashboards/` queries and README's tables
list (tests check both); `firehose_bq_` is their prefix. StatsD gets the per-batch counts as
`firehose_bq.<name>`, under names of its own (`_StatsD.send` calls in `observe_*`).

Counters follow the run summary exactly: at any moment `messages_total{outcome}` summed over outcomes
is the messages read, and the summary's counts equal these counters at the end of a run.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from firehose_bq.metrics import BatchStats
from firehose_bq.settings import setting

log = logging.getLogger(__name__)

PREFIX = "firehose_bq"
# Seconds: a micro-batch takes from a fraction of a second (streaming) to minutes (file loads, MERGE).
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
# Seconds: one BigQuery write call (insertAll request batch, AppendRows, staging a file).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class MetricsConfig:
    prometheus_port: int = setting(
        "METRIC_PROMETHEUS_PORT",
        "Serve Prometheus metrics at http://<driver>:PORT/metrics; -1 = off, 0 = any free port (logged).",
        -1, minimum=-1, maximum=65535,
    )
    statsd_host: str = setting(
        "METRIC_STATSD_HOST", "Send the same metrics to this StatsD agent (Firehose's setting); empty = off.", ""
    )
    statsd_port: int = setting("METRIC_STATSD_PORT", "Port of the StatsD agent.", 8125, minimum=1, maximum=65535)
    statsd_tags: str = setting(
        "METRIC_STATSD_TAGS", "Tags added to every StatsD metric, `key=value,key=value` (DogStatsD format).", ""
    )


_M = TypeVar("_M", Counter, Gauge, Histogram)


@dataclass(frozen=True)
class MetricInfo:
    """One Prometheus metric the job exports, as README's metrics table lists it."""

    name: str  # as exported
    kind: str  # counter, gauge or histogram
    labels: tuple[str, ...]  # besides `job`, which every metric has
    doc: str


def reference_markdown() -> str:
    """README's Prometheus metrics table (`make readme` pastes it between the metrics-reference markers)."""
    rows = [f"| `{m.name}` | {m.kind} | {', '.join(f'`{label}`' for label in m.labels) or '-'} | {m.doc} |"
            for m in Telemetry(MetricsConfig(), "job").metrics]
    return "\n".join(["| Metric | Type | Labels | Meaning |", "| --- | --- | --- | --- |", *rows])


class _StatsD:
    """Fire-and-forget StatsD over UDP with DogStatsD tags: a lost datagram loses a sample, never a message."""

    def __init__(self, host: str, port: int, tags: str) -> None:
        self._address = (host, port)
        self._tags = [t.strip().replace("=", ":", 1) for t in tags.split(",") if t.strip()]
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(self, name: str, value: float, kind: str, tags: Mapping[str, str] | None = None) -> None:
        labels = self._tags + [f"{k}:{v}" for k, v in (tags or {}).items()]
        line = f"{PREFIX}.{name}:{value:g}|{kind}" + (f"|#{','.join(labels)}" if labels else "")
        try:
            self._socket.sendto(line.encode(), self._address)
        except OSError as exc:  # an agent that is down must not stop the sink
            log.debug("statsd send failed: %s", exc)

    def close(self) -> None:
        self._socket.close()


class Telemetry:
    """The job's (or a replay's) metrics; `observe_*` are called by the driver after each batch."""

    def __init__(self, config: MetricsConfig, job: str) -> None:
        self.config = config
        self.port: int | None = None
        self.registry = CollectorRegistry()
        self._job = job
        self.metrics: list[MetricInfo] = []
        self.messages = self._add(Counter, "messages", "Messages read, by where they ended (written, dlq, failed, "
                                  "fallback) and destination table (empty: none was found)", "outcome", "table")
        self.read = self._add(Counter, "messages_read", "Messages read from Kafka")
        self.rows = self._add(Counter, "rows_written", "Rows written to BigQuery, by table", "table")
        self.retried = self._add(Counter, "messages_retried", "Messages sent again at least once")
        self.errors = self._add(Counter, "errors", "Messages that were not written, by error type and where they "
                                "ended (dlq, failed)", "error_type", "outcome")
        self.unknown = self._add(Counter, "unknown_fields_messages", "Messages written carrying fields their "
                                 "descriptors lack (dropped, or kept in additional_properties)")
        self.batches = self._add(Counter, "batches", "Micro-batches settled, by result (ok, failed)", "result")
        self.batch_seconds = self._add(Histogram, "batch_duration_seconds", "Micro-batch duration, tasks and the "
                                       "driver step", buckets=BATCH_BUCKETS)
        self.rate = self._add(Gauge, "batch_messages_per_second", "Messages per second of the last micro-batch")
        self.lag = self._add(Gauge, "consumer_lag", "Records on the broker not yet read, per partition (as seen "
                             "when the last micro-batch was planned)", "topic", "partition")
        self.requests = self._add(Histogram, "bigquery_write_seconds", "Duration of one BigQuery write call from a "
                                  "task, per write path", "path", buckets=REQUEST_BUCKETS)
        self.driver_steps = self._add(Histogram, "driver_step_seconds", "The write mode's driver step per batch "
                                      "(load jobs, MERGE)", "mode", buckets=BATCH_BUCKETS)
        self.refreshes = self._add(Counter, "schema_refreshes", "Descriptor fetches, by result (changed, "
                                   "unchanged, failed)", "result")
        self.table_updates = self._add(Counter, "table_updates", "Tables created or evolved by the driver")
        self.replayed = self._add(Counter, "dlq_replay_messages", "Dead letters replayed, by where they ended",
                                  "outcome")
        self._statsd = _StatsD(config.statsd_host, config.statsd_port, config.statsd_tags) \
            if config.statsd_host else None
        self._refresh_seen = (0, 0, 0)
        self._tables_seen = 0

    def _add(self, kind: type[_M], name: str, doc: str, *labels: str, buckets: tuple[float, ...] = ()) -> _M:
        """A metric of this registry, labelled by `job` and `labels`, and listed in `self.metrics`."""
        extra = {"buckets": buckets} if buckets else {}
        metric = kind(f"{PREFIX}_{name}", doc, ["job", *labels], registry=self.registry, **extra)
        # Prometheus exports a counter as `<name>_total` (and a histogram as `_bucket`, `_sum`, `_count`).
        exported = f"{PREFIX}_{name}_total" if kind is Counter else f"{PREFIX}_{name}"
        self.metrics.append(MetricInfo(exported, kind.__name__.lower(), labels, doc))
        return metric

    def start(self) -> Telemetry:
        if self.config.prometheus_port >= 0:
            server, _thread = start_http_server(self.config.prometheus_port, addr="0.0.0.0", registry=self.registry)
            self.port = server.server_port
            self._server = server
            log.info("Prometheus metrics at http://0.0.0.0:%d/metrics", self.port)
        return self

    def close(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._statsd is not None:
            self._statsd.close()

    # --- what the driver observes -------------------------------------------------------------------

    def observe_batch(self, stats: BatchStats, seconds: float, ok: bool,
                      write_seconds: Mapping[str, Iterable[float]] = {}) -> None:
        job = self._job
        self.read.labels(job).inc(stats.messages)
        self.retried.labels(job).inc(stats.retried)
        self.unknown.labels(job).inc(stats.unknown_fields)
        for table, counts in stats.tables.items():
            self.rows.labels(job, table).inc(counts["written"])
            for outcome, key in (("written", "written"), ("dlq", "dlq"), ("failed", "failed")):
                self.messages.labels(job, outcome, table).inc(counts[key])
        untabled = self._untabled(stats)
        for outcome, count in untabled.items():
            self.messages.labels(job, outcome, "").inc(count)
        if untabled.get("written"):
            self.rows.labels(job, "").inc(untabled["written"])
        for (error_type, outcome), count in stats.errors_by_outcome.items():
            self.errors.labels(job, error_type, outcome).inc(count)
        self.batches.labels(job, "ok" if ok else "failed").inc()
        self.batch_seconds.labels(job).observe(seconds)
        self.rate.labels(job).set(stats.messages / seconds if seconds > 0 else 0.0)
        for path, samples in write_seconds.items():
            for sample in samples:
                self.requests.labels(job, path).observe(sample)
        if self._statsd is not None:
            self._statsd.send("messages_read", stats.messages, "c")
            self._statsd.send("rows_written", stats.rows_written, "c")
            self._statsd.send("messages_dead_lettered", stats.dead_lettered, "c")
            self._statsd.send("messages_failed", stats.failed, "c")
            self._statsd.send("messages_fallback", stats.fallback, "c")  # so read = the four outcomes
            self._statsd.send("messages_retried", stats.retried, "c")
            for error_type, count in stats.errors_by_type.items():
                self._statsd.send("errors", count, "c", {"error_type": error_type})
            self._statsd.send("batch_duration_ms", seconds * 1000, "ms")

    @staticmethod
    def _untabled(stats: BatchStats) -> dict[str, int]:
        """Outcomes of messages no table was named for (the job's one table, unrouted ones, decode-only)."""
        tabled = {k: sum(c[k] for c in stats.tables.values()) for k in ("written", "dlq", "failed")}
        out = {"written": stats.rows_written - tabled["written"], "dlq": stats.dead_lettered - tabled["dlq"],
               "failed": stats.failed - tabled["failed"], "fallback": stats.fallback}
        return {k: v for k, v in out.items() if v}

    def observe_driver_step(self, mode: str, seconds: float) -> None:
        self.driver_steps.labels(self._job, mode).observe(seconds)

    def observe_lag(self, lag: Mapping[tuple[str, int], int]) -> None:
        for (topic, partition), records in lag.items():
            self.lag.labels(self._job, topic, str(partition)).set(records)
            if self._statsd is not None:
                self._statsd.send("consumer_lag", records, "g", {"topic": topic, "partition": str(partition)})

    def observe_refreshes(self, fetches: int, failures: int, changes: int) -> None:
        """The registry cache's totals so far; counted as deltas since the last call."""
        seen_fetches, seen_failures, seen_changes = self._refresh_seen
        job = self._job
        self.refreshes.labels(job, "changed").inc(changes - seen_changes)
        self.refreshes.labels(job, "failed").inc(failures - seen_failures)
        self.refreshes.labels(job, "unchanged").inc(
            (fetches - seen_fetches) - (changes - seen_changes) - (failures - seen_failures))
        self._refresh_seen = (fetches, failures, changes)

    def observe_table_updates(self, total: int) -> None:
        """The driver's tables created or evolved so far; counted as the delta since the last call."""
        self.table_updates.labels(self._job).inc(total - self._tables_seen)
        self._tables_seen = total

    def observe_replay(self, stats: BatchStats) -> None:
        job = self._job
        for outcome, count in (("written", stats.rows_written), ("dlq", stats.dead_lettered),
                               ("failed", stats.failed), ("fallback", stats.fallback)):
            self.replayed.labels(job, outcome).inc(count)
        if self._statsd is not None:
            self._statsd.send("dlq_replay_messages", stats.messages, "c")
