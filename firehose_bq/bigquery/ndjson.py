"""Staged newline-delimited JSON: what file loads stage for a table with a JSON column, instead of Parquet.

A BigQuery load job fills JSON columns only from CSV, Avro or JSON files ("Working with JSON data",
Limitations): a Parquet load into a table with a JSON column anywhere (top level, inside a RECORD, or
REPEATED) fails, batch after batch. So for such a table the staged file is newline-delimited JSON, one
row per line, its text from the insertAll serializer (`json_rows.py`) in the form load jobs read: a JSON
column's value as the JSON value itself (an object, array or scalar, not a string holding its text), and
integers beyond 2^53 as strings. Every other table keeps Parquet, which is faster to write and smaller.

A JSON column's value goes into the file as it is, so it is checked first, per row: text that is not
JSON (possible from a protobuf string in a user's JSON column) would break the file's line and fail the
whole load job; BigQuery's JSON type refuses, and fails the load job on, a number beyond FLOAT64's range,
nesting deeper than 500 levels and a lone UTF-16 surrogate; a JSON `null` as an element of a REPEATED
JSON column is a NULL element, which BigQuery's arrays cannot hold, and as the value of a REQUIRED one
(or a REQUIRED field of a RECORD that is there) a NULL the column cannot hold. Those rows fail alone (RowErrors), as
conform.py's do, and never reach the file. (JSON input's decoders refuse all of these already; a protobuf
job writing a user's JSON column does not.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.cloud.bigquery import SchemaField

from firehose_bq.bigquery.conform import MISFIT, OUT_OF_RANGE
from firehose_bq.bigquery.json_rows import JsonForm, row_texts
from firehose_bq.decode.json_reference import SURROGATE_ESCAPE, nests_deeper
from firehose_bq.errors import ErrorType

PARQUET = "PARQUET"
NDJSON = "NEWLINE_DELIMITED_JSON"
SUFFIXES = {PARQUET: ".parquet", NDJSON: ".ndjson"}
# "The JSON data type has a nesting limit of 500" (Working with JSON data, Limitations).
JSON_NESTING_LIMIT = 500
# Rows staged as Parquet and loaded in a JSON job (the table gained a JSON column during the batch) hold
# no JSON column: a Parquet file was only begun while the table had none.
CONVERTED = JsonForm(wide_integers_as_text=True)


def json_columns(columns: Sequence[SchemaField]) -> frozenset[str]:
    """The dotted paths of the JSON columns among `columns`, at any depth (empty: the table loads Parquet)."""
    return frozenset(path for path, _ in _json_fields(columns, ""))


def required_json_columns(columns: Sequence[SchemaField]) -> frozenset[str]:
    """The dotted paths of the REQUIRED JSON columns (or RECORD fields) among `columns`."""
    return frozenset(path for path, column in _json_fields(columns, "") if column.mode == "REQUIRED")


def _json_fields(columns: Sequence[SchemaField], prefix: str) -> Iterator[tuple[str, SchemaField]]:
    for column in columns:
        path = f"{prefix}{column.name}"
        if column.field_type.upper() == "JSON":
            yield path, column
        elif column.fields:
            yield from _json_fields(column.fields, f"{path}.")


def load_form(paths: frozenset[str]) -> JsonForm:
    return JsonForm(raw=paths, wide_integers_as_text=True)


class _NotStorable(ValueError):
    """A JSON number BigQuery's JSON type cannot hold."""


def _finite(literal: str) -> int:
    if math.isinf(float(literal)):  # float() of a decimal string rounds; only beyond FLOAT64's range is it infinite
        raise _NotStorable(literal)
    return 0  # the value itself is not needed


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json module would take NaN and Infinity


def problem(text: str, element: bool, required: bool = False) -> tuple[ErrorType, str] | None:
    """Why this JSON column value cannot go into a load job's file, or None; `element`: of a REPEATED column,
    `required`: of a REQUIRED one."""
    try:
        value = json.loads(text, parse_int=_finite, parse_float=_finite, parse_constant=_no_constant)
    except _NotStorable as exc:
        return OUT_OF_RANGE, (f"the value holds a number beyond FLOAT64's range ({str(exc)[:40]}), which BigQuery's "
                              "JSON type cannot store")
    except ValueError as exc:
        return MISFIT, f"the value is not JSON text ({exc})"
    except RecursionError:
        return MISFIT, f"the value nests deeper than BigQuery's JSON type does ({JSON_NESTING_LIMIT} levels)"
    if nests_deeper(text, JSON_NESTING_LIMIT):
        return MISFIT, f"the value nests deeper than BigQuery's JSON type does ({JSON_NESTING_LIMIT} levels)"
    if SURROGATE_ESCAPE.search(text) and _lone_surrogate(value):
        return MISFIT, "the value is not JSON text BigQuery reads: a lone UTF-16 surrogate escape"
    if element and value is None:
        return MISFIT, "a JSON null element: BigQuery arrays cannot hold NULL"
    if required and value is None:
        return MISFIT, "a JSON null, which a load job reads as NULL: the REQUIRED column cannot hold it"
    return None


def _lone_surrogate(value: object) -> bool:
    """The parsed JSON value's strings (keys included) hold a surrogate escape that is not half of a pair."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_failures(rows: pa.RecordBatch, paths: frozenset[str],
                  required: frozenset[str] = frozenset()) -> dict[int, tuple[ErrorType, str]]:
    """The rows of `rows` (by index) whose JSON column values cannot go into a load job's file, each with
    its first problem; `required`: those of `paths` that are REQUIRED."""
    failed: dict[int, tuple[ErrorType, str]] = {}
    everyone = np.arange(rows.num_rows)
    for name, column in zip(rows.schema.names, rows.columns, strict=True):
        for path, values, owners, element in _json_values(column, name, paths, everyone, False):
            for text, row in zip(values.to_pylist(), owners.tolist(), strict=True):
                if text is None or row in failed:
                    continue
                found = problem(text, element, path in required)
                if found is not None:
                    failed[row] = (found[0], f"column {path}: {found[1]}")
    return failed


def _json_values(array: pa.Array, path: str, paths: frozenset[str], owners: np.ndarray,
                 element: bool) -> Iterator[tuple[str, pa.Array, np.ndarray, bool]]:
    """The string values of the JSON columns at or under `path`, each with the row that holds it."""
    if not any(p == path or p.startswith(f"{path}.") for p in paths):
        return
    kind = array.type
    if pa.types.is_struct(kind):
        # A RECORD element's fields are no elements: NULL in a NULLABLE one is as fine as anywhere else.
        for field, child in zip(kind, array.flatten(), strict=True):
            yield from _json_values(child, f"{path}.{field.name}", paths, owners, False)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        yield from _json_values(array.flatten(), path, paths, owners[parents], True)
    elif path in paths and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        yield path, array, owners, element


def lines(rows: pa.RecordBatch, form: JsonForm) -> memoryview:
    """The rows as newline-delimited JSON: each row's text and a line break, straight from Arrow's buffer."""
    texts = pc.binary_join_element_wise(row_texts(rows, form), "", "\n")  # "<row>\n": the empty string after it
    _, offsets, data = texts.buffers()
    if not len(texts) or data is None:
        return memoryview(b"")
    bounds = np.frombuffer(offsets, dtype=np.int32, count=len(texts) + 1, offset=texts.offset * 4)
    return memoryview(data)[int(bounds[0]):int(bounds[-1])]


class NdjsonWriter:
    """A staged NDJSON file, written as ParquetWriter writes Parquet (`schema`, `write_batch`, `close`), so
    that the staging writer treats both alike."""

    def __init__(self, path: Path, schema: pa.Schema, paths: frozenset[str]) -> None:
        self.schema = schema
        self._form = load_form(paths)
        self._out = open(path, "wb")  # noqa: SIM115 - closed by close(), as a ParquetWriter is

    def write_batch(self, rows: pa.RecordBatch) -> None:
        self._out.write(lines(rows, self._form))

    def close(self) -> None:
        self._out.close()
