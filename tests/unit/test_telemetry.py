"""Metrics from the driver: counters equal the run's counts, StatsD lines, and the dashboard's names."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.metrics import BatchStats
from firehose_bq.telemetry import MetricsConfig, Telemetry, reference_markdown

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "firehose-bq.json"
README = REPO / "README.md"


def stats() -> BatchStats:
    s = BatchStats(messages=10, rows_written=6)
    dead = [MessageError(ErrorType.SINK_4XX_ERROR, "t", 0, 1, "bad")] * 2
    failed = [MessageError(ErrorType.DESERIALIZATION_ERROR, "t", 0, 2, "bad")]
    s.add_errors(dead + failed)  # as the batch core counts them: by type, then by outcome
    s.add_outcome("dlq", dead)
    s.add_outcome("failed", failed)
    s.add_outcome("fallback", 1)
    s.add_outcome("retried", 3)
    s.add_table("ds.a", messages=5, written=4, dlq=1)
    s.add_table("ds.b", messages=4, written=2, dlq=1, failed=1)
    s.add_write_seconds("storage_write", 0.02)
    return s


def samples(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "job"))): sample.value
            for metric in telemetry.registry.collect() for sample in metric.samples}


def test_counters_follow_the_batch_counts() -> None:
    t = Telemetry(MetricsConfig(), "job")
    t.observe_batch(stats(), 2.0, ok=True, write_seconds={"storage_write": [0.02, 0.5]})
    t.observe_batch(stats(), 1.0, ok=False)
    got = samples(t)
    assert got[("firehose_bq_messages_read_total", ())] == 20
    assert got[("firehose_bq_rows_written_total", (("table", "ds.a"),))] == 8
    assert got[("firehose_bq_messages_total", (("outcome", "written"), ("table", "ds.b")))] == 4
    assert got[("firehose_bq_messages_total", (("outcome", "fallback"), ("table", "")))] == 2
    assert got[("firehose_bq_errors_total", (("error_type", "SINK_4XX_ERROR"), ("outcome", "dlq")))] == 4
    assert got[("firehose_bq_errors_total", (("error_type", "DESERIALIZATION_ERROR"), ("outcome", "failed")))] == 2
    assert got[("firehose_bq_messages_retried_total", ())] == 6
    assert got[("firehose_bq_batches_total", (("result", "failed"),))] == 1
    assert got[("firehose_bq_bigquery_write_seconds_count", (("path", "storage_write"),))] == 2
    assert got[("firehose_bq_batch_messages_per_second", ())] == 10.0
    # Every message read ended somewhere, and the counters say where.
    ended = sum(v for (name, _), v in got.items() if name == "firehose_bq_messages_total")
    assert ended == got[("firehose_bq_messages_read_total", ())]


def test_refreshes_lag_and_table_updates_count_deltas() -> None:
    t = Telemetry(MetricsConfig(), "job")
    t.observe_refreshes(fetches=3, failures=1, changes=1)
    t.observe_refreshes(fetches=5, failures=1, changes=2)
    t.observe_table_updates(2)
    t.observe_table_updates(2)
    t.observe_lag({("t", 0): 7, ("t", 1): 0})
    got = samples(t)
    assert got[("firehose_bq_schema_refreshes_total", (("result", "changed"),))] == 2
    assert got[("firehose_bq_schema_refreshes_total", (("result", "unchanged"),))] == 2
    assert got[("firehose_bq_schema_refreshes_total", (("result", "failed"),))] == 1
    assert got[("firehose_bq_table_updates_total", ())] == 2
    assert got[("firehose_bq_consumer_lag", (("partition", "0"), ("topic", "t")))] == 7


def test_the_endpoint_serves_the_registry_on_a_free_port() -> None:
    t = Telemetry(MetricsConfig(prometheus_port=0), "job").start()
    try:
        t.observe_batch(stats(), 1.0, ok=True)
        assert t.port
        body = urllib.request.urlopen(f"http://127.0.0.1:{t.port}/metrics", timeout=5).read().decode()
        families = {f.name for f in text_string_to_metric_families(body)}
        assert {"firehose_bq_messages_read", "firehose_bq_consumer_lag"} <= families
    finally:
        t.close()


def test_statsd_lines_carry_firehose_tags() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(5)
    t = Telemetry(MetricsConfig(statsd_host="127.0.0.1", statsd_port=server.getsockname()[1],
                                statsd_tags="team=data,env=test"), "job")
    try:
        t.observe_batch(stats(), 1.0, ok=True)
        lines = [server.recv(4096).decode() for _ in range(5)]
    finally:
        t.close()
        server.close()
    assert lines[0] == "firehose_bq.messages_read:10|c|#team:data,env:test"
    assert lines[1].startswith("firehose_bq.rows_written:6|c")
    # Read = written + dead-lettered + failed + fallback, in StatsD too: 10 = 6 + 2 + 1 + 1.
    assert [line.split("|")[0] for line in lines[2:]] == [
        "firehose_bq.messages_dead_lettered:2", "firehose_bq.messages_failed:1", "firehose_bq.messages_fallback:1"]


def observe_everything(t: Telemetry) -> None:
    t.observe_batch(stats(), 1.0, ok=True, write_seconds={"insertall": [0.1]})
    t.observe_driver_step("file_loads", 1.0)
    t.observe_lag({("t", 0): 1})
    t.observe_refreshes(1, 0, 0)
    t.observe_table_updates(1)
    t.observe_replay(stats())


def test_every_metric_the_dashboard_queries_exists() -> None:
    t = Telemetry(MetricsConfig(), "job")
    observe_everything(t)
    exported = {sample.name for metric in t.registry.collect() for sample in metric.samples}
    queried = {name for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]
               for name in re.findall(r"firehose_bq_\w+", target["expr"])}
    assert len(queried) >= 12 and queried <= exported, sorted(queried - exported)


def readme_block(name: str) -> str:
    match = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", README.read_text(), re.S)
    assert match, f"README.md has no {name} block"
    return match.group(1).strip()


def test_readme_lists_exactly_the_metrics_the_job_exports() -> None:
    t = Telemetry(MetricsConfig(), "job")
    families = {metric.name for metric in t.registry.collect()}
    assert {m.name.removesuffix("_total") for m in t.metrics} == families  # none made around `_add`
    assert readme_block("metrics-reference") == reference_markdown(), (
        "README's metrics table is out of date: run `make readme`")


def test_readme_lists_exactly_the_statsd_metrics_the_job_sends() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    t = Telemetry(MetricsConfig(statsd_host="127.0.0.1", statsd_port=server.getsockname()[1]), "job")
    try:
        observe_everything(t)
        server.setblocking(False)
        sent: set[tuple[str, str, str]] = set()
        kinds = {"c": "counter", "g": "gauge", "ms": "timer"}
        while True:
            try:
                metric, _, tags = server.recv(4096).decode().partition("|#")
            except BlockingIOError:  # sent before observe_* returned: every datagram is here
                break
            name, kind = metric.split(":", 1)[0], metric.split("|")[1]
            sent.add((name, kinds[kind], ", ".join(f"`{tag.split(':')[0]}`" for tag in tags.split(",") if tag) or "-"))
    finally:
        t.close()
        server.close()
    rows = [line.split("|")[1:4] for line in readme_block("statsd-reference").splitlines()[2:]]
    assert {(name.strip().strip("`"), kind.strip(), tags.strip()) for name, kind, tags in rows} == sent


def test_replayed_letters_are_counted_once_each_by_where_they_ended() -> None:
    t = Telemetry(MetricsConfig(), "job")
    t.observe_replay(stats())
    replayed = {dict(labels)["outcome"]: value for (name, labels), value in samples(t).items()
                if name == "firehose_bq_dlq_replay_messages_total"}
    assert replayed == {"written": 6, "dlq": 2, "failed": 1, "fallback": 1}
    assert sum(replayed.values()) == stats().messages
