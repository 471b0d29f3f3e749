"""Arrow rows made to fit the live table before they leave, and the rows that cannot, found columnar.

Several ways into BigQuery take data that does not fit a table without a word, and the local emulator
more so: its Arrow appends match names case-sensitively (a differently spelled column lands as NULL,
at any depth), drop unknown columns and keep a TIMESTAMP past year 9999 that then breaks every query
of the table; a wrongly typed value fails a whole request without naming a row. So every path that
sends typed data (Storage Write, staged Parquet) sends only what `fit` returned, and `fit` decides per
row, as BigQuery would:

- names match the table's case-insensitively, as BigQuery's do, and go out in the table's spelling at
  every depth;
- a column or RECORD field the table lacks is dropped where it is NULL in every row (nothing is lost);
  rows that hold a value in it fail, and `Fitted.unknown` names it (the caller may re-read the table);
- a value whose type differs from the column's is cast when the cast is lossless (same family, Arrow's
  safe cast); a row holding a value that does not cast fails;
- NULL in a REQUIRED column or field fails the row; a REQUIRED column the batch lacks fails every row;
- a NULL array becomes the empty array (BigQuery has no NULL array); a NULL element fails the row;
- a TIMESTAMP or DATE outside 0001-01-01 .. 9999-12-31 fails the row.

With no table (insertAll, which BigQuery checks row by row itself) only the last two apply, so that a
value BigQuery cannot hold at all fails the same way on every write path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.arrow_schema import UnsupportedColumnError, arrow_field
from firehose_bq.bq_limits import MAX_DAYS, MAX_MICROS, MIN_DAYS, MIN_MICROS
from firehose_bq.bigquery.classify import classify_exception
from firehose_bq.bigquery.client import REQUEST_ERRORS
from firehose_bq.errors import ErrorType, RowError, SinkError

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

OUT_OF_RANGE = ErrorType.INVALID_MESSAGE_ERROR  # no table could hold the value: the message itself is bad
MISFIT = ErrorType.SINK_4XX_ERROR  # what BigQuery answers `invalid` for: this table does not take the row


@dataclass
class Fitted:
    """The rows that fit (in the table's spelling and types), where they came from, and those that do not."""

    rows: pa.RecordBatch
    positions: np.ndarray  # int64: the position in the input batch of each row of `rows`
    failures: list[RowError] = field(default_factory=list)  # ordered by position
    # Columns (dotted paths, as the batch spells them) that hold values the table has no place for.
    unknown: list[str] = field(default_factory=list)


@dataclass
class _Problem:
    """Rows (a mask over one nesting level) that fail, and why."""

    mask: np.ndarray
    error_type: ErrorType
    text: str


@dataclass
class _Walk:
    table_ref: str
    problems: list[_Problem] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def read_schema(client: bigquery.Client, table_ref: str, call: Mapping[str, Any]) -> list[SchemaField]:
    """The live table's columns; SinkError (classified) when the table cannot be read."""
    try:
        return list(client.get_table(table_ref, **call).schema)
    except REQUEST_ERRORS as exc:
        raise SinkError(classify_exception(exc), f"reading the schema of {table_ref} failed: {exc}") from exc


class LiveTable:
    """The table's schema as one writer knows it: read for its first batch (unless the writer was given it:
    `known`, the columns the task's check of the table just read), and read once more for a batch that
    holds values in a column it lacks (the driver may have added that column since).

    The read is part of the writer's write, which the error policy retries: it is made once, whatever
    retry `call` carries (retries here would multiply the policy's)."""

    def __init__(self, client: bigquery.Client, table_ref: str, call: Mapping[str, Any],
                 known: list[SchemaField] | None = None) -> None:
        self._client = client
        self.table_ref = table_ref
        self._call = {**call, "retry": None}
        self._schema: list[SchemaField] | None = known

    @property
    def schema(self) -> list[SchemaField]:
        """The columns the last `fit` fitted rows to."""
        assert self._schema is not None, "the schema is read by the first fit"
        return self._schema

    def fit(self, rows: pa.RecordBatch) -> Fitted:
        fresh = self._schema is None
        if self._schema is None:
            self._schema = read_schema(self._client, self.table_ref, self._call)
        fitted = fit(rows, self._schema, self.table_ref)
        if fitted.unknown and not fresh:
            self._schema = read_schema(self._client, self.table_ref, self._call)
            fitted = fit(rows, self._schema, self.table_ref)
        return fitted

    def lacks(self, sent: pa.Schema) -> list[str]:
        """The columns and RECORD fields of `sent` (rows this writer fitted and sent) that the live table, read
        again now, does not have: those the table lost since the columns this writer started from were read
        (dropped and created again by hand). The table as read becomes this writer's schema."""
        self._schema = read_schema(self._client, self.table_ref, self._call)
        return absent(sent, self._schema)


def absent(sent: pa.Schema | pa.StructType, table: Sequence[SchemaField], prefix: str = "") -> list[str]:
    """Dotted paths of the fields of `sent` (an Arrow schema or struct, in the table's spelling) that `table`
    (columns, or a RECORD's fields) lacks, at any depth."""
    columns = {c.name.lower(): c for c in table}
    out: list[str] = []
    for given in sent:
        column = columns.get(given.name.lower())
        path = f"{prefix}{given.name}"
        if column is None:
            out.append(path)
            continue
        kind = given.type
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        if pa.types.is_struct(kind) and column.fields:
            out.extend(absent(kind, column.fields, f"{path}."))
    return out


def has_field(table: Sequence[SchemaField], path: str) -> bool:
    """Whether `table` (columns) has the dotted `path` (a column, or a RECORD's field at any depth), as BigQuery
    names them: case-insensitively."""
    fields: Sequence[SchemaField] = table
    for name in path.split("."):
        found = next((f for f in fields if f.name.lower() == name.lower()), None)
        if found is None:
            return False
        fields = found.fields
    return True


def fit(rows: pa.RecordBatch, table: Sequence[SchemaField] | None, table_ref: str = "") -> Fitted:
    """`rows` made to fit `table` (its live schema), or, with `table=None`, only checked for the values
    BigQuery cannot hold in any table. Never raises for bad data: such rows come back as failures."""
    walk = _Walk(table_ref)
    count = rows.num_rows
    everywhere = np.ones(count, dtype=bool)
    targets = _targets(table)
    arrays, fields = _fit_children(list(rows.columns), list(rows.schema), targets, everywhere, "", walk)
    fitted_rows = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)) if fields else _no_columns(count)
    failures, failed = _failures(walk.problems, count)
    positions = np.arange(count, dtype=np.int64)
    if failed.any():
        keep = ~failed
        fitted_rows = fitted_rows.filter(pa.array(keep))
        positions = positions[keep]
    return Fitted(fitted_rows, positions, failures, walk.unknown)


def _no_columns(count: int) -> pa.RecordBatch:
    # No column of the batch has a place in the table (each unknown and NULL): rows without values.
    return pa.RecordBatch.from_struct_array(pa.array([{}] * count, pa.struct([])))


def _targets(table: Sequence[SchemaField] | None) -> list[tuple[str, pa.Field | None]] | None:
    """The table's columns as (name, Arrow field); the field is None for a type with no Arrow form."""
    if table is None:
        return None
    out: list[tuple[str, pa.Field | None]] = []
    for column in table:
        try:
            out.append((column.name, arrow_field(column)))
        except UnsupportedColumnError:
            out.append((column.name, None))
    return out


def _fit_children(arrays: list[pa.Array], fields: list[pa.Field], targets: list[tuple[str, pa.Field | None]] | None,
                  present: np.ndarray, prefix: str, walk: _Walk) -> tuple[list[pa.Array], list[pa.Field]]:
    """The columns of a batch, or the fields of a struct, fitted to `targets` (the table's columns or a
    RECORD's fields; None = no table). `present`: where the parent holds a value (the rows, or the valid
    slots of a struct), so that a REQUIRED field is judged only there."""
    by_name = {name.lower(): (name, target) for name, target in targets} if targets is not None else {}
    taken: set[str] = set()
    out_arrays: list[pa.Array] = []
    out_fields: list[pa.Field] = []
    for array, given in zip(arrays, fields, strict=True):
        path = f"{prefix}{given.name}"
        if targets is None:
            fitted = _fit(array, None, path, walk)
            out_arrays.append(fitted)
            out_fields.append(pa.field(given.name, fitted.type, nullable=given.nullable))
            continue
        key = given.name.lower()
        name, target = by_name.get(key, (None, None))
        if name is None or key in taken or target is None:
            holds = _holds_value(array)
            if holds.any():
                why = ("has no column" if name is None else "is given twice for column" if key in taken
                       else "has a column whose type cannot be written here, for")
                walk.problems.append(_Problem(holds, MISFIT, f"table {walk.table_ref} {why} {path}"))
                walk.unknown.append(path)
            continue
        taken.add(key)
        fitted = _fit(array, target, f"{prefix}{name}", walk)
        if not target.nullable:
            walk.problems.append(_Problem(fitted.is_null().to_numpy(zero_copy_only=False) & present, MISFIT,
                                          f"NULL in REQUIRED column {prefix}{name}"))
        out_arrays.append(fitted)
        out_fields.append(pa.field(name, fitted.type, nullable=target.nullable))
    for name, target in targets or ():
        # (An absent REPEATED column is the empty array: its non-nullable Arrow list is no REQUIRED.)
        if name.lower() not in taken and target is not None and not target.nullable \
                and not _is_list(target.type) and present.any():
            walk.problems.append(_Problem(present.copy(), MISFIT, f"REQUIRED column {prefix}{name} is missing"))
    return out_arrays, out_fields


def _fit(array: pa.Array, target: pa.Field | None, path: str, walk: _Walk) -> pa.Array:
    """One column (or nested field, or the elements of an array) fitted to `target` (None = as it is)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    wanted = target.type if target is not None else None
    if pa.types.is_struct(kind) and (wanted is None or pa.types.is_struct(wanted)):
        return _fit_struct(array, wanted, path, walk)
    if _is_list(kind) and (wanted is None or _is_list(wanted)):
        return _fit_list(array, wanted, path, walk)
    if wanted is not None and kind != wanted:
        array = _cast(array, wanted, path, walk)
    _check_range(array, path, walk)
    return array


def _fit_struct(array: pa.StructArray, wanted: pa.StructType | None, path: str, walk: _Walk) -> pa.Array:
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    # flatten(), unlike field(), is NULL where the struct is: no check looks at what a NULL struct hides.
    children = array.flatten()
    targets = [(f.name, f) for f in wanted] if wanted is not None else None
    arrays, fields = _fit_children(children, list(array.type), targets, valid, f"{path}.", walk)
    if not fields:
        # Nothing of it has a place in the table: it goes out as NULL (rows that held a value failed).
        return pa.nulls(len(array), wanted if wanted is not None else pa.struct([]))
    mask = pa.array(~valid) if not valid.all() else None
    return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)


def _fit_list(array: pa.Array, wanted: pa.DataType | None, path: str, walk: _Walk) -> pa.Array:
    values = array.flatten()  # the values of this slice's valid lists
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    element = wanted.value_field if wanted is not None else array.type.value_field
    inner = _Walk(walk.table_ref)
    fitted = _fit(values, element if wanted is not None else None, path, inner)
    walk.unknown.extend(inner.unknown)
    parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
    for problem in inner.problems:
        walk.problems.append(_Problem(_to_parents(problem.mask, parents, len(array)), problem.error_type,
                                      problem.text))
    nulls = fitted.is_null().to_numpy(zero_copy_only=False)
    if nulls.any():
        walk.problems.append(_Problem(_to_parents(nulls, parents, len(array)), MISFIT,
                                      f"NULL element in REPEATED column {path}: BigQuery arrays cannot hold NULL"))
    large = pa.types.is_large_list(wanted if wanted is not None else array.type)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int64() if large else pa.int32())
    list_type = (pa.large_list if large else pa.list_)(element.with_type(fitted.type))
    # No mask: a NULL array goes out as the empty one.
    return (pa.LargeListArray if large else pa.ListArray).from_arrays(offsets, fitted, type=list_type)


def _to_parents(mask: np.ndarray, parents: np.ndarray, count: int) -> np.ndarray:
    rows = np.zeros(count, dtype=bool)
    rows[parents[mask]] = True
    return rows


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _family(kind: pa.DataType) -> str:
    if pa.types.is_null(kind):
        return "null"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        return "text"
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return "time"
    if pa.types.is_boolean(kind):
        return "bool"
    return str(kind)


def _cast(array: pa.Array, wanted: pa.DataType, path: str, walk: _Walk) -> pa.Array:
    """`array` as `wanted` when the cast loses nothing; values that do not cast fail their rows."""
    given = _family(array.type)
    if given != "null" and given != _family(wanted):
        bad = array.is_valid().to_numpy(zero_copy_only=False)
        if bad.any():
            walk.problems.append(_Problem(bad, MISFIT, f"a {array.type} value does not fit column {path} ({wanted})"))
        return pa.nulls(len(array), wanted)
    try:
        return array.cast(wanted, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        first = str(exc)
    bad = np.zeros(len(array), dtype=bool)
    _mark_uncastable(array, wanted, 0, len(array), bad)
    walk.problems.append(_Problem(bad, MISFIT, f"value does not fit column {path} ({wanted}): {first}"))
    return pc.if_else(pa.array(bad), pa.scalar(None, array.type), array).cast(wanted, safe=True)


def _mark_uncastable(array: pa.Array, wanted: pa.DataType, start: int, stop: int, bad: np.ndarray) -> None:
    """Find the values that do not cast by halving: a few casts per bad value, none per good one."""
    try:
        array.slice(start, stop - start).cast(wanted, safe=True)
        return
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if stop - start == 1:
            bad[start] = True
            return
    middle = (start + stop) // 2
    _mark_uncastable(array, wanted, start, middle, bad)
    _mark_uncastable(array, wanted, middle, stop, bad)


def _check_range(array: pa.Array, path: str, walk: _Walk) -> None:
    kind = array.type
    if pa.types.is_timestamp(kind):
        scale = _PER_SECOND[kind.unit]
        # Bounds in the column's unit, rounded inwards to whole units.
        low, high = -((-MIN_MICROS * scale) // 1_000_000), (MAX_MICROS * scale) // 1_000_000
        what = "TIMESTAMP"
        values = array.cast(pa.int64())
    elif pa.types.is_date32(kind):
        low, high, what, values = MIN_DAYS, MAX_DAYS, "DATE", array.cast(pa.int32())
    elif pa.types.is_date64(kind):
        low, high, what = MIN_DAYS * 86_400_000, MAX_DAYS * 86_400_000, "DATE"
        values = array.cast(pa.int64())
    else:
        return
    outside = pc.fill_null(pc.or_(pc.less(values, low), pc.greater(values, high)), False)
    if pc.any(outside).as_py():
        walk.problems.append(_Problem(outside.to_numpy(zero_copy_only=False), OUT_OF_RANGE,
                                      f"{what} value of {path} is outside BigQuery's range 0001-01-01 .. 9999-12-31"))


def _holds_value(array: pa.Array) -> np.ndarray:
    """Where a column the table lacks holds something: non-NULL, and for arrays non-empty."""
    if _is_list(array.type):
        return pc.fill_null(pc.greater(pc.list_value_length(array), 0), False).to_numpy(zero_copy_only=False)
    return array.is_valid().to_numpy(zero_copy_only=False)


def _failures(problems: list[_Problem], count: int) -> tuple[list[RowError], np.ndarray]:
    """One RowError per failed row: its first problem, in column order."""
    failed = np.zeros(count, dtype=bool)
    found: list[RowError] = []
    for problem in problems:
        new = problem.mask & ~failed
        if new.any():
            found.extend(RowError(int(p), problem.error_type, problem.text) for p in np.flatnonzero(new))
            failed |= new
    found.sort(key=lambda f: f.index)
    return found, failed
