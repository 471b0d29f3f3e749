"""Protobuf input with SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE on the real local stack: messages of a newer
proto than the registry has land with their unknown fields in `additional_properties`, readable with JSON
functions, and nothing fails."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors
from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_newer_writers_fields_land_in_additional_properties(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    fake, _server = registry
    paths = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / v) for v in ("v1", "v2")}
    fake.routes["/evo.desc"] = paths["v1"].read_bytes()  # the registry never learns v2 here
    env = {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event", "SINK_BIGQUERY_TABLE_NAME": "events",
           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/evo.desc", "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "600000",
           "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS": "0"}
    off = Config.from_env(env)
    # On, with the strictest unknown-field policy: additional_properties overrides it.
    on = Config.from_env({**env, "SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE": "true",
                          "INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE": "false"})
    table = off.bigquery.table_ref
    topic = off.source.topics[0]
    ensure_topic(off.source.brokers, topic, 1)
    v1, v2 = (descriptors.load([str(paths[v])]).message_class("evo.Event") for v in ("v1", "v2"))
    producer = KafkaProducer(bootstrap_servers=off.source.brokers)
    cache = DescriptorCache.for_stencil(off.input_schema.stencil_urls, off.registry).start()
    try:
        producer.send(topic, v1(id="old", amount=1).SerializeToString())
        producer.flush()
        assert Pipeline(off, spark, descriptor_source=cache.get).run(available_now=True).totals.rows_written == 1
        assert "additional_properties" not in {f.name for f in bq_client.get_table(table).schema}

        for i in range(3):
            producer.send(topic, v2(id=f"n{i}", amount=i, detail={"note": "v2", "priority": i + 1},
                                    tags=["t", f"u{i}"]).SerializeToString())
        producer.send(topic, v1(id="plain", amount=5).SerializeToString())
        producer.send(topic, v2(id="far", detail={"priority": 7}).SerializeToString() + b"\x98\x06\x01")  # <99: 1>
        producer.flush()
        summary = Pipeline(on, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)

        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed, t.unknown_fields) == (5, 5, 0, 0, 4)
        column = next(f for f in bq_client.get_table(table).schema if f.name == "additional_properties")
        assert (column.field_type, column.mode) == ("STRING", "NULLABLE")  # added to the live table
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{table}`").result()}
        assert rows["n1"]["detail"] == {"note": "v2"} and rows["n1"]["amount"] == 1  # known columns as ever
        assert json.loads(rows["n1"]["additional_properties"]) == {"6": [b64("t"), b64("u1")], "detail": {"2": [2]}}
        assert json.loads(rows["far"]["additional_properties"]) == {"99": [1], "detail": {"2": [7]}}
        assert rows["plain"]["additional_properties"] is None and rows["old"]["additional_properties"] is None

        # The backfill a user runs once the new column exists: JSON functions over the column.
        backfill = bq_client.query(
            f"SELECT id, CAST(JSON_VALUE(additional_properties, '$.detail.\"2\"[0]') AS INT64) AS priority "
            f"FROM `{table}` WHERE additional_properties IS NOT NULL").result()
        assert {r["id"]: r["priority"] for r in backfill} == {"n0": 1, "n1": 2, "n2": 3, "far": 7}
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(off.bigquery.dataset, delete_contents=True, not_found_ok=True)
