"""Protobuf → BigQuery JSON rows: values, presence, well-known types, errors as data."""

from __future__ import annotations

import base64
import json
import math
import re

import pytest

from google.cloud.bigquery import SchemaField

from firehose_bq.convert import (
    JSON,
    METADATA_VALUES,
    STORAGE,
    ValueEncoding,
    KafkaRecords,
    RowConverter,
    compile_message,
    millis_to_rfc3339,
    rfc3339,
)
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType, SchemaError
from firehose_bq.schema import METADATA_COLUMNS, MetadataColumns, SchemaOptions, table_schema


@pytest.fixture(scope="module")
def all_types(test_descriptors: Descriptors):  # noqa: ANN201
    return test_descriptors.message_class("testdata.AllTypes")


def test_scalars_enums_bytes_and_defaults(all_types) -> None:
    msg = all_types(f_bytes=b"\x00\xff", f_string="s", f_enum=2, f_double=1.25, f_bool=True, f_int64=-(2**63),
                    f_uint64=2**63 - 1, f_sint32=-5)
    row = compile_message(all_types.DESCRIPTOR)(msg)
    assert row["f_bytes"] == base64.b64encode(b"\x00\xff").decode()
    assert row["f_string"] == "s"
    assert row["f_enum"] == "GREEN"
    assert row["f_double"] == 1.25
    assert row["f_bool"] is True
    assert row["f_int64"] == -(2**63)
    assert row["f_uint64"] == 2**63 - 1  # the largest INTEGER; past it, see test_uint64_past_integer_*
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


def test_missing_required_fields_are_named_at_any_depth(test_descriptors: Descriptors) -> None:
    """Names built here, not by upb's FindInitializationErrors: beside a map field it builds wrong paths
    and can segfault (4a002200: an empty map entry after a repeated message missing its field)."""
    cls = test_descriptors.message_class("testdata.Proto2All")
    values = [bytes.fromhex("4a002200"), bytes.fromhex("22004a00"), cls(req={"b": "x"}, m_req={5: {}}).SerializePartialToString()]
    out = RowConverter(cls, MetadataColumns()).convert(records(values), "L")
    assert [e.message for e in out.errors] == ["required field(s) missing: r_req[0].a",
                                              "required field(s) missing: r_req[0].a",
                                              "required field(s) missing: req.a, m_req[5].a"]


def test_oneof_members_are_null_unless_chosen_even_with_the_default_value(all_types) -> None:
    convert = compile_message(all_types.DESCRIPTOR)
    row = convert(all_types(c_text=""))
    assert (row["c_text"], row["c_inner"]) == ("", None)
    msg = all_types()
    msg.c_inner.SetInParent()
    row = convert(msg)
    assert (row["c_text"], row["c_inner"]) == (None, {"label": "", "counts": []})


def test_wrappers_are_their_values_or_null_and_dates_are_iso(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Wrapped")
    msg = cls()
    msg.w_double.value = math.nan
    msg.w_uint64.value = 2**64 - 1
    msg.w_string.value = ""  # set to the default: a value, not NULL
    msg.w_bytes.value = b"\x01"
    msg.w_bool.value = False
    msg.r_int64.add(value=5)
    msg.r_int64.add()
    msg.m_string["a"].value = "x"
    msg.day.year, msg.day.month, msg.day.day = 2024, 2, 29
    msg.r_day.add(year=1, month=1, day=1)
    # 2^64-1 fits no INTEGER column: kept whole as text with the uint64 opt-in
    assert compile_message(cls.DESCRIPTOR, options=SchemaOptions(uint64_type="STRING"))(msg) == {
        "w_double": "NaN", "w_float": None, "w_int64": None, "w_uint64": str(2**64 - 1), "w_int32": None,
        "w_uint32": None, "w_bool": False, "w_string": "", "w_bytes": "AQ==", "r_int64": [5, 0],
        "m_string": [{"key": "a", "value": "x"}], "day": "2024-02-29", "r_day": ["0001-01-01"],
    }


def test_partial_dates_are_invalid_messages(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Wrapped")
    values = [cls(day={"year": 0, "month": 5, "day": 1}), cls(day={"year": 2024, "month": 0, "day": 0}),
              cls(day={"year": 2023, "month": 2, "day": 29}), cls(day={"year": 2024, "month": 12, "day": 31})]
    out = RowConverter(cls, MetadataColumns()).convert(records([v.SerializeToString() for v in values]), "L")
    assert [(e.error_type, e.message) for e in out.errors] == [
        (ErrorType.INVALID_MESSAGE_ERROR, "google.type.Date 0-5-1 is not a valid DATE: year 0 is out of range"),
        (ErrorType.INVALID_MESSAGE_ERROR, "google.type.Date 2024-0-0 is not a valid DATE: month must be in 1..12"),
        (ErrorType.INVALID_MESSAGE_ERROR, "google.type.Date 2023-2-29 is not a valid DATE: day is out of range "
                                          "for month"),
    ]
    assert [r["day"] for r in out.rows] == ["2024-12-31"]


def chain(cls, names: str):  # noqa: ANN201
    """A testdata.Node chain: a → b → ... (one level per letter)."""
    root = node = cls(name=names[0])
    for name in names[1:]:
        node = node.child
        node.name = name
    return root


def test_recursive_message_is_json_from_max_depth_on(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Node")
    row = compile_message(cls.DESCRIPTOR, options=SchemaOptions(max_depth=3))(chain(cls, "abcde"))
    assert row == {"name": "a", "child": {"name": "b", "child": {
        "name": "c", "child": '{"child": {"name": "e"}, "name": "d"}'}}}
    deep = compile_message(cls.DESCRIPTOR)(chain(cls, "abcdefghijklmnopqrst"))  # 20 levels
    for _ in range(14):
        deep = deep["child"]
    assert deep["name"] == "o" and json.loads(deep["child"])["child"]["child"]["name"] == "r"


def test_recursion_through_a_map_is_one_json_per_entry(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Tree")
    tree = cls(label="root")
    tree.children["x"].children["y"].children["z"].label = "z"
    tree.children["x"].children["b"].label = "b"
    row = compile_message(cls.DESCRIPTOR, options=SchemaOptions(max_depth=3))(tree)
    assert row == {"label": "root", "children": [{"key": "x", "value": {"label": "", "children": [
        '{"key": "b", "value": {"label": "b"}}', '{"key": "y", "value": {"children": {"z": {"label": "z"}}}}']}}]}


def test_sanitized_names_are_the_row_keys(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Reserved")
    msg = cls(_PARTITIONTIME="p", _table_suffix="t", ok="o")
    assert compile_message(cls.DESCRIPTOR, options=SchemaOptions(sanitize_names=True))(msg) == {
        "__PARTITIONTIME": "p", "__table_suffix": "t", "ok": "o"}
    with pytest.raises(SchemaError, match="testdata.Reserved._PARTITIONTIME"):
        RowConverter(cls, MetadataColumns())


def test_metadata_values_cover_every_metadata_column() -> None:
    assert METADATA_VALUES.keys() == METADATA_COLUMNS.keys()


def test_flip107_metadata_columns(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    value = cls(id="a").SerializeToString()
    batch = KafkaRecords(["t"] * 4, [1] * 4, [7, 8, 9, 10], [5, -1, None, 0], [value] * 4,
                         headers=[[("h", b"\x00\xff"), ("empty", None)], [], [("h", b"")], []],
                         timestamp_types=[0, 1, None, -1], leader_epochs=[3, -1, None, 0])
    names = ("message_headers", "message_timestamp_type", "message_leader_epoch", "message_timestamp")
    rows = RowConverter(cls, MetadataColumns(columns=names)).convert(batch, "L").rows
    assert [tuple(r[n] for n in names) for r in rows] == [
        ([{"key": "h", "value": "AP8="}, {"key": "empty", "value": None}], "CreateTime", 3,
         "1970-01-01T00:00:00.005000Z"),
        ([], "LogAppendTime", None, None),
        ([{"key": "h", "value": ""}], "NoTimestampType", None, None),
        ([], "NoTimestampType", 0, "1970-01-01T00:00:00.000000Z"),
    ]
    assert "message_topic" not in rows[0]
    # A source that does not provide them: NULL, and no headers.
    nested = RowConverter(cls, MetadataColumns(namespace="kafka", columns=names)).convert(records([value]), "L")
    assert nested.rows[0]["kafka"] == {"message_headers": [], "message_timestamp_type": None,
                                       "message_leader_epoch": None,
                                       "message_timestamp": "1970-01-01T00:00:01.000000Z"}


def test_key_column(test_descriptors: Descriptors) -> None:
    cls, key_cls = test_descriptors.message_class("testdata.Legacy"), test_descriptors.message_class("testdata.Key")
    value = cls(id="v").SerializeToString()
    keys = [key_cls(id="k", day={"year": 2026, "month": 1, "day": 2}).SerializeToString(), None, b"\x0a\x05ab",
            key_cls(day={"year": 2026}).SerializeToString()]
    batch = KafkaRecords(["t"] * 4, [0] * 4, [10, 11, 12, 13], [0] * 4, [value] * 4, keys=keys)
    out = RowConverter(cls, MetadataColumns(enabled=False), key_class=key_cls).convert(batch, "L")
    assert [r["message_key"] for r in out.rows] == [{"id": "k", "day": "2026-01-02"}, None]
    assert [(e.error_type, e.offset, e.message.split(":")[0]) for e in out.errors] == [
        (ErrorType.DESERIALIZATION_ERROR, 12, "key"), (ErrorType.INVALID_MESSAGE_ERROR, 13, "key")]
    assert "google.type.Date 2026-0-0" in out.errors[1].message
    no_keys = RowConverter(cls, MetadataColumns(), key_class=key_cls).convert(records([value]), "L")
    assert no_keys.rows[0]["message_key"] is None
    assert "message_key" not in RowConverter(cls, MetadataColumns()).convert(batch, "L").rows[0]


def test_changelog_mode_turns_tombstones_into_deletes_and_requires_keys(test_descriptors: Descriptors) -> None:
    cls, key_cls = test_descriptors.message_class("testdata.Legacy"), test_descriptors.message_class("testdata.Key")
    key = key_cls(id="k").SerializeToString()
    batch = KafkaRecords(["t"] * 4, [0] * 4, [10, 11, 12, 13], [0] * 4,
                         [cls(id="v").SerializeToString(), None, None, cls(id="w").SerializeToString()],
                         keys=[key, key, None, None])
    out = RowConverter(cls, MetadataColumns(columns=("message_offset",)), key_class=key_cls,
                       changelog=True).convert(batch, "L")
    assert [r["message_offset"] for r in out.rows] == [10, 11]
    assert out.deletes == [1]
    assert out.rows[1] == {"message_key": {"id": "k", "day": None}, "message_offset": 11}
    assert out.rows[0]["id"] == "v"
    assert [(e.error_type, e.offset) for e in out.errors] == [(ErrorType.INVALID_MESSAGE_ERROR, 12),
                                                             (ErrorType.INVALID_MESSAGE_ERROR, 13)]
    assert "null key" in out.errors[0].message
    with pytest.raises(ValueError, match="key"):
        RowConverter(cls, MetadataColumns(), changelog=True)


def test_storage_encoding_keeps_values_proto_native(all_types) -> None:
    msg = all_types(f_bytes=b"\x00\xff", f_double=float("inf"))
    msg.f_timestamp.seconds, msg.f_timestamp.nanos = 1_700_000_000, 123_456_789
    data = msg.SerializeToString()
    batch = KafkaRecords(["t"], [0], [7], [1_700_000_000_123], [data], headers=[[("h", b"\x01")]])
    meta = MetadataColumns(columns=("message_timestamp", "load_time", "message_headers"))
    json_row = RowConverter(all_types, meta).convert(batch, "2026-11-23T10:00:00.250000Z").rows[0]
    row = RowConverter(all_types, meta, encoding=STORAGE).convert(batch, "2026-11-23T10:00:00.250000Z").rows[0]
    assert json_row["f_bytes"] == "AP8=" and row["f_bytes"] == b"\x00\xff"
    assert json_row["f_double"] == "Infinity" and row["f_double"] == float("inf")
    assert json_row["f_timestamp"] == "2023-11-14T22:13:20.123456Z" and row["f_timestamp"] == 1_700_000_000_123_456
    assert row["message_timestamp"] == 1_700_000_000_123_000
    assert row["load_time"] == 1_795_428_000_250_000
    assert row["message_headers"] == [{"key": "h", "value": b"\x01"}]


LOAD_TIME = "2026-11-23T10:00:00.000000Z"
TIMESTAMPS = [((-62135596800, 0), True), ((253402300799, 999999999), True), ((-62135596801, 0), False),
              ((253402300800, 0), False), ((0, -1), False), ((0, 1_000_000_000), False)]
DURATIONS = [((315576000000, 999999999), True), ((-315576000000, -999999999), True), ((0, -5), True),
             ((315576000001, 0), False), ((0, 1_000_000_000), False), ((1, -1), False), ((-1, 1), False)]


@pytest.mark.parametrize("encoding", [JSON, STORAGE], ids=["json", "storage"])
def test_well_known_values_outside_their_range_fail_the_message(all_types, encoding: ValueEncoding) -> None:
    """Never normalized, clamped or wrapped: BigQuery would store a different time (or refuse the row)."""
    converter = RowConverter(all_types, MetadataColumns(), encoding=encoding)
    for field, cases in (("f_timestamp", TIMESTAMPS), ("f_duration", DURATIONS)):
        for (seconds, nanos), valid in cases:
            for msg in (all_types(**{field: {"seconds": seconds, "nanos": nanos}}),
                        all_types(r_timestamp=[{"seconds": seconds, "nanos": nanos}]) if field == "f_timestamp"
                        else all_types(**{field: {"seconds": seconds, "nanos": nanos}})):
                out = converter.convert(records([msg.SerializeToString()]), LOAD_TIME)
                assert bool(out.rows) == valid, (field, seconds, nanos, out.errors)
                if not valid:
                    assert out.errors[0].error_type is ErrorType.INVALID_MESSAGE_ERROR
                    assert "outside" in out.errors[0].message


@pytest.mark.parametrize("encoding", [JSON, STORAGE], ids=["json", "storage"])
def test_uint64_past_integer_fails_unless_the_column_keeps_it(all_types, encoding: ValueEncoding) -> None:
    import decimal

    big = all_types(f_uint64=2**64 - 1, f_fixed64=2**63).SerializeToString()
    fine = all_types(f_uint64=2**63 - 1).SerializeToString()
    out = RowConverter(all_types, MetadataColumns(), encoding=encoding).convert(records([big, fine]), LOAD_TIME)
    assert [e.error_type for e in out.errors] == [ErrorType.INVALID_MESSAGE_ERROR]
    assert "SINK_BIGQUERY_UINT64_COLUMN_TYPE" in out.errors[0].message
    assert out.rows[0]["f_uint64"] == 2**63 - 1
    for uint64_type, expected in (("STRING", str(2**64 - 1)),
                                  ("NUMERIC", str(2**64 - 1) if encoding is JSON else decimal.Decimal(2**64 - 1))):
        options = SchemaOptions(uint64_type=uint64_type)
        out = RowConverter(all_types, MetadataColumns(), options, encoding=encoding).convert(records([big]), LOAD_TIME)
        assert out.rows[0]["f_uint64"] == expected and not out.errors


def fits(value: object, f: SchemaField) -> bool:
    """Whether `value` is what BigQuery's JSON for column `f` may hold."""
    if f.mode == "REPEATED":
        return isinstance(value, list) and all(fits(v, _one(f)) for v in value)
    if value is None:
        return f.mode == "NULLABLE"
    if f.field_type == "RECORD":
        return (isinstance(value, dict) and value.keys() == {s.name for s in f.fields}
                and all(fits(value[s.name], s) for s in f.fields))
    kinds = {"INTEGER": int, "FLOAT": (float, str), "BOOLEAN": bool, "STRING": str, "BYTES": str,
             "TIMESTAMP": str, "DATE": str}
    return isinstance(value, kinds[f.field_type]) and (f.field_type != "INTEGER" or not isinstance(value, bool))


def _one(f: SchemaField) -> SchemaField:
    return SchemaField(f.name, f.field_type, mode="NULLABLE", fields=f.fields)


@pytest.mark.parametrize("options", [SchemaOptions(), SchemaOptions(max_depth=1), SchemaOptions(max_depth=3)])
def test_rows_fit_the_schema(test_descriptors: Descriptors, options: SchemaOptions) -> None:
    """The lock-step between schema.py and convert.py, on fully populated messages."""
    all_types = test_descriptors.message_class("testdata.AllTypes")
    full = all_types(f_string="s", f_bytes=b"b", r_string=["x"], m_scalar={"k": 1}, r_enum=[1], r_bytes=[b"1"])
    full.f_message.counts.append(1)
    full.r_message.add(label="r")
    full.m_message[1].label = "m"
    full.f_timestamp.seconds = 1
    full.r_timestamp.add(seconds=2)
    full.f_struct.update({"a": [1, {"b": None}]})
    full.f_duration.seconds = 3
    full.c_inner.label = "c"
    wrapped = test_descriptors.message_class("testdata.Wrapped")(
        w_double={"value": 1.5}, w_bool={"value": True}, r_int64=[{"value": 1}], m_string={"a": {"value": "b"}},
        day={"year": 2000, "month": 1, "day": 1}, r_day=[{"year": 2000, "month": 1, "day": 1}])
    tree = test_descriptors.message_class("testdata.Tree")()
    tree.children["a"].children["b"].children["c"].children["d"].label = "d"
    key_cls = test_descriptors.message_class("testdata.Key")
    key = key_cls(id="k", day={"year": 2000, "month": 1, "day": 1}).SerializeToString()
    metadata = MetadataColumns(namespace="kafka", columns=tuple(METADATA_COLUMNS))
    for msg in (full, wrapped, tree, chain(test_descriptors.message_class("testdata.Node"), "a" * 20)):
        schema = table_schema(msg.DESCRIPTOR, metadata, options, key=key_cls.DESCRIPTOR)
        batch = KafkaRecords(["t"], [0], [0], [0], [msg.SerializeToString()], keys=[key], headers=[[("h", b"v")]],
                             timestamp_types=[0], leader_epochs=[1])
        out = RowConverter(type(msg), metadata, options, key_class=key_cls).convert(batch, "L")
        assert not out.errors
        assert fits(out.rows[0], SchemaField("row", "RECORD", fields=schema)), (msg.DESCRIPTOR.full_name, out.rows)


def test_confluent_frames_are_stripped_and_bad_frames_are_deserialization_errors(
        test_descriptors: Descriptors) -> None:
    from firehose_bq.registry.confluent import encode_frame

    cls = test_descriptors.message_class("testdata.Legacy")
    good = encode_frame(7, [0], cls(id="x").SerializeToString())
    converter = RowConverter(cls, MetadataColumns(enabled=False), confluent_framed=True)
    out = converter.convert(records([good, b"\x01\x00\x00\x00\x07\x00", b"\x00\x00"]), load_time="L")
    assert out.rows == [{"id": "x", "count": None, "tags": []}]
    assert [(e.error_type, e.offset) for e in out.errors] == [
        (ErrorType.DESERIALIZATION_ERROR, 11), (ErrorType.DESERIALIZATION_ERROR, 12)]


# -- the generated converter's fast paths, checked against the slow, obvious implementations ------------

def random_value(rng, depth: int = 0):  # noqa: ANN001, ANN201
    """A JSON-able Python value of the kinds a google.protobuf.Value holds, with the awkward cases."""
    texts = ["", "plain", "é ü ß", "日本語", "emoji 😀", 'quote " and \\ backslash', "\n\t\r\x00\x1f", "\u2028\u2029",
             "</script>", "a\udcff"[:1]]
    numbers = [0.0, -0.0, 1.0, -1.5, 0.1, 1e300, -1e-300, 5e-324, 1e16, 2.0**53 + 2, 123456789.125, 1.7976931348623157e308]
    choice = rng.randrange(6 if depth < 4 else 4)
    if choice == 0:
        return rng.choice(texts)
    if choice == 1:
        return rng.choice(numbers)
    if choice == 2:
        return rng.random() < 0.5
    if choice == 3:
        return None
    if choice == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(texts) + str(i): random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_struct_value_and_list_value_text_is_what_json_format_writes() -> None:
    import random

    from google.protobuf import struct_pb2

    from firehose_bq.convert import _json, _list_text, _struct_text, _value_text

    rng = random.Random(7)
    for _ in range(300):
        struct = struct_pb2.Struct()
        struct.update({f"k{i}": random_value(rng) for i in range(rng.randrange(5))})
        assert _struct_text(struct) == _json(struct)
        values = struct_pb2.ListValue()
        values.extend([random_value(rng) for _ in range(rng.randrange(4))])
        assert _list_text(values) == _json(values)
        value = struct_pb2.Value()
        value.struct_value.update({"x": random_value(rng)})
        assert _value_text(value) == _json(value)
    assert _struct_text(struct_pb2.Struct()) == "{}" == _json(struct_pb2.Struct())
    assert _value_text(struct_pb2.Value()) == "null" == _json(struct_pb2.Value())  # no kind set
    assert _value_text(struct_pb2.Value(null_value=0)) == "null"
    assert _list_text(struct_pb2.ListValue()) == "[]"
    number = struct_pb2.Value(number_value=1.0)
    assert _value_text(number) == _json(number) == "1.0"


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_struct_numbers_fail_as_json_format_does(number: float, all_types) -> None:
    from google.protobuf import struct_pb2

    from firehose_bq.convert import _json, _struct_text

    struct = struct_pb2.Struct()
    struct.update({"ok": 1, "nested": {"list": [1, "x", number]}})
    with pytest.raises(ValueError) as expected:
        _json(struct)
    with pytest.raises(ValueError) as got:
        _struct_text(struct)
    assert str(got.value) == str(expected.value)
    msg = all_types()
    msg.f_struct.update({"bad": number})
    out = RowConverter(all_types, MetadataColumns()).convert(records([msg.SerializeToString()]), "L")
    assert [(e.error_type, e.message) for e in out.errors] == [
        (ErrorType.INVALID_MESSAGE_ERROR, "Fail to serialize {} for Value.number_value, which would parse as "
                                          "string_value".format("NaN" if math.isnan(number) else "Infinity"))]


def test_cached_timestamp_text_is_rfc3339() -> None:
    from firehose_bq.convert import TIMESTAMP_CACHE_DAYS, _timestamp_text

    text = _timestamp_text()
    seconds = [0, -1, 59, 60, 86399, 86400, -86400, -86401, 1_700_000_000, 253402300799, -62135596800,
               *range(1_767_225_600, 1_767_225_600 + 3 * 86400, 7919)]
    nanos = [0, 1, 999, 1000, 123_456_789, 999_999_999, -1, -1000, 1_000_000_000, 5_000_000_000]
    for s in seconds:
        for n in nanos:
            assert text(s, n) == rfc3339(s, n), (s, n)
    for s in range(0, (TIMESTAMP_CACHE_DAYS + 10) * 86400, 86400 - 1):  # more days than the cache keeps
        assert text(s, 5000) == rfc3339(s, 5000)
    for s in (253402300800, -62135596801, 2**63 - 1):  # out of range: the same error as rfc3339
        with pytest.raises(Exception) as expected:
            rfc3339(s)
        with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
            text(s, 0)


def dynamic_class(name: str, fields: list[tuple[str, int, str | None]], extra: list = ()):  # noqa: ANN001, ANN201
    """A message class built from a descriptor made here: field names protoc-generated fixtures can't have
    in a checked-in .proto this test owns. fields: (name, FieldDescriptorProto type, message type name)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name=f"{name.lower()}.proto", package="dyn", syntax="proto3")
    for message_name, message_fields in [(name, fields), *extra]:
        message = file.message_type.add(name=message_name)
        for number, (field_name, type_, type_name) in enumerate(message_fields, start=1):
            fd = message.field.add(name=field_name, number=number, type=type_,
                                   label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if type_name:
                fd.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"dyn.{name}"))


def test_field_names_that_are_not_plain_python_become_constants_not_code() -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    names = ["class", "None", "lambda", "m", "meta", "_t1", "_list", "__class__x", "import"]
    cls = dynamic_class("Awkward", [(n, F.TYPE_STRING, None) for n in names])
    msg = cls()
    for n in names:
        setattr(msg, n, f"value of {n}")
    assert compile_message(cls.DESCRIPTOR)(msg) == {n: f"value of {n}" for n in names}
    out = RowConverter(cls, MetadataColumns(namespace="lambda")).convert(records([msg.SerializeToString()]), "L")
    assert out.rows[0]["class"] == "value of class" and out.rows[0]["lambda"]["load_time"] == "L"


def test_nested_records_deeper_than_the_inline_limit() -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    from firehose_bq.convert import MAX_INLINE_LEVELS

    levels = MAX_INLINE_LEVELS + 3
    extra = [(f"L{i}", [("name", F.TYPE_STRING, None), ("down", F.TYPE_MESSAGE, f".dyn.L{i + 1}")])
             for i in range(1, levels)] + [(f"L{levels}", [("name", F.TYPE_STRING, None)])]
    cls = dynamic_class("L0", [("name", F.TYPE_STRING, None), ("down", F.TYPE_MESSAGE, ".dyn.L1")], extra)
    msg = cls(name="0")
    node = msg
    for i in range(1, levels + 1):
        node = node.down
        node.name = str(i)
    expected: dict = {"name": str(levels)}
    for i in reversed(range(levels)):
        expected = {"name": str(i), "down": expected}
    assert compile_message(cls.DESCRIPTOR)(msg) == expected
    cut = compile_message(cls.DESCRIPTOR, options=SchemaOptions(max_depth=3))(msg)
    assert json.loads(cut["down"]["down"]["down"]) == json.loads(json.dumps(expected["down"]["down"]["down"]))


def test_maps_and_repeated_fields_empty_and_full(all_types) -> None:
    convert = compile_message(all_types.DESCRIPTOR)
    empty = convert(all_types())
    assert (empty["m_scalar"], empty["m_message"], empty["r_message"], empty["r_enum"], empty["r_timestamp"]) == (
        [], [], [], [], [])
    msg = all_types(m_scalar={"z": 1, "a": 2, "m": 3}, r_enum=[2, 0, 5])
    msg.r_timestamp.add(seconds=86400, nanos=1000)
    msg.m_message[-1].counts.append(7)
    row = convert(msg)
    assert row["m_scalar"] == [{"key": "a", "value": 2}, {"key": "m", "value": 3}, {"key": "z", "value": 1}]
    assert row["r_enum"] == ["GREEN", "COLOR_UNSPECIFIED", "5"]
    assert row["r_timestamp"] == ["1970-01-02T00:00:00.000001Z"]
    assert row["m_message"] == [{"key": -1, "value": {"label": "", "counts": [7]}}]
    storage = compile_message(all_types.DESCRIPTOR, enc=STORAGE)(msg)
    assert storage["r_timestamp"] == [86_400_000_001]


def test_rows_are_fresh_objects(test_descriptors: Descriptors) -> None:
    """Writers may change rows (e.g. add columns): no two rows share a dict or list."""
    cls = test_descriptors.message_class("testdata.Legacy")
    value = cls(id="a").SerializeToString()
    rows = RowConverter(cls, MetadataColumns(namespace="kafka")).convert(records([value, value]), "L").rows
    assert rows[0]["tags"] == rows[1]["tags"] == []
    assert rows[0] is not rows[1] and rows[0]["kafka"] is not rows[1]["kafka"] and rows[0]["tags"] is not rows[1]["tags"]


def test_unknown_fields_are_detected_recursively(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.AllTypes")
    inner_unknown = b"\x8a\x01\x03\xf8\x01\x07"  # f_message (17) holding an unknown field 31 = 7
    top_unknown = cls(f_string="s").SerializeToString() + b"\xf8\x03\x01"  # field 63 = 1
    plain = cls(f_string="s").SerializeToString()
    out = RowConverter(cls, MetadataColumns(), detect_unknown_fields=True).convert(
        records([plain, inner_unknown, top_unknown]), "L")
    assert out.unknown_fields == [1, 2]
    assert out.rows[1]["f_message"] == {"label": "", "counts": []} and not out.errors


@pytest.mark.parametrize("enabled", [True, False])
def test_cycle_collector_is_left_as_it_was(test_descriptors: Descriptors, enabled: bool) -> None:
    import gc

    cls = test_descriptors.message_class("testdata.Legacy")
    converter = RowConverter(cls, MetadataColumns())
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        out = converter.convert(records([cls(id="a").SerializeToString(), b"\x0a\x05ab"]), "L")
        assert gc.isenabled() is enabled
        assert [r["id"] for r in out.rows] == ["a"] and len(out.errors) == 1
    finally:
        gc.enable() if was else gc.disable()


def test_unknown_fields_with_a_key_column(test_descriptors: Descriptors) -> None:
    cls, key_cls = test_descriptors.message_class("testdata.AllTypes"), test_descriptors.message_class("testdata.Key")
    values = [cls(f_string="a").SerializeToString() + b"\xf8\x03\x01", cls(f_string="b").SerializeToString()]
    batch = KafkaRecords(["t"] * 2, [0] * 2, [10, 11], [0] * 2, values, keys=[key_cls(id="k").SerializeToString()] * 2)
    out = RowConverter(cls, MetadataColumns(enabled=False), key_class=key_cls, detect_unknown_fields=True).convert(
        batch, "L")
    assert out.unknown_fields == [0]
    assert [(r["f_string"], r["message_key"]) for r in out.rows] == [("a", {"id": "k", "day": None}),
                                                                     ("b", {"id": "k", "day": None})]
