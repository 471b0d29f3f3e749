"""BigQuery goes away under a running job: a short outage is retried through, a long one stops the job
within the bound its settings imply, with the reason and its offsets uncommitted, and a rerun lands
every row once.

These tests run a stack of their own with a persistent emulator (the session's keeps tables in memory,
which a restart would lose, and stopping it would disturb other tests); the session's stack is left
alone.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.cloud import bigquery

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.errors import FirehoseError
from firehose_bq.modes import handling_of
from firehose_bq.pipeline import Pipeline
from firehose_bq.source.kafka_client import KafkaMetadataClient
from tests.integration.conftest import EXAMPLE_DESCRIPTORS
from tests.integration.test_end_to_end import produce_bookings

pytestmark = pytest.mark.integration

OUTAGE_S = 15
PARTITIONS = 3  # produce_bookings' topics
CORES = 2  # the session's local[2]
# What the bound leaves out: meeting the outage (the next trigger, planning the batch, starting its
# tasks) and stopping the query once a task gave up.
STOP_OVERHEAD_S = 6


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {**isolated_env(tmp_path_factory.mktemp("stack")), "FIREHOSE_STACK_BIGQUERY_PERSISTENT": "true"}
    stack = Stack(StackConfig.from_env({**os.environ, **env}))
    stack.up(report=lambda line: None)
    try:
        yield stack
    finally:
        stack.down(report=lambda line: None)


def job_config(stack: Stack, tmp_path: Path, name: str, **settings: str) -> Config:
    return Config.from_env({
        **stack.env(), "SOURCE_KAFKA_TOPIC": name, "SOURCE_KAFKA_CONSUMER_GROUP_ID": name,
        "INPUT_SCHEMA_PROTO_CLASS": "firehose.example.v1.Booking",
        "SCHEMA_REGISTRY_STENCIL_URLS": str(EXAMPLE_DESCRIPTORS), "SINK_BIGQUERY_DATASET_NAME": name,
        "SINK_BIGQUERY_TABLE_NAME": "bookings", "SPARK_CHECKPOINT_LOCATION": str(tmp_path / "checkpoint"),
        "SPARK_TRIGGER_INTERVAL_MS": "500", "SPARK_MAX_OFFSETS_PER_TRIGGER": "100",
        "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "BLOB", "DLQ_BLOB_LOCAL_DIRECTORY": str(tmp_path / "dlq"),
        **settings})


def table_client(cfg: Config) -> bigquery.Client:
    return make_client(BigQueryConfig(project_id=cfg.bigquery.project_id, dataset="x", table="x",
                                      api_endpoint=cfg.bigquery.api_endpoint))


def landed(client: bigquery.Client, cfg: Config) -> tuple[int, int]:
    """(rows, distinct bookings) in the table; (-1, -1) while the emulator is down or starting."""
    query = f"SELECT COUNT(*) AS n, COUNT(DISTINCT order_number) AS d FROM `{cfg.bigquery.table_ref}`"
    try:
        row = next(iter(client.query(query, timeout=5).result()))
        return int(row.n), int(row.d)
    except Exception:  # noqa: BLE001 - not yet
        return -1, -1


def committed(cfg: Config) -> int:
    """Records the job's consumer group has committed, over all partitions (the source mirrors the
    checkpoint's progress there, a batch or so behind)."""
    kafka = KafkaMetadataClient(cfg.source.brokers, cfg.source.consumer_group_id)
    try:
        return sum(o for parts in kafka.committed_offsets(cfg.source.topics).values() for o in parts.values())
    finally:
        kafka.close()


def checkpoint_batches(cfg: Config, log: str) -> set[int]:
    """The micro-batches Spark's checkpoint has planned (`offsets`) or committed (`commits`)."""
    directory = Path(cfg.spark.checkpoint_location) / log
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def settled(cfg: Config) -> bool:
    """Every batch the checkpoint planned is committed: none in flight."""
    return checkpoint_batches(cfg, "offsets") == checkpoint_batches(cfg, "commits")


@dataclass
class Running:
    """A streaming run in a thread, and when and how it ended."""

    pipeline: Pipeline
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    ended_at: float | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.pipeline.run(available_now=False, stop=self.stop)
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.failure = exc
        finally:
            self.ended_at = time.monotonic()


def test_an_outage_shorter_than_the_deadline_is_retried_and_every_message_lands(
        spark, own_stack: Stack, tmp_path: Path) -> None:
    # Each request gives up after 2 s; the policy retries a write for up to 60 s, longer than the outage
    # and the emulator's restart.
    cfg = job_config(own_stack, tmp_path, "outage", SINK_BIGQUERY_RETRY_DEADLINE_MS="60000",
                     SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS="2000")
    client = table_client(cfg)
    produce_bookings(cfg, 200)
    run = Running(Pipeline(cfg, spark))
    try:
        eventually(lambda: landed(client, cfg) == (200, 200), 120, "the first 200 rows")
        own_stack.stop_service("bigquery")
        down_at = time.monotonic()
        produce_bookings(cfg, 300, start=200)  # read and written (tried) while BigQuery is down
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert run.failure is None, run.failure
        own_stack.up(report=lambda line: None)  # starts only what is not running: the emulator
        eventually(lambda: landed(client, cfg) == (500, 500), 120, "every row after the outage")
    finally:
        run.stop.set()
        run.thread.join(180)
    assert run.failure is None, run.failure
    t = run.pipeline.summary.totals
    assert (t.messages, t.dead_lettered, t.failed) == (500, 0, 0)
    assert t.retried > 0  # the outage was met, and retried through
    assert not list((tmp_path / "dlq").rglob("*.jsonl"))


def test_a_dead_bigquery_stops_the_job_within_its_bound_and_a_rerun_lands_every_row_once(
        spark, own_stack: Stack, tmp_path: Path) -> None:
    # Short settings, so the bound is seconds: 5 s of retries per write, 2 s per request.
    cfg = job_config(own_stack, tmp_path, "dead", SINK_BIGQUERY_RETRY_DEADLINE_MS="5000",
                     SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS="2000")
    per_task = handling_of(cfg).write_backoff().bound_s(cfg.bigquery.client_timeout_ms / 1000)
    assert per_task == 7  # the deadline and one request: what README's bound says, with these settings
    # Tasks run one per Kafka partition, as many at once as there are cores: the rest in a second wave.
    bound = math.ceil(PARTITIONS / CORES) * per_task
    client = table_client(cfg)
    produce_bookings(cfg, 200)
    run = Running(Pipeline(cfg, spark))
    try:
        eventually(lambda: landed(client, cfg) == (200, 200) and settled(cfg), 120, "the first 200 rows")
        committed_before = checkpoint_batches(cfg, "commits")
        own_stack.stop_service("bigquery")
        down_at = time.monotonic()
        produce_bookings(cfg, 300, start=200)
        run.thread.join(bound + STOP_OVERHEAD_S + 60)  # long enough to see it run over, if it does
        assert run.ended_at is not None, "the job did not stop"
    finally:
        run.stop.set()
        run.thread.join(60)
        own_stack.up(report=lambda line: None)

    held = run.ended_at - down_at
    print(f"\nBigQuery down → job stopped: {held:.1f} s (bound {bound} s for {PARTITIONS} tasks on {CORES} cores, "
          f"+ {STOP_OVERHEAD_S} s to meet the outage and stop)")
    assert 5 <= held <= bound + STOP_OVERHEAD_S  # retried for the deadline, and no longer than the bound
    assert isinstance(run.failure, FirehoseError)
    reason = str(run.failure)
    assert "offsets not committed" in reason and "SINK_RETRYABLE_ERROR" in reason, reason
    assert "gave up after" in reason and cfg.bigquery.table_ref in reason, reason
    assert run.pipeline.summary.failure == reason.splitlines()[0]
    # Nothing moved on: the checkpoint planned the batch the outage met but did not commit it, the
    # consumer group covers no more than the first rows, and the messages were not dead-lettered.
    planned = checkpoint_batches(cfg, "offsets") - committed_before
    assert planned and checkpoint_batches(cfg, "commits") == committed_before
    assert committed(cfg) <= 200
    assert not list((tmp_path / "dlq").rglob("*.jsonl"))

    # BigQuery is back: a rerun on the same checkpoint replays the failed batch and lands every row once.
    eventually(lambda: landed(client, cfg) == (200, 200), 60, "the emulator back with the first rows")
    summary = Pipeline(cfg, spark).run(available_now=True)
    assert landed(client, cfg) == (500, 500)
    assert summary.totals.messages == 300 and summary.totals.dead_lettered == 0
    assert planned <= checkpoint_batches(cfg, "commits") and settled(cfg)  # the failed batch, replayed
