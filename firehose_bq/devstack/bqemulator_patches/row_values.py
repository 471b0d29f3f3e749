"""insertAll's row validation, as BigQuery does it: types, ranges, REQUIRED, unknown fields, field paths.

This module has no bqemulator imports: it is pure Python over schema objects with ``name``, ``type``,
``mode`` and ``fields`` attributes (bqemulator's ``TableFieldSchema``), so the rules can be read and
tested apart from the routes that use them. ``insert_all`` validates every insertAll row with it, and
``storage_write_row_errors`` reuses its value parsers and BigQuery's TIMESTAMP range for AppendRows.

The messages, locations and leniencies (numbers as STRING, whole floats as INTEGER, epoch seconds and
offsets for TIMESTAMP, URL-safe base64 for BYTES, rounding of extra NUMERIC digits) are BigQuery's, as
the ``test_gap2_*`` tests in tests/integration/test_emulator_gaps.py pin them down.
"""


import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation, localcontext
from typing import Any

from ._bq_types import canonical_type, mode
from .json_column_numbers import holds_number_beyond_float64


@dataclass(frozen=True, slots=True)
class RowError:
    """The first problem found in a row: ``location`` is a field path, e.g. ``a.b[2].c``."""

    location: str
    message: str


class InvalidValue(Exception):  # noqa: N818 - control flow inside the patches, never escapes them
    def __init__(self, location: str, message: str) -> None:
        super().__init__(message)
        self.error = RowError(location, message)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# BigQuery TIMESTAMP range is 0001-01-01 00:00:00 to 9999-12-31 23:59:59.999999 UTC.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TS_MIN_SECONDS = Decimal(-62135596800)
TS_MAX_SECONDS = Decimal("253402300799.999999")
_NUMBER_RE = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")
_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT_SPECIALS = {
    "nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
}
_DATE_RE = re.compile(r"^\s*(\d{4})-(\d{1,2})-(\d{1,2})\s*$")
_TIME_PART = r"(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,12}))?)?"
_TIME_RE = re.compile(rf"^\s*{_TIME_PART}\s*$")
_DATETIME_RE = re.compile(rf"^\s*(\d{{4}})-(\d{{1,2}})-(\d{{1,2}})(?:(?:[Tt]|\s+){_TIME_PART})?\s*$")
_TIMESTAMP_RE = re.compile(
    rf"^\s*(\d{{4}})-(\d{{1,2}})-(\d{{1,2}})(?:(?:[Tt]|\s+){_TIME_PART})?"
    r"\s*(?:(?P<utc>[Zz]|UTC)|(?P<sign>[+-])(?P<oh>\d{1,2})(?::?(?P<om>\d{2}))?)?\s*$",
)
_NUMERIC_LIMITS = {"NUMERIC": (29, 9), "BIGNUMERIC": (38, 38)}


def _display(value: Any) -> str:
    """Render a bad value the way BigQuery echoes it back: strings raw, the rest as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _micros(fraction: str | None) -> int:
    # BigQuery keeps microseconds and drops any finer digits.
    return int((fraction or "0")[:6].ljust(6, "0"))


def _civil_datetime(groups: Sequence[str | None], tzinfo: Any = None) -> datetime | None:
    """A datetime from regex groups (year, month, day, hour, minute, second, fraction); None if no such day."""
    year, month, day, hour, minute, second, fraction = groups
    try:
        return datetime(int(year or 0), int(month or 0), int(day or 0), int(hour or 0), int(minute or 0),
                        int(second or 0), _micros(fraction), tzinfo=tzinfo)
    except ValueError:
        return None


def _coerce_integer(value: Any, loc: str) -> int:
    # JSON numbers that are whole (5, 5.0) and strings of digits are integers; 5.5 and true are not.
    whole_number = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )
    digits = isinstance(value, str) and _INT_RE.match(value) is not None
    result = int(value) if whole_number or digits else None
    if result is None or not _INT64_MIN <= result <= _INT64_MAX:
        raise InvalidValue(loc, f"Cannot convert value to integer (bad value): {_display(value)}")
    return result


def _coerce_float(value: Any, loc: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        special = _FLOAT_SPECIALS.get(value.strip().lower())
        if special is not None:
            return special
        if _NUMBER_RE.match(value):
            return float(value)
    raise InvalidValue(loc, f"Cannot convert value to floating point (bad value): {_display(value)}")


def _coerce_boolean(value: Any, loc: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidValue(loc, f"Cannot convert value to boolean (bad value): {_display(value)}")


def _coerce_string(value: Any, _loc: str) -> str:
    # Real BigQuery also accepts JSON numbers and booleans for STRING columns.
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _coerce_numeric(value: Any, loc: str, bq_type: str) -> Decimal:
    max_int_digits, scale = _NUMERIC_LIMITS[bq_type]
    bad = InvalidValue(loc, f"Invalid {bq_type} value: {_display(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad
    if isinstance(value, str) and not _NUMBER_RE.match(value):
        raise bad
    try:
        # Wide enough for every value of the type at its scale (BIGNUMERIC: 38 + 38 digits): the default
        # context's 28 digits made quantize refuse valid NUMERICs such as 2^64-1 (29 digits at scale 9).
        with localcontext(prec=max_int_digits + scale + 2):
            number = Decimal(str(value).strip())
            # BigQuery rounds extra fractional digits rather than rejecting them.
            number = number.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_EVEN)
            too_big = not number.is_finite() or abs(number) >= Decimal(10) ** max_int_digits
    except InvalidOperation:
        raise bad from None
    if too_big:
        raise bad
    return number


def _coerce_bytes(value: Any, loc: str) -> bytes:
    if isinstance(value, str):
        text = value.strip()
        padded = text + "=" * (-len(text) % 4)
        try:
            return base64.b64decode(padded, validate=True)
        except (binascii.Error, ValueError):
            pass
        # BigQuery also takes the URL-safe alphabet.
        if re.fullmatch(r"[A-Za-z0-9_\-]*=*", padded):
            try:
                return base64.urlsafe_b64decode(padded)
            except (binascii.Error, ValueError):
                pass
    raise InvalidValue(loc, "Could not decode base64 string to bytes.")


def _timestamp_from_epoch(seconds: Decimal, value: Any, loc: str) -> datetime:
    if not TS_MIN_SECONDS <= seconds <= TS_MAX_SECONDS:
        raise InvalidValue(loc, f"Timestamp field value is out of range: {_display(value)}")
    micros = int((seconds * 1_000_000).to_integral_value())
    return _EPOCH + timedelta(microseconds=micros)


def coerce_timestamp(value: Any, loc: str) -> datetime:
    """Accept what insertAll accepts: RFC 3339 / canonical strings, or epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidValue(loc, f"Timestamp field value is out of range: {_display(value)}")
        return _timestamp_from_epoch(Decimal(repr(value)), value, loc)
    if isinstance(value, str):
        if _NUMBER_RE.match(value):
            return _timestamp_from_epoch(Decimal(value.strip()), value, loc)
        match = _TIMESTAMP_RE.match(value)
        if match:
            local = _civil_datetime(match.groups()[:7], UTC)
            if local is not None:
                offset = timedelta(0)
                if match.group("sign"):
                    offset = timedelta(hours=int(match.group("oh")), minutes=int(match.group("om") or 0))
                    if match.group("sign") == "-":
                        offset = -offset
                try:
                    return local - offset
                except OverflowError:
                    raise InvalidValue(loc, f"Timestamp field value is out of range: {value}") from None
    raise InvalidValue(
        loc,
        f"Could not parse '{_display(value)}' as a timestamp. "
        "Required format is YYYY-MM-DD HH:MM[:SS[.SSSSSS]]",
    )


def coerce_date(value: Any, loc: str) -> date:
    match = _DATE_RE.match(value) if isinstance(value, str) else None
    if match:
        try:
            return date(*(int(part) for part in match.groups()))
        except ValueError:
            pass
    raise InvalidValue(loc, f"Invalid date: '{_display(value)}'")


def _coerce_datetime(value: Any, loc: str) -> datetime:
    match = _DATETIME_RE.match(value) if isinstance(value, str) else None
    result = _civil_datetime(match.groups()) if match else None
    if result is not None:
        return result
    raise InvalidValue(loc, f'Invalid datetime string "{_display(value)}"')


def _coerce_time(value: Any, loc: str) -> dt_time:
    match = _TIME_RE.match(value) if isinstance(value, str) else None
    if match:
        hour, minute, second, fraction = match.groups()
        try:
            return dt_time(int(hour), int(minute), int(second or 0), _micros(fraction))
        except ValueError:
            pass
    raise InvalidValue(loc, f'Invalid time string "{_display(value)}"')


def _coerce_json(value: Any, loc: str) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            raise InvalidValue(loc, f"Invalid JSON: {value}") from None
    else:
        value = json.dumps(value)
    if holds_number_beyond_float64(value):  # BigQuery's JSON type cannot round it to FLOAT64
        raise InvalidValue(loc, f"Invalid JSON: a number out of FLOAT64 range: {_display(value)}")
    return value


SCALAR_COERCERS: dict[str, Callable[[Any, str], Any]] = {
    "INTEGER": _coerce_integer,
    "FLOAT": _coerce_float,
    "BOOLEAN": _coerce_boolean,
    "STRING": _coerce_string,
    "BYTES": _coerce_bytes,
    "TIMESTAMP": coerce_timestamp,
    "DATE": coerce_date,
    "DATETIME": _coerce_datetime,
    "TIME": _coerce_time,
    "JSON": _coerce_json,
    "NUMERIC": lambda v, loc: _coerce_numeric(v, loc, "NUMERIC"),
    "BIGNUMERIC": lambda v, loc: _coerce_numeric(v, loc, "BIGNUMERIC"),
}


def _validate_record(
    payload: Any, fields: Sequence[Any], prefix: str, ignore_unknown: bool
) -> dict[str, Any]:
    """Validate a JSON object against RECORD ``fields``. Returns the canonical values.

    Field names match case-insensitively, as BigQuery column names do. The
    payload is walked in its own key order and the first problem is raised,
    since BigQuery also reports one error per row.
    """
    by_name = {field.name.lower(): field for field in fields}
    result: dict[str, Any] = {}
    for key, value in payload.items():
        loc = f"{prefix}{key}"
        field = by_name.get(str(key).lower())
        if field is None:
            if ignore_unknown:
                continue
            raise InvalidValue(loc, f"no such field: {key}.")
        result[field.name] = _validate_field_value(value, field, f"{prefix}{field.name}", ignore_unknown)
    for field in fields:
        if mode(field) == "REQUIRED" and result.get(field.name) is None:
            raise InvalidValue(f"{prefix}{field.name}", f"Missing required field: {field.name}.")
    return result


def _validate_field_value(value: Any, field: Any, loc: str, ignore_unknown: bool) -> Any:
    if value is None:
        # NULL for a REPEATED field is an empty array, as in BigQuery.
        # NULL for a REQUIRED field is reported by the caller.
        return None
    if mode(field) == "REPEATED":
        if not isinstance(value, list):
            raise InvalidValue(loc, f"Repeated field must be imported as a JSON array: {field.name}.")
        elements = []
        for index, element in enumerate(value):
            element_loc = f"{loc}[{index}]"
            if element is None:
                raise InvalidValue(
                    element_loc, f"Array cannot have a null element; error in writing field {field.name}"
                )
            elements.append(_validate_single_value(element, field, element_loc, ignore_unknown))
        return elements
    return _validate_single_value(value, field, loc, ignore_unknown)


def _validate_single_value(value: Any, field: Any, loc: str, ignore_unknown: bool) -> Any:
    bq_type = canonical_type(field.type)
    if bq_type == "JSON":
        # Any JSON value is valid here, arrays and objects included.
        return _coerce_json(value, loc)
    if isinstance(value, list):
        raise InvalidValue(loc, f"Array specified for non-repeated field: {field.name}.")
    if bq_type == "RECORD":
        if not isinstance(value, dict):
            raise InvalidValue(loc, f"Cannot convert value to record (bad value): {_display(value)}")
        return _validate_record(value, field.fields, f"{loc}.", ignore_unknown)
    if isinstance(value, dict):
        raise InvalidValue(loc, f"This field: {field.name} is not a record.")
    coercer = SCALAR_COERCERS.get(bq_type)
    # GEOGRAPHY, INTERVAL and RANGE go to bqemulator's own converter unchanged.
    return coercer(value, loc) if coercer is not None else value


def validate_row(
    payload: Any, fields: Sequence[Any], *, ignore_unknown: bool
) -> tuple[dict[str, Any] | None, RowError | None]:
    """Validate one insertAll row against a table's top-level schema fields.

    Returns ``(canonical_row, None)`` for a good row and ``(None, error)`` for a
    bad one. ``fields`` are objects with ``name``, ``type``, ``mode`` and
    ``fields`` attributes, like bqemulator's ``TableFieldSchema``.
    """
    if not isinstance(payload, dict):
        return None, RowError("", f"Cannot convert value to record (bad value): {_display(payload)}")
    try:
        return _validate_record(payload, fields, "", ignore_unknown), None
    except InvalidValue as exc:
        return None, exc.error
