"""A wide, skewed topic whose micro-batches run fewer Spark tasks than it has partitions, each task reading
several partitions' ranges in turn (SPARK_MAX_TASKS_PER_BATCH, source/kafka_source.py `group_ranges`), on
the real local stack and a proto of its own (protos/wide_v1, wide_v2). Every record must end in exactly one
place, the table or the DLQ, with its own Kafka coordinates, whatever task read it and however far that
task got before it stopped."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors
from firehose_bq.config import Config
from firehose_bq.errors import BatchFailedError
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from tests.conftest import compile_protos
from tests.integration import drills
from tests.integration.conftest import FakeRegistry
from tests.integration.test_new_partitions import add_partitions

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos"
PARTITIONS = 24
# Records per partition: partition 0 holds most of them, several partitions are empty, the rest a few each.
SKEW = {0: 900, **{p: p % 4 for p in range(1, PARTITIONS)}}
Coordinates = tuple[str, int, int]  # topic, partition, offset


def tick_id(topic: str, partition: int, offset: int) -> str:
    """Each record names where it was produced: a row whose metadata columns disagree is in the wrong place."""
    return f"{topic}:{partition}:{offset}"


def produce(brokers: str, tick: type, counts: dict[tuple[str, int], int], start: dict[tuple[str, int], int] | None = None,
            bad: Iterable[Coordinates] = (), extra: Iterable[Coordinates] = ()) -> set[Coordinates]:
    """`counts` records into each (topic, partition), from offset `start` (0); `bad` coordinates get bytes no Tick
    parses, `extra` ones a Tick with a field only v2 knows (lot). Returns the coordinates of the good records."""
    bad, extra = set(bad), set(extra)
    producer = KafkaProducer(bootstrap_servers=brokers, linger_ms=20)
    good: set[Coordinates] = set()
    try:
        for (topic, partition), n in sorted(counts.items()):
            for offset in range((start or {}).get((topic, partition), 0), (start or {}).get((topic, partition), 0) + n):
                where = (topic, partition, offset)
                if where in bad:
                    value = b"\x0a\x05ab"  # a string field cut short
                else:
                    msg = tick(id=tick_id(*where), seq=offset, venue=topic)
                    value = msg.SerializeToString() + (b"\x20\x07" if where in extra else b"")  # field 4 = 7
                    good.add(where)
                producer.send(topic, value=value, key=_key(tick, tick_id(*where)), partition=partition)
        producer.flush(60)
    finally:
        producer.close()
    return good


def _key(tick: type, text: str) -> bytes:
    from google.protobuf import message_factory

    key_class = message_factory.GetMessageClass(tick.DESCRIPTOR.file.message_types_by_name["TickKey"])
    return key_class(id=text).SerializeToString()


def landed(client: bigquery.Client, cfg: Config) -> list[tuple[str, int, int, str]]:
    rows = client.query(f"SELECT message_topic t, message_partition p, message_offset o, id FROM "
                        f"`{cfg.bigquery.table_ref}`", job_config=bigquery.QueryJobConfig(use_query_cache=False))
    return [(r.t, r.p, r.o, r.id) for r in rows.result()]


def assert_once(rows: list[tuple[str, int, int, str]], expected: set[Coordinates]) -> None:
    seen = [(t, p, o) for t, p, o, _ in rows]
    duplicates = sorted({c for c in seen if seen.count(c) > 1})
    assert not duplicates, f"{len(seen) - len(set(seen))} duplicate rows, e.g. {duplicates[:5]}"
    missing, unexpected = sorted(expected - set(seen)), sorted(set(seen) - expected)
    assert not missing, f"{len(missing)} records missing, e.g. {missing[:5]}"
    assert not unexpected, f"rows that should not be there: {unexpected[:5]}"
    wrong = [r for r in rows if r[3] != tick_id(*r[:3])]
    assert not wrong, f"rows whose metadata columns are another record's: {wrong[:5]}"


def letters_in(directory: Path) -> list[Coordinates]:
    found = []
    for path in directory.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            letter = json.loads(line)
            found.append((letter["topic"], letter["partition"], letter["offset"]))
    return found


@pytest.fixture(scope="module")
def desc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wide")
    return {v: compile_protos(out / f"{v}.desc", PROTOS / f"wide_{v}") for v in ("v1", "v2")}


def wide_env(job_env: dict[str, str], desc: Path | str, topics: list[str], **extra: str) -> dict[str, str]:
    return {**job_env, "SOURCE_KAFKA_TOPIC": ",".join(topics), "INPUT_SCHEMA_PROTO_CLASS": "wide.v1.Tick",
            "SCHEMA_REGISTRY_STENCIL_URLS": str(desc), "SINK_BIGQUERY_TABLE_NAME": "ticks",
            "SPARK_TRIGGER_INTERVAL_MS": "0", **extra}


def topics_of(job_env: dict[str, str], n: int) -> list[str]:
    suffix = uuid.uuid4().hex[:6]
    return [f"wide{i}-{suffix}" for i in range(n)]


@pytest.mark.parametrize("method", ["storage_write", "insertall", "file_loads", "upsert"])
def test_two_skewed_wide_topics_land_once_each_whatever_task_read_them(
        method: str, spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client) -> None:
    topics = topics_of(job_env, 2)
    extra = ({"SINK_BIGQUERY_UPSERT_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "tick_key",
              "INPUT_SCHEMA_PROTO_KEY_CLASS": "wide.v1.TickKey", "SINK_BIGQUERY_MERGE_INTERVAL_MS": "200"}
             if method == "upsert" else {"SINK_BIGQUERY_WRITE_METHOD": method})
    # Two batches (300 records each at most): the second reads what the first left of partition 0.
    cfg = Config.from_env(wide_env(job_env, desc["v1"], topics, SPARK_MAX_OFFSETS_PER_TRIGGER="700", **extra))
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    for topic in topics:
        ensure_topic(cfg.source.brokers, topic, PARTITIONS if topic == topics[0] else 7)
    counts = {(topics[0], p): n for p, n in SKEW.items()} | {(topics[1], p): 3 * p for p in range(7)}
    expected = produce(cfg.source.brokers, tick, counts)
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.batches >= 2 or method == "upsert"  # upsert's batches follow its MERGE threshold
        assert (summary.totals.messages, summary.totals.failed) == (len(expected), 0)
        assert_once(landed(bq_client, cfg), expected)
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@pytest.mark.parametrize("way", ["plan", "scan"])
def test_tasks_take_their_ranges_from_the_plan_or_through_the_scan_and_land_alike(
        way: str, spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """pipeline.py `_run_tasks`: on this Spark the tasks get the source's planned ranges from the micro-batch's
    plan; a Spark whose plan is laid out otherwise has them come through the source's scan. Either way every
    record lands once, in as many tasks as planned, and each batch's lag is reported."""
    import logging

    from firehose_bq import pipeline as pipeline_mod

    real, seen = pipeline_mod.planned_partitions, []

    def planned(df):  # noqa: ANN001, ANN202
        seen.append(real(df) if way == "plan" else None)
        return seen[-1]

    monkeypatch.setattr(pipeline_mod, "planned_partitions", planned)
    topics = topics_of(job_env, 2)
    cfg = Config.from_env(wide_env(job_env, desc["v1"], topics, SPARK_MAX_OFFSETS_PER_TRIGGER="700",
                                   SPARK_MAX_TASKS_PER_BATCH="3"))
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(cfg.source.brokers, topics[0], PARTITIONS)
    ensure_topic(cfg.source.brokers, topics[1], 7)
    expected = produce(cfg.source.brokers, tick, {(topics[0], p): n for p, n in SKEW.items()}
                       | {(topics[1], p): 3 * p for p in range(7)})
    try:
        with caplog.at_level(logging.INFO, logger="firehose_bq.pipeline"):
            summary = Pipeline(cfg, spark).run(available_now=True)
        assert (summary.batches, summary.totals.messages, summary.totals.failed, summary.lag) == (2, len(expected), 0, 0)
        assert_once(landed(bq_client, cfg), expected)
        assert caplog.text.count(": lag ") == 2
        if way == "plan":
            assert [len(parts) for parts in seen] == [3, 3], seen
            assert "does not show the source's planned ranges" not in caplog.text
        else:
            assert caplog.text.count("does not show the source's planned ranges") == 1  # once per run
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@pytest.mark.parametrize("method", ["storage_write", "file_loads"])
def test_a_batch_held_for_the_registry_resumes_every_partition_of_every_task_once(
        method: str, spark, job_env: dict[str, str], desc: dict[str, Path], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client) -> None:
    """v2's field in partitions 3 and 17 only: the task reading 3 holds there, past partitions it wrote and
    before partitions it has not reached; the rerun must read exactly those."""
    fake, _server = registry
    fake.routes["/wide.desc"] = desc["v1"].read_bytes()
    topics = topics_of(job_env, 1)
    cfg = Config.from_env(wide_env(job_env, f"{fake.url}/wide.desc", topics,
                                   SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS="600000",
                                   SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS="0",
                                   SINK_BIGQUERY_WRITE_METHOD=method, SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0"))
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(cfg.source.brokers, topics[0], PARTITIONS)
    counts = {(topics[0], p): 5 for p in range(PARTITIONS)} | {(topics[0], 0): 300}
    expected = produce(cfg.source.brokers, tick, counts, extra=[(topics[0], 3, 2), (topics[0], 17, 0)])
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()  # on v1
    fake.routes["/wide.desc"] = desc["v2"].read_bytes()  # what the refresh finds
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
        assert cache.stats().changes == 1, "the batch was held for a refresh"
        assert (summary.totals.messages, summary.totals.failed) == (len(expected), 0)
        assert_once(landed(bq_client, cfg), expected)
        lots = {r.id for r in bq_client.query(f"SELECT id FROM `{cfg.bigquery.table_ref}` WHERE lot = 7").result()}
        assert lots == {tick_id(topics[0], 3, 2), tick_id(topics[0], 17, 0)}, "v2's field written once refreshed"
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_bad_records_across_a_tasks_partitions_stop_the_job_then_go_to_the_dlq_once(
        spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client, tmp_path: Path) -> None:
    topics = topics_of(job_env, 1)
    base = wide_env(job_env, desc["v1"], topics, SINK_BIGQUERY_WRITE_METHOD="file_loads",
                    SPARK_MAX_TASKS_PER_BATCH="3")
    cfg = Config.from_env(base)
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(cfg.source.brokers, topics[0], PARTITIONS)
    bad = {(topics[0], p, 1) for p in (1, 2, 5, 9, 14, 22)}
    expected = produce(cfg.source.brokers, tick, {(topics[0], p): 4 for p in range(PARTITIONS)}, bad=bad)
    try:
        # The DLQ off: the poison records stop the job, nothing of the batch in the table or committed.
        with pytest.raises(BatchFailedError, match="DESERIALIZATION_ERROR"):
            Pipeline(cfg, spark).run(available_now=True)
        assert landed(bq_client, cfg) == []
        # The operator turns the DLQ on and restarts: the same batch, each record in one place.
        dlq = Config.from_env({**base, "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "BLOB",
                               "DLQ_BLOB_LOCAL_DIRECTORY": str(tmp_path / "dlq")})
        summary = Pipeline(dlq, spark).run(available_now=True)
        assert (summary.totals.rows_written, summary.totals.dead_lettered) == (len(expected), len(bad))
        assert_once(landed(bq_client, cfg), expected)
        letters = letters_in(tmp_path / "dlq")
        assert sorted(letters) == sorted(bad), "each bad record dead-lettered once"
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_partitions_added_between_runs_are_read_once_whatever_the_task_count(
        spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client, tmp_path: Path) -> None:
    """One checkpoint, three restarts with a different SPARK_MAX_TASKS_PER_BATCH, the topic growing each time."""
    topics = topics_of(job_env, 1)
    topic = topics[0]
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    base = wide_env(job_env, desc["v1"], topics)
    ensure_topic(base["SOURCE_KAFKA_BROKERS"], topic, 4)
    expected = produce(base["SOURCE_KAFKA_BROKERS"], tick, {(topic, p): 6 for p in range(4)})
    ends = {(topic, p): 6 for p in range(4)}
    try:
        for total, tasks in ((9, "-1"), (17, "1"), (26, "3")):
            cfg = Config.from_env({**base, "SPARK_MAX_TASKS_PER_BATCH": tasks})
            summary = Pipeline(cfg, spark).run(available_now=True)
            assert summary.totals.failed == 0
            assert_once(landed(bq_client, cfg), expected)
            before = len(ends)
            add_partitions(cfg.source.brokers, topic, total)
            counts = {(topic, p): 2 + p % 3 for p in range(total)}
            expected |= produce(cfg.source.brokers, tick, counts, start=ends)
            ends = {k: ends.get(k, 0) + n for k, n in counts.items()}
            assert len(ends) == total > before
        summary = Pipeline(Config.from_env(base), spark).run(available_now=True)
        assert_once(landed(bq_client, Config.from_env(base)), expected)
    finally:
        bq_client.delete_dataset(base["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)


def test_a_routed_job_whose_partitions_each_bring_their_own_tables_lands_them_all_in_one_task(
        spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client) -> None:
    """SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK=2 and two tables per partition: fine one task per partition, so
    fine when one task reads all six (DLQ off: a record past the cap would stop the job)."""
    topics = topics_of(job_env, 1)
    topic = topics[0]
    cfg = Config.from_env(wide_env(job_env, desc["v1"], topics, SINK_BIGQUERY_TABLE_NAME="ticks_${header.region}",
                                   SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK="2", SPARK_MAX_TASKS_PER_BATCH="1"))
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(cfg.source.brokers, topic, 6)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, linger_ms=20)
    expected: dict[str, set[Coordinates]] = {}
    for p in range(6):
        for offset in range(4):
            region = f"r{p}{'ab'[offset % 2]}"
            producer.send(topic, tick(id=tick_id(topic, p, offset), seq=offset).SerializeToString(), partition=p,
                          headers=[("region", region.encode())])
            expected.setdefault(region, set()).add((topic, p, offset))
    producer.flush(30)
    producer.close()
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert (summary.totals.rows_written, summary.totals.failed) == (24, 0)
        for region, coordinates in expected.items():
            assert_once(landed(bq_client, dataclasses.replace(cfg, bigquery=dataclasses.replace(
                cfg.bigquery, table=f"ticks_{region}"))), coordinates)
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_partitions_added_while_the_job_streams_are_read_once_by_grouped_tasks(
        spark, job_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client) -> None:
    topics = topics_of(job_env, 1)
    topic = topics[0]
    cfg = Config.from_env(wide_env(job_env, desc["v1"], topics, SPARK_MAX_TASKS_PER_BATCH="3",
                                   SINK_BIGQUERY_WRITE_METHOD="file_loads", SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0"))
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(cfg.source.brokers, topic, 5)
    expected = produce(cfg.source.brokers, tick, {(topic, p): 10 for p in range(5)})
    stop, failures = threading.Event(), []

    def run() -> None:
        try:
            Pipeline(cfg, spark).run(available_now=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            failures.append(exc)

    def rows() -> int:
        try:
            return len(landed(bq_client, cfg))
        except NotFound:  # the job has not created the table yet
            return 0

    def wait_rows(count: int) -> None:
        deadline = time.monotonic() + 60
        while rows() < count and time.monotonic() < deadline and not failures:
            time.sleep(0.5)

    job = threading.Thread(target=run)
    job.start()
    try:
        wait_rows(len(expected))
        add_partitions(cfg.source.brokers, topic, 30)
        expected |= produce(cfg.source.brokers, tick, {(topic, p): 1 + p % 4 for p in range(30)},
                            start={(topic, p): 10 for p in range(5)})
        wait_rows(len(expected))
    finally:
        stop.set()
        job.join(120)
    assert not failures, failures
    assert_once(landed(bq_client, cfg), expected)
    bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_kill_9_of_a_file_loads_job_mid_batch_then_restart_loads_every_offset_once(
        stack_env: dict[str, str], desc: dict[str, Path], bq_client: bigquery.Client, tmp_path: Path) -> None:
    """`firehose-bq run` as an operator runs it, its whole process tree killed while grouped tasks stage a batch."""
    topic = f"wide-{uuid.uuid4().hex[:6]}"
    env = {**wide_env(stack_env, desc["v1"], [topic], SINK_BIGQUERY_WRITE_METHOD="file_loads",
                      SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0", SPARK_MAX_OFFSETS_PER_TRIGGER="1500",
                      FIREHOSE_LOG_LEVEL="INFO"),
           "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"kill-{topic}", "SINK_BIGQUERY_DATASET_NAME": f"kill_{topic[5:]}",
           "SPARK_CHECKPOINT_LOCATION": str(tmp_path / "checkpoint"), "SPARK_MASTER": "local[2]"}
    tick = descriptors.load([str(desc["v1"])]).message_class("wide.v1.Tick")
    ensure_topic(env["SOURCE_KAFKA_BROKERS"], topic, PARTITIONS)
    expected = produce(env["SOURCE_KAFKA_BROKERS"], tick, {(topic, p): 10 * n for p, n in SKEW.items()})
    table = f"{env['SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID']}.{env['SINK_BIGQUERY_DATASET_NAME']}.ticks"
    try:
        job = drills.start_job(env, tmp_path / "killed.log")
        try:
            drills.wait_log(job, tmp_path / "killed.log", drills.BATCH_DONE, 1)
        finally:
            drills.kill_group(job)  # SIGKILL, the whole tree: the next batch's tasks are staging
        restart = drills.start_job(env, tmp_path / "restart.log", "--available-now")
        try:
            assert restart.wait(timeout=240) == 0, (tmp_path / "restart.log").read_text(errors="replace")[-4000:]
        finally:
            drills.kill_group(restart)
        landed = drills.landed_offsets(bq_client, table, drills.end_offsets(env))
        assert (landed.distinct, landed.missing[:5], landed.duplicates) == (len(expected), [], 0)
    finally:
        bq_client.delete_dataset(env["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)
