"""A running sink follows a schema registry: new fields land without a restart, an outage is survived."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

PROTOS = Path(__file__).parent / "protos"
REFRESH_MS = 1000


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until `check()` held; fails the test after `timeout_s`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - started


def test_new_fields_land_without_restart_and_an_outage_is_survived(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    fake, _server = registry
    blobs = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / v).read_bytes() for v in ("v1", "v2")}
    fake.routes["/evo.desc"] = blobs["v1"]
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event", "SINK_BIGQUERY_TABLE_NAME": "events",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/evo.desc",
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": str(REFRESH_MS),
                           "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES": "0", "SPARK_TRIGGER_INTERVAL_MS": "500"})
    table = cfg.bigquery.table_ref
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 2)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    pipeline = Pipeline(cfg, spark, descriptor_source=cache.get)
    cache.add_listener(pipeline.schema.on_descriptors_changed)
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(available_now=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            failures.append(exc)

    def send(version: str, values: list[dict]) -> None:
        cls = cache.get().message_class("evo.Event")
        assert version == "v1" or "tags" in cls.DESCRIPTOR.fields_by_name
        for v in values:
            producer.send(topic, cls(**v).SerializeToString())
        producer.flush()

    def rows() -> dict[str, dict]:
        result = bq_client.query(f"SELECT * FROM `{table}`").result()  # v1's table has no `tags` yet
        return {r["id"]: {k: dict(r.items()).get(k) for k in ("id", "amount", "detail", "tags")} for r in result}

    def columns() -> set[str]:
        schema = bq_client.get_table(table).schema
        return {f.name for f in schema} | {f"detail.{s.name}" for f in schema if f.name == "detail" for s in f.fields}

    pipeline.prepare()  # as `firehose-bq run` does: the table exists before the stream starts
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        send("v1", [{"id": f"a{i}", "amount": i, "detail": {"note": "v1"}} for i in range(5)])
        eventually(lambda: len(rows()) == 5, 120, "the v1 rows")
        assert "tags" not in columns()

        fake.routes["/evo.desc"] = blobs["v2"]
        published = time.monotonic()
        eventually(lambda: {"tags", "detail.priority"} <= columns(), 30, "the new columns")
        # Within one refresh interval (plus the table update itself), without new messages.
        assert time.monotonic() - published < REFRESH_MS / 1000 + 5
        send("v2", [{"id": f"b{i}", "amount": 10 + i, "detail": {"note": "v2", "priority": i}, "tags": ["x"]}
                    for i in range(5)])
        eventually(lambda: len(rows()) == 10, 60, "the v2 rows")
        landed = rows()
        assert landed["b3"]["detail"] == {"note": "v2", "priority": 3} and landed["b3"]["tags"] == ["x"]
        assert landed["a3"] == {"id": "a3", "amount": 3, "detail": {"note": "v1", "priority": None}, "tags": []}

        fake.routes.clear()  # the registry is down: every request gets a 404
        failures_before = cache.stats().failures
        eventually(lambda: cache.stats().failures > failures_before, 10, "a failed refresh")
        send("v2", [{"id": f"c{i}", "amount": 20 + i, "tags": ["y"]} for i in range(5)])
        eventually(lambda: len(rows()) == 15, 60, "rows written while the registry is down")
        assert not failures
    finally:
        stop.set()
        runner.join(120)
        cache.stop()
        producer.close()
    assert not runner.is_alive()
    assert not failures, failures


def refreshing_on_hold(job_env: dict[str, str], fake: FakeRegistry, tmp_path: Path,
                       **settings: str) -> tuple[Config, dict[str, Path]]:
    """A job on evo.Event whose registry serves v1 (until the test publishes `paths["v2"]`), refreshed only
    when a task holds at fields its descriptors lack (no background refresh)."""
    paths = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / v) for v in ("v1", "v2")}
    fake.routes["/evo.desc"] = paths["v1"].read_bytes()
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event", "SINK_BIGQUERY_TABLE_NAME": "events",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/evo.desc",
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "600000",
                           "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS": "0", **settings})
    return cfg, paths


def test_unknown_fields_refresh_the_descriptors_before_the_message_is_written(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    from firehose_bq import descriptors

    fake, _server = registry
    cfg, paths = refreshing_on_hold(job_env, fake, tmp_path)
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 2)
    v2 = descriptors.load([str(paths["v2"])]).message_class("evo.Event")
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        # The producer and the registry already have v2; the running sink still has v1. Partition 0 holds
        # only what v1 knows (its task writes it all before the refresh); partition 1 starts the same way.
        fake.routes["/evo.desc"] = paths["v2"].read_bytes()
        for i in range(5):
            producer.send(topic, v2(id=f"o{i}", amount=i).SerializeToString(), partition=i % 2)
        for i in range(3):
            producer.send(topic, v2(id=f"n{i}", detail={"note": "v2", "priority": i}, tags=["t"]).SerializeToString(),
                          partition=1)
        unknown_to_all = v2(id="u0", amount=7).SerializeToString() + b"\x98\x06\x01"  # field 99: in no version
        producer.send(topic, unknown_to_all, partition=1)
        producer.flush()

        pipeline = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now)
        summary = pipeline.run(available_now=True)

        assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (9, 9, 0)
        assert summary.totals.unknown_fields == 1  # only field 99, after the refresh explained the rest
        # Written once each, in the default write mode (Storage Write: no insertIds to drop a second append)
        # although the batch ran twice around the refresh.
        ids = [r["id"] for r in bq_client.query(f"SELECT id FROM `{cfg.bigquery.table_ref}`")]
        assert sorted(ids) == sorted([f"o{i}" for i in range(5)] + ["n0", "n1", "n2", "u0"])
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`")}
        assert rows["n2"]["detail"] == {"note": "v2", "priority": 2} and rows["n2"]["tags"] == ["t"]
        assert rows["u0"]["amount"] == 7
        assert cache.stats().changes == 1
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_confluent_framed_topic_follows_the_subjects_latest_schema(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    from firehose_bq import descriptors
    from firehose_bq.registry.confluent import encode_frame

    fake, _server = registry
    topic = job_env["SOURCE_KAFKA_TOPIC"]

    def register(schema_id: int, version: str) -> None:
        text = (PROTOS / version / "evo" / "event.proto").read_text()
        fake.register_confluent(f"{topic}-value", schema_id, schema_id, text)

    register(1, "v1")
    env = {k: v for k, v in job_env.items() if k != "SCHEMA_REGISTRY_STENCIL_URLS"}
    cfg = Config.from_env({**env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event", "SINK_BIGQUERY_TABLE_NAME": "events",
                           "SCHEMA_REGISTRY_CONFLUENT_URL": fake.url,
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "600000",
                           "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS": "0"})
    classes = {v: descriptors.load([str(compile_protos(tmp_path / f"{v}.desc", PROTOS / v))]).message_class("evo.Event")
               for v in ("v1", "v2")}
    ensure_topic(cfg.source.brokers, topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    from firehose_bq.sink_schema import descriptor_cache

    cache = descriptor_cache(cfg).start()
    try:
        for i in range(3):
            producer.send(topic, encode_frame(1, [1], classes["v1"](id=f"a{i}", amount=i).SerializeToString()))
        producer.flush()
        pipeline = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now)
        assert pipeline.run(available_now=True).totals.rows_written == 3

        register(2, "v2")  # a producer moved on: its framed messages name schema 2
        for i in range(2):
            payload = classes["v2"](id=f"b{i}", detail={"note": "v2", "priority": i}, tags=["t"]).SerializeToString()
            producer.send(topic, encode_frame(2, [1], payload))
        producer.flush()
        again = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)

        assert (again.totals.rows_written, again.totals.failed, again.totals.unknown_fields) == (2, 0, 0)
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`")}
        assert rows["a2"]["amount"] == 2 and rows["a2"]["tags"] == []
        assert rows["b1"]["detail"] == {"note": "v2", "priority": 1} and rows["b1"]["tags"] == ["t"]
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
