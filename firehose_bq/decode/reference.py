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
from firehose_bq.convert import _MESSAGE_FAULTS, _UNDECODABLE, _collector_paused, _has_unknown_fields, _parser, \
    compile_message
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
        self._unknown = _has_unknown_fields if detect_unknown_fields else None

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
                try:
                    msg = parse(value)
                    if unknown is not None and unknown(msg):
                        out.unknown_fields.append(i)
                    rows.append(to_row(msg))
                except _MESSAGE_FAULTS as exc:
                    kind = ErrorType.DESERIALIZATION_ERROR if isinstance(exc, _UNDECODABLE) else \
                        ErrorType.INVALID_MESSAGE_ERROR
                    out.failures.append(RowError(i, kind, str(exc) or type(exc).__name__, _qualified(exc)))
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
                                             f"a value does not fit its column: {exc}", _qualified(exc)))
                rows[i] = None
        out.failures.sort(key=lambda f: f.index)
        return pa.array(rows, type=self._arrow_type)


def _qualified(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
