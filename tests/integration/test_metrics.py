"""The metrics endpoint and StatsD agree with the run summary and with BigQuery, on the real local stack.

A routed job (three tables and a fallback topic) reads the sample events with bad ones among them, in
several micro-batches, serving Prometheus on a free port and sending StatsD to a UDP socket of the test's.
`/metrics` is scraped over HTTP after every micro-batch has been counted (the run is going: the batch's
offsets are not even committed yet) and once after the run returns, while the endpoint is still up, as
`firehose-bq run` prints its summary before it closes the endpoint.
"""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.cloud import bigquery
from prometheus_client.parser import text_string_to_metric_families

from firehose_bq import sample
from firehose_bq.config import Config
from firehose_bq.errors import ErrorType
from firehose_bq.metrics import BatchStats
from firehose_bq.pipeline import Pipeline
from firehose_bq.sink_schema import load_descriptors
from firehose_bq.telemetry import Telemetry
from tests.integration.test_dead_letters import read_blobs
from tests.integration.test_routing import TABLES, landed_events, routed_env

pytestmark = pytest.mark.integration

COUNT = 240
PER_TRIGGER = 60  # four or more micro-batches

# Sample event i replaced by a bad one of its own type (so it is routed to that type's table), and the
# error it must be dead-lettered with.
BAD: dict[int, ErrorType] = {
    4: ErrorType.DESERIALIZATION_ERROR,  # ride.completed: bytes that do not parse
    90: ErrorType.UNKNOWN_FIELDS_ERROR,  # ride.requested: a field no descriptor has
    150: ErrorType.INVALID_MESSAGE_ERROR,  # ride.requested: a Timestamp's nanos out of range
    200: ErrorType.DESERIALIZATION_ERROR,  # payment.captured
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def bad_events(cfg: Config) -> Callable[[int], sample.Record]:
    pool = load_descriptors(cfg)
    classes = {short: pool.message_class(f"firehose.example.v1.{short}") for short in sample.EVENT_TYPES.values()}
    good = sample.event_messages(classes)

    def make(i: int) -> sample.Record:
        key, value, headers = good(i)
        kind = BAD.get(i)
        if kind is ErrorType.DESERIALIZATION_ERROR:
            value = b"\xff\xff\xff\xff\xff"
        elif kind is ErrorType.UNKNOWN_FIELDS_ERROR:
            value = (value or b"") + b"\xc0\x3e\x01"  # field 1000, varint 1
        elif kind is ErrorType.INVALID_MESSAGE_ERROR:
            assert sample.event_type(i) == "ride.requested"
            msg = classes["RideRequested"].FromString(value)
            msg.requested_at.nanos = -5  # type: ignore[attr-defined]
            value = msg.SerializeToString()
        return key, value, headers

    return make


def scrape(port: int) -> Samples:
    """Every sample `/metrics` serves, by name and labels (without `job`)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def by_label(samples: Samples, name: str, label: str, **labels: str) -> dict[str, float]:
    out: Counter[str] = Counter()
    for (n, ls), v in samples.items():
        if n == name and set(labels.items()) <= set(ls) and v:
            out[dict(ls)[label]] += v
    return dict(out)


def assert_counters_equal(samples: Samples, totals: BatchStats, batches: int) -> None:
    """The scraped counters say what the run summary's totals say."""
    assert total(samples, "firehose_bq_messages_read_total") == totals.messages
    assert total(samples, "firehose_bq_messages_total") == totals.messages  # each message ended once
    assert by_label(samples, "firehose_bq_rows_written_total", "table") == {
        t: c["written"] for t, c in totals.tables.items() if c["written"]}
    for outcome in ("written", "dlq", "failed"):
        assert by_label(samples, "firehose_bq_messages_total", "table", outcome=outcome) == {
            t: c[outcome] for t, c in totals.tables.items() if c[outcome]}, outcome
    assert total(samples, "firehose_bq_messages_total", outcome="fallback", table="") == totals.fallback
    assert by_label(samples, "firehose_bq_errors_total", "error_type", outcome="dlq") == {
        error_type: n for (error_type, outcome), n in totals.errors_by_outcome.items() if outcome == "dlq" and n}
    assert total(samples, "firehose_bq_errors_total", outcome="failed") == totals.failed
    assert total(samples, "firehose_bq_messages_retried_total") == totals.retried
    assert total(samples, "firehose_bq_unknown_fields_messages_total") == totals.unknown_fields
    assert total(samples, "firehose_bq_batches_total", result="ok") == batches
    assert total(samples, "firehose_bq_batch_duration_seconds_count") == batches


@dataclass(frozen=True)
class Seen:
    """One mid-run scrape and the summary's counts at that moment."""

    samples: Samples
    totals: BatchStats
    batches: int


class ScrapedTelemetry(Telemetry):
    """The job's telemetry, scraped over HTTP right after each micro-batch is counted into it."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg.metrics, cfg.spark.app_name)  # as `firehose-bq run` makes it
        self.pipeline: Pipeline | None = None  # whose summary each scrape is compared with
        self.seen: list[Seen] = []

    def observe_batch(self, stats: BatchStats, seconds: float, ok: bool,
                      write_seconds: Mapping[str, Iterable[float]] = {}) -> None:
        super().observe_batch(stats, seconds, ok, write_seconds)
        assert self.port is not None and self.pipeline is not None
        summary = self.pipeline.summary
        totals = BatchStats.from_json(summary.totals.to_json())  # a copy: the summary keeps counting
        self.seen.append(Seen(scrape(self.port), totals, summary.batches))


def statsd_totals(server: socket.socket) -> tuple[Counter[str], int]:
    """Counter sums by `name` or `name#tags` of every datagram received, and how many batch timings came."""
    server.setblocking(False)
    sums: Counter[str] = Counter()
    timings = 0
    while True:
        try:
            line = server.recv(4096).decode()
        except BlockingIOError:  # the job sent each datagram before its batch returned: all are here
            return sums, timings
        metric, _, tags = line.partition("|#")
        name, value_kind = metric.split(":", 1)
        value, kind = value_kind.split("|")
        if kind == "ms":
            timings += 1
        if kind != "c":
            continue
        tag = ",".join(t for t in tags.split(",") if t.startswith("error_type:"))
        sums[f"{name}#{tag}" if tag else name] += float(value)


def test_metrics_equal_the_run_summary_and_bigquery_mid_run_and_at_the_end(
        spark, job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path) -> None:
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    cfg = Config.from_env(routed_env(
        job_env, METRIC_PROMETHEUS_PORT="0", METRIC_STATSD_HOST="127.0.0.1",
        METRIC_STATSD_PORT=str(agent.getsockname()[1]), METRIC_STATSD_TAGS="env=it",
        SPARK_MAX_OFFSETS_PER_TRIGGER=str(PER_TRIGGER), INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false",
        DLQ_SINK_ENABLE="true", DLQ_WRITER_TYPE="BLOB", DLQ_BLOB_LOCAL_DIRECTORY=str(tmp_path / "dlq")))
    sample.ensure_topic(cfg.source.brokers, cfg.source.topics[0], 2)
    sample.ensure_topic(cfg.source.brokers, cfg.bigquery.route_fallback_topic, 1)
    sample.produce(cfg.source.brokers, cfg.source.topics[0], bad_events(cfg), COUNT, progress=False)
    telemetry = ScrapedTelemetry(cfg)
    try:
        telemetry.start()
        pipeline = telemetry.pipeline = Pipeline(cfg, spark, telemetry=telemetry)
        summary = pipeline.run(available_now=True)
        assert telemetry.port
        final = scrape(telemetry.port)
    finally:
        telemetry.close()
        bq_landed = landed_events(bq_client, cfg)
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
    statsd, timings = statsd_totals(agent)
    agent.close()

    # What the run must have done, from the input alone.
    dataset = cfg.bigquery.dataset
    unrouted = sum(1 for i in range(COUNT) if sample.event_type(i) == sample.UNROUTED_TYPE)
    written = Counter(f"{dataset}.{TABLES[sample.event_type(i)]}" for i in range(COUNT)
                      if sample.event_type(i) in TABLES and i not in BAD)
    dead = Counter(f"{dataset}.{TABLES[sample.event_type(i)]}" for i in BAD)
    assert len(dead) == len(TABLES)  # every table has a dead letter
    t = summary.totals
    assert (t.messages, t.rows_written, t.dead_lettered, t.fallback, t.failed) == (
        COUNT, sum(written.values()), len(BAD), unrouted, 0)
    assert {name: c["written"] for name, c in t.tables.items()} == written
    assert {name: c["dlq"] for name, c in t.tables.items() if c["dlq"]} == dead
    assert dict(t.errors_by_type) == dict(Counter(k.value for k in BAD.values()))
    assert {f"{dataset}.{table}": n for table, n in bq_landed.items()} == written
    letters = read_blobs(tmp_path / "dlq")
    assert Counter(x.error.error_type.value for x in letters) == t.errors_by_type

    # At the end the endpoint says exactly what the summary says (and so BigQuery and the DLQ).
    assert summary.batches >= 4
    assert_counters_equal(final, t, summary.batches)
    assert by_label(final, "firehose_bq_rows_written_total", "table") == {
        f"{dataset}.{table}": n for table, n in bq_landed.items()}
    assert total(final, "firehose_bq_batches_total", result="failed") == 0
    if summary.lag is not None:
        assert total(final, "firehose_bq_consumer_lag") == summary.lag == 0

    # Mid-run: one scrape per micro-batch, each equal to the summary then, partial and growing.
    assert [s.batches for s in telemetry.seen] == list(range(1, summary.batches + 1))
    for seen in telemetry.seen:
        assert_counters_equal(seen.samples, seen.totals, seen.batches)
    read = [total(s.samples, "firehose_bq_messages_read_total") for s in telemetry.seen]
    assert 0 < read[0] < COUNT and read[-1] == COUNT
    assert all(a <= b for a, b in zip(read, read[1:])) and len(set(read)) > 1
    for name in ("firehose_bq_messages_total", "firehose_bq_errors_total", "firehose_bq_rows_written_total"):
        for before, after in zip(telemetry.seen, telemetry.seen[1:]):
            grown = {k: v for k, v in after.samples.items() if k[0] == name}
            assert all(grown.get(k, 0) >= v for k, v in before.samples.items() if k[0] == name), name

    # StatsD got the same counts.
    assert statsd["firehose_bq.messages_read"] == t.messages
    assert statsd["firehose_bq.rows_written"] == t.rows_written
    assert statsd["firehose_bq.messages_dead_lettered"] == t.dead_lettered
    assert statsd["firehose_bq.messages_failed"] == t.failed == 0
    assert statsd["firehose_bq.messages_fallback"] == t.fallback
    assert statsd["firehose_bq.messages_read"] == sum(statsd[f"firehose_bq.{name}"] for name in (
        "rows_written", "messages_dead_lettered", "messages_failed", "messages_fallback"))
    assert {k.split("#error_type:")[1]: v for k, v in statsd.items() if "#error_type:" in k and v} == \
        dict(t.errors_by_type)
    assert timings == summary.batches
