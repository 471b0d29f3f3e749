"""Native vs reference on the same values: everything the contract promises must be equal."""

from __future__ import annotations

import math
import struct
from functools import lru_cache
from typing import Any

import pyarrow as pa
from google.protobuf import message_factory

from firehose_bq.decode.native import NativeDecoder, UnsupportedShape
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.decode.values import DecodedValues
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.schema import SchemaOptions


# The test protos' shapes the native decoder leaves to the reference: extensions known to the pool, groups.
UNSUPPORTED = {"testdata.Extendable", "testdata.Grouped", "testdata.editions.Delimited"}


def normalized(value: Any) -> Any:
    """`value` with floats compared by their bits (NaN == NaN, -0.0 != 0.0)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value)) if not math.isnan(value) else ("float", "nan")
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


@lru_cache(maxsize=None)
def decoders(tree: Descriptors, name: str, depth: int = 1, options: SchemaOptions = SchemaOptions(),
             framed: bool = False) -> tuple[NativeDecoder, ReferenceDecoder] | None:
    """Both decoders of message `name`, or None when its table cannot exist with these options (a name
    BigQuery refuses, too many columns) or the native decoder leaves it to the reference (UNSUPPORTED)."""
    cls = message_factory.GetMessageClass(tree.find_message(name))
    try:
        reference = ReferenceDecoder(cls, depth, options, framed)
    except SchemaError:
        return None
    try:
        return NativeDecoder(cls, depth, options, framed), reference
    except UnsupportedShape:
        assert name in UNSUPPORTED, f"{name} should be decoded natively"
        return None


def assert_same(values: pa.Array, native: NativeDecoder, reference: ReferenceDecoder) -> DecodedValues:
    got, want = native.decode(values), reference.decode(values)
    got.values.validate(full=True)
    assert got.values.type == want.values.type
    assert len(got.values) == len(values)
    rows = values.to_pylist()
    got_failures = [(f.index, f.error_type) for f in got.failures]
    want_failures = [(f.index, f.error_type) for f in want.failures]
    if got_failures != want_failures:
        differ = sorted({i for i, _ in set(got_failures) ^ set(want_failures)})
        native = {f.index: f for f in got.failures}
        reference = {f.index: f for f in want.failures}
        raise AssertionError("failures differ:\n" + "\n".join(
            f"row {i} {rows[i].hex() if rows[i] else None}: native {native.get(i)} reference {reference.get(i)}"
            for i in differ))
    assert all(f.message for f in got.failures)
    if got.unknown_fields != want.unknown_fields:
        differ = sorted(set(got.unknown_fields) ^ set(want.unknown_fields))
        raise AssertionError(f"unknown fields differ at {differ}: values {[rows[i].hex() for i in differ]}")
    got_rows, want_rows = normalized(got.values.to_pylist()), normalized(want.values.to_pylist())
    for i, (a, b) in enumerate(zip(got_rows, want_rows)):
        if a != b:
            raise AssertionError(f"row {i} differs for value {rows[i].hex() if rows[i] else None}:\n"
                                 f"native    {a}\nreference {b}")
    return got
