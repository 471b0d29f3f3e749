"""JSON input: how a JSON document becomes a row of its destination table (seed 004's coercion rules).

The destination table's own schema is the schema. Both JSON decoders (`json_reference.py` in Python,
`_json.c` natively) follow the rules below exactly; `tests/unit/decode/test_json_differential.py` checks
that they agree. This module holds what they share: the schema compiled into a column tree, the key
renaming, and the per-row problems with their messages.

Keys (object keys, at every level):

    `-` and `.` become `_`; a key starting with an ASCII digit gets a `_` prefix; the result is matched to
    the columns ignoring ASCII case (BigQuery column names are case-insensitive). Two keys of one object
    landing on the same column (`a-b` and `a_b`, or `a` twice) fail the row naming both.

Values, by column type (JSON null: NULL for a NULLABLE column, the empty list for a REPEATED one; for a
REQUIRED column, null or a missing key fails the row):

    column          accepted JSON values                         stored as
    --------------  -------------------------------------------  -------------------------------------------
    STRING          string                                       the string
                    number                                       its text as written (1.50 → "1.50")
                    true / false                                 "true" / "false"
                    object / array                               compact JSON text, keys in document order,
                                                                 numbers as written
    INTEGER         number that is whole (42, 1.0, 1e3)          int64; out of range → error
                    string holding a JSON number ("42", "1e3")   the same
    FLOAT           number                                       nearest float64; overflow → error
                    string holding a JSON number                 the same
                    "NaN", "Infinity", "-Infinity"               NaN, +inf, -inf
    NUMERIC         number, or string holding a JSON number      decimal128(38, 9) exactly: more than 9
                                                                 significant decimal places or more than 29
                                                                 integer digits → error (1.5000000000 is
                                                                 1.5 and fits; never rounded)
    BIGNUMERIC      number, or string holding a JSON number      decimal256(76, 38) exactly (38 / 38 digits)
    BOOLEAN         true / false; "true" / "false" (any case)    bool
    TIMESTAMP       string: YYYY-MM-DD(T|t)HH:MM:SS[.f][Z|z|±HH:MM|±HHMM]        microseconds since the
                    string: YYYY-MM-DD HH:MM:SS[.f][Z|z|±HH:MM|±HHMM| UTC]       epoch, UTC; fraction
                    number: seconds since the epoch (BigQuery's reading)         past microseconds:
                    0001-01-01 00:00:00 .. 9999-12-31 23:59:59.999999 UTC        truncated towards the
                                                                                 past; outside → error;
                                                                                 no zone: UTC, as BigQuery
                                                                                 reads its canonical format
    DATE            string YYYY-MM-DD                            days since the epoch
    DATETIME        string YYYY-MM-DD[(T| )HH:MM:SS[.f]]         the string (fraction cut to 6 digits)
    TIME            string HH:MM:SS[.f]                          the string (fraction cut to 6 digits)
    BYTES           string in base64 (standard alphabet, padded) the decoded bytes
    JSON            any value                                    its compact JSON text (a string value is
                                                                 stored as a JSON string: "a" → "\\"a\\""); a
                                                                 number anywhere in it beyond FLOAT64's
                                                                 range (1e400) → error
    GEOGRAPHY       string (WKT or GeoJSON text); object         the string; the object's JSON text (GeoJSON)
    INTERVAL        string                                       the string (BigQuery validates it)
    RECORD          object                                       its fields, by the key rules
    REPEATED x      array                                        each element as x; a null element → error
    REPEATED RECORD object, when the RECORD has exactly the      the list of {key, value} records in document
      (key, value)    fields `key` and `value` (a map)           order; each key coerced from a JSON string
                                                                 to `key`'s type, each value to `value`'s

Anything else (a boolean for an INTEGER, an object for a REPEATED column that is not a map, a scalar for
a REPEATED column, 1.5 for INTEGER, ...) fails the row with INVALID_MESSAGE_ERROR naming the column path
(`items[2].price`) and what was there. Nothing is clamped, wrapped or rounded into range.

JSON columns: BigQuery's JSON type "can store integers in the range of -9,223,372,036,854,775,808 ... to
18,446,744,073,709,551,615 and floating point numbers within a domain of FLOAT64" (its data types
reference). Other numbers are rounded to the nearest FLOAT64 where it ingests them (PARSE_JSON's
wide_number_mode 'round': "If the number cannot be rounded, the function throws an error"), so a number
beyond FLOAT64's range (1e400, -1e999) is refused, and in a load job it fails the whole job. Such a value
fails its row here instead, naming the column. What BigQuery accepts is kept as written: wide integers
and long fractions (it rounds them), duplicate keys (it keeps the first), nesting up to its 500 levels
(MAX_DEPTH is lower). Lone surrogates and NaN / Infinity literals are not JSON (below).

A document that is not UTF-8, not JSON (RFC 8259: no NaN literals, no comments, no trailing commas, no
byte-order mark), nested deeper than MAX_DEPTH, holds a lone UTF-16 surrogate escape (`"\\ud800"`), or is
not an object at the top fails with DESERIALIZATION_ERROR. One document never fails another.

Unknown values (keys that match no column) never fail a row. With `additional_properties` filled (the
option is on and the table has that top-level STRING column) they are kept, under their original keys
and as written (compact), in that column as one JSON object that mirrors where they were:

    {"new_top": 1, "client": {"new_nested": "x"}}      an unknown key inside the known record `client`
    {"items": [{}, {"extra": true}]}                   arrays of records: one object per element, by
                                                       index, `{}` for an element with nothing unknown
    {"attrs": {"k1": {"extra": 2}}}                    maps: by the map key, only entries with unknowns

Parents appear under their keys as written in the document; a parent with nothing unknown below it is
left out, and a row with nothing unknown has NULL there. A document key that lands on
`additional_properties` itself is kept there as an unknown value. Otherwise (option off, or no such
column) unknown values are dropped and the row is listed in `DecodedValues.unknown_fields`, which the
batch core counts, or rejects as UNKNOWN_FIELDS_ERROR when unknown fields are not allowed.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from google.cloud.bigquery import SchemaField

from firehose_bq.arrow_schema import arrow_struct
from firehose_bq.schema import ADDITIONAL_PROPERTIES

# Containers (objects and arrays) nested deeper than this fail the document. Real documents stay far
# below it; the limit keeps both decoders' recursion bounded (Python's stack included).
MAX_DEPTH = 256
# What dead letters name as the cause of a document that is not JSON (both decoders; the reference raises
# it). Not the default for DESERIALIZATION_ERROR, protobuf's DecodeError, which points at descriptors.
NOT_JSON_CAUSE = "firehose_bq.decode.json_reference.NotJson"


class Kind(enum.IntEnum):
    """A column's BigQuery type; the numbers are shared with `_json.c`."""

    RECORD = 0
    STRING = 1
    BYTES = 2
    INTEGER = 3
    FLOAT = 4
    BOOLEAN = 5
    TIMESTAMP = 6
    DATE = 7
    NUMERIC = 8
    BIGNUMERIC = 9
    DATETIME = 10
    TIME = 11
    JSON = 12
    GEOGRAPHY = 13
    INTERVAL = 14


KINDS: dict[str, Kind] = {
    "RECORD": Kind.RECORD, "STRUCT": Kind.RECORD,
    "STRING": Kind.STRING, "BYTES": Kind.BYTES,
    "INTEGER": Kind.INTEGER, "INT64": Kind.INTEGER,
    "FLOAT": Kind.FLOAT, "FLOAT64": Kind.FLOAT,
    "BOOLEAN": Kind.BOOLEAN, "BOOL": Kind.BOOLEAN,
    "TIMESTAMP": Kind.TIMESTAMP, "DATE": Kind.DATE, "DATETIME": Kind.DATETIME, "TIME": Kind.TIME,
    "NUMERIC": Kind.NUMERIC, "BIGNUMERIC": Kind.BIGNUMERIC,
    "JSON": Kind.JSON, "GEOGRAPHY": Kind.GEOGRAPHY, "INTERVAL": Kind.INTERVAL,
}
# Decimal kinds: (digits after the point, digits before it) of their Arrow types.
DECIMAL_DIGITS: dict[Kind, tuple[int, int]] = {Kind.NUMERIC: (9, 29), Kind.BIGNUMERIC: (38, 38)}


class Mode(enum.IntEnum):
    NULLABLE = 0
    REQUIRED = 1
    REPEATED = 2


@dataclass(eq=False)
class Column:
    """One column of the destination table, as both decoders walk it."""

    name: str
    kind: Kind
    mode: Mode
    children: tuple[Column, ...] = ()
    # Children by their ASCII-lowercased names: what a renamed key is looked up by.
    by_name: dict[str, Column] = field(default_factory=dict, repr=False)
    # Set for a REPEATED RECORD of exactly (key, value): the map's two fields.
    map_key: Column | None = None
    map_value: Column | None = None

    @property
    def type_name(self) -> str:
        return self.kind.name


@dataclass(frozen=True)
class Plan:
    """The table's columns compiled once per schema version.

    `nodes` lists every column in depth-first order with the root (the row) first; the native decoder
    reports a failing column by its index here. `additional_properties` is the top-level column the
    decoder writes unknown values into, when it does."""

    root: Column
    nodes: tuple[Column, ...]
    arrow_type: pa.StructType
    additional_properties: Column | None


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_RENAME = str.maketrans("-.ABCDEFGHIJKLMNOPQRSTUVWXYZ", "__abcdefghijklmnopqrstuvwxyz")


def fold(name: str) -> str:
    """ASCII-only lowercasing: BigQuery column names compare case-insensitively, and non-ASCII letters
    are compared as they are (Unicode case folding would make `ǅ` and `ǆ` one column)."""
    return name.translate(_ASCII_LOWER)


def column_key(key: str) -> str:
    """A JSON object key renamed (seed 004) and folded: what it is matched to column names by."""
    renamed = key.translate(_RENAME)
    return "_" + renamed if renamed and renamed[0] in "0123456789" else renamed


def plan(columns: Sequence[SchemaField], additional_properties: bool) -> Plan:
    """Compile the table's columns. With `additional_properties` on, a top-level column of that name (a
    NULLABLE STRING) receives the unknown values; without the column the option has nothing to fill."""
    arrow_type = arrow_struct(columns)  # raises for a column type with no Arrow form
    root = Column("", Kind.RECORD, Mode.NULLABLE, tuple(_column(c) for c in columns))
    _index(root)
    target = root.by_name.get(ADDITIONAL_PROPERTIES) if additional_properties else None
    if target is not None and (target.kind is not Kind.STRING or target.mode is not Mode.NULLABLE):
        raise ValueError(f"column {target.name} receives unknown values as JSON text, so it must be a NULLABLE "
                         f"STRING, not {target.mode.name} {target.type_name}")
    nodes: list[Column] = []

    def walk(column: Column) -> None:
        nodes.append(column)
        for child in column.children:
            walk(child)

    walk(root)
    return Plan(root, tuple(nodes), arrow_type, target)


def _column(field_: SchemaField) -> Column:
    kind = KINDS.get(field_.field_type.upper())
    if kind is None:
        raise ValueError(f"column {field_.name}: BigQuery type {field_.field_type} cannot be read from JSON")
    mode = Mode[(field_.mode or "NULLABLE").upper()]
    children = tuple(_column(c) for c in field_.fields) if kind is Kind.RECORD else ()
    return Column(field_.name, kind, mode, children)


def _index(column: Column) -> None:
    for child in column.children:
        folded = fold(child.name)
        if folded in column.by_name:
            raise ValueError(f"columns {column.by_name[folded].name} and {child.name} differ only in case")
        column.by_name[folded] = child
        _index(child)
    if column.kind is Kind.RECORD and column.mode is Mode.REPEATED and set(column.by_name) == {"key", "value"}:
        key, value = column.by_name["key"], column.by_name["value"]
        if key.mode is not Mode.REPEATED and key.kind is not Kind.RECORD:
            column.map_key, column.map_value = key, value


class Problem(enum.IntEnum):
    """Why a document that is JSON does not fit its row (INVALID_MESSAGE_ERROR); shared with `_json.c`."""

    NO_COERCION = 1
    NOT_AN_ARRAY = 2
    REQUIRED_MISSING = 3
    NULL_ELEMENT = 4
    DUPLICATE_KEY = 5
    NOT_A_NUMBER = 6
    NOT_WHOLE = 7
    OUT_OF_RANGE = 8
    TOO_PRECISE = 9
    NOT_BOOLEAN = 10
    BAD_TIMESTAMP = 11
    TIMESTAMP_RANGE = 12
    BAD_DATE = 13
    BAD_DATETIME = 14
    BAD_TIME = 15
    BAD_BASE64 = 16
    JSON_NUMBER_RANGE = 17


class JsonType(enum.IntEnum):
    """The JSON type of the value a problem is about (RFC 8259's names); shared with `_json.c`."""

    null = 0
    boolean = 1
    number = 2
    string = 3
    array = 4
    object = 5


# What is wrong with a value, by problem; filled in by `describe`.
_PROBLEMS: dict[Problem, str] = {
    Problem.NO_COERCION: "a JSON {json} cannot be stored as {type}",
    Problem.NOT_AN_ARRAY: "a JSON {json} for a REPEATED {type} column, which takes {takes}",
    Problem.REQUIRED_MISSING: "the REQUIRED {type} column is missing or null",
    Problem.NULL_ELEMENT: "a null element: BigQuery arrays cannot hold NULL",
    Problem.DUPLICATE_KEY: "the keys {key1} and {key2} both land on this column",
    Problem.NOT_A_NUMBER: "the JSON string is not a JSON number{words}, so it cannot be {type}",
    Problem.NOT_WHOLE: "the number is not a whole number, so it cannot be INTEGER",
    Problem.OUT_OF_RANGE: "the number is out of {type} range",
    Problem.TOO_PRECISE: "the number has more than {places} decimal places, which {type} would round",
    Problem.NOT_BOOLEAN: "the JSON string is neither true nor false",
    Problem.BAD_TIMESTAMP: "the JSON string is not a timestamp (YYYY-MM-DD(T| )HH:MM:SS[.ffffff][Z|±HH:MM], no zone "
                           "meaning UTC, or YYYY-MM-DD HH:MM:SS[.ffffff] UTC)",
    Problem.TIMESTAMP_RANGE: "the timestamp is outside 0001-01-01 00:00:00 .. 9999-12-31 23:59:59.999999 UTC",
    Problem.BAD_DATE: "the JSON string is not a date YYYY-MM-DD (0001-01-01 .. 9999-12-31)",
    Problem.BAD_DATETIME: "the JSON string is not a datetime YYYY-MM-DD[(T| )HH:MM:SS[.ffffff]]",
    Problem.BAD_TIME: "the JSON string is not a time HH:MM:SS[.ffffff]",
    Problem.BAD_BASE64: "the JSON string is not base64 (standard alphabet, padded with =)",
    Problem.JSON_NUMBER_RANGE: "the value holds a number beyond FLOAT64's range (about ±1.8e308), which BigQuery's "
                               "JSON type cannot store",
}


def describe(problem: Problem, path: str, json_type: JsonType, column: Column, keys: tuple[str, str] = ("", "")) \
        -> str:
    """The row's error message: the column path first, then what is wrong with the value there."""
    what = _PROBLEMS[problem].format(
        json=json_type.name, type=column.type_name, key1=_quote(keys[0]), key2=_quote(keys[1]),
        takes="an array, or an object as a map" if column.map_key is not None else "an array",
        words=', nor "NaN", "Infinity" or "-Infinity"' if column.kind is Kind.FLOAT else "",
        places=DECIMAL_DIGITS.get(column.kind, (0, 0))[0])
    return f"{path}: {what}"


def _quote(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)
