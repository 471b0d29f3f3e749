"""File loads end to end on the real local stack: staged Parquet, one load job per table per micro-batch,
replays; staged in a local directory (uploaded by the driver) or on the Cloud Storage emulator (read by
the BigQuery emulator's load job itself, from the GCS emulator's objects on disk).

The emulator runs with the launcher's patches that make load jobs keep their job id (409 when taken),
load all their files or none, and decode BYTES from base64, as BigQuery does.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import bigquery

from firehose_bq.bigquery import file_loads
from firehose_bq.blobstore import GcsOptions, open_blob_store
from firehose_bq.config import Config
from firehose_bq.errors import BatchFailedError, FirehoseError, SchemaEvolutionError
from firehose_bq.pipeline import Pipeline
from tests.integration.test_end_to_end import assert_sample_landed, produce_bookings, read_table

pytestmark = pytest.mark.integration



@pytest.fixture
def file_loads_env(job_env: dict[str, str]) -> dict[str, str]:
    return {**job_env, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"}


@pytest.fixture
def cleanup(bq_client: bigquery.Client):  # noqa: ANN201
    configs: list[Config] = []
    yield configs.append
    for cfg in configs:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def job_prefix(cfg: Config) -> str:
    return f"firehose_bq_{cfg.bigquery.dataset}_{cfg.bigquery.table}_b"


def load_jobs(client: bigquery.Client, cfg: Config) -> list[bigquery.LoadJob]:
    """This table's load jobs, found by the prefix the sink gives their ids."""
    return [j for j in client.list_jobs(max_results=1000) if j.job_id.startswith(job_prefix(cfg))]


def staged_leftovers(cfg: Config) -> list[str]:
    area = file_loads.staging_area(cfg)
    if area.location.startswith("gs://"):
        return area.store().names()
    root = Path(area.location)  # every file and directory, not only what the store lists
    return sorted(str(p) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def gcs_staging(file_loads_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """File loads staged under a fresh prefix of the GCS emulator's bucket (emptied afterwards)."""
    location = f"gs://{file_loads_env['FIREHOSE_STACK_GCS_BUCKET']}/it-{uuid.uuid4().hex[:8]}/staging"
    yield {**file_loads_env, "SINK_BIGQUERY_FILE_LOADS_STAGING_URI": location}
    endpoint = file_loads_env["SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT"]
    open_blob_store(location, GcsOptions(endpoint=endpoint)).delete_prefix("")


def forget_last_commit(cfg: Config) -> int:
    """A crash after the last batch's load jobs finished but before Spark committed its offsets: the
    offsets log still plans that batch, the commit log does not have it. Returns the batch id."""
    commits = Path(cfg.spark.checkpoint_location) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it would block the rewrite
    return last


def test_rows_land_exactly_with_one_load_job_per_batch(spark, file_loads_env, bq_client, cleanup) -> None:
    cfg = Config.from_env({**file_loads_env, "SPARK_MAX_OFFSETS_PER_TRIGGER": "200"})
    cleanup(cfg)
    count = 600
    produce_bookings(cfg, count)

    started = datetime.now(UTC)

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (count, count, 0)
    assert_sample_landed(bq_client, cfg, count, started, datetime.now(UTC))
    # One load job per micro-batch, each for its own batch id, none retried.
    jobs = load_jobs(bq_client, cfg)
    assert summary.batches >= 3
    assert len(jobs) == summary.batches
    batch_ids = sorted(int(j.job_id.removeprefix(job_prefix(cfg)).split("_")[0]) for j in jobs)
    assert batch_ids == list(range(summary.batches))
    assert all(j.state == "DONE" and j.error_result is None for j in jobs)
    # (Each job's outputRows is not checked: the emulator reports the table's row count there.)
    assert staged_leftovers(cfg) == [], "staged files are deleted once loaded"


def test_replayed_batch_is_not_loaded_twice(spark, file_loads_env, bq_client, cleanup, caplog) -> None:
    cfg = Config.from_env({**file_loads_env, "SPARK_MAX_OFFSETS_PER_TRIGGER": "100"})
    cleanup(cfg)
    produce_bookings(cfg, 250)
    first = Pipeline(cfg, spark).run(available_now=True)
    assert first.totals.rows_written == 250
    jobs_before = {j.job_id for j in load_jobs(bq_client, cfg)}
    assert len(jobs_before) == first.batches
    last = forget_last_commit(cfg)

    with caplog.at_level(logging.INFO, logger="firehose_bq.bigquery.file_loads"):
        replay = Pipeline(cfg, spark).run(available_now=True)

    assert replay.batches == 1 and replay.totals.messages > 0, "the last batch was replayed"
    assert len(read_table(bq_client, cfg)) == 250
    assert {j.job_id for j in load_jobs(bq_client, cfg)} == jobs_before
    assert any("already loaded these rows" in r.getMessage() and f"batch {last}:" in r.getMessage()
               for r in caplog.records)
    assert staged_leftovers(cfg) == []


def test_failed_load_job_stops_the_batch_with_its_errors(spark, file_loads_env, bq_client, cleanup) -> None:
    cfg = Config.from_env(file_loads_env)
    cleanup(cfg)
    produce_bookings(cfg, 10)
    pipeline = Pipeline(cfg, spark)
    pipeline.prepare()
    load = pipeline.mode.finish

    def table_changes_then_load(batch: int, results: object, plan: object) -> None:
        # After the tasks staged their rows (fitted to the table as it was), the table changes so that
        # none of them fits: `order_number` becomes an INTEGER. Only the load job can find out.
        live = bq_client.get_table(cfg.bigquery.table_ref)
        schema = [bigquery.SchemaField(f.name, "INTEGER", f.mode) if f.name == "order_number" else f
                  for f in live.schema]
        bq_client.delete_table(live)
        bq_client.create_table(bigquery.Table(cfg.bigquery.table_ref, schema=schema))
        load(batch, results, plan)

    pipeline.mode.finish = table_changes_then_load  # type: ignore[method-assign]
    with pytest.raises(FirehoseError) as failed:
        pipeline.run(available_now=True)

    text = str(failed.value)
    assert text.startswith("batch 0 stopped, offsets not committed: SINK_"), text
    assert ": load job firehose_bq_" in text and "Traceback" not in text
    assert [r.n for r in bq_client.query(f"SELECT COUNT(*) AS n FROM `{cfg.bigquery.table_ref}`").result()] == [0]
    # Not committed, and a restart stops before writing anything, naming what changed under it.
    with pytest.raises(SchemaEvolutionError, match="field order_number: type INTEGER in the table, STRING"):
        Pipeline(cfg, spark).run(available_now=True)


def test_a_bad_message_stops_the_batch_before_any_load(spark, file_loads_env, bq_client, cleanup) -> None:
    from kafka import KafkaProducer

    cfg = Config.from_env(file_loads_env)
    cleanup(cfg)
    produce_bookings(cfg, 20)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    producer.send(cfg.source.topics[0], key=b"bad", value=b"\x0a\x05ab", partition=1).get(timeout=10)
    producer.close()

    with pytest.raises(BatchFailedError, match="DESERIALIZATION_ERROR"):
        Pipeline(cfg, spark).run(available_now=True)

    assert load_jobs(bq_client, cfg) == []
    assert [r.n for r in bq_client.query(f"SELECT COUNT(*) AS n FROM `{cfg.bigquery.table_ref}`").result()] == [0]
    assert staged_leftovers(cfg) == [], "the replay stages the rows again; nothing is kept"


def test_staged_in_cloud_storage_every_row_lands_once_and_a_replayed_batch_finds_its_job(
        spark, gcs_staging, bq_client, cleanup, caplog) -> None:
    cfg = Config.from_env({**gcs_staging, "SPARK_MAX_OFFSETS_PER_TRIGGER": "200"})
    cleanup(cfg)
    count = 500
    produce_bookings(cfg, count)
    started = datetime.now(UTC)

    with caplog.at_level(logging.INFO, logger="firehose_bq.bigquery.file_loads"):
        summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (count, count, 0)
    assert_sample_landed(bq_client, cfg, count, started, datetime.now(UTC))
    jobs = load_jobs(bq_client, cfg)
    assert summary.batches >= 3 and len(jobs) == summary.batches
    # BigQuery read each batch's objects itself: the jobs name them, nothing went through the driver.
    staging = cfg.bigquery.file_loads_staging_uri
    sources = [uri for job in jobs for uri in bq_client.get_job(job.job_id).source_uris]
    assert sources and all(uri.startswith(f"{staging}/batch-") and uri.endswith(".parquet") for uri in sources)
    assert not any("uploaded" in r.getMessage() for r in caplog.records)
    assert staged_leftovers(cfg) == [], "the objects are deleted once loaded"
    assert not (Path(cfg.spark.checkpoint_location) / file_loads.DEFAULT_STAGING_DIR).exists()

    last = forget_last_commit(cfg)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="firehose_bq.bigquery.file_loads"):
        replay = Pipeline(cfg, spark).run(available_now=True)

    assert replay.batches == 1 and replay.totals.messages > 0, "the last batch was replayed"
    assert len(read_table(bq_client, cfg)) == count
    assert {j.job_id for j in load_jobs(bq_client, cfg)} == {j.job_id for j in jobs}
    assert any("already loaded these rows" in r.getMessage() and f"batch {last}:" in r.getMessage()
               for r in caplog.records)
    assert staged_leftovers(cfg) == []


def test_mixed_mode_streams_its_tables_and_loads_the_others_from_cloud_storage(
        spark, gcs_staging, bq_client, cleanup) -> None:
    cfg = Config.from_env({**gcs_staging, "SINK_BIGQUERY_WRITE_METHOD": "mixed",
                           "SINK_BIGQUERY_TABLE_NAME": "bookings_${partition}",
                           "SINK_BIGQUERY_MIXED_STREAMING_TABLES": "bookings_0"})
    cleanup(cfg)
    count = 150
    produce_bookings(cfg, count)  # over 3 partitions: one table each

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.rows_written, summary.totals.failed) == (count, 0)
    landed = {}
    for partition in range(3):
        rows = bq_client.query(f"SELECT message_partition AS p, message_offset AS o FROM "
                               f"`{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.bookings_{partition}`").result()
        offsets = [(r.p, r.o) for r in rows]
        assert {p for p, _ in offsets} <= {partition} and len(offsets) == len(set(offsets))
        landed[partition] = len(offsets)
    assert sum(landed.values()) == count and all(landed.values())
    loaded = {job.destination.table_id for job in bq_client.list_jobs(max_results=1000)
              if job.job_id.startswith(f"firehose_bq_{cfg.bigquery.dataset}_bookings_")}
    assert loaded == {"bookings_1", "bookings_2"}, "bookings_0 is streamed, the others are loaded"
    assert staged_leftovers(cfg) == []


def test_emulator_load_from_gcs_is_atomic_and_keeps_its_job_id(bq_client, bq_dataset, stack_env, tmp_path) -> None:
    """What file loads from `gs://` rely on, as BigQuery behaves: the load job reads the objects (here from
    the GCS emulator's files), loads all of its files or none, and a job id that is taken answers 409."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = bq_client.create_table(bigquery.Table(f"{bq_client.project}.{bq_dataset}.t",
                                                  schema=[bigquery.SchemaField("n", "INTEGER")]))
    store = open_blob_store(f"gs://{stack_env['FIREHOSE_STACK_GCS_BUCKET']}/{bq_dataset}",
                            GcsOptions(endpoint=stack_env["STORAGE_EMULATOR_HOST"]))
    uris = []
    for part in range(2):
        pq.write_table(pa.table({"n": [part * 10 + i for i in range(3)]}), tmp_path / f"{part}.parquet")
        uris.append(store.put_file(f"part-{part}.parquet", tmp_path / f"{part}.parquet"))
    config = file_loads.load_job_config()
    try:
        broken = bq_client.load_table_from_uri([uris[0], f"{uris[1]}.missing"], table, job_config=config)
        with pytest.raises(exceptions.GoogleAPICallError):
            broken.result()
        assert broken.error_result is not None
        assert next(iter(bq_client.query(f"SELECT COUNT(*) AS n FROM `{table.full_table_id.replace(':', '.')}`")
                         .result())).n == 0, "nothing of a failed job stays"

        job_id = f"test_{bq_dataset}"
        bq_client.load_table_from_uri(uris, table, job_id=job_id, job_config=config).result()
        with pytest.raises(exceptions.Conflict):
            bq_client.load_table_from_uri(uris, table, job_id=job_id, job_config=config)

        rows = bq_client.query(f"SELECT n FROM `{table.full_table_id.replace(':', '.')}` ORDER BY n").result()
        assert [r.n for r in rows] == [0, 1, 2, 10, 11, 12]
        assert bq_client.get_job(job_id).source_uris == uris
    finally:
        store.delete_prefix("")


def test_emulator_keeps_an_uploaded_load_jobs_id_and_decodes_bytes(bq_client, bq_dataset) -> None:
    """The two launcher patches this path relies on, as BigQuery behaves: 409 for a taken job id, and
    BYTES in a JSON load read as base64 (at the top level and inside repeated records)."""
    schema = [bigquery.SchemaField("b", "BYTES"),
              bigquery.SchemaField("h", "RECORD", "REPEATED", fields=[bigquery.SchemaField("v", "BYTES")])]
    table = bq_client.create_table(bigquery.Table(f"{bq_client.project}.{bq_dataset}.t", schema=schema))
    data = b'{"b":"AQI=","h":[{"v":"/w=="},{"v":""}]}\n{"b":null,"h":[]}\n'
    config = bigquery.LoadJobConfig(source_format="NEWLINE_DELIMITED_JSON", schema=schema)
    job_id = f"test_{bq_dataset}"

    bq_client.load_table_from_file(io.BytesIO(data), table, job_id=job_id, job_config=config).result()
    with pytest.raises(exceptions.Conflict):
        bq_client.load_table_from_file(io.BytesIO(data), table, job_id=job_id, job_config=config)

    assert bq_client.get_job(job_id).state == "DONE"
    rows = sorted((dict(r) for r in bq_client.query(f"SELECT * FROM `{table.full_table_id.replace(':', '.')}`")
                   .result()), key=lambda r: r["b"] is None)
    assert rows == [{"b": b"\x01\x02", "h": [{"v": b"\xff"}, {"v": b""}]}, {"b": None, "h": []}]


def test_emulator_refuses_a_parquet_load_into_a_table_with_a_json_column(bq_client, bq_dataset, tmp_path) -> None:
    """As BigQuery does ("Working with JSON data", Limitations): a load job fills JSON columns only from CSV,
    Avro or JSON files. A Parquet load into a table with a JSON column, here only inside a RECORD, fails
    `invalid`, naming the format, and loads nothing; the same rows as newline-delimited JSON load."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = [bigquery.SchemaField("n", "INTEGER"),
              bigquery.SchemaField("r", "RECORD", fields=[bigquery.SchemaField("doc", "JSON")])]
    table = bq_client.create_table(bigquery.Table(f"{bq_client.project}.{bq_dataset}.t", schema=schema))
    ref = table.full_table_id.replace(":", ".")
    pq.write_table(pa.table({"n": [1, 2]}), tmp_path / "rows.parquet")
    parquet = bigquery.LoadJobConfig(source_format=bigquery.SourceFormat.PARQUET,
                                     write_disposition=bigquery.WriteDisposition.WRITE_APPEND)
    # (The emulator runs an uploaded load within the upload, so the upload itself answers the job's error.)
    with pytest.raises(exceptions.BadRequest) as failed, open(tmp_path / "rows.parquet", "rb") as data:
        bq_client.load_table_from_file(data, table, job_config=parquet).result()
    assert [e.get("reason") for e in failed.value.errors] == ["invalid"]
    assert "PARQUET" in str(failed.value) and "r.doc" in str(failed.value)
    assert next(iter(bq_client.query(f"SELECT COUNT(*) AS n FROM `{ref}`").result())).n == 0

    ndjson = bigquery.LoadJobConfig(source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
                                    write_disposition=bigquery.WriteDisposition.WRITE_APPEND)
    data = b'{"n":1,"r":{"doc":{"a":[1,"x"]}}}\n{"n":2,"r":{"doc":"text"}}\n'
    bq_client.load_table_from_file(io.BytesIO(data), table, job_config=ndjson).result()
    docs = [r.doc for r in bq_client.query(f"SELECT r.doc AS doc FROM `{ref}` ORDER BY n").result()]
    assert docs == [{"a": [1, "x"]}, "text"]  # the client parses JSON values: an object, and a JSON string
    # A number no JSON column holds fails the whole JSON load, as on BigQuery (json_column_numbers).
    with pytest.raises(exceptions.BadRequest, match="out of FLOAT64 range"):
        bq_client.load_table_from_file(io.BytesIO(b'{"n":3}\n{"n":4,"r":{"doc":[1e400]}}\n'), table,
                                       job_config=ndjson).result()
    assert next(iter(bq_client.query(f"SELECT COUNT(*) AS n FROM `{ref}`").result())).n == 2


def test_a_table_given_a_json_column_loads_its_next_batches_from_json_lines(
        spark, gcs_staging, bq_client, cleanup) -> None:
    # A user adds a JSON column to the live table (the proto has no such field): BigQuery would refuse the
    # Parquet of every later batch; its rows (every type of the sample proto) now load as JSON lines.
    from tests.integration.test_end_to_end import expected_row

    cfg = Config.from_env(gcs_staging)
    cleanup(cfg)
    produce_bookings(cfg, 30)
    assert Pipeline(cfg, spark).run(available_now=True).totals.rows_written == 30
    table = bq_client.get_table(cfg.bigquery.table_ref)
    table.schema = [*table.schema, bigquery.SchemaField("notes", "JSON")]
    bq_client.update_table(table, ["schema"])
    before = {j.job_id for j in load_jobs(bq_client, cfg)}

    produce_bookings(cfg, 30, start=30)
    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.rows_written, summary.totals.failed) == (30, 0)
    later = [j for j in load_jobs(bq_client, cfg) if j.job_id not in before]
    assert later and {j.source_format for j in later} == {"NEWLINE_DELIMITED_JSON"}
    assert all(uri.endswith(".ndjson") for j in later for uri in j.source_uris), "read from gs:// by the job"
    rows = {r["order_number"]: r for r in read_table(bq_client, cfg)}
    assert len(rows) == 60
    for i in range(60):
        row = dict(rows[f"ORD-{i:08d}"])
        row["context"] = json.loads(row["context"])
        for name in ("message_topic", "message_partition", "message_offset", "message_timestamp", "load_time"):
            del row[name]
        assert row.pop("notes") is None and row == expected_row(i), f"booking {i}"
    assert staged_leftovers(cfg) == []
