"""Descriptor → BigQuery schema: every row of seed 001's type table, and each addition."""

from __future__ import annotations

import pytest

from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.schema import MetadataColumns, bigquery_fields, schema_json, table_schema


def columns(test_descriptors: Descriptors, message: str) -> dict[str, dict]:
    fields = bigquery_fields(test_descriptors.find_message(message))
    return {f["name"]: f for f in schema_json(fields)}


@pytest.mark.parametrize(
    ("field", "bq_type"),
    [
        ("f_bytes", "BYTES"),
        ("f_string", "STRING"),
        ("f_enum", "STRING"),
        ("f_float", "FLOAT"),
        ("f_double", "FLOAT"),
        ("f_bool", "BOOLEAN"),
        *[(f"f_{t}", "INTEGER") for t in ("int64", "uint64", "int32", "uint32", "fixed64", "fixed32",
                                           "sfixed64", "sfixed32", "sint64", "sint32")],
        ("f_timestamp", "TIMESTAMP"),
        ("f_struct", "STRING"),
    ],
)
def test_type_table(test_descriptors: Descriptors, field: str, bq_type: str) -> None:
    assert columns(test_descriptors, "testdata.AllTypes")[field] == {"name": field, "type": bq_type,
                                                                     "mode": "NULLABLE"}


def test_message_is_record_with_its_fields(test_descriptors: Descriptors) -> None:
    assert columns(test_descriptors, "testdata.AllTypes")["f_message"] == {
        "name": "f_message", "type": "RECORD", "mode": "NULLABLE",
        "fields": [{"name": "label", "type": "STRING", "mode": "NULLABLE"},
                   {"name": "counts", "type": "INTEGER", "mode": "REPEATED"}],
    }


def test_duration_is_record_of_seconds_and_nanos(test_descriptors: Descriptors) -> None:
    assert columns(test_descriptors, "testdata.AllTypes")["f_duration"] == {
        "name": "f_duration", "type": "RECORD", "mode": "NULLABLE",
        "fields": [{"name": "seconds", "type": "INTEGER", "mode": "NULLABLE"},
                   {"name": "nanos", "type": "INTEGER", "mode": "NULLABLE"}],
    }


def test_repeated_modifier(test_descriptors: Descriptors) -> None:
    cols = columns(test_descriptors, "testdata.AllTypes")
    assert cols["r_string"] == {"name": "r_string", "type": "STRING", "mode": "REPEATED"}
    assert cols["r_enum"] == {"name": "r_enum", "type": "STRING", "mode": "REPEATED"}
    assert cols["r_timestamp"] == {"name": "r_timestamp", "type": "TIMESTAMP", "mode": "REPEATED"}
    assert cols["r_message"]["type"] == "RECORD" and cols["r_message"]["mode"] == "REPEATED"


def test_maps_are_repeated_key_value_records(test_descriptors: Descriptors) -> None:
    cols = columns(test_descriptors, "testdata.AllTypes")
    assert cols["m_scalar"] == {
        "name": "m_scalar", "type": "RECORD", "mode": "REPEATED",
        "fields": [{"name": "key", "type": "STRING", "mode": "NULLABLE"},
                   {"name": "value", "type": "INTEGER", "mode": "NULLABLE"}],
    }
    value = cols["m_message"]["fields"][1]
    assert value["name"] == "value" and value["type"] == "RECORD"


def test_optional_and_oneof_are_nullable_columns(test_descriptors: Descriptors) -> None:
    cols = columns(test_descriptors, "testdata.AllTypes")
    assert cols["o_int32"]["mode"] == "NULLABLE"
    assert cols["c_text"] == {"name": "c_text", "type": "STRING", "mode": "NULLABLE"}
    assert cols["c_inner"]["type"] == "RECORD"


def test_proto2_required_is_required(test_descriptors: Descriptors) -> None:
    assert schema_json(bigquery_fields(test_descriptors.find_message("testdata.Legacy"))) == [
        {"name": "id", "type": "STRING", "mode": "REQUIRED"},
        {"name": "count", "type": "INTEGER", "mode": "NULLABLE"},
        {"name": "tags", "type": "STRING", "mode": "REPEATED"},
    ]


def test_recursive_message_is_refused_at_bigquerys_depth_limit(test_descriptors: Descriptors) -> None:
    with pytest.raises(SchemaError, match="testdata.Node.child.*deeper than BigQuery's limit of 15"):
        bigquery_fields(test_descriptors.find_message("testdata.Node"))


def test_metadata_columns_at_root_and_in_namespace(test_descriptors: Descriptors) -> None:
    message = test_descriptors.find_message("testdata.Legacy")
    root = schema_json(table_schema(message, MetadataColumns()))
    assert [c["name"] for c in root[3:]] == ["message_topic", "message_partition", "message_offset",
                                             "message_timestamp", "load_time"]
    assert [c["type"] for c in root[3:]] == ["STRING", "INTEGER", "INTEGER", "TIMESTAMP", "TIMESTAMP"]
    nested = schema_json(table_schema(message, MetadataColumns(namespace="kafka")))
    assert nested[3]["name"] == "kafka" and nested[3]["type"] == "RECORD"
    assert [c["name"] for c in nested[3]["fields"]] == list(MetadataColumns.NAMES)
    assert len(schema_json(table_schema(message, MetadataColumns(enabled=False)))) == 3


def test_metadata_clash_is_an_error(test_descriptors: Descriptors) -> None:
    with pytest.raises(SchemaError, match="message_offset.*SINK_BIGQUERY_METADATA_NAMESPACE"):
        table_schema(test_descriptors.find_message("testdata.Clash"), MetadataColumns())
    assert table_schema(test_descriptors.find_message("testdata.Clash"), MetadataColumns(namespace="meta"))
