"""Protobuf values → Arrow columns: the conversion rules, on both decoders (the native one skips when it is
not built). Presence, enums, well-known types, maps, the depth cut to JSON, the uint64 opt-in, and the
values that fail their message instead of being stored as something else."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.message import Message

from firehose_bq.decode import DecodedValues, make_value_decoder, native_unavailable
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType, SchemaError
from firehose_bq.schema import SchemaOptions

INVALID, DESER = ErrorType.INVALID_MESSAGE_ERROR, ErrorType.DESERIALIZATION_ERROR
NATIVE_MISSING = native_unavailable()
DECODERS = [pytest.param("python"),
            pytest.param("native", marks=pytest.mark.skipif(bool(NATIVE_MISSING), reason=NATIVE_MISSING))]

Decode = Callable[..., DecodedValues]


@pytest.fixture(params=DECODERS)
def decode(request: pytest.FixtureRequest) -> Decode:
    def run(cls: type[Message], values: Sequence[bytes | Message | None], options: SchemaOptions = SchemaOptions(),
            framed: bool = False) -> DecodedValues:
        decoder = make_value_decoder(cls, 1, options, framed, prefer=request.param)
        data = [v.SerializeToString() if isinstance(v, Message) else v for v in values]
        out = decoder.decode(pa.array(data, pa.binary()))
        out.values.validate(full=True)
        assert len(out.values) == len(values) and out.values.type == decoder.arrow_type
        assert all(f.message for f in out.failures)
        assert all(not out.values[f.index].is_valid for f in out.failures)  # a failed slot is NULL
        return out
    return run


def rows(decode: Decode, cls: type[Message], *messages: Message, options: SchemaOptions = SchemaOptions()) \
        -> list[dict[str, Any]]:
    out = decode(cls, messages, options)
    assert out.failures == [], out.failures
    return out.values.to_pylist()


def failures(out: DecodedValues) -> list[tuple[int, ErrorType]]:
    return [(f.index, f.error_type) for f in out.failures]


@pytest.fixture(scope="module")
def all_types(test_descriptors: Descriptors):  # noqa: ANN201
    return test_descriptors.message_class("testdata.AllTypes")


def test_scalars_enums_bytes_and_defaults(decode: Decode, all_types) -> None:
    msg = all_types(f_bytes=b"\x00\xff", f_string="s", f_enum=2, f_double=1.25, f_bool=True, f_int64=-(2**63),
                    f_uint64=2**63 - 1, f_sint32=-5)
    [row] = rows(decode, all_types, msg)
    assert row["f_bytes"] == b"\x00\xff"
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


def test_proto2_optional_fields_are_null_unless_set(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    assert rows(decode, cls, cls(id="a"), cls(id="b", count=0)) == [
        {"id": "a", "count": None, "tags": []}, {"id": "b", "count": 0, "tags": []}]


def test_unknown_enum_number_is_kept_as_its_number(decode: Decode, all_types) -> None:
    [row] = rows(decode, all_types, all_types(f_enum=7, r_enum=[1, 9]))
    assert row["f_enum"] == "7"
    assert row["r_enum"] == ["RED", "9"]


def test_non_finite_floats_are_kept(decode: Decode, all_types) -> None:
    first, second = rows(decode, all_types, all_types(f_double=math.inf, f_float=-math.inf),
                         all_types(f_double=math.nan))
    assert first["f_double"] == math.inf and first["f_float"] == -math.inf
    assert math.isnan(second["f_double"])


def test_nested_repeated_map_and_well_known_types(decode: Decode, all_types) -> None:
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
    [row] = rows(decode, all_types, msg)
    assert row["f_message"] == {"label": "x", "counts": [1, 2]}
    assert row["r_message"] == [{"label": "a", "counts": []}]
    assert row["r_string"] == ["p", "q"]
    assert row["m_scalar"] == [{"key": "a", "value": 1}, {"key": "b", "value": 2}]
    assert row["m_message"] == [{"key": 5, "value": {"label": "five", "counts": []}}]
    # BigQuery keeps microseconds: the nanos past them are cut, not rounded.
    assert row["f_timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    assert row["r_timestamp"] == [datetime(1970, 1, 1, tzinfo=UTC)]
    assert row["f_duration"] == {"seconds": 90, "nanos": 5}
    assert json.loads(row["f_struct"]) == {"k": "v", "n": 1}
    assert row["o_int32"] == 0  # explicitly set optional: a value, not NULL
    assert row["c_inner"] == {"label": "chosen", "counts": []} and row["c_text"] is None
    assert row["r_bytes"] == [b"\x01"]


def test_oneof_members_are_null_unless_chosen_even_with_the_default_value(decode: Decode, all_types) -> None:
    inner = all_types()
    inner.c_inner.SetInParent()
    text, chosen = rows(decode, all_types, all_types(c_text=""), inner)
    assert (text["c_text"], text["c_inner"]) == ("", None)
    assert (chosen["c_text"], chosen["c_inner"]) == (None, {"label": "", "counts": []})


def test_maps_and_repeated_fields_empty_and_full(decode: Decode, all_types) -> None:
    msg = all_types(m_scalar={"z": 1, "a": 2, "m": 3}, r_enum=[2, 0, 5])
    msg.r_timestamp.add(seconds=86400, nanos=1000)
    msg.m_message[-1].counts.append(7)
    empty, row = rows(decode, all_types, all_types(), msg)
    assert (empty["m_scalar"], empty["m_message"], empty["r_message"], empty["r_enum"], empty["r_timestamp"]) == (
        [], [], [], [], [])
    # Sorted by key: a map has no order, and a stable one makes rows comparable.
    assert row["m_scalar"] == [{"key": "a", "value": 2}, {"key": "m", "value": 3}, {"key": "z", "value": 1}]
    assert row["r_enum"] == ["GREEN", "COLOR_UNSPECIFIED", "5"]
    assert row["r_timestamp"] == [datetime(1970, 1, 2, 0, 0, 0, 1, tzinfo=UTC)]
    assert row["m_message"] == [{"key": -1, "value": {"label": "", "counts": [7]}}]


def test_wrappers_are_their_values_or_null_and_dates_are_dates(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Wrapped")
    msg = cls()
    msg.w_double.value = math.inf
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
    assert rows(decode, cls, msg, options=SchemaOptions(uint64_type="STRING")) == [{
        "w_double": math.inf, "w_float": None, "w_int64": None, "w_uint64": str(2**64 - 1), "w_int32": None,
        "w_uint32": None, "w_bool": False, "w_string": "", "w_bytes": b"\x01", "r_int64": [5, 0],
        "m_string": [{"key": "a", "value": "x"}], "day": date(2024, 2, 29), "r_day": [date(1, 1, 1)],
    }]


def test_partial_dates_are_invalid_messages(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Wrapped")
    out = decode(cls, [cls(day={"year": 0, "month": 5, "day": 1}), cls(day={"year": 2024, "month": 0, "day": 0}),
                       cls(day={"year": 2023, "month": 2, "day": 29}), cls(day={"year": 2024, "month": 12, "day": 31})])
    assert failures(out) == [(0, INVALID), (1, INVALID), (2, INVALID)]
    for failure, text in zip(out.failures, ("0-5-1", "2024-0-0", "2023-2-29")):
        assert f"google.type.Date {text} is not a valid DATE" in failure.message
    assert out.values.to_pylist()[3]["day"] == date(2024, 12, 31)


def test_missing_proto2_required_field_is_an_invalid_message(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    out = decode(cls, [cls(count=1).SerializePartialToString(), cls(id="x")])
    assert failures(out) == [(0, INVALID)]
    assert out.failures[0].message.startswith("required field(s) missing: ") and out.failures[0].message.endswith("id")
    assert out.values.to_pylist()[1]["id"] == "x"


def test_missing_required_fields_fail_at_any_depth(decode: Decode, test_descriptors: Descriptors) -> None:
    """4a002200: an empty map entry after a repeated message missing its field, where upb's own report
    builds wrong paths and can segfault: a producer's bad message must only fail its row."""
    cls = test_descriptors.message_class("testdata.Proto2All")
    values = [bytes.fromhex("4a002200"), bytes.fromhex("22004a00"),
              cls(req={"b": "x"}, m_req={5: {}}).SerializePartialToString()]
    out = decode(cls, values, SchemaOptions(max_depth=4))
    assert failures(out) == [(0, INVALID), (1, INVALID), (2, INVALID)]
    assert all(f.message.startswith("required field(s) missing: ") for f in out.failures)


def test_the_reference_names_missing_required_fields_by_path(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Proto2All")
    values = [bytes.fromhex("4a002200"), cls(req={"b": "x"}, m_req={5: {}}).SerializePartialToString()]
    out = make_value_decoder(cls, options=SchemaOptions(max_depth=4), prefer="python").decode(pa.array(values))
    assert [f.message for f in out.failures] == ["required field(s) missing: r_req[0].a",
                                                "required field(s) missing: req.a, m_req[5].a"]


def chain(cls, names: str):  # noqa: ANN201
    """A testdata.Node chain: a → b → ... (one level per letter)."""
    root = node = cls(name=names[0])
    for name in names[1:]:
        node = node.child
        node.name = name
    return root


def test_recursive_message_is_json_from_max_depth_on(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Node")
    assert rows(decode, cls, chain(cls, "abcde"), options=SchemaOptions(max_depth=3)) == [
        {"name": "a", "child": {"name": "b", "child": {"name": "c", "child": '{"child": {"name": "e"}, "name": "d"}'}}}]
    [deep] = rows(decode, cls, chain(cls, "abcdefghijklmnopqrst"))  # 20 levels
    for _ in range(14):
        deep = deep["child"]
    assert deep["name"] == "o" and json.loads(deep["child"])["child"]["child"]["name"] == "r"


def test_recursion_through_a_map_is_one_json_per_entry(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Tree")
    tree = cls(label="root")
    tree.children["x"].children["y"].children["z"].label = "z"
    tree.children["x"].children["b"].label = "b"
    assert rows(decode, cls, tree, options=SchemaOptions(max_depth=3)) == [
        {"label": "root", "children": [{"key": "x", "value": {"label": "", "children": [
            '{"key": "b", "value": {"label": "b"}}', '{"key": "y", "value": {"children": {"z": {"label": "z"}}}}']}}]}]


def test_sanitized_names_are_the_columns(decode: Decode, test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Reserved")
    msg = cls(_PARTITIONTIME="p", _table_suffix="t", ok="o")
    assert rows(decode, cls, msg, options=SchemaOptions(sanitize_names=True)) == [
        {"__PARTITIONTIME": "p", "__table_suffix": "t", "ok": "o"}]
    with pytest.raises(SchemaError, match="testdata.Reserved._PARTITIONTIME"):
        decode(cls, [])


TIMESTAMPS = [((-62135596800, 0), True), ((253402300799, 999999999), True), ((-62135596801, 0), False),
              ((253402300800, 0), False), ((0, -1), False), ((0, 1_000_000_000), False)]
DURATIONS = [((315576000000, 999999999), True), ((-315576000000, -999999999), True), ((0, -5), True),
             ((315576000001, 0), False), ((0, 1_000_000_000), False), ((1, -1), False), ((-1, 1), False)]


def test_well_known_values_outside_their_range_fail_the_message(decode: Decode, all_types) -> None:
    """Never normalized, clamped or wrapped: BigQuery would store a different time (or refuse the row)."""
    messages, valid = [], []
    for (seconds, nanos), ok in TIMESTAMPS:
        value = {"seconds": seconds, "nanos": nanos}
        messages += [all_types(f_timestamp=value), all_types(r_timestamp=[value])]
        valid += [ok, ok]
    for (seconds, nanos), ok in DURATIONS:
        messages.append(all_types(f_duration={"seconds": seconds, "nanos": nanos}))
        valid.append(ok)
    out = decode(all_types, messages)
    assert failures(out) == [(i, INVALID) for i, ok in enumerate(valid) if not ok]
    assert out.values.to_pylist()[2]["f_timestamp"] == datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


@pytest.mark.parametrize("uint64_type,expected", [("STRING", str(2**64 - 1)), ("NUMERIC", Decimal(2**64 - 1))])
def test_uint64_past_integer_fails_unless_the_column_keeps_it(decode: Decode, all_types, uint64_type: str,
                                                              expected: object) -> None:
    big = all_types(f_uint64=2**64 - 1, f_fixed64=2**63)
    fine = all_types(f_uint64=2**63 - 1)
    out = decode(all_types, [big, fine])
    assert failures(out) == [(0, INVALID)]
    assert "SINK_BIGQUERY_UINT64_COLUMN_TYPE" in out.failures[0].message
    assert out.values.to_pylist()[1]["f_uint64"] == 2**63 - 1
    [row] = rows(decode, all_types, big, options=SchemaOptions(uint64_type=uint64_type))
    assert row["f_uint64"] == expected


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_struct_numbers_fail_the_message(decode: Decode, all_types, number: float) -> None:
    """JSON has no spelling for them, and a Struct column is JSON text."""
    msg = all_types()
    msg.f_struct.update({"ok": 1, "nested": {"list": [1, "x", number]}})
    assert failures(decode(all_types, [msg])) == [(0, INVALID)]


def test_confluent_frames_are_stripped_and_bad_frames_are_deserialization_errors(
        decode: Decode, test_descriptors: Descriptors) -> None:
    from firehose_bq.registry.confluent import encode_frame

    cls = test_descriptors.message_class("testdata.Legacy")
    good = encode_frame(7, [0], cls(id="x").SerializeToString())
    out = decode(cls, [good, b"\x01\x00\x00\x00\x07\x00", b"\x00\x00"], framed=True)
    assert out.values.to_pylist()[0] == {"id": "x", "count": None, "tags": []}
    assert failures(out) == [(1, DESER), (2, DESER)]


def test_a_frame_naming_another_message_type_is_a_deserialization_error_not_a_row(
        decode: Decode, test_descriptors: Descriptors) -> None:
    """The acceptance run's bug: another message type of the schema's file (or of another schema), decoded
    as the configured class because the header was skipped, landed as a wrong row. Its frame says so."""
    from firehose_bq.registry.confluent import encode_frame, message_indexes

    cls = test_descriptors.message_class("testdata.AllTypes")
    own = list(message_indexes(cls.DESCRIPTOR))
    payload = cls(f_string="s").SerializeToString()  # bytes that parse as the class: only the frame tells
    spelled_out = b"\x00\x00\x00\x00\x07" + bytes([2 * len(own)]) + bytes(2 * i for i in own)
    values = [encode_frame(7, own, payload), spelled_out + payload, encode_frame(7, [own[0] + 1], payload),
              encode_frame(7, [*own, 0], payload), encode_frame(7, own[:-1] or [5], payload),
              b"\x00\x00\x00\x00\x07\x06\x02" + payload]  # three indexes announced, then cut
    out = decode(cls, values, framed=True)
    assert [r["f_string"] if r else None for r in out.values.to_pylist()] == ["s", "s", None, None, None, None]
    assert failures(out) == [(2, DESER), (3, DESER), (4, DESER), (5, DESER)]
    assert out.failures[0].message == (
        f"written as another message type: its Confluent frame names message indexes [{own[0] + 1}] (schema id 7), "
        f"the configured class testdata.AllTypes is {own}")


def test_a_hostile_frame_of_huge_message_indexes_is_refused_with_the_same_text_by_both_decoders(
        decode: Decode, test_descriptors: Descriptors) -> None:
    """Nine indexes of INT64_MIN (ten-byte varints): the eight shown take 20 characters each. The C decoder
    wrote them into a buffer sized for 19 (a stack overflow, into its other message's text)."""
    cls = test_descriptors.message_class("testdata.Legacy")
    int64_min = b"\xff" * 9 + b"\x01"  # zig-zag: -2**63
    value = b"\x00\x00\x00\x00\x07" + bytes([2 * 9]) + int64_min * 9 + cls(id="x").SerializeToString()
    out = decode(cls, [value], framed=True)
    assert failures(out) == [(0, DESER)]
    shown = ", ".join([str(-2 ** 63)] * 8)
    assert out.failures[0].message == (f"written as another message type: its Confluent frame names message indexes "
                                       f"[{shown}, ...] (schema id 7), the configured class testdata.Legacy is [0]")


def test_unknown_fields_are_detected_recursively(decode: Decode, all_types) -> None:
    inner_unknown = b"\x8a\x01\x03\xf8\x01\x07"  # f_message (17) holding an unknown field 31 = 7
    top_unknown = all_types(f_string="s").SerializeToString() + b"\xf8\x03\x01"  # field 63 = 1
    out = decode(all_types, [all_types(f_string="s"), inner_unknown, top_unknown])
    assert out.unknown_fields == [1, 2] and out.failures == []
    assert out.values.to_pylist()[1]["f_message"] == {"label": "", "counts": []}


def test_a_message_without_fields_is_its_json_text_and_null_when_unset(decode: Decode,
                                                                        test_descriptors: Descriptors) -> None:
    markers, marker = (test_descriptors.message_class(f"testdata.{n}") for n in ("Markers", "Marker"))
    empty = test_descriptors.message_class("google.protobuf.Empty")
    got = rows(decode, markers, markers(nothing=empty(), marks=[marker(), marker()], active=marker(),
                                        by_name={"a": marker()}, id="x"), markers(other="o"))
    assert got[0] == {"nothing": "{}", "marks": ["{}", "{}"], "active": "{}", "deleted": None, "other": None,
                      "by_name": [{"key": "a", "value": "{}"}], "id": "x"}
    assert got[1] == {"nothing": None, "marks": [], "active": None, "deleted": None, "other": "o",
                      "by_name": [], "id": ""}
    # upb reads field number 0 in a message without fields as an unknown field; so does the native decoder.
    out = decode(marker, [b"\x00\x01", b"\x03\x04", b"\x04", b"\x03\x0c"])
    assert failures(out) == [(2, DESER), (3, DESER)] and out.unknown_fields == [0, 1]


def test_a_map_key_not_utf8_beside_a_missing_required_field_fails_its_row_clearly(
        decode: Decode, test_descriptors: Descriptors) -> None:
    """upb hands the non-UTF-8 key as bytes among str keys: naming the missing field sorted them, and the
    row failed with Python's `'<' not supported between instances of 'bytes' and 'str'`. A missing field
    under such a key cannot be looked up (upb refuses the bytes key): the key is the row's failure."""
    from tests.unit.decode.wire import VARINT, length_delimited, tag

    cls = test_descriptors.message_class("testdata.Required2")
    head = cls(id="x", kind=3, req={"a": 1}).SerializeToString()
    complete, empty = length_delimited(2, tag(1, VARINT) + b"\x01"), length_delimited(2, b"")
    out = decode(cls, [head + length_delimited(5, length_delimited(1, b"ok") + empty)
                       + length_delimited(5, length_delimited(1, b"\xff") + complete),
                       head + length_delimited(5, length_delimited(1, b"\xff") + empty)
                       + length_delimited(5, length_delimited(1, b"ok") + complete)])
    assert [(f.index, f.error_type, f.message) for f in out.failures] == [
        (0, INVALID, "required field(s) missing: by_name['ok'].a"),
        (1, INVALID, "by_name.key: invalid UTF-8 in a string field; a STRING column holds UTF-8 only")]


def test_a_non_finite_number_in_a_struct_names_its_path_alike_in_both_decoders(decode: Decode,
                                                                               test_descriptors: Descriptors) -> None:
    """The row failed with json_format's words alone ("Fail to serialize NaN for Value.number_value"), or the
    native decoder's, naming no field: in a message with several Struct columns the producer could not
    tell which value to fix. Inside a Struct the path is JSON's (`['k'][0]`); the native decoder hands such
    a row to the reference, so the two say the same."""
    cls = test_descriptors.message_class("testdata.Edge3")
    words = "Fail to serialize {} for Value.number_value, which would parse as string_value"
    in_list, in_value, in_map, in_repeated, in_self = cls(), cls(), cls(), cls(), cls()
    in_list.list.values.add().number_value = 1
    in_list.list.values.add().struct_value.update({"n": math.nan})
    in_value.value.number_value = -math.inf
    in_map.m_struct["ok"].update({"a": 1})
    in_map.m_struct["bad"].update({"x": [1, {"y": math.inf}]})
    in_repeated.r_struct.add()
    in_repeated.r_struct.add().update({"k": math.nan})
    in_self.m_self["s"].c_struct.update({"k": math.inf})
    out = decode(cls, [in_list, in_value, in_map, in_repeated, in_self], SchemaOptions(max_depth=3))
    assert [(f.index, f.error_type, f.message) for f in out.failures] == [
        (0, INVALID, "list[1]['n']: " + words.format("NaN")),
        (1, INVALID, "value: " + words.format("Infinity")),  # json_format says so for -Infinity too
        (2, INVALID, "m_struct['bad']['x'][1]['y']: " + words.format("Infinity")),
        (3, INVALID, "r_struct[1]['k']: " + words.format("NaN")),
        (4, INVALID, "m_self['s'].c_struct['k']: " + words.format("Infinity"))]
    # cut to JSON at the max depth: the path from the cut column, as for invalid UTF-8 there
    cut = cls()
    cut.self.r_struct.add().update({"k": math.nan})
    [failure] = decode(cls, [cut], SchemaOptions(max_depth=1)).failures
    assert failure.message.startswith("r_struct[0]['k']: ") and "NaN" in failure.message, failure.message
