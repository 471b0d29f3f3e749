"""The Python value decoder: upb parses, `convert.py`'s generated function converts, pyarrow builds.

This is the reference the native decoder is tested against, and the fallback where the native one
cannot run (no compiler at install time, a shape it does not support). It creates Python objects per
field, so it is slow; it is exact.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from google.protobuf.message import Message

from firehose_bq.arrow_schema import arrow_struct
from firehose_bq.convert import _MESSAGE_FAULTS, _UNDECODABLE, NonFiniteNumber, _collector_paused, _parser, \
    compile_message, non_finite_number, non_utf8_problem, non_utf8_string, unknown_fields_check
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType, RowError
from firehose_bq.schema import SchemaOptions, bigquery_fields


class ReferenceDecoder:
    """Values of `message_class` whose columns sit at level `depth` (1 = the table's top level)."""

    def __init__(self, message_class: type[Message], depth: int = 1, options: SchemaOptions = SchemaOptions(),
                 confluent_framed: bool = False, detect_unknown_fields: bool = True) -> None:
        descriptor = message_class.DESCRIPTOR
        self._arrow_type = arrow_struct(bigquery_fields(descriptor, depth, options))
        self._parse = _parser(message_class, confluent_framed)
        self._row = compile_message(descriptor, depth, options)
        self._unknown = unknown_fields_check(descriptor) if detect_unknown_fields else None

    @property
    def arrow_type(self) -> pa.StructType:
        return self._arrow_type

    def decode(self, values: pa.Array) -> DecodedValues:
        rows: list[dict[str, Any] | None] = []
        out = DecodedValues(pa.array([], self._arrow_type))
        parse, to_row, unknown = self._parse, self._row, self._unknown
        with _collector_paused():
            for i, value in enumerate(values.to_pylist()):
                if value is None:
                    rows.append(None)
                    continue
                msg = None
                try:
                    msg = parse(value)
                    if unknown is not None and unknown(msg):
                        out.unknown_fields.append(i)
                    rows.append(to_row(msg))
                except _MESSAGE_FAULTS as exc:
                    kind = ErrorType.DESERIALIZATION_ERROR if isinstance(exc, _UNDECODABLE) else \
                        ErrorType.INVALID_MESSAGE_ERROR
                    text = str(exc) or type(exc).__name__
                    if msg is not None and isinstance(exc, NonFiniteNumber) and (path := non_finite_number(msg)):
                        text = f"{path}: {text}"  # the Struct/Value/ListValue column's converter cannot tell where
                    elif msg is not None and isinstance(exc, (UnicodeDecodeError, TypeError)) \
                            and (path := non_utf8_string(msg)):
                        # upb hands a proto2 map's non-UTF-8 string key as bytes, which the converter
                        # trips over (decoding it, or sorting it among str keys)
                        text = non_utf8_problem(path)
                    out.failures.append(RowError(i, kind, text, _qualified(exc)))
                    rows.append(None)
            out.values = self._arrow(rows, out)
        return out

    def _arrow(self, rows: list[dict[str, Any] | None], out: DecodedValues) -> pa.StructArray:
        try:
            return pa.array(rows, type=self._arrow_type)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass
        # Some row holds a value its column cannot take: find it (one row at a time, only on this path),
        # fail it alone, and build the rest.
        failed = {f.index for f in out.failures}
        for i, row in enumerate(rows):
            if row is None or i in failed:
                continue
            try:
                pa.array([row], type=self._arrow_type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                out.failures.append(RowError(i, ErrorType.INVALID_MESSAGE_ERROR,
                                             _misfit_message(row, self._arrow_type, exc), _qualified(exc)))
                rows[i] = None
        out.failures.sort(key=lambda f: f.index)
        return pa.array(rows, type=self._arrow_type)


def _misfit_message(row: dict[str, Any], arrow_type: pa.StructType, exc: BaseException) -> str:
    """What is wrong with a row pyarrow refused, naming the column (pyarrow's own message does not)."""
    found = _misfit(row, arrow_type, "")
    if found is None:
        return f"a value does not fit its column: {exc}"
    path, value = found
    if isinstance(value, bytes):  # an unvalidated (proto2) string: upb hands the bytes when they are not UTF-8
        return f"{path}: invalid UTF-8 in a string field ({value[:32]!r}); a STRING column holds UTF-8 only"
    return f"{path}: the value does not fit its column: {exc}"


def _misfit(value: Any, arrow_type: pa.DataType, path: str) -> tuple[str, Any] | None:
    """The path (as `required field(s) missing` writes it: `a.b[0].c`) and value of the first leaf of
    `value` that `arrow_type` does not take; None when each leaf fits on its own."""
    if value is None:
        return None
    if pa.types.is_struct(arrow_type) and isinstance(value, dict):
        for field in arrow_type:
            if (found := _misfit(value.get(field.name), field.type, f"{path}.{field.name}" if path else field.name)):
                return found
        return None
    if pa.types.is_list(arrow_type) and isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _misfit(item, arrow_type.value_type, f"{path}[{i}]")):
                return found
        return None
    try:
        pa.array([value], type=arrow_type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return path, value
    return None


def _qualified(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
