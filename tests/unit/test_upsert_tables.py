"""Intermediate tables, key schema checks, the changelog reshaping and the upsert settings."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.cloud.bigquery import SchemaField as F

from firehose_bq.batch.rows import RowBuilder, insert_ids
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ConfigError, SchemaEvolutionError
from firehose_bq.schema import MetadataColumns
from firehose_bq.upsert import tables
from firehose_bq.upsert.writer import DELETES_OFF, ChangelogTask
from tests.unit.batch.sources import source_batch
from tests.unit.test_config import MINIMAL

KEY = F("message_key", "RECORD", fields=[F("order_number", "STRING")])
PLANNED = [F("order_number", "STRING"), F("amount", "FLOAT", "REQUIRED"), KEY, F("message_offset", "INTEGER")]


def test_intermediate_schema_wraps_key_and_value() -> None:
    dest = tables.destination_schema(PLANNED, "booking_key")
    assert [f.name for f in dest] == ["order_number", "amount", "booking_key", "message_offset"]
    inter = tables.intermediate_schema(dest, "booking_key")
    assert [(f.name, f.field_type, f.mode) for f in inter] == [
        ("key", "RECORD", "NULLABLE"), ("value", "RECORD", "NULLABLE"), ("partitionTime", "TIMESTAMP", "NULLABLE"),
        ("i", "INTEGER", "REQUIRED"), ("kafkaPartition", "INTEGER", "REQUIRED"), ("kafkaTopic", "STRING", "REQUIRED"),
        ("batchNumber", "INTEGER", "REQUIRED")]
    assert [f.name for f in inter[0].fields] == ["order_number"]
    # Value keeps each column's mode: a row that fits the intermediate table fits the destination.
    assert [(f.name, f.mode) for f in inter[1].fields] == [("order_number", "NULLABLE"), ("amount", "REQUIRED"),
                                                          ("message_offset", "NULLABLE")]


def test_key_field_name_clashing_with_a_column_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match="clashes"):
        tables.destination_schema(PLANNED, "order_number")


def test_names_are_fresh_per_run_and_recognised_by_cleanup() -> None:
    a = tables.intermediate_name("bookings", "tmp")
    b = tables.intermediate_name("bookings", "tmp")
    assert a != b
    assert tables.is_intermediate_of(a, "bookings", "tmp")
    assert not tables.is_intermediate_of(a, "booking", "tmp")
    assert not tables.is_intermediate_of("bookings_tmp_notes", "bookings", "tmp")
    assert tables.intermediate_name("t", "s", "7", "0" * 32, 1) == f"t_s_7_{'0' * 32}_1"


def test_compatible_key_changes_pass() -> None:
    old = [F("id", "STRING", "REQUIRED"), F("geo", "RECORD", fields=[F("zone", "INTEGER", "REQUIRED")])]
    new = [F("id", "STRING", "NULLABLE"), F("geo", "RECORD", fields=[F("zone", "INT64"), F("cell", "STRING")]),
           F("tenant", "STRING")]
    assert tables.key_changes(old, new) == []


def test_incompatible_key_changes_are_named() -> None:
    old = [F("id", "STRING"), F("n", "INTEGER"), F("geo", "RECORD", fields=[F("zone", "INTEGER")]),
           F("flag", "BOOLEAN")]
    new = [F("id", "INTEGER"), F("n", "INTEGER", "REQUIRED"), F("geo", "RECORD", fields=[]),
           F("extra", "STRING", "REQUIRED")]
    assert tables.key_changes(old, new) == [
        "key field id changed type STRING -> INTEGER",
        "key field n changed mode NULLABLE -> REQUIRED",
        "key field geo.zone was removed",
        "key field flag was removed",
        "key field extra was added as REQUIRED",
    ]


UPSERT = {**MINIMAL, "SINK_BIGQUERY_UPSERT_ENABLED": "true"}


def test_upsert_needs_key_field_and_key_class() -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_env(UPSERT)
    text = str(err.value)
    assert "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME: required" in text and "INPUT_SCHEMA_PROTO_KEY_CLASS: required" in text
    with pytest.raises(ConfigError, match="INPUT_SCHEMA_PROTO_KEY_CLASS"):
        Config.from_env({**MINIMAL, "SINK_BIGQUERY_DELETE_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "k"})


def test_upsert_settings_parse_and_bad_names_are_refused() -> None:
    cfg = Config.from_env({**UPSERT, "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "booking_key",
                           "INPUT_SCHEMA_PROTO_KEY_CLASS": "p.K", "SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD": "5000"})
    assert cfg.upsert.enabled and not cfg.upsert.delete_enabled
    assert (cfg.upsert.merge_interval_ms, cfg.upsert.merge_records_threshold) == (60_000, 5000)
    assert cfg.upsert.intermediate_table_suffix == "tmp"
    with pytest.raises(ConfigError) as err:
        Config.from_env({**UPSERT, "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "k`x", "INPUT_SCHEMA_PROTO_KEY_CLASS": "p.K",
                         "SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX": "t-1", "SINK_BIGQUERY_MERGE_INTERVAL_MS": "0"})
    text = str(err.value)
    assert "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME" in text and "SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX" in text
    assert "SINK_BIGQUERY_MERGE_INTERVAL_MS" in text


def test_upsert_off_needs_nothing() -> None:
    assert not Config.from_env(MINIMAL).upsert.enabled


def test_changelog_rows_become_intermediate_rows(test_descriptors: Descriptors) -> None:
    inner, key = test_descriptors.message_class("testdata.Inner"), test_descriptors.message_class("testdata.Key")
    source = source_batch([inner(label="v").SerializeToString(), None], keys=[key(id="a").SerializeToString()] * 2,
                          offsets=[40, 41], timestamps_ms=[2_000, -1], partition=3)
    builder = RowBuilder(ReferenceDecoder(inner), MetadataColumns(columns=("message_offset",)),
                         ReferenceDecoder(key, depth=2), changelog=True)
    rows = builder.build(source, 5_000_000)
    task = ChangelogTask(BigQueryConfig(project_id="p", dataset="d", table="t"), "t_tmp", batch=9, deletes=True)
    pending, refused = task.shape(rows, source, insert_ids(source))
    assert not refused and pending.sources.tolist() == [0, 1]
    upsert, delete = pending.rows.to_pylist()
    assert upsert["key"] == {"id": "a", "day": None}
    assert upsert["value"] == {"label": "v", "counts": [], "message_offset": 40} and delete["value"] is None
    assert upsert["partitionTime"] == datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC)
    assert delete["partitionTime"] == datetime(1970, 1, 1, 0, 0, 5, tzinfo=UTC)  # no Kafka timestamp: load time
    assert (upsert["i"], delete["i"], upsert["kafkaPartition"], upsert["batchNumber"]) == (40, 41, 3, 9)
    assert upsert["kafkaTopic"] == delete["kafkaTopic"] == "t"  # with partition and offset, the record
    assert pending.insert_ids.to_pylist() == ["t_3_40", "t_3_41"]

    no_deletes = ChangelogTask(BigQueryConfig(project_id="p", dataset="d", table="t"), "t_tmp", batch=9, deletes=False)
    pending, refused = no_deletes.shape(rows, source, insert_ids(source))
    assert pending.sources.tolist() == [0] and [(f.index, f.message) for f in refused] == [(1, DELETES_OFF)]


def test_intermediate_values_carry_additional_properties_as_the_schema_orders_them(
        test_descriptors: Descriptors) -> None:
    from firehose_bq.decode.unknown import UnknownFieldsJson
    from firehose_bq.schema import table_schema

    inner, key = test_descriptors.message_class("testdata.Inner"), test_descriptors.message_class("testdata.Key")
    metadata = MetadataColumns(columns=("message_offset",))
    newer = inner(label="v").SerializeToString() + b"\xa0\x06\x01"
    source = source_batch([newer], keys=[key(id="a").SerializeToString()], offsets=[40])
    builder = RowBuilder(ReferenceDecoder(inner), metadata, ReferenceDecoder(key, depth=2),
                         changelog=True, unknown=UnknownFieldsJson(inner))
    task = ChangelogTask(BigQueryConfig(project_id="p", dataset="d", table="t"), "t_tmp", batch=1, deletes=True)
    pending, _ = task.shape(builder.build(source, 5_000_000), source, insert_ids(source))
    planned = tables.destination_schema(table_schema(inner.DESCRIPTOR, metadata, key=key.DESCRIPTOR,
                                                     additional_properties=True), "id_key")
    value = next(f for f in tables.intermediate_schema(planned, "id_key") if f.name == "value")
    assert [f.name for f in pending.rows.schema.field("value").type] == [f.name for f in value.fields]
    assert pending.rows.to_pylist()[0]["value"]["additional_properties"] == '{"100":[1]}'
