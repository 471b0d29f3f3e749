"""BigQuery goes away for 30 s under a running job: the policy retries, nothing is dead-lettered or lost.

This test runs a stack of its own with a persistent emulator (the session's keeps tables in memory,
which a restart would lose, and stopping it would disturb other tests).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.pipeline import Pipeline
from tests.integration.conftest import EXAMPLE_DESCRIPTORS
from tests.integration.test_end_to_end import produce_bookings

pytestmark = pytest.mark.integration

OUTAGE_S = 30


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Stack]:
    env = {**isolated_env(tmp_path / "stack"), "FIREHOSE_STACK_BIGQUERY_PERSISTENT": "true"}
    stack = Stack(StackConfig.from_env({**os.environ, **env}))
    stack.up(report=lambda line: None)
    try:
        yield stack
    finally:
        stack.down(report=lambda line: None)


def test_emulator_down_for_30_s_is_retried_and_every_message_lands(spark, own_stack: Stack, tmp_path: Path) -> None:
    env = {**own_stack.env(), "SOURCE_KAFKA_TOPIC": "outage", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "outage",
           "INPUT_SCHEMA_PROTO_CLASS": "firehose.example.v1.Booking",
           "SCHEMA_REGISTRY_STENCIL_URLS": str(EXAMPLE_DESCRIPTORS), "SINK_BIGQUERY_DATASET_NAME": "outage",
           "SINK_BIGQUERY_TABLE_NAME": "bookings", "SPARK_CHECKPOINT_LOCATION": str(tmp_path / "checkpoint"),
           "SPARK_TRIGGER_INTERVAL_MS": "500", "SPARK_MAX_OFFSETS_PER_TRIGGER": "100",
           # The client's own retry gives up after 2 s, so the policy's backoff is what rides out the outage.
           "SINK_BIGQUERY_RETRY_DEADLINE_MS": "2000", "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS": "2000",
           "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "BLOB", "DLQ_BLOB_LOCAL_DIRECTORY": str(tmp_path / "dlq")}
    cfg = Config.from_env(env)
    client = make_client(BigQueryConfig(project_id=cfg.bigquery.project_id, dataset="x", table="x",
                                        api_endpoint=cfg.bigquery.api_endpoint))

    def landed() -> int:
        try:
            query = f"SELECT COUNT(DISTINCT order_number) AS n FROM `{cfg.bigquery.table_ref}`"
            return int(next(iter(client.query(query, timeout=5).result())).n)
        except Exception:  # noqa: BLE001 - the emulator is down or starting: not yet
            return -1

    pipeline = Pipeline(cfg, spark)
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(available_now=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failures.append(exc)

    produce_bookings(cfg, 200)
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        eventually(lambda: landed() == 200, 120, "the first 200 rows")
        own_stack.stop_service("bigquery")
        down_at = time.monotonic()
        produce_bookings(cfg, 300, start=200)  # read and written (tried) while BigQuery is down
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert not failures, failures
        own_stack.up(report=lambda line: None)  # starts only what is not running: the emulator
        eventually(lambda: landed() == 500, 240, "every row after the outage")
    finally:
        stop.set()
        runner.join(180)
    assert not failures, failures
    t = pipeline.summary.totals
    assert (t.messages, t.dead_lettered, t.failed) == (500, 0, 0)
    assert t.retried > 0  # the outage was met, and retried through
    assert not list((tmp_path / "dlq").rglob("*.jsonl"))
