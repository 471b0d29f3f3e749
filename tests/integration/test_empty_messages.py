"""A proto with messages that have no fields (google.protobuf.Empty, a oneof's marker messages) on the real
local stack: BigQuery has no RECORD without fields, so the table could not be created and the job could not
start. Each such message is its JSON text, "{}" when set, through every write path."""

from __future__ import annotations

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

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]


@pytest.mark.parametrize("method", ["storage_write", "insertall", "file_loads"])
def test_messages_without_fields_land_as_their_json_text(
        method: str, spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client, tmp_path: Path) -> None:
    fake, _server = registry
    path = compile_protos(tmp_path / "testdata.desc")
    fake.routes["/markers.desc"] = path.read_bytes()
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "testdata.Markers",
                           "SINK_BIGQUERY_TABLE_NAME": "markers", "SINK_BIGQUERY_WRITE_METHOD": method,
                           "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "0",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/markers.desc"})
    tree = descriptors.load([str(path)])
    markers, marker = tree.message_class("testdata.Markers"), tree.message_class("testdata.Marker")
    empty = tree.message_class("google.protobuf.Empty")
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    producer.send(topic, markers(id="a", nothing=empty(), marks=[marker()], active=marker(),
                                 by_name={"k": marker()}).SerializeToString())
    producer.send(topic, markers(id="b", other="o").SerializeToString())
    producer.flush()
    producer.close()
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get).run(available_now=True)
        assert (summary.totals.rows_written, summary.totals.dead_lettered, summary.totals.failed) == (2, 0, 0)
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`")}
        assert {k: rows["a"][k] for k in ("nothing", "marks", "active", "deleted", "by_name")} == {
            "nothing": "{}", "marks": ["{}"], "active": "{}", "deleted": None, "by_name": [{"key": "k", "value": "{}"}]}
        assert (rows["b"]["nothing"], rows["b"]["active"], rows["b"]["other"]) == (None, None, "o")
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
