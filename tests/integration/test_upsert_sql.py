"""The generated MERGE statements run on the emulator, and key schema changes reach both tables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField as F

from firehose_bq import descriptors
from firehose_bq.config import Config
from firehose_bq.errors import SchemaEvolutionError
from firehose_bq.upsert.flush import UpsertSinkSchema
from firehose_bq.upsert.sql import MergePlan, TableRef
from tests.conftest import compile_protos
from tests.integration.test_schema_refresh import PROTOS

pytestmark = pytest.mark.integration

KEY = [F("id", "STRING"), F("geo", "RECORD", fields=[F("zone", "INTEGER")])]


def k(id_: str, zone: int | None = None) -> dict[str, object]:
    return {"id": id_, "geo": None if zone is None else {"zone": zone}}


@pytest.fixture
def tables(bq_client: bigquery.Client, bq_dataset: str) -> Iterator[tuple[TableRef, TableRef]]:
    project = bq_client.project
    dest = TableRef(project, bq_dataset, "dest")
    tmp = TableRef(project, bq_dataset, "dest_tmp")
    bq_client.create_table(bigquery.Table(dest.api, schema=[F("f", "STRING"), F("k", "RECORD", fields=KEY)]))
    bq_client.create_table(bigquery.Table(tmp.api, schema=[
        F("key", "RECORD", fields=KEY), F("value", "RECORD", fields=[F("f", "STRING")]),
        F("partitionTime", "TIMESTAMP"), F("i", "INTEGER", "REQUIRED"), F("kafkaPartition", "INTEGER", "REQUIRED"),
        F("kafkaTopic", "STRING", "REQUIRED"),
        F("batchNumber", "INTEGER", "REQUIRED")]))
    yield dest, tmp


def stage(client: bigquery.Client, tmp: TableRef, batch: int, rows: list[tuple[dict[str, object], str | None]],
          first_i: int, partition: int = 0, topic: str = "t") -> None:
    assert client.insert_rows_json(tmp.api, [{"key": key, "value": None if f is None else {"f": f}, "i": first_i + n,
                                              "kafkaPartition": partition, "kafkaTopic": topic, "batchNumber": batch}
                                             for n, (key, f) in enumerate(rows)]) == []


def content(client: bigquery.Client, dest: TableRef) -> list[tuple[str, int | None, str]]:
    rows = client.query(f"SELECT k.id, k.geo.zone, f FROM {dest.sql}").result()
    return sorted(((r.id, r.zone, r.f) for r in rows), key=lambda r: (r[0], r[1] if r[1] is not None else -1))


def run(client: bigquery.Client, plan: MergePlan, batch: int) -> None:
    client.query(plan.merge(batch)).result()
    client.query(plan.cleanup(batch, streaming_buffer=False)).result()


def test_upsert_only_keeps_the_latest_value_per_nested_key(bq_client, tables) -> None:
    dest, tmp = tables
    plan = MergePlan(dest, tmp, "k", tuple(KEY), ("f",), upsert=True, delete=False)
    stage(bq_client, tmp, 1, [(k("a"), "a1"), (k("a", 1), "a-1"), (k("a"), "a2"), (k("b"), "b1")], 0)
    run(bq_client, plan, 1)
    stage(bq_client, tmp, 2, [(k("b"), "b2"), (k("a", 1), "a-1b"), (k("c"), "c1")], 10)
    run(bq_client, plan, 2)
    run(bq_client, plan, 2)  # a replayed merge changes nothing
    assert content(bq_client, dest) == [("a", None, "a2"), ("a", 1, "a-1b"), ("b", None, "b2"), ("c", None, "c1")]
    assert next(iter(bq_client.query(f"SELECT COUNT(*) AS n FROM {tmp.sql}").result())).n == 0


def test_delete_only_appends_and_deletes_up_to_the_last_tombstone(bq_client, tables) -> None:
    dest, tmp = tables
    plan = MergePlan(dest, tmp, "k", tuple(KEY), ("f",), upsert=False, delete=True)
    stage(bq_client, tmp, 1, [(k("a"), "a1"), (k("a"), "a2"), (k("b"), "b1")], 0)
    run(bq_client, plan, 1)
    stage(bq_client, tmp, 2, [(k("a"), "a3"), (k("a"), None), (k("a"), "a4"), (k("b"), None), (k("x"), None)], 10)
    run(bq_client, plan, 2)
    assert content(bq_client, dest) == [("a", None, "a4")]
    # A record staged twice (a retried task whose insertAll dedup missed) is one record: one row, and a
    # tombstone staged twice still deletes (two source rows matching one target row would fail the MERGE).
    stage(bq_client, tmp, 3, [(k("c"), "c1"), (k("d"), "d1")], 20)
    stage(bq_client, tmp, 3, [(k("c"), "c1")], 20)
    stage(bq_client, tmp, 3, [(k("a"), None)], 30)
    stage(bq_client, tmp, 3, [(k("a"), None)], 30)
    run(bq_client, plan, 3)
    assert content(bq_client, dest) == [("c", None, "c1"), ("d", None, "d1")]
    # Two records of one key on two partitions may share an offset: still two records, both appended.
    stage(bq_client, tmp, 4, [(k("e"), "e-p0")], 40, partition=0)
    stage(bq_client, tmp, 4, [(k("e"), "e-p1")], 40, partition=1)
    run(bq_client, plan, 4)
    assert sorted(content(bq_client, dest), key=str) == [("c", None, "c1"), ("d", None, "d1"), ("e", None, "e-p0"),
                                                         ("e", None, "e-p1")]
    # Likewise on the same partition of two topics of one job (SOURCE_KAFKA_TOPIC=a,b).
    stage(bq_client, tmp, 5, [(k("g"), "g-a")], 50, topic="a")
    stage(bq_client, tmp, 5, [(k("g"), "g-b")], 50, topic="b")
    run(bq_client, plan, 5)
    assert [r for r in content(bq_client, dest) if r[0] == "g"] == [("g", None, "g-a"), ("g", None, "g-b")]


def test_upsert_and_delete_with_nested_keys(bq_client, tables) -> None:
    dest, tmp = tables
    plan = MergePlan(dest, tmp, "k", tuple(KEY), ("f",), upsert=True, delete=True)
    stage(bq_client, tmp, 1, [(k("a", 1), "a1"), (k("a", 2), "a2"), (k("b"), "b1"), (k("c"), None)], 0)
    run(bq_client, plan, 1)
    stage(bq_client, tmp, 2, [(k("a", 1), None), (k("a", 2), "a2b"), (k("b"), None), (k("b"), "b2"),
                              (k("c"), "c1"), (k("c"), None)], 10)
    run(bq_client, plan, 2)
    assert content(bq_client, dest) == [("a", 2, "a2b"), ("b", None, "b2")]


def schema_for(job_env: dict[str, str], tmp_path: Path, key: str, value: str) -> tuple[Config, UpsertSinkSchema, list]:
    loaded = {v: descriptors.load([str(compile_protos(tmp_path / f"{v}.desc", PROTOS / v))]) for v in ("v1", "v2")}
    cfg = Config.from_env({**job_env, "SCHEMA_REGISTRY_STENCIL_URLS": str(tmp_path / "v1.desc"),
                           "INPUT_SCHEMA_PROTO_CLASS": value, "INPUT_SCHEMA_PROTO_KEY_CLASS": key,
                           "SINK_BIGQUERY_UPSERT_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "the_key"})
    current = ["v1"]
    return cfg, UpsertSinkSchema(cfg, lambda: loaded[current[0]]), current


def key_fields(client: bigquery.Client, ref: str, column: str) -> list[tuple[str, str]]:
    table = client.get_table(ref)
    return [(f.name, f.mode) for f in next(c for c in table.schema if c.name == column).fields]


def test_compatible_key_change_evolves_both_tables(job_env, bq_client, tmp_path: Path) -> None:
    cfg, schema, version = schema_for(job_env, tmp_path, key="evo.Detail", value="evo.Event")
    try:
        schema.current()
        assert key_fields(bq_client, cfg.bigquery.table_ref, "the_key") == [("note", "NULLABLE")]
        version[0] = "v2"  # Detail gains `priority`
        schema.current()
        assert key_fields(bq_client, cfg.bigquery.table_ref, "the_key") == [("note", "NULLABLE"),
                                                                            ("priority", "NULLABLE")]
        assert key_fields(bq_client, schema.intermediate.api, "key") == [("note", "NULLABLE"), ("priority", "NULLABLE")]
        assert schema.merge_plan is not None and "`key`.`priority`" in schema.merge_plan.merge(1)
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_incompatible_key_change_stops_naming_it(job_env, bq_client, tmp_path: Path) -> None:
    cfg, schema, version = schema_for(job_env, tmp_path, key="evo.Event", value="evo.Detail")
    try:
        schema.current()
        before = key_fields(bq_client, cfg.bigquery.table_ref, "the_key")
        version[0] = "v2"  # Event's `legacy` leaves the proto: a removed key field changes what a key matches
        with pytest.raises(SchemaEvolutionError, match="key field legacy was removed"):
            schema.current()
        assert key_fields(bq_client, cfg.bigquery.table_ref, "the_key") == before
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
