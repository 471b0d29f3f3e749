"""Check that the patched bqemulator behaves like BigQuery (see firehose_bq/devstack/bqemulator_launcher.py).

There is one test per gap the launcher closes, and one per sub-case of the
insertAll validation. Each test reads its data back through the public client
API and compares it exactly. The fixtures ``bq_client`` (a client pointed at
the running patched emulator) and ``bq_dataset`` (a fresh dataset id, deleted
afterwards) come from ``conftest.py``.

Every call uses short retry deadlines. A regression that brings back HTTP 500
then fails in seconds, instead of hanging through the client's 600 s default
retry.
"""

import base64
import contextlib
import datetime as dt
import io
from decimal import Decimal
from typing import Any

import pytest
from google.api_core.exceptions import BadRequest
from google.cloud import bigquery
from google.cloud.bigquery import AutoRowIDs, SchemaField
from google.cloud.bigquery.retry import DEFAULT_RETRY

pytestmark = pytest.mark.integration

RETRY = DEFAULT_RETRY.with_deadline(10)
TIMEOUT = 30

STOPPED = {"reason": "stopped", "location": "", "debugInfo": "", "message": ""}


def invalid(location: str, message: str) -> dict[str, str]:
    return {"reason": "invalid", "location": location, "debugInfo": "", "message": message}


def make_table(client: bigquery.Client, dataset: str, name: str, schema: list[SchemaField]) -> str:
    table_id = f"{client.project}.{dataset}.{name}"
    client.create_table(bigquery.Table(table_id, schema=schema), retry=RETRY, timeout=TIMEOUT)
    return table_id


def insert(
    client: bigquery.Client, table_id: str, rows: list[dict[str, Any]], **kwargs: Any
) -> list[dict[str, Any]]:
    kwargs.setdefault("row_ids", AutoRowIDs.DISABLED)
    return client.insert_rows_json(table_id, rows, retry=RETRY, timeout=TIMEOUT, **kwargs)


def query(client: bigquery.Client, sql: str) -> list[dict[str, Any]]:
    job = client.query(sql, retry=RETRY, job_retry=None, timeout=TIMEOUT)
    return [dict(row.items()) for row in job.result(timeout=TIMEOUT)]


def count(client: bigquery.Client, table_id: str) -> int:
    return query(client, f"SELECT COUNT(*) AS n FROM `{table_id}`")[0]["n"]


PEOPLE = [
    SchemaField("id", "INTEGER", mode="REQUIRED"),
    SchemaField("name", "STRING"),
]


# --------------------------------------------------------------------------- gap 1


def test_gap1_emulator_serves_without_spatial_extension(bq_client: bigquery.Client, bq_dataset: str) -> None:
    # The emulator is running at all only because gap 1 is patched: offline,
    # the unpatched one dies at start-up trying to download `spatial`.
    datasets = [d.dataset_id for d in bq_client.list_datasets(retry=RETRY, timeout=TIMEOUT)]
    assert bq_dataset in datasets
    assert query(bq_client, "SELECT 1 AS one, 'x' AS s") == [{"one": 1, "s": "x"}]


# --------------------------------------------------------------------------- gap 2


def test_gap2_invalid_type_reports_invalid_and_stopped_and_inserts_nothing(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)
    rows = [{"id": 1, "name": "a"}, {"id": "not-a-number", "name": "b"}, {"id": 3, "name": "c"}]

    errors = insert(bq_client, table_id, rows)

    assert errors == [
        {"index": 0, "errors": [STOPPED]},
        {"index": 1, "errors": [invalid("id", "Cannot convert value to integer (bad value): not-a-number")]},
        {"index": 2, "errors": [STOPPED]},
    ]
    assert count(bq_client, table_id) == 0


def test_gap2_skip_invalid_rows_inserts_only_the_good_rows(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)
    rows = [{"id": 1, "name": "a"}, {"id": "not-a-number", "name": "b"}, {"id": 3, "name": "c"}]

    errors = insert(bq_client, table_id, rows, skip_invalid_rows=True)

    assert errors == [
        {"index": 1, "errors": [invalid("id", "Cannot convert value to integer (bad value): not-a-number")]},
    ]
    assert query(bq_client, f"SELECT id, name FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "name": "a"},
        {"id": 3, "name": "c"},
    ]


def test_gap2_unknown_field_is_invalid(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)

    errors = insert(bq_client, table_id, [{"id": 1, "name": "a", "extra": "x"}, {"id": 2}])

    assert errors == [
        {"index": 0, "errors": [invalid("extra", "no such field: extra.")]},
        {"index": 1, "errors": [STOPPED]},
    ]
    assert count(bq_client, table_id) == 0


def test_gap2_unknown_field_is_dropped_with_ignore_unknown_values(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)

    errors = insert(
        bq_client, table_id, [{"id": 1, "name": "a", "extra": "x"}, {"id": 2}], ignore_unknown_values=True
    )

    assert errors == []
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": None},
    ]


def test_gap2_missing_required_field_is_invalid(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)
    rows = [{"name": "no id"}, {"id": None, "name": "null id"}, {"id": 3, "name": "ok"}]
    missing = invalid("id", "Missing required field: id.")

    assert insert(bq_client, table_id, rows) == [
        {"index": 0, "errors": [missing]},
        {"index": 1, "errors": [missing]},
        {"index": 2, "errors": [STOPPED]},
    ]
    assert count(bq_client, table_id) == 0

    assert insert(bq_client, table_id, rows, skip_invalid_rows=True) == [
        {"index": 0, "errors": [missing]},
        {"index": 1, "errors": [missing]},
    ]
    assert query(bq_client, f"SELECT * FROM `{table_id}`") == [{"id": 3, "name": "ok"}]


NESTED = [
    SchemaField("id", "INTEGER"),
    SchemaField(
        "address",
        "RECORD",
        fields=[
            SchemaField("street", "STRING"),
            SchemaField("zip", "INTEGER", mode="REQUIRED"),
            SchemaField("geo", "RECORD", fields=[SchemaField("lat", "FLOAT"), SchemaField("lon", "FLOAT")]),
        ],
    ),
    SchemaField("tags", "STRING", mode="REPEATED"),
    SchemaField(
        "items",
        "RECORD",
        mode="REPEATED",
        fields=[SchemaField("sku", "STRING"), SchemaField("qty", "INTEGER")],
    ),
]


def test_gap2_nested_record_and_repeated_errors_carry_the_field_path(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "nested", NESTED)
    good = {
        "id": 0,
        "address": {"street": "Main", "zip": "12345", "geo": {"lat": 1.5, "lon": -2}},
        "tags": ["a", "b"],
        "items": [{"sku": "x", "qty": 1}, {"sku": "y", "qty": "2"}],
    }
    rows = [
        good,
        {"id": 1, "address": {"zip": "abc"}},
        {"id": 2, "address": {"street": "no zip"}},
        {"id": 3, "address": {"zip": 1, "geo": {"lat": "north"}}},
        {"id": 4, "address": {"zip": 1, "color": "red"}},
        {"id": 5, "tags": "not-a-list"},
        {"id": 6, "tags": ["a", None]},
        {"id": 7, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "many"}]},
        {"id": 8, "address": {"zip": 1, "street": ["a"]}},
        {"id": 9, "address": "a string"},
        {"id": 10, "tags": None, "items": []},
    ]

    errors = insert(bq_client, table_id, rows, skip_invalid_rows=True)

    assert errors == [
        {"index": 1, "errors": [invalid("address.zip", "Cannot convert value to integer (bad value): abc")]},
        {"index": 2, "errors": [invalid("address.zip", "Missing required field: zip.")]},
        {
            "index": 3,
            "errors": [
                invalid("address.geo.lat", "Cannot convert value to floating point (bad value): north")
            ],
        },
        {"index": 4, "errors": [invalid("address.color", "no such field: color.")]},
        {"index": 5, "errors": [invalid("tags", "Repeated field must be imported as a JSON array: tags.")]},
        {
            "index": 6,
            "errors": [invalid("tags[1]", "Array cannot have a null element; error in writing field tags")],
        },
        {
            "index": 7,
            "errors": [invalid("items[1].qty", "Cannot convert value to integer (bad value): many")],
        },
        {
            "index": 8,
            "errors": [invalid("address.street", "Array specified for non-repeated field: street.")],
        },
        {"index": 9, "errors": [invalid("address", "Cannot convert value to record (bad value): a string")]},
    ]
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {
            "id": 0,
            "address": {"street": "Main", "zip": 12345, "geo": {"lat": 1.5, "lon": -2.0}},
            "tags": ["a", "b"],
            "items": [{"sku": "x", "qty": 1}, {"sku": "y", "qty": 2}],
        },
        {"id": 10, "address": None, "tags": [], "items": []},
    ]


ALL_TYPES = [
    SchemaField("id", "INTEGER"),
    SchemaField("score", "FLOAT"),
    SchemaField("active", "BOOLEAN"),
    SchemaField("name", "STRING"),
    SchemaField("ts", "TIMESTAMP"),
    SchemaField("day", "DATE"),
    SchemaField("blob", "BYTES"),
    SchemaField("dtm", "DATETIME"),
    SchemaField("tod", "TIME"),
    SchemaField("amount", "NUMERIC"),
    SchemaField("doc", "JSON"),
]


def test_gap2_lenient_conversions_match_bigquery(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "types", ALL_TYPES)
    rows = [
        {
            "id": "1",
            "score": "1.5",
            "active": "true",
            "name": 123,
            "ts": "2024-01-02T03:04:05.123456Z",
            "day": "2024-02-29",
            "blob": base64.b64encode(b"hi").decode(),
            "dtm": "2024-01-02 03:04:05",
            "tod": "12:34:56.5",
            "amount": "1.2345678904",
            "doc": {"a": [1, 2]},
        },
        {
            "id": 2.0,
            "score": 2,
            "active": False,
            "name": True,
            "ts": 1700000000.25,
            "day": "1999-12-31",
            "blob": "",
            "dtm": "2024-01-02T03:04:05.000001",
            "tod": "00:00",
            "amount": 7,
            "doc": [1, "x"],
        },
        {"id": 3, "ts": "2024-01-02 03:04:05+02:00"},
        {"id": 4, "ts": "2024-01-02 03:04:05 UTC"},
    ]

    assert insert(bq_client, table_id, rows) == []

    utc = dt.UTC
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {
            "id": 1,
            "score": 1.5,
            "active": True,
            "name": "123",
            "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=utc),
            "day": dt.date(2024, 2, 29),
            "blob": b"hi",
            "dtm": dt.datetime(2024, 1, 2, 3, 4, 5),
            "tod": dt.time(12, 34, 56, 500000),
            "amount": Decimal("1.234567890"),
            "doc": {"a": [1, 2]},
        },
        {
            "id": 2,
            "score": 2.0,
            "active": False,
            "name": "true",
            "ts": dt.datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=utc),
            "day": dt.date(1999, 12, 31),
            "blob": b"",
            "dtm": dt.datetime(2024, 1, 2, 3, 4, 5, 1),
            "tod": dt.time(0, 0),
            "amount": Decimal("7"),
            "doc": [1, "x"],
        },
        {
            "id": 3,
            "score": None,
            "active": None,
            "name": None,
            "ts": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=utc),
            "day": None,
            "blob": None,
            "dtm": None,
            "tod": None,
            "amount": None,
            "doc": None,
        },
        {
            "id": 4,
            "score": None,
            "active": None,
            "name": None,
            "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=utc),
            "day": None,
            "blob": None,
            "dtm": None,
            "tod": None,
            "amount": None,
            "doc": None,
        },
    ]


def test_gap2_wrong_scalar_types_and_value_ranges(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(
        bq_client,
        bq_dataset,
        "ranges",
        [
            SchemaField("k", "INTEGER"),
            SchemaField("ts", "TIMESTAMP"),
            SchemaField("day", "DATE"),
            SchemaField("flag", "BOOLEAN"),
            SchemaField("score", "FLOAT"),
            SchemaField("blob", "BYTES"),
            SchemaField("name", "STRING"),
        ],
    )
    rows = [
        {"k": 0, "ts": "0001-01-01 00:00:00 UTC", "day": "0001-01-01"},
        {"k": 1, "ts": "9999-12-31T23:59:59.999999Z", "day": "9999-12-31"},
        {"k": 2, "ts": "10000-01-01 00:00:00"},
        {"k": 3, "ts": 253402300800},
        {"k": 4, "ts": "0001-01-01T00:00:00+01:00"},
        {"k": 5, "day": "2023-02-29"},
        {"k": 6, "day": "0000-12-31"},
        {"k": 7, "flag": "yes"},
        {"k": 8, "score": "1,5"},
        {"k": 9, "blob": "not base64!"},
        {"k": 10, "name": {"a": 1}},
        {"k": 11.5},
        {"k": "9223372036854775808"},
    ]

    errors = insert(bq_client, table_id, rows, skip_invalid_rows=True)

    assert errors == [
        {
            "index": 2,
            "errors": [
                invalid(
                    "ts",
                    "Could not parse '10000-01-01 00:00:00' as a timestamp. "
                    "Required format is YYYY-MM-DD HH:MM[:SS[.SSSSSS]]",
                )
            ],
        },
        {"index": 3, "errors": [invalid("ts", "Timestamp field value is out of range: 253402300800")]},
        {
            "index": 4,
            "errors": [invalid("ts", "Timestamp field value is out of range: 0001-01-01T00:00:00+01:00")],
        },
        {"index": 5, "errors": [invalid("day", "Invalid date: '2023-02-29'")]},
        {"index": 6, "errors": [invalid("day", "Invalid date: '0000-12-31'")]},
        {"index": 7, "errors": [invalid("flag", "Cannot convert value to boolean (bad value): yes")]},
        {"index": 8, "errors": [invalid("score", "Cannot convert value to floating point (bad value): 1,5")]},
        {"index": 9, "errors": [invalid("blob", "Could not decode base64 string to bytes.")]},
        {"index": 10, "errors": [invalid("name", "This field: name is not a record.")]},
        {"index": 11, "errors": [invalid("k", "Cannot convert value to integer (bad value): 11.5")]},
        {
            "index": 12,
            "errors": [invalid("k", "Cannot convert value to integer (bad value): 9223372036854775808")],
        },
    ]
    utc = dt.UTC
    assert query(bq_client, f"SELECT k, ts, day FROM `{table_id}` ORDER BY k") == [
        {"k": 0, "ts": dt.datetime(1, 1, 1, tzinfo=utc), "day": dt.date(1, 1, 1)},
        {
            "k": 1,
            "ts": dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
            "day": dt.date(9999, 12, 31),
        },
    ]


def test_gap2_insert_id_deduplicates_rows(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "people", PEOPLE)

    assert insert(bq_client, table_id, [{"id": 1}, {"id": 2}], row_ids=["r1", "r2"]) == []
    # A retried batch: r2 was already stored, r3 is new, and r3 also appears
    # twice in this request.
    assert insert(bq_client, table_id, [{"id": 2}, {"id": 3}, {"id": 3}], row_ids=["r2", "r3", "r3"]) == []

    assert query(bq_client, f"SELECT id FROM `{table_id}` ORDER BY id") == [{"id": 1}, {"id": 2}, {"id": 3}]


# --------------------------------------------------------------------------- gap 3


def test_gap3_update_table_adds_columns_and_relaxes_required(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "evolving", PEOPLE)
    assert insert(bq_client, table_id, [{"id": 1, "name": "old"}]) == []

    table = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT)
    table.schema = [
        SchemaField("id", "INTEGER", mode="NULLABLE"),
        SchemaField("name", "STRING"),
        SchemaField("extra", "STRING"),
        SchemaField("labels", "STRING", mode="REPEATED"),
        SchemaField("meta", "RECORD", fields=[SchemaField("k", "STRING"), SchemaField("v", "INTEGER")]),
    ]
    bq_client.update_table(table, ["schema"], retry=RETRY, timeout=TIMEOUT)

    fetched = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT)
    assert [(f.name, f.field_type, f.mode) for f in fetched.schema] == [
        ("id", "INTEGER", "NULLABLE"),
        ("name", "STRING", "NULLABLE"),
        ("extra", "STRING", "NULLABLE"),
        ("labels", "STRING", "REPEATED"),
        ("meta", "RECORD", "NULLABLE"),
    ]
    new_rows = [
        {"id": 2, "name": "new", "extra": "e", "labels": ["x", "y"], "meta": {"k": "a", "v": "5"}},
        {"id": None, "name": "relaxed"},
    ]
    assert insert(bq_client, table_id, new_rows) == []

    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY name") == [
        {"id": 2, "name": "new", "extra": "e", "labels": ["x", "y"], "meta": {"k": "a", "v": 5}},
        {"id": 1, "name": "old", "extra": None, "labels": [], "meta": None},
        {"id": None, "name": "relaxed", "extra": None, "labels": [], "meta": None},
    ]


def test_gap3_update_table_adds_nested_subfields(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(
        bq_client,
        bq_dataset,
        "nested_evolving",
        [
            SchemaField("id", "INTEGER"),
            SchemaField("rec", "RECORD", fields=[SchemaField("a", "INTEGER")]),
            SchemaField("items", "RECORD", mode="REPEATED", fields=[SchemaField("x", "STRING")]),
        ],
    )
    assert insert(bq_client, table_id, [{"id": 1, "rec": {"a": 1}, "items": [{"x": "p"}]}]) == []

    table = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT)
    table.schema = [
        SchemaField("id", "INTEGER"),
        SchemaField("rec", "RECORD", fields=[SchemaField("a", "INTEGER"), SchemaField("b", "STRING")]),
        SchemaField(
            "items",
            "RECORD",
            mode="REPEATED",
            fields=[SchemaField("x", "STRING"), SchemaField("y", "INTEGER")],
        ),
    ]
    bq_client.update_table(table, ["schema"], retry=RETRY, timeout=TIMEOUT)
    assert (
        insert(bq_client, table_id, [{"id": 2, "rec": {"a": 2, "b": "new"}, "items": [{"x": "q", "y": 9}]}])
        == []
    )

    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "rec": {"a": 1, "b": None}, "items": [{"x": "p", "y": None}]},
        {"id": 2, "rec": {"a": 2, "b": "new"}, "items": [{"x": "q", "y": 9}]},
    ]


def test_gap3_incompatible_schema_changes_are_rejected(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "strict", PEOPLE)
    table = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT)
    ref = f"{bq_client.project}:{bq_dataset}.strict"

    table.schema = [SchemaField("id", "INTEGER", mode="REQUIRED")]
    with pytest.raises(BadRequest) as dropped:
        bq_client.update_table(table, ["schema"], retry=RETRY, timeout=TIMEOUT)
    assert f"Provided Schema does not match Table {ref}. Field name is missing in new schema" in str(
        dropped.value
    )

    table.schema = [SchemaField("id", "INTEGER", mode="REQUIRED"), SchemaField("name", "INTEGER")]
    with pytest.raises(BadRequest) as retyped:
        bq_client.update_table(table, ["schema"], retry=RETRY, timeout=TIMEOUT)
    assert "Field name has changed type from STRING to INTEGER" in str(retyped.value)

    assert [f.name for f in bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT).schema] == [
        "id",
        "name",
    ]


def test_gap3_ddl_alter_table_add_column_updates_metadata(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = make_table(bq_client, bq_dataset, "ddl", PEOPLE)
    assert insert(bq_client, table_id, [{"id": 1, "name": "old"}]) == []

    query(bq_client, f"ALTER TABLE `{table_id}` ADD COLUMN note STRING")

    schema = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT).schema
    assert [(f.name, f.field_type, f.mode) for f in schema] == [
        ("id", "INTEGER", "REQUIRED"),
        ("name", "STRING", "NULLABLE"),
        ("note", "STRING", "NULLABLE"),
    ]
    assert insert(bq_client, table_id, [{"id": 2, "name": "new", "note": "hello"}]) == []
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "name": "old", "note": None},
        {"id": 2, "name": "new", "note": "hello"},
    ]


# --------------------------------------------------------------------------- gap 4


def test_gap4_load_table_from_json_under_5mb_uses_multipart(
    bq_client: bigquery.Client, bq_dataset: str
) -> None:
    table_id = f"{bq_client.project}.{bq_dataset}.loaded_json"
    config = bigquery.LoadJobConfig(schema=PEOPLE)

    job = bq_client.load_table_from_json(
        [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], table_id, job_config=config, timeout=TIMEOUT
    )
    job.result(timeout=TIMEOUT)

    assert job.errors is None
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
    ]


def test_gap4_load_table_from_file_csv_under_5mb(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(bq_client, bq_dataset, "loaded_csv", PEOPLE)
    config = bigquery.LoadJobConfig(
        source_format=bigquery.SourceFormat.CSV,
        skip_leading_rows=1,
        write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
    )

    data = b"id,name\n1,a\n2,b\n"

    # With a size given, and under 5 MB, the client uses a multipart upload
    # (without one it falls back to a resumable upload, which always worked).
    job = bq_client.load_table_from_file(
        io.BytesIO(data), table_id, size=len(data), job_config=config, timeout=TIMEOUT
    )
    job.result(timeout=TIMEOUT)

    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
    ]


# --------------------------------------------------------------------------- gaps 5 and 6: Storage Write


def write_client(stack_env: dict[str, str]) -> Any:
    import grpc
    from google.cloud.bigquery_storage_v1 import BigQueryWriteClient
    from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

    channel = grpc.insecure_channel(stack_env["SINK_BIGQUERY_STORAGE_API_ENDPOINT"])
    return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))


def row_class(descriptor: Any) -> Any:
    """The message class of a self-contained DescriptorProto (what a Storage Write writer sends)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    file = descriptor_pb2.FileDescriptorProto(name="gap_rows.proto", syntax="proto2")
    file.message_type.append(descriptor)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(descriptor.name))


def proto_field(message: Any, name: str, number: int, kind: str, repeated: bool = False, type_name: str = "") -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    added = message.field.add(name=name, number=number, type=getattr(F, f"TYPE_{kind}"),
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if type_name:
        added.type_name = type_name


# A table with a RECORD and a REPEATED RECORD, and the proto2 row message for it.
ORDERS = [
    SchemaField("id", "INTEGER", mode="REQUIRED"),
    SchemaField("at", "TIMESTAMP"),
    SchemaField("pickup", "RECORD", fields=[SchemaField("lat", "FLOAT"), SchemaField("name", "STRING")]),
    SchemaField("items", "RECORD", mode="REPEATED",
                fields=[SchemaField("sku", "STRING"), SchemaField("qty", "INTEGER")]),
]


def orders_descriptor() -> Any:
    from google.protobuf import descriptor_pb2

    row = descriptor_pb2.DescriptorProto(name="Order")
    place = row.nested_type.add(name="Place")
    proto_field(place, "lat", 1, "DOUBLE")
    proto_field(place, "name", 2, "STRING")
    item = row.nested_type.add(name="Item")
    proto_field(item, "sku", 1, "STRING")
    proto_field(item, "qty", 2, "INT64")
    proto_field(row, "id", 1, "INT64")
    proto_field(row, "at", 2, "INT64")  # TIMESTAMP as int64 microseconds
    proto_field(row, "pickup", 3, "MESSAGE", type_name="Place")
    proto_field(row, "items", 4, "MESSAGE", repeated=True, type_name="Item")
    return row


AT = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
AT_MICROS = int(AT.timestamp()) * 1_000_000 + AT.microsecond


def order(cls: Any, i: int, **changes: Any) -> bytes:
    values = {"id": i, "at": AT_MICROS, "pickup": {"lat": -6.2, "name": f"stop {i}"},
              "items": [{"sku": f"SKU-{i}", "qty": i}], **changes}
    return cls(**values).SerializeToString()


def expected_order(i: int) -> dict[str, Any]:
    return {"id": i, "at": AT, "pickup": {"lat": -6.2, "name": f"stop {i}"}, "items": [{"sku": f"SKU-{i}", "qty": i}]}


def append_request(stream: str | None, descriptor: Any | None, rows: list[bytes]) -> Any:
    from google.cloud.bigquery_storage_v1 import types

    request = types.AppendRowsRequest.pb()()
    request.proto_rows.rows.serialized_rows.extend(rows)
    if stream:
        request.write_stream = stream
    if descriptor is not None:
        request.proto_rows.writer_schema.proto_descriptor.CopyFrom(descriptor)
    return types.AppendRowsRequest.wrap(request)


def default_stream(table_id: str) -> str:
    project, dataset, table = table_id.split(".")
    return f"projects/{project}/datasets/{dataset}/tables/{table}/streams/_default"


def append(client: Any, requests: list[Any]) -> list[Any]:
    """One AppendRows connection carrying `requests`; the responses, in order."""
    from google.cloud.bigquery_storage_v1 import types

    return [types.AppendRowsResponse.pb(r) for r in client.append_rows(iter(requests), timeout=TIMEOUT)]


def test_gap5_storage_write_into_record_columns(bq_client: bigquery.Client, bq_dataset: str,
                                                stack_env: dict[str, str]) -> None:
    table_id = make_table(bq_client, bq_dataset, "orders", ORDERS)
    descriptor = orders_descriptor()
    cls = row_class(descriptor)
    client = write_client(stack_env)
    try:
        responses = append(client, [append_request(default_stream(table_id), descriptor,
                                                   [order(cls, 1), order(cls, 2, pickup=None, items=[])])])
    finally:
        client.transport.close()

    assert [(r.error.code, r.error.message) for r in responses] == [(0, "")]
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        expected_order(1), {**expected_order(2), "pickup": None, "items": []}]


def test_gap6_append_rows_stream_helper_sends_the_stream_name_once(
    bq_client: bigquery.Client, bq_dataset: str, stack_env: dict[str, str]
) -> None:
    from google.cloud.bigquery_storage_v1 import types, writer
    from google.cloud.bigquery_storage_v1.exceptions import StreamClosedError

    table_id = make_table(bq_client, bq_dataset, "helper", ORDERS)
    descriptor = orders_descriptor()
    cls = row_class(descriptor)
    client = write_client(stack_env)
    # The official helper puts the template (stream name, writer schema) into the first request only.
    stream = writer.AppendRowsStream(client, append_request(default_stream(table_id), descriptor, []))
    try:
        futures = [stream.send(types.AppendRowsRequest(proto_rows=types.AppendRowsRequest.ProtoData(
            rows=types.ProtoRows(serialized_rows=[order(cls, i)])))) for i in (1, 2, 3)]
        results = [f.result(timeout=TIMEOUT) for f in futures]
    finally:
        # After a failed request the helper has closed the stream already; keep that failure visible.
        with contextlib.suppress(StreamClosedError):
            stream.close()
        client.transport.close()

    assert [r.error.code for r in results] == [0, 0, 0]
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [expected_order(i) for i in (1, 2, 3)]


def test_gap6_first_request_without_a_stream_name_is_invalid(stack_env: dict[str, str]) -> None:
    from google.api_core.exceptions import InvalidArgument

    client = write_client(stack_env)
    try:
        with pytest.raises(InvalidArgument, match="must set write_stream"):
            append(client, [append_request(None, orders_descriptor(), [])])
    finally:
        client.transport.close()


def test_storage_write_bad_rows_come_back_as_row_errors_and_nothing_is_appended(
    bq_client: bigquery.Client, bq_dataset: str, stack_env: dict[str, str]
) -> None:
    table_id = make_table(bq_client, bq_dataset, "row_errors", ORDERS)
    descriptor = orders_descriptor()
    cls = row_class(descriptor)
    beyond_9999 = 253402300800 * 1_000_000
    rows = [order(cls, 1), order(cls, 2, at=beyond_9999), order(cls, 3), cls(at=AT_MICROS).SerializeToString()]
    client = write_client(stack_env)
    try:
        rejected, = append(client, [append_request(default_stream(table_id), descriptor, rows)])
        # BigQuery's answer: send the other rows again; they land.
        accepted, = append(client, [append_request(default_stream(table_id), descriptor, [rows[0], rows[2]])])
    finally:
        client.transport.close()

    assert rejected.error.code == 3  # INVALID_ARGUMENT
    assert not rejected.HasField("append_result")
    assert [(e.index, e.code, e.message) for e in rejected.row_errors] == [
        (1, 1, f"Timestamp field value is out of range: {beyond_9999} on field at."),
        (3, 1, "Missing required field: id."),
    ]
    assert accepted.error.code == 0 and accepted.HasField("append_result")
    assert query(bq_client, f"SELECT id FROM `{table_id}` ORDER BY id") == [{"id": 1}, {"id": 3}]


# --------------------------------------------------------------------------- extras


def test_storage_write_arrow_rows_take_time_as_text(bq_client: bigquery.Client, bq_dataset: str,
                                                    stack_env: dict[str, str]) -> None:
    """Arrow appends as the sink sends them (arrow_schema.py): TIME and DATETIME as their text. Without the
    patch the whole append failed ("Unsupported cast from string to time64"), stopping a JSON job with a
    TIME column in its default write mode on every restart."""
    import pyarrow as pa
    from google.cloud.bigquery_storage_v1 import types

    table_id = make_table(bq_client, bq_dataset, "clock", [SchemaField("id", "INTEGER"), SchemaField("t", "TIME"),
                                                            SchemaField("at", "DATETIME")])
    rows = pa.record_batch({"id": pa.array([1, 2, 3]), "t": pa.array(["03:04:05", "23:59:59.123456", None]),
                            "at": pa.array(["2024-01-02T03:04:05", None, "2024-01-02 00:00:00.5"])})
    request = types.AppendRowsRequest(write_stream=default_stream(table_id))
    request.arrow_rows.writer_schema.serialized_schema = rows.schema.serialize().to_pybytes()
    request.arrow_rows.rows.serialized_record_batch = rows.serialize().to_pybytes()
    client = write_client(stack_env)
    try:
        responses = append(client, [request])
    finally:
        client.transport.close()

    assert [(r.error.code, r.error.message) for r in responses] == [(0, "")]
    assert query(bq_client, f"SELECT * FROM `{table_id}` ORDER BY id") == [
        {"id": 1, "t": dt.time(3, 4, 5), "at": dt.datetime(2024, 1, 2, 3, 4, 5)},
        {"id": 2, "t": dt.time(23, 59, 59, 123456), "at": None},
        {"id": 3, "t": None, "at": dt.datetime(2024, 1, 2, 0, 0, 0, 500000)}]


def test_record_subfields_named_like_sql_keywords(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = make_table(
        bq_client,
        bq_dataset,
        "keywords",
        [
            SchemaField(
                "rec", "RECORD", fields=[SchemaField("inner", "STRING"), SchemaField("order", "INTEGER")]
            )
        ],
    )

    assert insert(bq_client, table_id, [{"rec": {"inner": "x", "order": 1}}]) == []

    assert query(bq_client, f"SELECT * FROM `{table_id}`") == [{"rec": {"inner": "x", "order": 1}}]


def test_load_job_keeps_time_partitioning(bq_client: bigquery.Client, bq_dataset: str) -> None:
    table_id = f"{bq_client.project}.{bq_dataset}.partitioned"
    config = bigquery.LoadJobConfig(
        schema=[SchemaField("ts", "TIMESTAMP"), SchemaField("v", "INTEGER")],
        time_partitioning=bigquery.TimePartitioning(type_=bigquery.TimePartitioningType.DAY, field="ts"),
        clustering_fields=["v"],
    )
    rows = [{"ts": "2024-05-01T00:00:00Z", "v": 1}]

    bq_client.load_table_from_json(rows, table_id, job_config=config, timeout=TIMEOUT).result(timeout=TIMEOUT)

    table = bq_client.get_table(table_id, retry=RETRY, timeout=TIMEOUT)
    assert (table.time_partitioning.type_, table.time_partitioning.field) == ("DAY", "ts")
    assert table.clustering_fields == ["v"]
    assert query(bq_client, f"SELECT v FROM `{table_id}`") == [{"v": 1}]


def test_writes_after_a_partial_list_rows(bq_client: bigquery.Client, bq_dataset: str) -> None:
    # tabledata.list leaves a DuckDB result unfinished; streaming and load-job writes after it used
    # to fail with HTTP 500 "connection has an unfinished result" (found by `make run` twice).
    table_id = make_table(bq_client, bq_dataset, "after_list", PEOPLE)
    assert insert(bq_client, table_id, [{"id": i} for i in range(5)]) == []
    assert len(list(bq_client.list_rows(table_id, max_results=2, retry=RETRY, timeout=TIMEOUT))) == 2
    assert insert(bq_client, table_id, [{"id": 5}]) == []
    assert len(list(bq_client.list_rows(table_id, max_results=1, retry=RETRY, timeout=TIMEOUT))) == 1
    bq_client.load_table_from_json([{"id": 6}], table_id, timeout=TIMEOUT).result(timeout=TIMEOUT)
    assert count(bq_client, table_id) == 7


def test_parquet_load_matches_columns_by_name(bq_client: bigquery.Client, bq_dataset: str) -> None:
    # As BigQuery: a Parquet file's columns go to the table's columns of the same name (in any case and
    # order); the table's other columns stay NULL. bqemulator paired them by position.
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = [SchemaField("id", "INTEGER", mode="REQUIRED"), SchemaField("Name", "STRING"),
              SchemaField("extra", "STRING"),
              SchemaField("rec", "RECORD", fields=[SchemaField("a", "INTEGER"), SchemaField("b", "STRING")])]
    table_id = make_table(bq_client, bq_dataset, "by_name", schema)
    data = io.BytesIO()
    pq.write_table(pa.table({"rec": [{"b": "x", "a": 1}], "name": ["n"], "id": [7]}), data)
    data.seek(0)
    config = bigquery.LoadJobConfig(source_format="PARQUET", write_disposition="WRITE_APPEND",
                                    create_disposition="CREATE_NEVER")

    bq_client.load_table_from_file(data, table_id, job_config=config, timeout=TIMEOUT).result(timeout=TIMEOUT)

    assert query(bq_client, f"SELECT * FROM `{table_id}`") == [
        {"id": 7, "Name": "n", "extra": None, "rec": {"a": 1, "b": "x"}}]


def test_queries_run_while_rows_are_appended(bq_client: bigquery.Client, bq_dataset: str,
                                             stack_env: dict[str, str]) -> None:
    # As BigQuery: concurrent requests each run. bqemulator ran them all on one DuckDB connection, which
    # refused a query made during a Storage Write append ("connection is busy with another call").
    import threading

    import pyarrow as pa

    from firehose_bq.bigquery.client import Clients
    from firehose_bq.bigquery.storage_write import StorageWriteWriter
    from firehose_bq.config import BigQueryConfig

    table_id = make_table(bq_client, bq_dataset, "busy", [SchemaField("id", "INTEGER"), SchemaField("pad", "STRING")])
    cfg = BigQueryConfig(project_id=bq_client.project, dataset=bq_dataset, table="busy",
                         api_endpoint=stack_env["SINK_BIGQUERY_API_ENDPOINT"],
                         storage_api_endpoint=stack_env["SINK_BIGQUERY_STORAGE_API_ENDPOINT"])
    appends, rows_each, errors = 30, 2000, []

    def append() -> None:
        clients = Clients()  # one per thread: as in a task, each writer has clients of its own here
        writer = StorageWriteWriter(clients.bigquery_client(cfg), clients.write_client(cfg), cfg)
        try:
            for n in range(appends):
                batch = pa.RecordBatch.from_pydict({"id": pa.array(range(n * rows_each, (n + 1) * rows_each),
                                                                   pa.int64()), "pad": ["x" * 50] * rows_each})
                errors.extend(writer.write(batch, None))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            writer.close()
            clients.close()

    writer_thread = threading.Thread(target=append)
    writer_thread.start()
    seen = []
    while writer_thread.is_alive():
        seen.append(count(bq_client, table_id))  # raised BadRequest (connection busy) without the patch
    writer_thread.join()
    assert errors == []
    assert seen == sorted(seen) and count(bq_client, table_id) == appends * rows_each
