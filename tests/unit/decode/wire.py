"""Hypothesis strategies that write protobuf wire bytes for any descriptor, the way no serializer does.

Protobuf libraries write one canonical form; producers in the wild (and hostile data) do not. These
strategies write fields in any order, repeat singular fields, mix packed and unpacked encodings, pad
varints, leave out map keys and values, repeat map keys, and put edge values everywhere (integer limits,
NaN and -0.0, out-of-range Timestamps and Durations, impossible dates, unknown enum numbers). With
`unknown=True` they also add unknown field numbers, known numbers with the wrong wire type, and invalid
UTF-8. The decoders under test must agree on all of it.
"""

from __future__ import annotations

import struct
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

FD = FieldDescriptor

VARINT, I64, LEN, START_GROUP, END_GROUP, I32 = 0, 1, 2, 3, 4, 5
MASK64 = 2**64 - 1


def varint(value: int, pad: int = 0) -> bytes:
    """`value` (two's complement if negative) as a varint, with up to `pad` redundant zero bytes (an
    overlong encoding, which parsers accept while the whole stays within 10 bytes)."""
    value &= MASK64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            break
        out.append(byte | 0x80)
    extra = min(pad, 10 - len(out))
    if extra > 0:
        out[-1] |= 0x80
        out.extend([0x80] * (extra - 1) + [0x00])
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, LEN) + varint(len(payload)) + payload


def zigzag(value: int, bits: int) -> int:
    return ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)


WIRE_TYPES = {
    **dict.fromkeys((FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_SINT32, FD.TYPE_SINT64,
                     FD.TYPE_BOOL, FD.TYPE_ENUM), VARINT),
    **dict.fromkeys((FD.TYPE_FIXED64, FD.TYPE_SFIXED64, FD.TYPE_DOUBLE), I64),
    **dict.fromkeys((FD.TYPE_FIXED32, FD.TYPE_SFIXED32, FD.TYPE_FLOAT), I32),
    **dict.fromkeys((FD.TYPE_STRING, FD.TYPE_BYTES, FD.TYPE_MESSAGE), LEN),
    FD.TYPE_GROUP: START_GROUP,
}
RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1), FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1), FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1), FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1), FD.TYPE_BOOL: (0, 1),
}
TIMESTAMP_EDGES = [-62135596800, -62135596801, 253402300799, 253402300800, 0, -1, 1, 1767225600, 2**62, -(2**63)]
DURATION_EDGES = [315576000000, 315576000001, -315576000000, -315576000001, 0, 1, -1, 60]
NANOS_EDGES = [0, 999999999, 1000000000, -1, -999999999, -1000000000, 500, 123456789, 2**31 - 1, -(2**31)]
INVALID_UTF8 = [b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"a\x80b", b"\xe2\x82"]


def integers(kind: int) -> st.SearchStrategy[int]:
    low, high = RANGES[kind]
    edges = [v for v in (low, high, 0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 127, 128, 300)
             if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high), st.integers(-1000, 1000).filter(lambda v: low <= v <= high))


@st.composite
def scalar(draw: Any, fd: FieldDescriptor, unknown: bool) -> tuple[int, bytes]:
    """(wire type, encoded value) of one value of scalar field `fd`."""
    kind = fd.type
    wire = WIRE_TYPES[kind]
    if kind == FD.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        number = draw(st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))
                      if draw(st.integers(0, 9)) < 2 else st.sampled_from(known))
        return wire, varint(number, draw(st.sampled_from([0, 0, 0, 2])))
    if kind in (FD.TYPE_STRING, FD.TYPE_BYTES):
        if kind == FD.TYPE_BYTES:
            data = draw(st.binary(max_size=12))
        elif unknown and draw(st.integers(0, 29)) == 0:
            data = draw(st.sampled_from(INVALID_UTF8))
        else:
            data = draw(st.text(max_size=10)).encode()
        return wire, varint(len(data)) + data
    if kind == FD.TYPE_DOUBLE:
        value = draw(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e16, 0.1, 5e-324]))
        return wire, struct.pack("<d", value)
    if kind == FD.TYPE_FLOAT:
        value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
        return wire, struct.pack("<f", value)
    if kind == FD.TYPE_BOOL:
        return wire, varint(draw(st.sampled_from([0, 1, 1, 2, 2**63])))
    value = draw(integers(kind))
    if kind in (FD.TYPE_SINT32, FD.TYPE_SINT64):
        value = zigzag(value, 32 if kind == FD.TYPE_SINT32 else 64)
    if wire == I32:
        return wire, struct.pack("<I", value & 0xFFFFFFFF)
    if wire == I64:
        return wire, struct.pack("<Q", value & MASK64)
    if kind in (FD.TYPE_INT32, FD.TYPE_UINT32) and draw(st.integers(0, 19)) == 0:
        value = draw(st.integers(0, MASK64))  # upb keeps the low 32 bits of an over-wide varint
    return wire, varint(value, draw(st.sampled_from([0, 0, 0, 0, 1, 3])))


def well_known(draw: Any, desc: Descriptor) -> bytes | None:
    """Values of the types whose ranges matter, mostly valid; None for the other types."""
    name = desc.full_name
    if name == "google.protobuf.Timestamp":
        seconds = draw(st.one_of(st.sampled_from(TIMESTAMP_EDGES), st.integers(-62135596800, 253402300799)))
        nanos = draw(st.one_of(st.sampled_from(NANOS_EDGES), st.integers(0, 999999999)))
    elif name == "google.protobuf.Duration":
        seconds = draw(st.one_of(st.sampled_from(DURATION_EDGES), st.integers(-10**6, 10**6)))
        nanos = draw(st.sampled_from(NANOS_EDGES))
    elif name == "google.type.Date":
        parts = draw(st.one_of(
            st.tuples(st.integers(1, 9999), st.integers(1, 12), st.integers(1, 28)),
            st.tuples(st.sampled_from([0, 1, 1970, 2000, 2024, 2023, 9999, 10000, -1]),
                      st.sampled_from([0, 1, 2, 12, 13]), st.sampled_from([0, 1, 28, 29, 30, 31, 32]))))
        out = b""
        for number, value in enumerate(parts, 1):
            if value or draw(st.booleans()):
                out += tag(number, VARINT) + varint(value)
        return out
    else:
        return None
    out = b""
    if seconds or draw(st.booleans()):
        out += tag(1, VARINT) + varint(seconds)
    if nanos or draw(st.booleans()):
        out += tag(2, VARINT) + varint(nanos)
    return out


@st.composite
def message(draw: Any, desc: Descriptor, unknown: bool = False, level: int = 0, max_level: int = 4,
            max_fields: int = 10) -> bytes:
    """Wire bytes of a message of type `desc`; nested messages get half their parent's field budget, so
    recursive types stay small."""
    if level < 2 and (special := well_known(draw, desc)) is not None and draw(st.integers(0, 3)):
        return special
    fields = sorted(desc.fields, key=lambda f: f.number)
    parts = []
    budget = max(1, max_fields >> level) if level < max_level else 1
    for _ in range(draw(st.integers(0, budget))):
        roll = draw(st.integers(0, 99))
        if unknown and roll < 3:
            parts.append(draw(unknown_field(desc)))
        elif unknown and roll < 5 and fields:
            fd = draw(st.sampled_from(fields))
            parts.append(draw(wrong_wire_type(fd)))
        elif fields:
            parts.append(draw(field(draw(st.sampled_from(fields)), unknown, level, max_level)))
    return b"".join(parts)


@st.composite
def field(draw: Any, fd: FieldDescriptor, unknown: bool, level: int, max_level: int) -> bytes:
    """One occurrence of `fd` (a repeated field: one element, or a packed run)."""
    if fd.type == FD.TYPE_GROUP:  # delimited: the fields between a start and an end tag of its number
        inner = b"" if level >= max_level else draw(message(fd.message_type, unknown, level + 1, max_level))
        return tag(fd.number, START_GROUP) + inner + tag(fd.number, END_GROUP)
    if fd.type == FD.TYPE_MESSAGE:
        if fd.message_type.GetOptions().map_entry:
            return length_delimited(fd.number, draw(map_entry(fd.message_type, unknown, level + 1, max_level)))
        if level >= max_level:
            return length_delimited(fd.number, b"")
        return length_delimited(fd.number, draw(message(fd.message_type, unknown, level + 1, max_level)))
    wire, value = draw(scalar(fd, unknown))
    if fd.is_repeated and wire != LEN and draw(st.booleans()):
        run = [value] + [draw(scalar(fd, unknown))[1] for _ in range(draw(st.integers(0, 4)))]
        return length_delimited(fd.number, b"".join(run))
    return tag(fd.number, wire) + value


@st.composite
def map_entry(draw: Any, entry: Descriptor, unknown: bool, level: int, max_level: int) -> bytes:
    key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
    parts = []
    if draw(st.integers(0, 9)):
        if key.type == FD.TYPE_STRING:  # few distinct keys: repeated keys are common
            data = draw(st.sampled_from(["a", "b", "", "é", "a\x00", "zz"])).encode()
            parts.append(length_delimited(1, data))
        else:
            wire, data = draw(scalar(key, False)) if draw(st.booleans()) else (WIRE_TYPES[key.type], None)
            if data is None:
                small = draw(st.sampled_from([0, 1, 2, 1, 5]))
                data = (struct.pack("<I" if wire == I32 else "<Q", small) if wire in (I32, I64)
                        else varint(zigzag(small, 64) if key.type in (FD.TYPE_SINT32, FD.TYPE_SINT64) else small))
            parts.append(tag(1, wire) + data)
    if draw(st.integers(0, 9)):
        parts.append(draw(field(value, unknown, level, max_level)))
    if unknown and draw(st.integers(0, 19)) == 0:
        parts.append(draw(unknown_field(entry)))
    if draw(st.integers(0, 4)) == 0:
        parts.reverse()
    return b"".join(parts)


@st.composite
def unknown_field(draw: Any, desc: Descriptor) -> bytes:
    taken = {f.number for f in desc.fields}
    number = draw(st.one_of(st.integers(1, 40), st.integers(1, 536870911)).filter(lambda n: n not in taken))
    kind = draw(st.sampled_from([VARINT, I64, LEN, I32, START_GROUP]))
    if kind == VARINT:
        return tag(number, kind) + varint(draw(st.integers(0, MASK64)))
    if kind == I64:
        return tag(number, kind) + b"\x01" * 8
    if kind == I32:
        return tag(number, kind) + b"\x02" * 4
    if kind == LEN:
        return length_delimited(number, draw(st.binary(max_size=6)))
    inner = tag(number + 1 if number < 536870911 else 1, VARINT) + b"\x05"
    return tag(number, START_GROUP) + inner + tag(number, END_GROUP)


@st.composite
def wrong_wire_type(draw: Any, fd: FieldDescriptor) -> bytes:
    """A known field number with a wire type its field does not take (an unknown field for upb)."""
    expected = WIRE_TYPES[fd.type]
    choices = [w for w in (VARINT, I64, I32, LEN) if w != expected]
    if fd.is_repeated and expected != LEN:
        choices.remove(LEN)  # a packed run: not wrong
    kind = draw(st.sampled_from(choices))
    payload = {VARINT: varint(7), I64: b"\x00" * 8, I32: b"\x00" * 4, LEN: varint(2) + b"\x08\x01"}[kind]
    return tag(fd.number, kind) + payload
