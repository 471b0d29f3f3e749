"""Protobuf → BigQuery JSON rows: values, presence, well-known types, errors as data."""

from __future__ import annotations

import base64
import json
import math

import pytest

from firehose_bq.convert import KafkaRecords, RowConverter, compile_message, millis_to_rfc3339, rfc3339
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType
from firehose_bq.schema import MetadataColumns


@pytest.fixture(scope="module")
def all_types(test_descriptors: Descriptors):  # noqa: ANN201
    return test_descriptors.message_class("testdata.AllTypes")


def test_scalars_enums_bytes_and_defaults(all_types) -> None:
    msg = all_types(f_bytes=b"\x00\xff", f_string="s", f_enum=2, f_double=1.25, f_bool=True, f_int64=-(2**63),
                    f_uint64=2**64 - 1, f_sint32=-5)
    row = compile_message(all_types.DESCRIPTOR)(msg)
    assert row["f_bytes"] == base64.b64encode(b"\x00\xff").decode()
    assert row["f_string"] == "s"
    assert row["f_enum"] == "GREEN"
    assert row["f_double"] == 1.25
    assert row["f_bool"] is True
    assert row["f_int64"] == -(2**63)
    assert row["f_uint64"] == 2**64 - 1
    assert row["f_sint32"] == -5
    # proto3 scalars without presence: unset is the default value, not NULL
    assert row["f_int32"] == 0 and row["f_float"] == 0.0 and row["f_string"] == "s"
    # fields with presence: NULL when unset
    assert row["f_message"] is None and row["f_timestamp"] is None and row["o_int32"] is None
    assert row["c_text"] is None and row["c_inner"] is None


def test_unknown_enum_number_is_kept_as_its_number(all_types) -> None:
    row = compile_message(all_types.DESCRIPTOR)(all_types(f_enum=7, r_enum=[1, 9]))
    assert row["f_enum"] == "7"
    assert row["r_enum"] == ["RED", "9"]


def test_non_finite_floats_use_bigquery_spellings(all_types) -> None:
    row = compile_message(all_types.DESCRIPTOR)(all_types(f_double=math.inf, f_float=-math.inf))
    assert row["f_double"] == "Infinity" and row["f_float"] == "-Infinity"
    assert compile_message(all_types.DESCRIPTOR)(all_types(f_double=math.nan))["f_double"] == "NaN"


def test_nested_repeated_map_and_well_known_types(all_types) -> None:
    msg = all_types()
    msg.f_message.label = "x"
    msg.f_message.counts.extend([1, 2])
    msg.r_message.add(label="a")
    msg.r_string.extend(["p", "q"])
    msg.m_scalar.update({"b": 2, "a": 1})
    msg.m_message[5].label = "five"
    msg.f_timestamp.seconds, msg.f_timestamp.nanos = 1_700_000_000, 123_456_789
    msg.r_timestamp.add(seconds=0)
    msg.f_duration.seconds, msg.f_duration.nanos = 90, 5
    msg.f_struct.update({"k": "v", "n": 1})
    msg.o_int32 = 0
    msg.c_inner.label = "chosen"
    msg.r_bytes.append(b"\x01")
    row = compile_message(all_types.DESCRIPTOR)(msg)
    assert row["f_message"] == {"label": "x", "counts": [1, 2]}
    assert row["r_message"] == [{"label": "a", "counts": []}]
    assert row["r_string"] == ["p", "q"]
    assert row["m_scalar"] == [{"key": "a", "value": 1}, {"key": "b", "value": 2}]
    assert row["m_message"] == [{"key": 5, "value": {"label": "five", "counts": []}}]
    assert row["f_timestamp"] == "2023-11-14T22:13:20.123456Z"
    assert row["r_timestamp"] == ["1970-01-01T00:00:00.000000Z"]
    assert row["f_duration"] == {"seconds": 90, "nanos": 5}
    assert json.loads(row["f_struct"]) == {"k": "v", "n": 1}
    assert row["o_int32"] == 0  # explicitly set optional: a value, not NULL
    assert row["c_inner"] == {"label": "chosen", "counts": []} and row["c_text"] is None
    assert row["r_bytes"] == ["AQ=="]


def test_timestamps() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert rfc3339(-1, 500_000_000) == "1969-12-31T23:59:59.500000Z"
    assert rfc3339(253402300799, 999_999_999) == "9999-12-31T23:59:59.999999Z"
    assert millis_to_rfc3339(1_700_000_000_123) == "2023-11-14T22:13:20.123000Z"


def records(values: list[bytes | None], timestamps: list[int | None] | None = None) -> KafkaRecords:
    n = len(values)
    return KafkaRecords(["t"] * n, [0] * n, list(range(10, 10 + n)), timestamps or [1_000] * n, values)


def test_batch_conversion_adds_metadata_and_insert_ids(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    converter = RowConverter(cls, MetadataColumns())
    out = converter.convert(records([cls(id="a").SerializeToString()], [None]), load_time="2026-01-01T00:00:00Z")
    assert out.rows == [{"id": "a", "count": None, "tags": [], "message_topic": "t", "message_partition": 0,
                         "message_offset": 10, "message_timestamp": None, "load_time": "2026-01-01T00:00:00Z"}]
    assert out.insert_ids == ["t_0_10"]
    nested = RowConverter(cls, MetadataColumns(namespace="kafka")).convert(
        records([cls(id="a").SerializeToString()]), load_time="L")
    assert nested.rows[0]["kafka"]["message_timestamp"] == "1970-01-01T00:00:01.000000Z"
    assert "message_topic" not in nested.rows[0]
    assert "message_topic" not in RowConverter(cls, MetadataColumns(enabled=False)).convert(
        records([cls(id="a").SerializeToString()]), load_time="L").rows[0]


def test_bad_messages_become_typed_errors_with_coordinates(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.AllTypes")
    too_far = cls()
    too_far.f_timestamp.seconds = 253402300800  # year 10000: BigQuery and Python cannot hold it
    good = cls(f_string="ok").SerializeToString()
    out = RowConverter(cls, MetadataColumns()).convert(
        records([good, b"\x0a\x05ab", None, too_far.SerializeToString(), good]), load_time="L")
    assert [r["f_string"] for r in out.rows] == ["ok", "ok"]
    assert out.sources == [0, 4]
    assert out.insert_ids == ["t_0_10", "t_0_14"]
    assert [(e.error_type, e.offset) for e in out.errors] == [
        (ErrorType.DESERIALIZATION_ERROR, 11),
        (ErrorType.INVALID_MESSAGE_ERROR, 12),
        (ErrorType.INVALID_MESSAGE_ERROR, 13),
    ]
    assert "tombstone" in out.errors[1].message


def test_missing_proto2_required_field_is_an_invalid_message(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    out = RowConverter(cls, MetadataColumns()).convert(records([cls(count=1).SerializePartialToString()]), "L")
    assert [(e.error_type, e.message) for e in out.errors] == [
        (ErrorType.INVALID_MESSAGE_ERROR, "required field(s) missing: id")]
    assert out.rows == []
