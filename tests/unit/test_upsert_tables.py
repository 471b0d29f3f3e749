"""Intermediate tables, key schema checks, the changelog reshaping and the upsert settings."""

from __future__ import annotations

import pytest
from google.cloud.bigquery import SchemaField as F

from firehose_bq.config import Config
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.errors import ConfigError, ErrorType, SchemaEvolutionError
from firehose_bq.upsert import tables
from firehose_bq.upsert.writer import to_intermediate
from tests.unit.test_config import MINIMAL

KEY = F("message_key", "RECORD", fields=[F("order_number", "STRING")])
PLANNED = [F("order_number", "STRING"), F("amount", "FLOAT", "REQUIRED"), KEY, F("message_offset", "INTEGER")]


def test_intermediate_schema_wraps_key_and_value() -> None:
    dest = tables.destination_schema(PLANNED, "booking_key")
    assert [f.name for f in dest] == ["order_number", "amount", "booking_key", "message_offset"]
    inter = tables.intermediate_schema(dest, "booking_key")
    assert [(f.name, f.field_type, f.mode) for f in inter] == [
        ("key", "RECORD", "NULLABLE"), ("value", "RECORD", "NULLABLE"), ("partitionTime", "TIMESTAMP", "NULLABLE"),
        ("i", "INTEGER", "REQUIRED"), ("batchNumber", "INTEGER", "REQUIRED")]
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


def records(n: int) -> KafkaRecords:
    return KafkaRecords(topics=["t"] * n, partitions=[1] * n, offsets=[10 + j for j in range(n)],
                        timestamps_ms=[1_767_225_600_000, -1, None][:n], values=[b""] * n)


def converted() -> ConvertedBatch:
    return ConvertedBatch(
        rows=[{"order_number": "a", "message_key": {"order_number": "K1"}},
              {"message_key": {"order_number": "K2"}, "message_offset": 11},
              {"order_number": "c", "message_key": {"order_number": "K1"}}],
        insert_ids=["t_1_10", "t_1_11", "t_1_12"], sources=[0, 1, 2], deletes=[1])


def test_rows_are_reshaped_with_offset_order_and_batch() -> None:
    out, errors = to_intermediate(converted(), records(3), 5, "2026-11-23T00:00:00.000000Z", deletes=True)
    assert errors == []
    assert out.rows == [
        {"key": {"order_number": "K1"}, "value": {"order_number": "a"}, "partitionTime": "2026-01-01T00:00:00.000000Z",
         "i": 10, "batchNumber": 5},
        {"key": {"order_number": "K2"}, "value": None, "partitionTime": "2026-11-23T00:00:00.000000Z",
         "i": 11, "batchNumber": 5},
        {"key": {"order_number": "K1"}, "value": {"order_number": "c"}, "partitionTime": "2026-11-23T00:00:00.000000Z",
         "i": 12, "batchNumber": 5},
    ]
    assert out.insert_ids == ["t_1_10", "t_1_11", "t_1_12"] and out.sources == [0, 1, 2]


def test_tombstones_without_deletes_are_errors_not_silently_dropped() -> None:
    out, errors = to_intermediate(converted(), records(3), 5, "2026-11-23T00:00:00Z", deletes=False)
    assert [r["i"] for r in out.rows] == [10, 12]
    assert [(e.error_type, e.offset) for e in errors] == [(ErrorType.INVALID_MESSAGE_ERROR, 11)]


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
