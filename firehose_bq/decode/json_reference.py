"""The Python JSON decoder: `json` parses, a plain walk coerces (the rules of `json_rules.py`), pyarrow builds.

It is the reference the native decoder (`_json.c`) is tested against and the fallback where that one is
not built. It keeps numbers as their text (so nothing is rounded before a column says how to read it)
and objects as their (key, value) pairs (so duplicate keys and document order survive).
"""

from __future__ import annotations

import base64
import json
import math
import re
from datetime import date
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any, NoReturn

import pyarrow as pa
from google.cloud.bigquery import SchemaField

from firehose_bq.decode.json_rules import DECIMAL_DIGITS, MAX_DEPTH, NOT_JSON_CAUSE, Column, JsonType, Kind, Mode, \
    Problem, column_key, describe, fold, plan
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType, RowError


class _Number(str):
    """A JSON number as written."""


class _Object(list[tuple[str, Any]]):
    """A JSON object: its (key, value) pairs in document order, duplicate keys included."""


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


_PARSER = json.JSONDecoder(object_pairs_hook=_Object, parse_float=_Number, parse_int=_Number,
                           parse_constant=_no_constant)
_NUMBER = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")
# An exponent is read up to this size; past it every column's verdict is already decided (out of range,
# or zero), and both decoders stop counting at the same point.
_EXPONENT_CAP = 10 ** 15
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

_INT64 = (-2 ** 63, 2 ** 63 - 1)
# TIMESTAMP's range in microseconds since the epoch: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z.
TIMESTAMP_MICROS = (-62_135_596_800_000_000, 253_402_300_799_999_999)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_D2 = "([0-9]{2})"
_TIMESTAMP = re.compile(rf"([0-9]{{4}})-{_D2}-{_D2}([Tt ]){_D2}:{_D2}:{_D2}(?:\.([0-9]+))?"
                        rf"(Z|z|[+-][0-9]{{2}}:?[0-9]{{2}}| UTC)?")
_DATE = re.compile(rf"([0-9]{{4}})-{_D2}-{_D2}")
_DATETIME = re.compile(rf"([0-9]{{4}})-{_D2}-{_D2}(?:[T ]{_D2}:{_D2}:{_D2}(?:\.([0-9]+))?)?")
_TIME = re.compile(rf"{_D2}:{_D2}:{_D2}(?:\.([0-9]+))?")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class NotJson(ValueError):
    """The document is not a JSON object (DESERIALIZATION_ERROR)."""


class _Invalid(Exception):
    """A value does not fit its column: the first one in document order fails the row."""

    def __init__(self, problem: Problem, path: str, json_type: JsonType, column: Column,
                 keys: tuple[str, str] = ("", "")) -> None:
        super().__init__(describe(problem, path, json_type, column, keys))


def parse(raw: bytes) -> _Object:
    """One Kafka value → its top-level object, or NotJson."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJson(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if nests_deeper(text, MAX_DEPTH):
        raise NotJson(f"not JSON this decoder reads: nested deeper than {MAX_DEPTH} levels")
    try:
        document = _PARSER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise NotJson(f"not JSON: {exc}") from None
    if type(document) is not _Object:
        raise NotJson(f"not a JSON object: the document is a JSON {_json_type(document).name}")
    if SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(document):
        raise NotJson("not JSON text: a lone UTF-16 surrogate escape")
    return document


def nests_deeper(text: str, limit: int) -> bool:
    """Whether the JSON text's arrays and objects nest deeper than `limit` (brackets inside strings do not
    count); counting brackets first spares nearly every text the walk."""
    return text.count("{") + text.count("[") > limit and _nesting_depth(text) > limit


def _nesting_depth(text: str) -> int:
    """How deep the JSON text's arrays and objects nest (brackets inside strings do not count)."""
    deepest = depth = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):  # numbers are ASCII
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if type(value) is _Object:
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value)
    if type(value) is list:
        return any(_has_lone_surrogate(v) for v in value)
    return False


def _json_type(value: Any) -> JsonType:
    if value is None:
        return JsonType.null
    if type(value) is bool:
        return JsonType.boolean
    if type(value) is _Number:
        return JsonType.number
    if type(value) is str:
        return JsonType.string
    return JsonType.object if type(value) is _Object else JsonType.array


def dump(value: Any) -> str:
    """Compact JSON text: no whitespace, keys in document order, numbers as written, strings escaped only
    where JSON requires it (`"`, `\\`, control characters)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is _Number:
        return str(value)
    if type(value) is str:
        return encode_basestring(value)
    if type(value) is _Object:
        return "{" + ",".join(encode_basestring(k) + ":" + dump(v) for k, v in value) + "}"
    return "[" + ",".join(dump(v) for v in value) + "]"


def decimal_parts(text: str) -> tuple[bool, str, int]:
    """A JSON number's exact value as (negative, significant digits, exponent): digits × 10^exponent,
    digits without leading or trailing zeros ("" for zero)."""
    negative, whole, fraction, exponent = _NUMBER.fullmatch(text).groups()  # type: ignore[union-attr]
    fraction = fraction or ""
    e = 0
    if exponent:
        unsigned = exponent.lstrip("+-").lstrip("0")
        e = min(int(unsigned or "0"), _EXPONENT_CAP) if len(unsigned) <= 16 else _EXPONENT_CAP
        e = -e if exponent.startswith("-") else e
    digits = (whole + fraction).lstrip("0")
    significant = digits.rstrip("0")
    return negative == "-", significant, e - len(fraction) + len(digits) - len(significant)


class _Row:
    """One document's walk: the row's values, its unknown values mirrored, the first problem raised."""

    def __init__(self, additional_properties: Column | None) -> None:
        self.target = additional_properties
        self.unknown = False

    def record(self, column: Column, obj: _Object, path: str) -> tuple[dict[str, Any], _Object | None]:
        row: dict[str, Any] = {}
        seen: dict[str, str] = {}  # column name → the key that landed on it
        mirror = _Object()
        for key, value in obj:
            child = column.by_name.get(column_key(key))
            if child is None or child is self.target:
                self.unknown = True
                mirror.append((key, value))
                continue
            child_path = f"{path}.{child.name}" if path else child.name
            if child.name in seen:
                raise _Invalid(Problem.DUPLICATE_KEY, child_path, _json_type(value), child, (seen[child.name], key))
            seen[child.name] = key
            row[child.name], inner = self.field(child, value, child_path)
            if inner is not None:
                mirror.append((key, inner))
        for child in column.children:
            if child.name in seen or child is self.target:
                continue
            if child.mode is Mode.REQUIRED:
                child_path = f"{path}.{child.name}" if path else child.name
                raise _Invalid(Problem.REQUIRED_MISSING, child_path, JsonType.null, child)
            row[child.name] = [] if child.mode is Mode.REPEATED else None
        return row, (mirror or None)

    def field(self, column: Column, value: Any, path: str) -> tuple[Any, Any]:
        """`value` for `column` → (its column value, the mirror of its unknown values or None)."""
        if column.mode is Mode.REPEATED:
            if value is None:
                return [], None
            if type(value) is list:
                return self.array(column, value, path)
            if type(value) is _Object and column.map_key is not None:
                return self.map(column, value, path)
            raise _Invalid(Problem.NOT_AN_ARRAY, path, _json_type(value), column)
        if value is None:
            if column.mode is Mode.REQUIRED:
                raise _Invalid(Problem.REQUIRED_MISSING, path, JsonType.null, column)
            return None, None
        return self.element(column, value, path)

    def element(self, column: Column, value: Any, path: str) -> tuple[Any, Any]:
        if column.kind is Kind.RECORD:
            if type(value) is not _Object:
                raise _Invalid(Problem.NO_COERCION, path, _json_type(value), column)
            return self.record(column, value, path)
        return scalar(column, value, path), None

    def array(self, column: Column, values: list[Any], path: str) -> tuple[list[Any], list[Any] | None]:
        items, mirrors = [], []
        for i, value in enumerate(values):
            if value is None:
                raise _Invalid(Problem.NULL_ELEMENT, f"{path}[{i}]", JsonType.null, column)
            item, inner = self.element(column, value, f"{path}[{i}]")
            items.append(item)
            mirrors.append(inner)
        if column.kind is not Kind.RECORD or all(m is None for m in mirrors):
            return items, None
        return items, [_Object() if m is None else m for m in mirrors]

    def map(self, column: Column, obj: _Object, path: str) -> tuple[list[Any], _Object | None]:
        key_column, value_column = column.map_key, column.map_value
        assert key_column is not None and value_column is not None
        items, mirror = [], _Object()
        for i, (key, value) in enumerate(obj):
            entry = f"{path}[{i}]"
            item_key = scalar(key_column, key, f"{entry}.{key_column.name}")
            item_value, inner = self.field(value_column, value, f"{entry}.{value_column.name}")
            items.append({key_column.name: item_key, value_column.name: item_value})
            if inner is not None:
                mirror.append((key, inner))
        return items, (mirror or None)


def scalar(column: Column, value: Any, path: str) -> Any:
    """A non-null JSON value for a leaf column → the column's Python value for pyarrow."""
    kind, json_type = column.kind, _json_type(value)
    if json_type is JsonType.string:
        return _from_string(column, value, path)
    if json_type is JsonType.number:
        return _from_number(column, value, path, JsonType.number)
    if kind is Kind.JSON:
        _check_json_numbers(column, value, path)
    if kind in (Kind.STRING, Kind.JSON) or (kind is Kind.GEOGRAPHY and json_type is JsonType.object):
        return dump(value)
    if kind is Kind.BOOLEAN and json_type is JsonType.boolean:
        return value
    raise _Invalid(Problem.NO_COERCION, path, json_type, column)


def _check_json_numbers(column: Column, value: Any, path: str) -> None:
    """A JSON column's value must hold no number beyond FLOAT64's range: BigQuery's JSON type rounds
    other numbers to FLOAT64 and refuses what cannot be rounded (json_rules)."""
    if type(value) is _Number:
        if math.isinf(float(value)):
            raise _Invalid(Problem.JSON_NUMBER_RANGE, path, JsonType.number, column)
    elif type(value) is _Object:
        for _, item in value:
            _check_json_numbers(column, item, path)
    elif type(value) is list:
        for item in value:
            _check_json_numbers(column, item, path)


def _from_string(column: Column, text: str, path: str) -> Any:
    kind = column.kind
    if kind in (Kind.STRING, Kind.GEOGRAPHY, Kind.INTERVAL):
        return text
    if kind is Kind.JSON:
        return encode_basestring(text)
    if kind in (Kind.INTEGER, Kind.FLOAT, Kind.NUMERIC, Kind.BIGNUMERIC):
        if kind is Kind.FLOAT and text in _FLOAT_WORDS:
            return _FLOAT_WORDS[text]
        if not _NUMBER.fullmatch(text):
            raise _Invalid(Problem.NOT_A_NUMBER, path, JsonType.string, column)
        return _from_number(column, text, path, JsonType.string)
    if kind is Kind.BOOLEAN:
        folded = fold(text)
        if folded in ("true", "false"):
            return folded == "true"
        raise _Invalid(Problem.NOT_BOOLEAN, path, JsonType.string, column)
    if kind is Kind.TIMESTAMP:
        return _timestamp(column, text, path)
    if kind is Kind.DATE:
        m = _DATE.fullmatch(text)
        day = _day(*m.groups()) if m else None
        if day is None:
            raise _Invalid(Problem.BAD_DATE, path, JsonType.string, column)
        return day
    if kind is Kind.DATETIME:
        return _wall_clock(column, text, path, _DATETIME, Problem.BAD_DATETIME)
    if kind is Kind.TIME:
        return _wall_clock(column, text, path, _TIME, Problem.BAD_TIME)
    if kind is Kind.BYTES:
        if len(text) % 4 or not _BASE64.fullmatch(text):
            raise _Invalid(Problem.BAD_BASE64, path, JsonType.string, column)
        return base64.b64decode(text)
    raise _Invalid(Problem.NO_COERCION, path, JsonType.string, column)


def _from_number(column: Column, text: str, path: str, json_type: JsonType) -> Any:
    kind = column.kind
    if kind is Kind.JSON and json_type is JsonType.number:
        _check_json_numbers(column, _Number(text), path)
    if kind in (Kind.STRING, Kind.JSON):
        return str(text)
    if kind is Kind.FLOAT:
        number = float(text)
        if math.isinf(number):
            raise _Invalid(Problem.OUT_OF_RANGE, path, json_type, column)
        return number
    if kind not in (Kind.INTEGER, Kind.NUMERIC, Kind.BIGNUMERIC, Kind.TIMESTAMP):
        raise _Invalid(Problem.NO_COERCION, path, json_type, column)
    negative, digits, e = decimal_parts(text)
    if kind is Kind.INTEGER:
        if not digits:
            return 0
        if e < 0:
            raise _Invalid(Problem.NOT_WHOLE, path, json_type, column)
        number = int(digits) * 10 ** e if len(digits) + e <= 19 else None
        number = -number if negative and number is not None else number
        if number is None or not _INT64[0] <= number <= _INT64[1]:
            raise _Invalid(Problem.OUT_OF_RANGE, path, json_type, column)
        return number
    if kind is Kind.TIMESTAMP:
        micros = _scaled(digits, e + 6)
        if negative and digits and micros is not None:  # digits dropped: towards the past, as for text
            micros = -micros - (1 if e + 6 < 0 else 0)
        if micros is None or not TIMESTAMP_MICROS[0] <= micros <= TIMESTAMP_MICROS[1]:
            raise _Invalid(Problem.TIMESTAMP_RANGE, path, json_type, column)
        return micros
    scale, whole = DECIMAL_DIGITS[kind]
    if not digits:
        return Decimal(0)
    if e < -scale:
        raise _Invalid(Problem.TOO_PRECISE, path, json_type, column)
    if len(digits) + e > whole:
        raise _Invalid(Problem.OUT_OF_RANGE, path, json_type, column)
    return Decimal((int(negative), tuple(map(int, digits)), e))


def _scaled(digits: str, shift: int) -> int | None:
    """digits × 10^shift with the digits past the point dropped; None past 18 digits (out of any range
    here)."""
    if not digits:
        return 0
    if shift >= 0:
        return int(digits or "0") * 10 ** shift if len(digits) + shift <= 18 else None
    kept = len(digits) + shift
    return None if kept > 18 else int(digits[:kept]) if kept > 0 else 0


def _day(year: str, month: str, day: str) -> int | None:
    try:
        return date(int(year), int(month), int(day)).toordinal() - _EPOCH_DAY
    except ValueError:
        return None


def _timestamp(column: Column, text: str, path: str) -> int:
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        raise _Invalid(Problem.BAD_TIMESTAMP, path, JsonType.string, column)
    year, month, day, separator, hour, minute, second, fraction, zone = m.groups()
    days = _day(year, month, day)
    offset = _offset_seconds(zone)
    if (days is None or int(hour) > 23 or int(minute) > 59 or int(second) > 59 or offset is None
            or (zone == " UTC" and separator != " ")):
        raise _Invalid(Problem.BAD_TIMESTAMP, path, JsonType.string, column)
    seconds = days * 86_400 + int(hour) * 3_600 + int(minute) * 60 + int(second) - offset
    micros = seconds * 1_000_000 + int((fraction or "")[:6].ljust(6, "0"))
    if not TIMESTAMP_MICROS[0] <= micros <= TIMESTAMP_MICROS[1]:
        raise _Invalid(Problem.TIMESTAMP_RANGE, path, JsonType.string, column)
    return micros


def _offset_seconds(zone: str | None) -> int | None:
    if zone is None or zone in ("Z", "z", " UTC"):
        return 0
    hours, minutes = int(zone[1:3]), int(zone[-2:])
    if hours > 23 or minutes > 59:
        return None
    seconds = hours * 3_600 + minutes * 60
    return -seconds if zone[0] == "-" else seconds


def _wall_clock(column: Column, text: str, path: str, pattern: re.Pattern[str], problem: Problem) -> str:
    """DATETIME and TIME stay text (BigQuery parses them); checked here, fraction cut to microseconds."""
    m = pattern.fullmatch(text)
    if m is None or (pattern is _DATETIME and _day(*m.groups()[:3]) is None):
        raise _Invalid(problem, path, JsonType.string, column)
    hour, minute, second, fraction = m.groups()[-4:]
    if hour is not None and (int(hour) > 23 or int(minute) > 59 or int(second) > 59):
        raise _Invalid(problem, path, JsonType.string, column)
    return text[:len(text) - len(fraction) + 6] if fraction and len(fraction) > 6 else text


class JsonReferenceDecoder:
    """JSON documents → rows of the table whose columns are `columns` (see `json_rules`)."""

    def __init__(self, columns: list[SchemaField] | tuple[SchemaField, ...], *, additional_properties: bool) -> None:
        self._plan = plan(columns, additional_properties)

    @property
    def arrow_type(self) -> pa.StructType:
        return self._plan.arrow_type

    def decode(self, values: pa.Array) -> DecodedValues:
        rows: list[dict[str, Any] | None] = []
        out = DecodedValues(pa.array([], self.arrow_type))
        root, target = self._plan.root, self._plan.additional_properties
        for i, raw in enumerate(values.to_pylist()):
            if raw is None:
                rows.append(None)
                continue
            walk = _Row(target)
            try:
                row, mirror = walk.record(root, parse(raw if isinstance(raw, bytes) else raw.encode()), "")
            except NotJson as exc:
                out.failures.append(RowError(i, ErrorType.DESERIALIZATION_ERROR, str(exc), NOT_JSON_CAUSE))
                rows.append(None)
                continue
            except _Invalid as exc:
                out.failures.append(RowError(i, ErrorType.INVALID_MESSAGE_ERROR, str(exc)))
                rows.append(None)
                continue
            if target is not None:
                row[target.name] = dump(mirror) if mirror else None
            elif walk.unknown:
                out.unknown_fields.append(i)
            rows.append(row)
        out.values = pa.array(rows, type=self.arrow_type)
        return out
