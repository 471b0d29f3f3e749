"""Descriptor → BigQuery schema: every row of seed 001's type table, and each addition."""

from __future__ import annotations

import re

import pytest

from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.schema import (
    MetadataColumns,
    SchemaOptions,
    bigquery_fields,
    parse_metadata_columns,
    sanitize_name,
    schema_json,
    table_schema,
)


def columns(test_descriptors: Descriptors, message: str, **options: object) -> dict[str, dict]:
    fields = bigquery_fields(test_descriptors.find_message(message), options=SchemaOptions(**options))
    return {f["name"]: f for f in schema_json(fields)}


def col(name: str, bq_type: str, mode: str = "NULLABLE", **extra: object) -> dict[str, object]:
    return {"name": name, "type": bq_type, "mode": mode, **extra}


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


def test_wrappers_are_nullable_scalars_and_dates_are_dates(test_descriptors: Descriptors) -> None:
    assert list(columns(test_descriptors, "testdata.Wrapped").values()) == [
        col("w_double", "FLOAT"), col("w_float", "FLOAT"), col("w_int64", "INTEGER"), col("w_uint64", "INTEGER"),
        col("w_int32", "INTEGER"), col("w_uint32", "INTEGER"), col("w_bool", "BOOLEAN"), col("w_string", "STRING"),
        col("w_bytes", "BYTES"), col("r_int64", "INTEGER", "REPEATED"),
        col("m_string", "RECORD", "REPEATED", fields=[col("key", "STRING"), col("value", "STRING")]),
        col("day", "DATE"), col("r_day", "DATE", "REPEATED"),
    ]


@pytest.mark.parametrize("uint64_type", ["INTEGER", "NUMERIC", "STRING"])
def test_uint64_and_fixed64_columns_follow_the_opt_in(test_descriptors: Descriptors, uint64_type: str) -> None:
    fields = bigquery_fields(test_descriptors.find_message("testdata.AllTypes"),
                             options=SchemaOptions(uint64_type=uint64_type))
    types = {f.name: f.field_type for f in fields}
    assert (types["f_uint64"], types["f_fixed64"]) == (uint64_type, uint64_type)
    assert (types["f_int64"], types["f_uint32"], types["f_sfixed64"]) == ("INTEGER",) * 3
    wrapped = bigquery_fields(test_descriptors.find_message("testdata.Wrapped"),
                              options=SchemaOptions(uint64_type=uint64_type))
    assert {f.name: f.field_type for f in wrapped}["w_uint64"] == uint64_type
    with pytest.raises(ValueError, match="uint64_type"):
        SchemaOptions(uint64_type="FLOAT")


def test_recursive_message_is_cut_to_json_at_max_depth(test_descriptors: Descriptors) -> None:
    cut = "testdata.Node as JSON: cut at depth 3 because the message is recursive."
    assert columns(test_descriptors, "testdata.Node", max_depth=3)["child"] == col(
        "child", "RECORD", fields=[col("name", "STRING"), col("child", "RECORD", fields=[
            col("name", "STRING"), col("child", "STRING", description=cut)])])
    # The default: BigQuery's 15 levels, the last one JSON.
    column, levels = columns(test_descriptors, "testdata.Node")["child"], 1
    while column["type"] == "RECORD":
        column, levels = column["fields"][1], levels + 1
    assert levels == 15 and column["description"].startswith("testdata.Node as JSON: cut at depth 15 ")


def test_recursion_through_a_map_cuts_the_map_to_one_json_per_entry(test_descriptors: Descriptors) -> None:
    cut = "testdata.Tree.ChildrenEntry as JSON: cut at depth 3 because the message is recursive."
    assert columns(test_descriptors, "testdata.Tree", max_depth=3)["children"] == col(
        "children", "RECORD", "REPEATED", fields=[col("key", "STRING"), col("value", "RECORD", fields=[
            col("label", "STRING"), col("children", "STRING", "REPEATED", description=cut)])])


def test_any_nesting_past_max_depth_is_cut(test_descriptors: Descriptors) -> None:
    cols = columns(test_descriptors, "testdata.AllTypes", max_depth=1)
    assert cols["f_message"] == col("f_message", "STRING", description="testdata.Inner as JSON: cut at depth 1 "
                                                                       "because it nests deeper.")
    assert [cols[f]["type"] for f in ("r_message", "m_scalar", "f_duration", "f_timestamp")] == [
        "STRING", "STRING", "STRING", "TIMESTAMP"]
    for bad in (0, 16):
        with pytest.raises(ValueError, match="max_depth must be between 1 and 15"):
            SchemaOptions(max_depth=bad)


def test_a_message_recursing_through_two_fields_stops_at_bigquerys_column_limit(
        test_descriptors: Descriptors) -> None:
    with pytest.raises(SchemaError, match=r"testdata.Pair.(left|right) takes the table past BigQuery's 10,000"):
        bigquery_fields(test_descriptors.find_message("testdata.Pair"))
    assert len(schema_json(bigquery_fields(test_descriptors.find_message("testdata.Pair"),
                                           options=SchemaOptions(max_depth=5)))) == 2


def test_reserved_names_are_refused_or_sanitized(test_descriptors: Descriptors) -> None:
    with pytest.raises(SchemaError, match=r"field testdata.Reserved._PARTITIONTIME: .* '_PARTITIONTIME'"):
        columns(test_descriptors, "testdata.Reserved")
    assert list(columns(test_descriptors, "testdata.Reserved", sanitize_names=True)) == [
        "__PARTITIONTIME", "__table_suffix", "ok"]
    with pytest.raises(SchemaError, match=r"ReservedClash has more than one column named \['__TABLE_x', '__table_x'\]"):
        columns(test_descriptors, "testdata.ReservedClash", sanitize_names=True)


@pytest.mark.parametrize(("name", "sanitized"), [
    ("1st-name", "_1st_name"), ("a.b c", "a_b_c"), ("__ROOT__x", "___ROOT__x"), ("_colIdentifier", "__colIdentifier"),
    ("_ROW_TIMESTAMP", "__ROW_TIMESTAMP"), ("x" * 301, "x" * 300), ("_partition_ok", "__partition_ok"),
])
def test_sanitize_name(name: str, sanitized: str) -> None:
    assert sanitize_name(name) == sanitized


def test_proto_comments_become_descriptions(test_descriptors: Descriptors) -> None:
    message = test_descriptors.find_message("testdata.Described")
    cols = schema_json(bigquery_fields(message, descriptor_sets=test_descriptors.sets))
    assert cols[0] == col("id", "STRING", description="The booking's id.\nIndented second line.")
    assert cols[1] == col("count", "INTEGER", description="A trailing comment.")
    long = cols[2]["description"]
    assert len(long) == 1024 and long.startswith("Long comment. Long") and long.endswith("…")
    assert cols[3]["fields"] == [col("note", "STRING", description="Inside a nested message.")]
    assert cols[4] == col("plain", "STRING")
    # upb descriptors keep no source info: without the sets there are no comments to use.
    assert "description" not in schema_json(bigquery_fields(message))[0]


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



def test_additional_properties_is_the_last_column_and_never_shadows_one(test_descriptors: Descriptors) -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool

    message, key = test_descriptors.find_message("testdata.Legacy"), test_descriptors.find_message("testdata.Inner")
    for metadata in (MetadataColumns(), MetadataColumns(namespace="kafka"), MetadataColumns(enabled=False)):
        plain = schema_json(table_schema(message, metadata, key=key))
        extended = schema_json(table_schema(message, metadata, key=key, additional_properties=True))
        assert extended[:-1] == plain
        assert {k: extended[-1][k] for k in ("name", "type", "mode")} == {
            "name": "additional_properties", "type": "STRING", "mode": "NULLABLE"}
    with pytest.raises(SchemaError, match="'additional_properties'.*SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE"):
        table_schema(message, MetadataColumns(namespace="additional_properties"), additional_properties=True)
    assert table_schema(message, MetadataColumns(namespace="additional_properties"))  # off: the name is free

    file = descriptor_pb2.FileDescriptorProto(name="ap.proto", package="ap", syntax="proto3")
    file.message_type.add(name="Own").field.add(name="Additional_Properties", number=1,
                                                type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    with pytest.raises(SchemaError, match="ap.Own has a column named 'Additional_Properties'"):
        table_schema(pool.FindMessageTypeByName("ap.Own"), MetadataColumns(), additional_properties=True)


ALL_METADATA = ("message_topic", "message_partition", "message_offset", "message_timestamp", "load_time",
                "message_headers", "message_timestamp_type", "message_leader_epoch")


def test_metadata_columns_are_selected_in_order(test_descriptors: Descriptors) -> None:
    message = test_descriptors.find_message("testdata.Legacy")
    picked = schema_json(table_schema(message, MetadataColumns(columns=("message_headers", "message_offset"))))
    assert picked[3:] == [
        col("message_headers", "RECORD", "REPEATED", fields=[col("key", "STRING"), col("value", "BYTES")]),
        col("message_offset", "INTEGER"),
    ]
    flip = schema_json(table_schema(message, MetadataColumns(namespace="kafka", columns=ALL_METADATA)))
    assert [(c["name"], c["type"]) for c in flip[3]["fields"]][5:] == [
        ("message_headers", "RECORD"), ("message_timestamp_type", "STRING"), ("message_leader_epoch", "INTEGER")]
    with pytest.raises(ValueError, match="unknown metadata column.*'offset'"):
        MetadataColumns(columns=("offset",))


def test_parse_metadata_columns_types() -> None:
    assert parse_metadata_columns("message_offset=integer,message_topic=string,load_time=timestamp") == (
        "message_offset", "message_topic", "load_time")
    assert parse_metadata_columns(" message_leader_epoch = INT64 , message_headers=record,") == (
        "message_leader_epoch", "message_headers")
    assert parse_metadata_columns("") == MetadataColumns.NAMES
    for spec, error in [
        ("message_offset=string", "metadata column message_offset has type integer, not 'string'"),
        ("message_offset", "'message_offset': expected name=type"),
        ("offset=integer", "unknown metadata column 'offset'; known: message_topic=string, message_partition="),
        ("load_time=timestamp,load_time=timestamp", "load_time is listed twice"),
    ]:
        with pytest.raises(ValueError, match=re.escape(error)):
            parse_metadata_columns(spec)


def test_key_message_is_a_nullable_record_column(test_descriptors: Descriptors) -> None:
    message, key = test_descriptors.find_message("testdata.Legacy"), test_descriptors.find_message("testdata.Key")
    schema = schema_json(table_schema(message, MetadataColumns(), key=key))
    assert [c["name"] for c in schema] == ["id", "count", "tags", "message_key", *MetadataColumns.NAMES]
    assert schema[3] == col("message_key", "RECORD", description="Kafka message key (testdata.Key); NULL for a "
                            "null key", fields=[col("id", "STRING"), col("day", "DATE")])


def test_a_message_without_fields_is_its_json_text(test_descriptors: Descriptors) -> None:
    """BigQuery has no RECORD without fields: google.protobuf.Empty or a oneof's marker message made the
    table impossible to create, and the job could not start."""
    got = columns(test_descriptors, "testdata.Markers")
    marker = "testdata.Marker as JSON: a message without fields ({} when set)."
    assert got["nothing"] == col("nothing", "STRING", description="google.protobuf.Empty as JSON: a message "
                                 "without fields ({} when set).")
    assert got["marks"] == col("marks", "STRING", "REPEATED", description=marker)
    assert got["active"] == col("active", "STRING", description=marker)
    assert got["by_name"]["fields"][1] == col("value", "STRING", description=marker)


def test_a_proto2_group_is_a_record_like_a_message_field(test_descriptors: Descriptors) -> None:
    got = columns(test_descriptors, "testdata.Grouped")
    assert got["extra"] == col("extra", "RECORD", fields=[col("a", "INTEGER"), col("s", "STRING", "REPEATED")])
    assert got["line"] == col("line", "RECORD", "REPEATED", fields=[col("qty", "INTEGER", "REQUIRED")])
