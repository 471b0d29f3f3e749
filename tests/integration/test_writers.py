"""The three writers on their own against the real emulator: Arrow batches in, the table read back.

The live table differs from the job's rows the way real tables do: some columns are spelled in another
case, and it has columns the rows do not carry (a scalar, a REPEATED one and a RECORD, left from older
protos). Every writer must land the same values, and fail the same bad rows alone.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField as F

from firehose_bq.arrow_schema import TIMESTAMP, arrow_schema
from firehose_bq.bigquery import storage_write
from firehose_bq.bigquery.client import Clients, make_client
from firehose_bq.bigquery.file_loads import FileLoader, StagingWriter
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.bigquery.storage_write import StorageWriteWriter
from firehose_bq.blobstore import BlobStore, GcsOptions, LocalBlobStore, open_blob_store
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType, RowError

pytestmark = pytest.mark.integration

UTC = dt.UTC
ITEM = [F("sku", "STRING"), F("quantity", "INTEGER"), F("at", "TIMESTAMP")]
# The rows' columns, as the job derives them.
OURS = [
    F("id", "INTEGER", mode="REQUIRED"), F("name", "STRING"), F("amount", "FLOAT"), F("paid", "BOOLEAN"),
    F("signature", "BYTES"), F("created_at", "TIMESTAMP"), F("day", "DATE"),
    F("pickup", "RECORD", fields=[F("lat", "FLOAT"), F("place", "RECORD", fields=[F("name", "STRING")])]),
    F("items", "RECORD", mode="REPEATED", fields=ITEM),
    F("tags", "STRING", mode="REPEATED"),
    F("attributes", "RECORD", mode="REPEATED", fields=[F("key", "STRING"), F("value", "STRING")]),
]
# The live table: other spellings (Id, Name, pickup.Lat, items.SKU) and columns the rows lack.
TABLE = [
    F("Id", "INTEGER", mode="REQUIRED"), F("Name", "STRING"), F("amount", "FLOAT"), F("paid", "BOOLEAN"),
    F("signature", "BYTES"), F("created_at", "TIMESTAMP"), F("day", "DATE"),
    F("pickup", "RECORD", fields=[F("Lat", "FLOAT"), F("place", "RECORD", fields=[F("name", "STRING")]),
                                  F("old", "STRING")]),
    F("items", "RECORD", mode="REPEATED", fields=[F("SKU", "STRING"), F("quantity", "INTEGER"), F("at", "TIMESTAMP")]),
    F("tags", "STRING", mode="REPEATED"),
    F("attributes", "RECORD", mode="REPEATED", fields=[F("key", "STRING"), F("value", "STRING")]),
    F("legacy", "STRING"), F("legacy_list", "INTEGER", mode="REPEATED"),
    F("legacy_record", "RECORD", fields=[F("x", "INTEGER")]),
]
LAST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
FIRST = dt.datetime(1, 1, 1, tzinfo=UTC)


def good_rows() -> list[dict[str, Any]]:
    return [
        {"id": 0, "name": "every shape", "amount": 1.5, "paid": True, "signature": b"\x00\xff\x10",
         "created_at": dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), "day": dt.date(2026, 1, 2),
         "pickup": {"lat": -6.2, "place": {"name": 'quote " and \\ ü'}},
         "items": [{"sku": "A", "quantity": 2, "at": LAST}, {"sku": None, "quantity": None, "at": None}],
         "tags": ["x", "y"], "attributes": [{"key": "channel", "value": "app"}, {"key": "empty", "value": None}]},
        {"id": 1, "name": None, "amount": math.nan, "paid": None, "signature": b"", "created_at": LAST,
         "day": dt.date(9999, 12, 31), "pickup": None, "items": [], "tags": [], "attributes": []},
        {"id": 2, "name": "edges", "amount": math.inf, "paid": False, "signature": None, "created_at": FIRST,
         "day": dt.date(1, 1, 1), "pickup": {"lat": None, "place": None}, "items": [], "tags": ["z"],
         "attributes": []},
        {"id": 3, "name": "minus infinity", "amount": -math.inf, "paid": None, "signature": None, "created_at": None,
         "day": None, "pickup": {"lat": 0.0, "place": {"name": None}}, "items": [], "tags": [], "attributes": []},
    ]


def batch(rows: list[dict[str, Any]], extra: dict[str, pa.Array] | None = None) -> pa.RecordBatch:
    out = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(OURS))
    for name, values in (extra or {}).items():
        out = out.append_column(name, values)
    return out


def expected(row: dict[str, Any]) -> dict[str, Any]:
    """A row of `good_rows` as the table gives it back: its spellings, its extra columns NULL or empty."""
    pickup = row["pickup"]
    return {
        "Id": row["id"], "Name": row["name"], "amount": row["amount"], "paid": row["paid"],
        "signature": row["signature"], "created_at": row["created_at"], "day": row["day"],
        "pickup": None if pickup is None else {"Lat": pickup["lat"], "place": pickup["place"], "old": None},
        "items": [{"SKU": i["sku"], "quantity": i["quantity"], "at": i["at"]} for i in row["items"]],
        "tags": row["tags"], "attributes": row["attributes"],
        "legacy": None, "legacy_list": [], "legacy_record": None,
    }


def comparable(value: Any) -> Any:
    """NaN equals nothing, not even itself: compare it as text."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def read_back(client: bigquery.Client, table_ref: str) -> list[dict[str, Any]]:
    return comparable([dict(r.items()) for r in client.query(f"SELECT * FROM `{table_ref}` ORDER BY Id").result()])


Write = Callable[[pa.RecordBatch, pa.StringArray], list[RowError]]


@pytest.fixture(params=["insertall", "storage_write", "file_loads"])
def target(request: pytest.FixtureRequest, stack_env: dict[str, str], bq_client: bigquery.Client, bq_dataset: str,
           tmp_path: Path) -> tuple[BigQueryConfig, Write]:
    """A fresh table of TABLE's schema and a function that writes a batch into it through one writer."""
    cfg = BigQueryConfig(project_id=stack_env["SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID"], dataset=bq_dataset,
                         table=f"t_{request.param}", api_endpoint=stack_env["SINK_BIGQUERY_API_ENDPOINT"],
                         storage_api_endpoint=stack_env["SINK_BIGQUERY_STORAGE_API_ENDPOINT"])
    bq_client.create_table(bigquery.Table(cfg.table_ref, schema=TABLE))
    return cfg, writer_of(request.param, cfg, tmp_path)


def writer_of(method: str, cfg: BigQueryConfig, root: Path) -> Write:
    def write(rows: pa.RecordBatch, insert_ids: pa.StringArray) -> list[RowError]:
        with Clients() as clients:
            if method == "insertall":
                writer: Any = InsertAllWriter(clients.bigquery_client(cfg), cfg)
            elif method == "storage_write":
                writer = StorageWriteWriter(clients.bigquery_client(cfg), clients.write_client(cfg), cfg)
            else:
                writer = StagingWriter(clients.bigquery_client(cfg), cfg, LocalBlobStore(root), "batch-0/")
            try:
                failures = writer.write(rows, insert_ids)
            finally:
                writer.close()
        if method == "file_loads":
            with make_client(cfg) as client:
                # A plan of its own per write: the job id comes from it (bigquery/jobs.py), and another
                # write's done job under the same id would count as this one's.
                FileLoader(client, cfg, LocalBlobStore(root), "checkpoint").load(0, [writer.staged],
                                                                                 [uuid.uuid4().hex])
        return failures

    return write


def insert_ids(count: int) -> pa.StringArray:
    return pa.array([f"topic_0_{i}" for i in range(count)])


def test_rows_land_exactly_whatever_the_tables_spelling_and_extra_columns(target, bq_client) -> None:
    cfg, write = target
    rows = good_rows()

    assert write(batch(rows), insert_ids(len(rows))) == []

    assert read_back(bq_client, cfg.table_ref) == comparable([expected(r) for r in rows])


def test_bad_rows_fail_alone_and_the_others_land(target, bq_client) -> None:
    cfg, write = target
    good = good_rows()
    rows = [good[0], {**good[1], "id": None}, {**good[2], "id": 12}, {**good[3], "id": 13}, {**good[1], "id": 14}]
    data = batch(rows, {"coupon": pa.array([None, None, "FREE", None, None])})
    micros = data.column("created_at").cast(pa.int64()).to_pylist()
    micros[3] = 300_000_000_000_000_000  # year 11476: Arrow holds it, no TIMESTAMP column does
    data = data.set_column(data.schema.get_field_index("created_at"), "created_at",
                           pa.array(micros, pa.int64()).cast(TIMESTAMP))

    failures = write(data, insert_ids(len(rows)))

    assert [(f.index, f.error_type) for f in failures] == [
        (1, ErrorType.SINK_4XX_ERROR),  # NULL in the REQUIRED Id
        (2, ErrorType.SINK_4XX_ERROR),  # a value in a column the table does not have
        (3, ErrorType.INVALID_MESSAGE_ERROR),  # a TIMESTAMP past 9999-12-31
    ]
    assert "coupon" in failures[1].message and "created_at" in failures[2].message
    landed = read_back(bq_client, cfg.table_ref)
    assert [r["Id"] for r in landed] == [0, 14]
    # Nothing stored that breaks the table: its TIMESTAMPs still aggregate.
    [row] = bq_client.query(f"SELECT MAX(created_at) AS latest FROM `{cfg.table_ref}`").result()
    assert row.latest == LAST


def test_storage_write_spreads_a_large_batch_over_requests(stack_env, bq_client, bq_dataset, tmp_path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 4_000)  # a dozen rows or so per request
    cfg = BigQueryConfig(project_id=stack_env["SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID"], dataset=bq_dataset,
                         table="many", api_endpoint=stack_env["SINK_BIGQUERY_API_ENDPOINT"],
                         storage_api_endpoint=stack_env["SINK_BIGQUERY_STORAGE_API_ENDPOINT"])
    bq_client.create_table(bigquery.Table(cfg.table_ref, schema=TABLE))
    rows = [{**good_rows()[i % 4], "id": i} for i in range(300)]

    assert writer_of("storage_write", cfg, tmp_path)(batch(rows), insert_ids(300)) == []

    [row] = bq_client.query(f"SELECT COUNT(*) AS n, COUNT(DISTINCT Id) AS ids FROM `{cfg.table_ref}`").result()
    assert (row.n, row.ids) == (300, 300)


@pytest.fixture(params=["directory", "gcs"])
def staging_store(request: pytest.FixtureRequest, stack_env: dict[str, str], tmp_path: Path) -> Iterator[BlobStore]:
    """A local staging directory, or a fresh prefix in the GCS emulator's bucket (emptied afterwards)."""
    if request.param == "directory":
        yield LocalBlobStore(tmp_path)
        return
    store = open_blob_store(f"gs://{stack_env['FIREHOSE_STACK_GCS_BUCKET']}/writers-{uuid.uuid4().hex[:8]}",
                            GcsOptions(endpoint=stack_env["SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT"]))
    yield store
    store.delete_prefix("")


def test_a_load_of_files_staged_before_and_after_the_table_grew(stack_env, bq_client, bq_dataset,
                                                                staging_store) -> None:
    """Two tasks of one batch saw two versions of the table (a column added between them): one load job
    takes both files, and each row keeps what it had (from either kind of staging)."""
    cfg = BigQueryConfig(project_id=stack_env["SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID"], dataset=bq_dataset,
                         table="grown", api_endpoint=stack_env["SINK_BIGQUERY_API_ENDPOINT"])
    table = bq_client.create_table(bigquery.Table(cfg.table_ref, schema=TABLE))
    good = good_rows()
    store = staging_store
    before = StagingWriter(bq_client, cfg, store, "batch-7/")
    assert before.write(batch(good[:2]), insert_ids(2)) == []
    before.close()
    table.schema = [*TABLE, F("coupon", "STRING")]
    bq_client.update_table(table, ["schema"])
    after = StagingWriter(bq_client, cfg, store, "batch-7/")
    assert after.write(batch(good[2:], {"coupon": pa.array(["FREE", None])}),
                       pa.array(["topic_1_0", "topic_1_1"])) == []
    after.close()
    assert [pq.read_schema(pa.BufferReader(store.get(n))).names[-1] for f in (before.staged, after.staged)
            for n in f.objects] == ["attributes", "coupon"]

    with make_client(cfg) as client:
        outcome = FileLoader(client, cfg, store, "checkpoint").load(7, [before.staged, after.staged],
                                                                    [uuid.uuid4().hex])

    assert outcome is not None and outcome.rows == 4
    coupons = [None, None, "FREE", None]
    assert read_back(bq_client, cfg.table_ref) == comparable(
        [{**expected(r), "coupon": c} for r, c in zip(good, coupons, strict=True)])
