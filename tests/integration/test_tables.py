"""Dataset and table lifecycle on the emulator: create with layout and labels, evolve, never drop."""

from __future__ import annotations

from pathlib import Path

import pytest

from firehose_bq import descriptors
from firehose_bq.batch.core import row_builder
from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.cli import main
from firehose_bq.config import Config
from firehose_bq.errors import SchemaError
from firehose_bq.sink_schema import apply_plan, plan_table, spec_of
from tests.conftest import compile_protos
from tests.unit.batch.sources import source_batch

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos"
LOAD_TIME_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("evo")
    return {v: compile_protos(out / f"{v}.desc", PROTOS / v) for v in ("v1", "v2")}


def event_config(job_env: dict[str, str], desc: Path, **extra: str) -> Config:
    return Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event",
                            "SCHEMA_REGISTRY_STENCIL_URLS": str(desc), "SINK_BIGQUERY_TABLE_NAME": "events",
                            **extra})


def write(cfg: Config, values: list[dict]) -> None:
    """`values` as messages, decoded and written by the job's own steps (insertAll)."""
    loaded = descriptors.load(cfg.input_schema.stencil_urls)
    plan = plan_table(cfg, loaded)
    cls = loaded.message_class(plan.message_name)
    source = source_batch([cls(**v).SerializeToString() for v in values],
                          timestamps_ms=[1_767_225_600_000] * len(values))
    rows = row_builder(spec_of(cfg, loaded, plan.message_name), changelog=False, proto_class=plan.message_name).build(
        source, LOAD_TIME_US)
    assert not rows.failures
    with make_client(cfg.bigquery) as client:
        # No insertIds: each call's records start at offset 0, and BigQuery would drop the second as a replay.
        assert InsertAllWriter(client, cfg.bigquery).write(rows.table(), None) == []


def test_table_is_created_with_partitioning_clustering_labels(job_env, versions, bq_client) -> None:
    cfg = event_config(job_env, versions["v1"], SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE="true",
                       SINK_BIGQUERY_TABLE_PARTITION_KEY="message_timestamp",
                       SINK_BIGQUERY_TABLE_PARTITION_EXPIRY_MS="86400000",
                       SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE="true", SINK_BIGQUERY_TABLE_CLUSTERING_KEYS="id",
                       SINK_BIGQUERY_TABLE_LABELS="team=data", SINK_BIGQUERY_DATASET_LABELS="owner=sink")
    try:
        apply_plan(bq_client, cfg, plan_table(cfg, descriptors.load(cfg.input_schema.stencil_urls)))
        table = bq_client.get_table(cfg.bigquery.table_ref)
        assert table.time_partitioning.type_ == "DAY"
        assert table.time_partitioning.field == "message_timestamp"
        assert table.time_partitioning.expiration_ms == 86_400_000
        assert table.clustering_fields == ["id"]
        assert table.labels == {"team": "data"}
        assert table.description.startswith("Written by firehose-bq from evo.Event messages")
        assert bq_client.get_dataset(cfg.bigquery.dataset).labels == {"owner": "sink"}
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_partition_and_clustering_columns_are_checked_against_the_schema(job_env, versions) -> None:
    loaded = descriptors.load([str(versions["v1"])])
    bad_partition = event_config(job_env, versions["v1"], SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE="true",
                                 SINK_BIGQUERY_TABLE_PARTITION_KEY="amount")
    with pytest.raises(SchemaError, match="PARTITION_KEY: column 'amount' is NULLABLE INTEGER"):
        plan_table(bad_partition, loaded)
    bad_cluster = event_config(job_env, versions["v1"], SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE="true",
                               SINK_BIGQUERY_TABLE_CLUSTERING_KEYS="id,nope")
    with pytest.raises(SchemaError, match="CLUSTERING_KEYS: 'nope' is not a top-level column"):
        plan_table(bad_cluster, loaded)


def test_new_descriptor_version_evolves_the_table_and_keeps_old_rows(
        job_env, versions, bq_client, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    v1 = event_config(job_env, versions["v1"])
    v2 = event_config(job_env, versions["v2"])
    try:
        apply_plan(bq_client, v1, plan_table(v1, descriptors.load(v1.input_schema.stencil_urls)))
        write(v1, [{"id": "old", "amount": 1, "legacy": "kept", "detail": {"note": "n"}}])

        for name, value in {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "evo.Event",
                            "SCHEMA_REGISTRY_STENCIL_URLS": str(versions["v2"]),
                            "SINK_BIGQUERY_TABLE_NAME": "events"}.items():
            monkeypatch.setenv(name, value)
        assert main(["schema", "diff"]) == 0
        assert capsys.readouterr().out.splitlines() == [
            "relax id REQUIRED -> NULLABLE",
            "add detail.priority NULLABLE INTEGER",
            "add tags REPEATED STRING",
            "keep legacy (in the table, not in the proto: never dropped)",
        ]
        assert main(["schema", "apply"]) == 0

        table = bq_client.get_table(v2.bigquery.table_ref)
        columns = {f.name: f for f in table.schema}
        assert columns["id"].mode == "NULLABLE"
        assert [f.name for f in columns["detail"].fields] == ["note", "priority"]
        assert columns["tags"].mode == "REPEATED" and "legacy" in columns
        write(v2, [{"amount": 2, "detail": {"note": "m", "priority": 3}, "tags": ["a", "b"]}])
        rows = {r["amount"]: dict(r.items()) for r in bq_client.query(
            f"SELECT id, amount, legacy, detail, tags FROM `{v2.bigquery.table_ref}`").result()}
        assert rows[1] == {"id": "old", "amount": 1, "legacy": "kept", "detail": {"note": "n", "priority": None},
                           "tags": []}
        assert rows[2] == {"id": None, "amount": 2, "legacy": None, "detail": {"note": "m", "priority": 3},
                           "tags": ["a", "b"]}
        assert main(["schema", "diff"]) == 0
        assert capsys.readouterr().out.splitlines()[-1].endswith("is up to date")
    finally:
        bq_client.delete_dataset(v1.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_concurrent_evolutions_all_succeed_and_keep_every_field(job_env, versions, bq_client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    v1 = event_config(job_env, versions["v1"])
    v2 = event_config(job_env, versions["v2"])
    plans = [(cfg, plan_table(cfg, descriptors.load(cfg.input_schema.stencil_urls))) for cfg in (v1, v2)]
    try:
        # Eight workers, half on each version, creating and evolving the same table at once.
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: apply_plan(bq_client, *plans[i % 2]), range(8)))
        assert len(results) == 8
        columns = {f.name: f for f in bq_client.get_table(v1.bigquery.table_ref).schema}
        assert {"id", "amount", "detail", "happened_at", "legacy", "tags"} <= set(columns)
        assert [f.name for f in columns["detail"].fields] == ["note", "priority"]
        assert columns["id"].mode == "NULLABLE"
    finally:
        bq_client.delete_dataset(v1.bigquery.dataset, delete_contents=True, not_found_ok=True)
