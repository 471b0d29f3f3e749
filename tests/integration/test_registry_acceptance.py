"""A user's own proto evolving behind a Stencil registry that misbehaves, while the job streams.

Unusable answers (empty, garbage, cut short, a set without the job's class) keep the job on its last
good descriptors; a compatible publish (fields added at any depth, a map, an enum value, a field removed
and reserved, one renamed on its number, a message moved into another's scope) evolves the table and lands
every row; an incompatible one (int32 → string) stops the job naming the field, offsets not committed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from google.cloud import bigquery
from google.protobuf import json_format
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from firehose_bq.sample import ensure_topic
from firehose_bq.sink_schema import descriptor_cache
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry
from tests.integration.test_schema_refresh import eventually

pytestmark = [pytest.mark.integration]

PROTOS = Path(__file__).parent / "protos"
CLASS = "acme.shop.Order"


def test_a_misbehaving_registry_keeps_the_job_running_and_its_publishes_evolve_or_stop_it(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    fake, _server = registry
    v2_text = (PROTOS / "acme_v2" / "acme" / "order.proto").read_text()
    # v2 published wrongly: an incompatible type change, and the package renamed (the job's class gone).
    for name, text in (("v3qty", v2_text.replace("int32 qty = 2;", "string qty = 2;")),
                       ("v5pkg", v2_text.replace("package acme.shop;", "package acme.shop.v2;"))):
        (tmp_path / name / "acme").mkdir(parents=True)
        (tmp_path / name / "acme" / "order.proto").write_text(text)
    blobs = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / f"acme_{v}").read_bytes() for v in ("v1", "v2")}
    blobs |= {v: compile_protos(tmp_path / f"{v}.desc", tmp_path / v).read_bytes() for v in ("v3qty", "v5pkg")}
    fake.routes["/acme"] = blobs["v1"]
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": CLASS, "SINK_BIGQUERY_TABLE_NAME": "orders",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/acme",
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "1000",
                           "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES": "0", "SPARK_TRIGGER_INTERVAL_MS": "500"})
    table = cfg.bigquery.table_ref
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    cache = descriptor_cache(cfg).start()  # as `firehose-bq run` builds it: it knows the job's class

    def send(version: str, values: list[dict]) -> None:
        from firehose_bq import descriptors

        cls = descriptors.Descriptors((blobs[version],)).message_class(CLASS)
        for v in values:
            producer.send(topic, json_format.ParseDict(v, cls()).SerializeToString())
        producer.flush()

    def rows() -> dict[str, dict]:
        return {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{table}`").result()}

    def start(pipeline: Pipeline, failures: list[BaseException], stop: threading.Event) -> threading.Thread:
        def run() -> None:
            try:
                pipeline.run(available_now=False, stop=stop)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
                failures.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        return runner

    pipeline = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now)
    cache.add_listener(pipeline.schema.on_descriptors_changed)
    pipeline.prepare()  # as `firehose-bq run` does: the table exists before the stream starts
    stop, failures = threading.Event(), []
    runner = start(pipeline, failures, stop)
    try:
        send("v1", [{"id": "a1", "qty": 1, "customer": {"name": "ann"}, "status": "NEW", "note": "n", "legacy": "7"}])
        eventually(lambda: len(rows()) == 1, 120, "the v1 row")

        renamed = blobs["v5pkg"]  # the class moved to package acme.shop.v2: the job's class is not in it
        for bad in (b"", b"<html>maintenance</html>", blobs["v2"][: len(blobs["v2"]) // 2], renamed):
            failed = cache.stats().failures
            fake.routes["/acme"] = bad
            eventually(lambda: cache.stats().failures > failed, 20, "a refused refresh")
        send("v1", [{"id": "a2", "qty": 2}])
        eventually(lambda: len(rows()) == 2, 60, "a row written while the registry misbehaves")
        assert not failures and cache.stats().changes == 0

        fake.routes["/acme"] = blobs["v2"]
        eventually(lambda: cache.stats().changes == 1, 20, "v2")
        send("v2", [{"id": "b1", "qty": 3, "customer": {"name": "bo", "email": "b@x"}, "status": "SHIPPED",
                     "comment": "renamed", "price": 9.5, "ship": {"city": "Oslo", "lines": ["l1", "l2"]},
                     "tags": ["t1"], "attrs": {"k": 1}}])
        eventually(lambda: "b1" in rows(), 60, "the v2 row")
        landed = rows()
        assert not failures
        b1 = landed["b1"]
        assert (b1["qty"], b1["customer"], b1["status"], b1["comment"], b1["price"]) == (
            3, {"name": "bo", "email": "b@x"}, "SHIPPED", "renamed", 9.5)
        assert b1["ship"] == {"city": "Oslo", "lines": ["l1", "l2"]} and b1["tags"] == ["t1"]
        assert b1["attrs"] == [{"key": "k", "value": 1}]
        # A field removed (and reserved) or renamed keeps its column and its old rows' values.
        assert (b1["note"], b1["legacy"]) == (None, None)
        assert (landed["a1"]["note"], landed["a1"]["legacy"], landed["a1"]["comment"]) == ("n", 7, None)

        fake.routes["/acme"] = blobs["v3qty"]
        eventually(lambda: cache.stats().changes == 2, 20, "the incompatible version")
        send("v2", [{"id": "c1", "qty": 4}])  # its batch stops: the table cannot take the new descriptors
        eventually(lambda: not runner.is_alive(), 60, "the job to stop")
        assert len(failures) == 1
        assert "field qty: type INTEGER in the table, STRING in the proto" in str(failures[0])
        assert "offsets not committed" in str(failures[0])
        assert "c1" not in rows()
    finally:
        stop.set()
        runner.join(120)

    # The registry is fixed (v2 again): the restarted job lands the stopped batch's record, once.
    fake.routes["/acme"] = blobs["v2"]
    eventually(lambda: cache.stats().changes == 3, 20, "v2 again")
    again = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now)
    try:
        summary = again.run(available_now=True)
        assert summary.totals.rows_written == 1
        assert sorted(rows()) == ["a1", "a2", "b1", "c1"]
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_new_enum_value_from_a_producer_ahead_of_the_sink_lands_by_name(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    # The sink loaded v1 (Status without SHIPPED = 2); the registry and the producer already have v2. The
    # message has no unknown field, only an enum number v1 does not name: before, it was written as "2" at
    # once (and later ones as "SHIPPED"), the registry never asked.
    from firehose_bq import descriptors

    fake, _server = registry
    blobs = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / f"acme_{v}").read_bytes() for v in ("v1", "v2")}
    fake.routes["/acme"] = blobs["v1"]
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": CLASS, "SINK_BIGQUERY_TABLE_NAME": "orders",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/acme",
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "600000",
                           "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS": "0"})
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 1)
    cache = descriptor_cache(cfg).start()
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    try:
        fake.routes["/acme"] = blobs["v2"]
        v2 = descriptors.Descriptors((blobs["v2"],)).message_class(CLASS)
        for i, status in enumerate(["NEW", "SHIPPED"]):
            producer.send(topic, v2(id=f"s{i}", status=status).SerializeToString())
        producer.flush()
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
        assert (summary.totals.rows_written, summary.totals.failed) == (2, 0)
        statuses = {r["id"]: r["status"] for r in bq_client.query(f"SELECT id, status FROM `{cfg.bigquery.table_ref}`")}
        assert statuses == {"s0": "NEW", "s1": "SHIPPED"}
        assert cache.stats().changes == 1
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
