"""The native JSON decoder: `_json.c` fills one set of Arrow buffers per column, pyarrow wraps them as they are.

Importing this module fails with ImportError when the extension was not built (no C compiler at install
time); `make_json_decoder` then uses the Python reference instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from google.cloud.bigquery import SchemaField

from firehose_bq.decode import _json  # type: ignore[attr-defined]
from firehose_bq.decode.json_rules import MAX_DEPTH, NOT_JSON_CAUSE, Column, JsonType, Kind, Mode, Problem, describe, \
    fold, plan
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType, RowError

# The extension numbers kinds, modes and problems itself; a build from another revision must not be read
# with these tables.
if (_json.KINDS != {k.name: k.value for k in Kind} or _json.MODES != {m.name: m.value for m in Mode}
        or _json.PROBLEMS != {p.name: p.value for p in Problem}
        or _json.JSON_TYPES != {t.name: t.value for t in JsonType}):
    raise ImportError("firehose_bq.decode._json was built from other sources: rebuild it (pip install -e .)")

_BINARY_LAYOUT = (pa.binary(), pa.string())
_LARGE_LAYOUT = (pa.large_binary(), pa.large_string())


class JsonNativeDecoder:
    """JSON documents → rows of the table whose columns are `columns` (see `json_rules`)."""

    def __init__(self, columns: Sequence[SchemaField], *, additional_properties: bool) -> None:
        self._plan = plan(columns, additional_properties)
        index = {id(c): i for i, c in enumerate(self._plan.nodes)}

        def at(column: Column | None) -> int:
            return -1 if column is None else index[id(column)]

        # Each column's children by node index, in the order of its Arrow struct's fields.
        self._children = [tuple(at(k) for k in c.children) for c in self._plan.nodes]
        table = [(c.kind.value, c.mode.value, c.name, fold(c.name).encode(), children, at(c.map_key), at(c.map_value))
                 for c, children in zip(self._plan.nodes, self._children)]
        self._native = _json.Decoder(table, at(self._plan.additional_properties), MAX_DEPTH)

    @property
    def arrow_type(self) -> pa.StructType:
        return self._plan.arrow_type

    def decode(self, values: pa.Array) -> DecodedValues:
        if values.type not in _BINARY_LAYOUT and values.type not in _LARGE_LAYOUT:
            raise TypeError(f"JSON values must be a binary array, not {values.type}")
        validity, offsets, data = values.buffers()
        columns, failures, unknown = self._native.decode(
            validity, offsets, data if data is not None else b"", values.offset, len(values),
            values.type in _LARGE_LAYOUT)
        rows = self._assemble(self.arrow_type, 0, columns)
        return DecodedValues(rows, [_failure(f, self._plan.nodes) for f in failures], unknown)

    def _assemble(self, arrow_type: pa.DataType, i: int, columns: list[tuple[Any, ...]]) -> pa.Array:
        """Column i's buffers (and its children's) → its Arrow array, without copying them."""
        column = self._plan.nodes[i]
        length, nulls, validity, data, offsets, list_length, list_offsets = columns[i]
        value_type = arrow_type.value_type if column.mode is Mode.REPEATED else arrow_type
        bitmap = pa.py_buffer(validity) if validity is not None else None
        if column.kind is Kind.RECORD:
            children = [self._assemble(field.type, k, columns) for field, k in zip(value_type, self._children[i])]
            values = pa.Array.from_buffers(value_type, length, [bitmap], nulls, children=children)
        elif offsets is not None:
            values = pa.Array.from_buffers(value_type, length, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                           nulls)
        else:
            values = pa.Array.from_buffers(value_type, length, [bitmap, pa.py_buffer(data)], nulls)
        if column.mode is not Mode.REPEATED:
            return values
        return pa.Array.from_buffers(arrow_type, list_length, [None, pa.py_buffer(list_offsets)], 0, children=[values])


def _failure(raw: tuple[Any, ...], nodes: tuple[Column, ...]) -> RowError:
    if raw[1] == _json.DESERIALIZATION:
        row, _, reason, at = raw
        return RowError(row, ErrorType.DESERIALIZATION_ERROR, f"{reason} (at byte {at})", NOT_JSON_CAUSE)
    row, _, problem, node, json_type, path, key1, key2 = raw
    return RowError(row, ErrorType.INVALID_MESSAGE_ERROR,
                    describe(Problem(problem), path, JsonType(json_type), nodes[node], (key1, key2)))
