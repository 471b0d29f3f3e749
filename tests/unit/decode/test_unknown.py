"""Unknown protobuf fields → additional_properties' JSON: every wire type, every depth, framed or not, and
exactly the rows the decoders flag."""

from __future__ import annotations

import base64
import json
import struct

import pyarrow as pa
import pytest
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.decode.unknown import UnknownFieldsJson
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType, SchemaError
from firehose_bq.registry.confluent import WireFormatError, encode_frame, message_indexes
from tests.unit.decode import protos, wire
from tests.unit.decode.wire import END_GROUP, I32, I64, START_GROUP, VARINT, length_delimited, tag, varint


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encoded(trees: dict[str, Descriptors], name: str, value: bytes, framed: bool = False,
            tree: str = "testdata") -> object:
    text = UnknownFieldsJson(trees[tree].message_class(name), framed).encode(value)
    return None if text is None else json.loads(text)


def test_every_wire_type_and_repeated_numbers(trees: dict[str, Descriptors]) -> None:
    value = (length_delimited(1, b"known")
             + tag(9, VARINT) + varint(-1)  # an int64 -1: ten bytes on the wire, 2^64-1 read back
             + tag(10, I64) + struct.pack("<d", 1.5)  # a double: its bits
             + tag(11, I32) + struct.pack("<I", 0xFFFFFFFF)
             + length_delimited(12, b"\x00\xffhi")
             + tag(9, VARINT) + varint(300)  # the same number again: a list in wire order
             + tag(13, START_GROUP) + tag(1, VARINT) + varint(5) + tag(2, START_GROUP) + length_delimited(3, b"g")
             + tag(2, END_GROUP) + tag(13, END_GROUP))
    assert encoded(trees, "testdata.Inner", value) == {
        "9": [2**64 - 1, 300],
        "10": [struct.unpack("<Q", struct.pack("<d", 1.5))[0]],
        "11": [0xFFFFFFFF],
        "12": [b64(b"\x00\xffhi")],
        "13": [{"1": [5], "2": [{"3": [b64(b"g")]}]}],
    }


def test_no_unknown_fields_is_none(trees: dict[str, Descriptors]) -> None:
    cls = trees["testdata"].message_class("testdata.AllTypes")
    assert encoded(trees, "testdata.AllTypes", cls(f_string="x", r_message=[{"label": "a"}]).SerializeToString()) is None
    assert encoded(trees, "testdata.AllTypes", b"") is None


def test_nested_repeated_map_and_well_known_fields_are_reached_by_name(trees: dict[str, Descriptors]) -> None:
    extra = tag(7, VARINT) + varint(1)
    inner = length_delimited(1, b"l") + extra
    value = (length_delimited(17, inner)                                      # f_message
             + length_delimited(22, b"") + length_delimited(22, inner)        # r_message: 2nd element
             + length_delimited(25, tag(1, VARINT) + varint(9) + length_delimited(2, inner))  # m_message[9]
             + length_delimited(25, tag(1, VARINT) + varint(-3) + length_delimited(2, inner))  # m_message[-3]
             + length_delimited(25, tag(1, VARINT) + varint(4) + length_delimited(2, b""))  # nothing unknown
             + length_delimited(18, tag(1, VARINT) + varint(10) + extra)      # f_timestamp
             + length_delimited(28, inner)                                    # c_inner (oneof)
             + length_delimited(99, inner))                                   # unknown itself: raw bytes
    assert encoded(trees, "testdata.AllTypes", value) == {
        "99": [b64(inner)],
        "f_message": {"7": [1]},
        "f_timestamp": {"7": [1]},
        "r_message": [{}, {"7": [1]}],
        "m_message": {"-3": {"7": [1]}, "9": {"7": [1]}},
        "c_inner": {"7": [1]},
    }


def test_struct_values_at_depth(trees: dict[str, Descriptors]) -> None:
    # Struct{fields: {"k": Value{number_value: 1, <unknown 9>}}}
    entry = length_delimited(1, b"k") + length_delimited(2, tag(2, I64) + struct.pack("<d", 1) + tag(9, VARINT) + b"\x02")
    assert encoded(trees, "testdata.AllTypes", length_delimited(19, length_delimited(1, entry))) == {
        "f_struct": {"fields": {"k": {"9": [2]}}}}


def test_recursive_messages_and_map_keys_of_every_kind(trees: dict[str, Descriptors]) -> None:
    deep = length_delimited(2, length_delimited(2, length_delimited(1, b"leaf") + tag(3, VARINT) + b"\x01"))
    assert encoded(trees, "testdata.Node", deep) == {"child": {"child": {"3": [1]}}}
    # proto2 map<int64, Req> (a required field inside) and the bool / string spellings of keys
    req = tag(1, VARINT) + b"\x01" + tag(6, VARINT) + b"\x02"
    value = (length_delimited(10, tag(1, VARINT) + varint(-5) + length_delimited(2, req))
             + length_delimited(9, req) + length_delimited(8, req))
    assert encoded(trees, "testdata.Proto2All", value) == {
        "req": {"6": [2]}, "r_req": [{"6": [2]}], "m_req": {"-5": {"6": [2]}}}


def test_what_upb_keeps_unknown_in_the_parent(trees: dict[str, Descriptors]) -> None:
    """A closed enum's unknown number, and a map entry carrying an unknown field, are the parent's unknown
    fields (upb's rule): kept under the field's own number, losslessly."""
    bad_entry = length_delimited(1, b"k") + tag(2, VARINT) + b"\x07" + tag(5, VARINT) + b"\x01"
    value = tag(1, VARINT) + varint(4) + length_delimited(4, bad_entry)
    assert encoded(trees, "testdata.Proto2All", value) == {"1": [4], "4": [b64(bad_entry)]}


def test_a_set_extension_is_kept_by_its_number_as_an_unknown_field_is(trees: dict[str, Descriptors]) -> None:
    # The table has no column for an extension: its value is kept here, as it is on the wire, in number order
    # among the unknown fields (a repeated one in wire order).
    value = tag(1, VARINT) + b"\x01" + tag(15, VARINT) + b"\x03" + length_delimited(10, b"note")
    assert encoded(trees, "testdata.Extendable", value) == {"10": [b64(b"note")], "15": [3]}
    assert encoded(trees, "testdata.Extendable", length_delimited(10, b"n")) == {"10": [b64(b"n")]}
    assert encoded(trees, "testdata.Extendable", tag(1, VARINT) + b"\x01") is None


def test_confluent_framed_values(trees: dict[str, Descriptors]) -> None:
    """The frames the decoders accept, and only those: the class's own message indexes."""
    cls = trees["testdata"].message_class("testdata.Inner")
    own = list(message_indexes(cls.DESCRIPTOR))
    payload = length_delimited(1, b"x") + tag(9, VARINT) + b"\x2a"
    assert encoded(trees, "testdata.Inner", encode_frame(12, own, payload), framed=True) == {"9": [42]}
    other = encode_frame(12, [own[0] + 1], payload)
    with pytest.raises(WireFormatError, match=r"another message type: .* names message indexes \[\d+\] \(schema id 12\)"):
        encoded(trees, "testdata.Inner", other, framed=True)
    json_column, failures = UnknownFieldsJson(cls, True).column(pa.array([other, b"\x00\x00"], pa.binary()), [0, 1])
    assert json_column.to_pylist() == [None, None]
    assert [(f.index, f.error_type) for f in failures] == [(0, ErrorType.DESERIALIZATION_ERROR),
                                                           (1, ErrorType.DESERIALIZATION_ERROR)]


def test_column_scatters_the_flagged_rows_and_fails_what_does_not_parse(trees: dict[str, Descriptors]) -> None:
    unknown = UnknownFieldsJson(trees["testdata"].message_class("testdata.Inner"))
    newer = length_delimited(1, b"x") + tag(9, VARINT) + b"\x01"
    values = pa.array([newer, None, b"\xff", newer, length_delimited(1, b"y")], pa.binary())
    column, failures = unknown.column(values, [0, 2, 3, 4])
    assert column.to_pylist() == ['{"9":[1]}', None, None, '{"9":[1]}', None]
    assert [(f.index, f.error_type) for f in failures] == [(2, ErrorType.DESERIALIZATION_ERROR)]
    assert unknown.column(values, [])[0].to_pylist() == [None] * 5


def test_the_decoders_flag_exactly_the_rows_with_json(trees: dict[str, Descriptors]) -> None:
    """For random wire bytes (unknown numbers, wrong wire types, closed enums, map entries, groups) of
    every test message, a row is flagged by the decoder exactly when the encoder finds something."""
    for tree_name in ("testdata", "evo_v1", "dlq_v1", "registry", "example"):
        tree = trees[tree_name]
        for desc in protos.messages(tree):
            cls = message_factory.GetMessageClass(desc)
            try:
                decoder, unknown = ReferenceDecoder(cls), UnknownFieldsJson(cls)
            except SchemaError:
                continue  # no table for it (a name BigQuery refuses, too many columns)

            @settings(max_examples=4, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(st.lists(wire.message(desc, unknown=True), min_size=8, max_size=16))
            def check(values: list[bytes]) -> None:
                decoded = decoder.decode(pa.array(values, pa.binary()))
                failed = {f.index for f in decoded.failures}
                found = {i for i, v in enumerate(values) if i not in failed and unknown.encode(v) is not None}
                assert found == set(decoded.unknown_fields) - failed, desc.full_name

            check()
