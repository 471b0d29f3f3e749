"""JSON input with coercion and additional_properties (seed 004) on the real local stack."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import sample
from firehose_bq.config import Config
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from tests.integration.test_dead_letters import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "config" / "json-schema.json"
COUNT = 200


def json_env(job_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**job_env, "INPUT_SCHEMA_DATA_TYPE": "JSON", "INPUT_SCHEMA_PROTO_CLASS": "",
            "SCHEMA_REGISTRY_STENCIL_URLS": "", "SINK_BIGQUERY_TABLE_NAME": "telemetry",
            "SINK_BIGQUERY_TABLE_SCHEMA_FILE": str(SCHEMA_FILE), "SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE": "true",
            "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": f"dlq-{uuid.uuid4().hex[:8]}", **extra}


def rows(client: bigquery.Client, table: str) -> list[dict]:
    return [dict(r.items()) for r in client.query(f"SELECT * FROM `{table}` ORDER BY message_offset").result()]


def produce_routed(cfg: Config, count: int, docs: tuple[bytes, ...]) -> None:
    """`count` sample documents, their `doc` header taking the values of `docs` in turn."""
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for i in range(count):
        producer.send(cfg.source.topics[0], json.dumps(sample.json_document(i)).encode(),
                      headers=[("doc", docs[i % len(docs)])])
    producer.flush()
    producer.close()


def test_documents_ahead_of_the_table_land_coerced_and_nothing_unexpected_fails(
        spark, job_env: dict[str, str], bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(json_env(job_env))
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 1)
    sample.ensure_topic(cfg.source.brokers, cfg.dlq.kafka_topic, 1)
    sample.produce(cfg.source.brokers, topic, sample.json_messages(), COUNT, progress=False)
    # Two documents no coercion can save: a column's value of the wrong kind, and bytes that are not JSON.
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    producer.send(topic, json.dumps({**sample.json_document(COUNT), "duration_ms": {"nested": 1}}).encode())
    producer.send(topic, b'{"client-id": "x", ')
    producer.flush()
    producer.close()
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (COUNT + 2, COUNT, 2, 0)
        assert dict(t.errors_by_type) == {"INVALID_MESSAGE_ERROR": 1, "DESERIALIZATION_ERROR": 1}
        landed = rows(bq_client, cfg.bigquery.table_ref)
        assert len(landed) == COUNT
        first, second = landed[0], landed[1]
        source = sample.json_document(0)
        assert first["client_id"] == source["client-id"] and first["document_type"] == source["document.type"]
        assert first["_2fa_enabled"] is True and first["os"]["build_number"] == 1000
        assert first["counters"] == [{"key": k, "value": v} for k, v in source["counters"].items()]
        assert json.loads(first["settings"]) == source["settings"]
        assert first["duration_ms"] == int(source["duration_ms"])
        assert first["submitted_at"].isoformat() == "2026-01-01T00:00:00+00:00"
        # Values the table has no column for are kept, as written, for a later backfill.
        assert second["additional_properties"] is None
        assert json.loads(first["additional_properties"]) == {"experiment": source["experiment"]}
        assert sum(r["additional_properties"] is not None for r in landed) == COUNT // 10
        assert "additional_properties" in {f.name for f in bq_client.get_table(cfg.bigquery.table_ref).schema}
        letters = read_topic(cfg.source.brokers, cfg.dlq.kafka_topic)
        kinds = {x.error.error_type: x for x in letters}
        assert set(kinds) == {ErrorType.INVALID_MESSAGE_ERROR, ErrorType.DESERIALIZATION_ERROR}
        assert "duration_ms" in kinds[ErrorType.INVALID_MESSAGE_ERROR].error.message
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_routed_json_tables_are_created_from_the_schema_file_per_destination(
        spark, job_env: dict[str, str], bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_NAME="telemetry_${header.doc}",
                                   SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE="false"))
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 2)
    produce_routed(cfg, 40, (b"main", b"crash"))
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        t = summary.totals
        assert (t.messages, t.rows_written, t.failed) == (40, 40, 0)
        # Unknown fields with additional_properties off: written without them, counted, never failed.
        assert t.unknown_fields == 4
        for doc in ("main", "crash"):
            table = f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.telemetry_{doc}"
            assert len(rows(bq_client, table)) == 20
            assert "additional_properties" not in {f.name for f in bq_client.get_table(table).schema}
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_schema_file_retyping_a_live_column_stops_naming_the_file_not_a_proto(
        job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path) -> None:
    from firehose_bq.errors import SchemaEvolutionError
    from firehose_bq.json_tables import JsonTableSchema
    from firehose_bq.sink_schema import metadata_of

    files = {}
    for version, kind in (("v1", "INTEGER"), ("v2", "STRING")):
        files[version] = tmp_path / f"{version}.json"
        files[version].write_text(json.dumps([{"name": "id", "type": "STRING"}, {"name": "n", "type": kind}]))
    configs = {v: Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_SCHEMA_FILE=str(p))) for v, p in files.items()}
    try:
        JsonTableSchema(configs["v1"], metadata_of(configs["v1"])).columns()
        with pytest.raises(SchemaEvolutionError) as failed:
            JsonTableSchema(configs["v2"], metadata_of(configs["v2"])).columns()
        # JSON input has no proto: the message names the file the user has to change.
        assert f"STRING in SINK_BIGQUERY_TABLE_SCHEMA_FILE {files['v2']}" in str(failed.value)
        assert "proto" not in str(failed.value)
        assert {f.name: f.field_type for f in bq_client.get_table(configs["v1"].bigquery.table_ref).schema}["n"] == "INTEGER"
    finally:
        bq_client.delete_dataset(configs["v1"].bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_an_additional_properties_column_that_cannot_hold_json_text_stops_the_start(
        job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path) -> None:
    from firehose_bq.errors import SchemaError
    from firehose_bq.json_tables import JsonTableSchema
    from firehose_bq.sink_schema import metadata_of

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps([{"name": "id", "type": "STRING"}, {"name": "Additional_Properties", "type": "JSON"}]))
    cfg = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_SCHEMA_FILE=str(schema)))
    try:
        # On the driver, before the stream starts: not in every task's first batch, as a worker traceback.
        with pytest.raises(SchemaError) as failed:
            JsonTableSchema(cfg, metadata_of(cfg)).columns()
        assert str(failed.value) == (
            f"table {cfg.bigquery.table_ref}: column Additional_Properties is NULLABLE JSON, but "
            "SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE keeps unknown values there as JSON text, so it must be a "
            "NULLABLE STRING; rename the column or turn that setting off")
        off = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_SCHEMA_FILE=str(schema),
                                       SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE="false"))
        assert [json.loads(c)["name"] for c in JsonTableSchema(off, metadata_of(off)).columns()] == \
            ["id", "Additional_Properties"]
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_routed_table_whose_additional_properties_column_cannot_hold_them_fails_only_its_records(
        spark, job_env: dict[str, str], bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_NAME="telemetry_${header.doc}",
                                   SINK_BIGQUERY_TABLE_SCHEMA_FILE=""))  # the live tables are the schema
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 1)
    sample.ensure_topic(cfg.source.brokers, cfg.dlq.kafka_topic, 1)
    bq_client.create_dataset(cfg.bigquery.dataset, exists_ok=True)
    for doc, extra in (("main", []), ("bad", [bigquery.SchemaField("additional_properties", "JSON")])):
        table = f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.telemetry_{doc}"
        bq_client.create_table(bigquery.Table(table, schema=[bigquery.SchemaField("client_id", "STRING"), *extra]))
    produce_routed(cfg, 20, (b"main", b"bad"))
    try:
        # One table's header value must not stop the job on every restart: its records fail, the others land.
        t = Pipeline(cfg, spark).run(available_now=True).totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (20, 10, 10, 0)
        assert len(rows(bq_client, f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.telemetry_main")) == 10
        letters = read_topic(cfg.source.brokers, cfg.dlq.kafka_topic)
        assert {x.error.error_type for x in letters} == {ErrorType.ROUTING_ERROR} and len(letters) == 10
        assert "column additional_properties is NULLABLE JSON" in letters[0].error.message
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@pytest.mark.parametrize("method", ["file_loads", "storage_write"])
def test_a_json_value_bigquery_cannot_store_is_a_dead_letter_not_a_crash_loop(
        spark, job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path, method: str) -> None:
    # BigQuery's JSON type refuses a number beyond FLOAT64's range, and a load job holding one fails as a
    # whole: the job used to stop on it, and stop again on every restart (the emulator refuses it too).
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps([{"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
                                  {"name": "payload", "type": "JSON"}]))
    cfg = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_SCHEMA_FILE=str(schema),
                                   SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE="false",
                                   SINK_BIGQUERY_WRITE_METHOD=method))
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 1)
    sample.ensure_topic(cfg.source.brokers, cfg.dlq.kafka_topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for i in range(20):
        # A wide integer BigQuery takes (it rounds it): kept, not refused.
        producer.send(topic, b'{"id": %d, "payload": {"n": %d, "wide": 123456789012345678901234567890}}' % (i, i))
        if i == 9:
            producer.send(topic, b'{"id": 99, "payload": {"x": [1, 1e400]}}')
    producer.flush()
    producer.close()
    try:
        t = Pipeline(cfg, spark).run(available_now=True).totals  # returns: the CLI exits 0
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (21, 20, 1, 0)
        assert dict(t.errors_by_type) == {"INVALID_MESSAGE_ERROR": 1}
        landed = rows(bq_client, cfg.bigquery.table_ref)
        assert sorted(r["id"] for r in landed) == list(range(20))
        payload = landed[0]["payload"]
        assert (json.loads(payload) if isinstance(payload, str) else payload)["n"] == 0
        letters = read_topic(cfg.source.brokers, cfg.dlq.kafka_topic)
        assert len(letters) == 1 and letters[0].error.error_type is ErrorType.INVALID_MESSAGE_ERROR
        assert letters[0].error.message.startswith("payload: the value holds a number beyond FLOAT64's range")
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


JSON_COLUMNS_SCHEMA = [
    {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
    {"name": "payload", "type": "JSON"},
    {"name": "wide", "type": "INTEGER"},
    {"name": "detail", "type": "RECORD", "fields": [{"name": "doc", "type": "JSON"}, {"name": "blob", "type": "BYTES"}]},
    {"name": "tags", "type": "JSON", "mode": "REPEATED"},
    {"name": "seen_at", "type": "TIMESTAMP"},
    {"name": "amount", "type": "NUMERIC"},
]


def json_columns_document(i: int) -> dict:
    return {"id": i, "payload": {"n": i, "text": "two\nlines \"quoted\"", "list": [1, 2.5, None]},
            "wide": 2**62 + i, "detail": {"doc": [i, {"k": "v"}], "blob": "AP8="},
            "tags": [{"a": i}, "s", 3], "seen_at": "2026-01-02T03:04:05.123456Z", "amount": "12.5"}


@pytest.mark.parametrize("method", ["file_loads", "mixed"])
def test_file_loads_into_json_columns_land_every_row_once(
        spark, job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path, method: str) -> None:
    # BigQuery refuses a Parquet load into a table with a JSON column (the emulator now too): file loads
    # used to stage Parquet for every table, so every batch of such a table failed, on every restart.
    from decimal import Decimal

    from tests.integration.test_file_loads import forget_last_commit, load_jobs

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(JSON_COLUMNS_SCHEMA))
    extra = {"SINK_BIGQUERY_MIXED_STREAMING_TABLES": "elsewhere"} if method == "mixed" else {}
    if method == "mixed":  # and staged in Cloud Storage, which the load job reads itself
        extra["SINK_BIGQUERY_FILE_LOADS_STAGING_URI"] = \
            f"gs://{job_env['FIREHOSE_STACK_GCS_BUCKET']}/it-{uuid.uuid4().hex[:8]}/staging"
    cfg = Config.from_env(json_env(job_env, SINK_BIGQUERY_TABLE_SCHEMA_FILE=str(schema),
                                   SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE="false",
                                   SINK_BIGQUERY_WRITE_METHOD=method, **extra))
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 2)
    sample.ensure_topic(cfg.source.brokers, cfg.dlq.kafka_topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for i in range(30):
        producer.send(topic, json.dumps(json_columns_document(i)).encode(), partition=i % 2)
    producer.flush()
    producer.close()
    try:
        t = Pipeline(cfg, spark).run(available_now=True).totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (30, 30, 0, 0)
        jobs = load_jobs(bq_client, cfg)
        assert jobs and {j.source_format for j in jobs} == {"NEWLINE_DELIMITED_JSON"}

        # A crash between the load and the offsets' commit: the replayed batch finds its job done.
        forget_last_commit(cfg)
        assert Pipeline(cfg, spark).run(available_now=True).totals.messages > 0
        assert {j.job_id for j in load_jobs(bq_client, cfg)} == {j.job_id for j in jobs}

        # detail.doc selected on its own: the emulator types a JSON field inside a RECORD of `SELECT *` as STRING.
        landed = [dict(r.items()) for r in bq_client.query(
            f"SELECT id, payload, wide, detail.doc AS doc, detail.blob AS blob, tags, seen_at, amount "
            f"FROM `{cfg.bigquery.table_ref}` ORDER BY id").result()]
        assert [r["id"] for r in landed] == list(range(30)), "every row, once"
        for i, row in enumerate(landed):
            source = json_columns_document(i)
            # Each an object, array or JSON string as sent (the client parses JSON values), never a string
            # holding the JSON text.
            assert row["payload"] == source["payload"]
            assert row["wide"] == 2**62 + i
            assert row["doc"] == [i, {"k": "v"}] and row["blob"] == b"\x00\xff"
            # (The emulator answers a REPEATED JSON column's elements as their JSON text: "s" is '"s"'.)
            assert [json.loads(v) for v in row["tags"]] == source["tags"]
            assert row["seen_at"].isoformat() == "2026-01-02T03:04:05.123456+00:00"
            assert row["amount"] == Decimal("12.5")
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
