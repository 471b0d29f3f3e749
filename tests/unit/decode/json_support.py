"""Shared by the JSON input tests: both decoders side by side, and one way to compare what they return."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from google.cloud.bigquery import SchemaField

from firehose_bq.arrow_schema import arrow_struct
from firehose_bq.decode.json_reference import JsonReferenceDecoder
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType

try:
    from firehose_bq.decode.json_native import JsonNativeDecoder
except ImportError as exc:  # no compiler when the project was installed
    JsonNativeDecoder = None  # type: ignore[assignment,misc]
    NATIVE_MISSING = str(exc)
else:
    NATIVE_MISSING = ""

needs_native = pytest.mark.skipif(JsonNativeDecoder is None, reason=f"the _json extension is not built: {NATIVE_MISSING}")
IMPLEMENTATIONS = [pytest.param("reference"), pytest.param("native", marks=needs_native)]


def decoder(implementation: str, columns: Sequence[SchemaField], additional_properties: bool = False) -> Any:
    cls = JsonReferenceDecoder if implementation == "reference" else JsonNativeDecoder
    return cls(columns, additional_properties=additional_properties)


def as_values(documents: Sequence[bytes | str | None]) -> pa.Array:
    return pa.array([d.encode() if isinstance(d, str) else d for d in documents], pa.binary())


def checked(out: DecodedValues, columns: Sequence[SchemaField], count: int) -> DecodedValues:
    """What every decode must hold whatever the input: the table's type, one slot per input, valid Arrow,
    a NULL slot for each failure."""
    assert out.values.type == arrow_struct(columns)
    assert len(out.values) == count
    out.values.validate(full=True)
    for failure in out.failures:
        assert not out.values[failure.index].is_valid
    assert [f.index for f in out.failures] == sorted({f.index for f in out.failures})
    return out


def comparable(value: Any) -> Any:
    """Python values of decoded rows with floats compared by their bits (NaN equal to NaN, -0.0 not 0.0)."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def failures(out: DecodedValues) -> list[tuple[int, ErrorType, str]]:
    """(index, type, message); DESERIALIZATION_ERROR messages are each parser's own words."""
    return [(f.index, f.error_type, "" if f.error_type is ErrorType.DESERIALIZATION_ERROR else f.message)
            for f in out.failures]


def assert_same(columns: Sequence[SchemaField], documents: Sequence[bytes | None], additional_properties: bool) -> \
        DecodedValues:
    """Both decoders on the same batch: the same rows, failures and unknown-field lists."""
    values = as_values(documents)
    reference = checked(decoder("reference", columns, additional_properties).decode(values), columns, len(values))
    native = checked(decoder("native", columns, additional_properties).decode(values), columns, len(values))
    assert failures(native) == failures(reference)
    assert native.unknown_fields == reference.unknown_fields
    assert comparable(native.values.to_pylist()) == comparable(reference.values.to_pylist())
    return reference
