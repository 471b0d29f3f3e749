#!/usr/bin/env python3
"""Run the ``bqemulator`` BigQuery emulator with the patches the firehose tests need.

This is a standalone script. It runs under the emulator's own virtualenv,
not the project's, so it imports only the standard library, ``bqemulator``
and that package's own dependencies (FastAPI, DuckDB, pyarrow, sqlglot).
Never import ``firehose_bq`` here.

Usage::

    python bqemulator_launcher.py --host 127.0.0.1 --port 9050 --grpc-port 9060 \
        [--data-dir DIR] [--project PROJECT]

Without ``--data-dir`` the emulator keeps everything in memory. With it, the
emulator's persistent mode stores ``bqemulator.duckdb`` in that directory.

bqemulator 1.4.0 as shipped differs from BigQuery in ways the sink's tests
notice. Each difference is closed by one small patch function below, applied
before the server starts:

* gap 1  ``patch_optional_duckdb_extensions``: start-up no longer needs to
  download DuckDB's ``spatial`` / ``avro`` extensions.
* gap 2  ``patch_insert_all``: ``tabledata.insertAll`` validates rows the way
  BigQuery does and answers with per-row ``insertErrors`` instead of HTTP 500.
  It also deduplicates on ``insertId`` (``--insert-id-ttl``, 60 s by default).
  It no longer copies the whole table into a time-travel snapshot after every
  insert, a cost that grows with the table (``--insert-all-snapshots`` brings
  the copies back).
* gap 3  ``patch_schema_update_validation``, ``patch_schema_update_storage`` and
  ``patch_ddl_alter_table_sync``: a schema change made through
  ``tables.patch`` / ``tables.update`` also changes the DuckDB table, and an
  ``ALTER TABLE`` statement also changes the table's metadata.
* gap 4  ``patch_multipart_media_part``: multipart uploads (load jobs under
  5 MB) accept a data part whatever its Content-Type.
* gap 5  ``patch_storage_write_nested_schema``: Storage Write into tables with
  RECORD columns keeps the subfields (no more "Type STRUCT does not match").
* gap 6  ``patch_append_rows_remembers_stream``: an AppendRows connection stays
  bound to the stream its first request named; later requests may omit it.
* extras ``patch_append_rows_row_errors`` (Storage Write checks each row and
  answers BigQuery's ``row_errors``; appends go in BY NAME, without a snapshot
  copy each), ``patch_quote_nested_field_names`` (a RECORD subfield may be named
  like a SQL keyword), ``patch_load_job_partitioning`` (a load job that
  creates its destination keeps ``timePartitioning`` / ``clustering``) and
  ``patch_settle_abandoned_results`` (writes after a ``tabledata.list`` no
  longer fail on DuckDB 2.0's "unfinished result") and
  ``patch_parquet_load_by_name`` (a Parquet load matches columns by name).

Each patch checks that what it patches still exists. If one is missing (say, a
different bqemulator version), the launcher exits with status 3 and names it,
because an emulator that is silently unpatched gives misleading test results.
After the patches, the server runs in the foreground until SIGTERM or SIGINT,
then stops and exits 0. A failure during start-up exits 1.
"""

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import importlib
import json
import logging
import math
import re
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from types import ModuleType
from typing import Any

LOG = logging.getLogger("bqemulator_launcher")

EXIT_PATCH_TARGET_MISSING = 3
EXIT_STARTUP_FAILED = 1

# The version these patches were written against. Another version may still
# work. Every target is checked by name, so a real mismatch fails loudly.
TESTED_BQEMULATOR_VERSION = "1.4.0"


class PatchTargetMissingError(RuntimeError):
    """A module or attribute that a patch wraps is missing from the installed bqemulator."""


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PatchTargetMissingError(f"module {name} cannot be imported: {exc}") from exc


def _dotted(owner: Any) -> str:
    if isinstance(owner, ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def _require(owner: Any, attr: str) -> Any:
    """Return ``owner.attr``, or raise with the dotted name of whatever is missing."""
    if not hasattr(owner, attr):
        raise PatchTargetMissingError(f"{_dotted(owner)}.{attr} no longer exists")
    return getattr(owner, attr)


def _replace(owner: Any, attr: str, new: Any) -> str:
    """Replace ``owner.attr`` (which must exist) with ``new``, and return its dotted name for the log."""
    _require(owner, attr)
    setattr(owner, attr, new)
    return f"{_dotted(owner)}.{attr}"


def _quote_ident(name: str) -> str:
    """Quote a DuckDB identifier so that keywords and odd names are safe."""
    return '"' + name.replace('"', '""') + '"'


_RECORD_TYPES = frozenset({"RECORD", "STRUCT"})
_TYPE_ALIASES = {"INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN", "STRUCT": "RECORD"}


def _canonical_type(bq_type: str) -> str:
    upper = (bq_type or "STRING").upper()
    return _TYPE_ALIASES.get(upper, upper)


def _mode(field: Any) -> str:
    return (getattr(field, "mode", None) or "NULLABLE").upper()


# =============================================================================
# Gap 1: DuckDB extensions are optional
# =============================================================================


def _load_local_extension(conn: Any, name: str, *, allow_download: bool) -> bool:
    """LOAD an extension from the local cache, downloading it only if allowed.

    Offline, a DuckDB ``INSTALL`` fails only after 2-3 s of connection
    attempts, so by default nothing is downloaded.
    """
    try:
        conn.execute(f"LOAD {name}")
        return True
    except Exception:  # noqa: BLE001 - not installed locally; decide below
        pass
    if not allow_download:
        return False
    try:
        conn.execute(f"INSTALL {name}")
        conn.execute(f"LOAD {name}")
        return True
    except Exception as exc:  # noqa: BLE001 - offline or blocked; tolerated
        LOG.warning("DuckDB extension %s unavailable: %s", name, str(exc).splitlines()[0])
        return False


def patch_optional_duckdb_extensions(*, allow_download: bool) -> list[str]:
    """Gap 1: start up without DuckDB's ``spatial`` (and ``avro``) extensions.

    ``DuckDBEngine._load_spatial`` runs ``INSTALL spatial`` and aborts start-up
    when the download fails, so the emulator cannot start offline. The sink
    uses no GEOGRAPHY, so a missing extension should cost only GEOGRAPHY
    support. ``_load_format_extensions`` (avro) already tolerates failure, but
    every start still waits on a doomed download, so it gets the same
    local-only treatment.
    """
    engine_cls = _require(_module("bqemulator.storage.engine"), "DuckDBEngine")

    def _disable_autoinstall(conn: Any) -> None:
        # Without this, the first ST_* call would wait on a download before failing.
        # An older DuckDB without the setting has nothing to turn off.
        with contextlib.suppress(Exception):
            conn.execute("SET autoinstall_known_extensions = false")

    def _load_spatial(self: Any) -> None:
        conn = self.connection
        if _load_local_extension(conn, "spatial", allow_download=allow_download):
            return
        LOG.warning("DuckDB 'spatial' extension not available: GEOGRAPHY columns/functions will fail")
        if not allow_download:
            _disable_autoinstall(conn)

    def _load_format_extensions(self: Any) -> None:
        if not _load_local_extension(self.connection, "avro", allow_download=allow_download):
            LOG.info("DuckDB 'avro' extension not available: AVRO load/extract disabled")

    return [
        _replace(engine_cls, "_load_spatial", _load_spatial),
        _replace(engine_cls, "_load_format_extensions", _load_format_extensions),
    ]


# =============================================================================
# Gap 2: insertAll row validation, which has no bqemulator imports
# =============================================================================


@dataclass(frozen=True, slots=True)
class RowError:
    """The first problem found in a row: ``location`` is a field path, e.g. ``a.b[2].c``."""

    location: str
    message: str


class _Invalid(Exception):  # noqa: N818 - internal control flow, never escapes
    def __init__(self, location: str, message: str) -> None:
        super().__init__(message)
        self.error = RowError(location, message)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# BigQuery TIMESTAMP range is 0001-01-01 00:00:00 to 9999-12-31 23:59:59.999999 UTC.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TS_MIN_SECONDS = Decimal(-62135596800)
_TS_MAX_SECONDS = Decimal("253402300799.999999")
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


def _coerce_integer(value: Any, loc: str) -> int:
    # JSON numbers that are whole (5, 5.0) and strings of digits are integers; 5.5 and true are not.
    whole_number = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )
    digits = isinstance(value, str) and _INT_RE.match(value) is not None
    result = int(value) if whole_number or digits else None
    if result is None or not _INT64_MIN <= result <= _INT64_MAX:
        raise _Invalid(loc, f"Cannot convert value to integer (bad value): {_display(value)}")
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
    raise _Invalid(loc, f"Cannot convert value to floating point (bad value): {_display(value)}")


def _coerce_boolean(value: Any, loc: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _Invalid(loc, f"Cannot convert value to boolean (bad value): {_display(value)}")


def _coerce_string(value: Any, _loc: str) -> str:
    # Real BigQuery also accepts JSON numbers and booleans for STRING columns.
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _coerce_numeric(value: Any, loc: str, bq_type: str) -> Decimal:
    max_int_digits, scale = _NUMERIC_LIMITS[bq_type]
    bad = _Invalid(loc, f"Invalid {bq_type} value: {_display(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad
    if isinstance(value, str) and not _NUMBER_RE.match(value):
        raise bad
    try:
        number = Decimal(str(value).strip())
        # BigQuery rounds extra fractional digits rather than rejecting them.
        number = number.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_EVEN)
    except InvalidOperation:
        raise bad from None
    if not number.is_finite() or abs(number) >= Decimal(10) ** max_int_digits:
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
    raise _Invalid(loc, "Could not decode base64 string to bytes.")


def _timestamp_from_epoch(seconds: Decimal, value: Any, loc: str) -> datetime:
    if not _TS_MIN_SECONDS <= seconds <= _TS_MAX_SECONDS:
        raise _Invalid(loc, f"Timestamp field value is out of range: {_display(value)}")
    micros = int((seconds * 1_000_000).to_integral_value())
    return _EPOCH + timedelta(microseconds=micros)


def _coerce_timestamp(value: Any, loc: str) -> datetime:
    """Accept what insertAll accepts: RFC 3339 / canonical strings, or epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise _Invalid(loc, f"Timestamp field value is out of range: {_display(value)}")
        return _timestamp_from_epoch(Decimal(repr(value)), value, loc)
    if isinstance(value, str):
        if _NUMBER_RE.match(value):
            return _timestamp_from_epoch(Decimal(value.strip()), value, loc)
        match = _TIMESTAMP_RE.match(value)
        if match:
            year, month, day, hour, minute, second, fraction = match.groups()[:7]
            try:
                local = datetime(
                    int(year),
                    int(month),
                    int(day),
                    int(hour or 0),
                    int(minute or 0),
                    int(second or 0),
                    _micros(fraction),
                    tzinfo=UTC,
                )
            except ValueError:
                local = None
            if local is not None:
                offset = timedelta(0)
                if match.group("sign"):
                    offset = timedelta(hours=int(match.group("oh")), minutes=int(match.group("om") or 0))
                    if match.group("sign") == "-":
                        offset = -offset
                try:
                    return local - offset
                except OverflowError:
                    raise _Invalid(loc, f"Timestamp field value is out of range: {value}") from None
    raise _Invalid(
        loc,
        f"Could not parse '{_display(value)}' as a timestamp. "
        "Required format is YYYY-MM-DD HH:MM[:SS[.SSSSSS]]",
    )


def _coerce_date(value: Any, loc: str) -> date:
    match = _DATE_RE.match(value) if isinstance(value, str) else None
    if match:
        try:
            return date(*(int(part) for part in match.groups()))
        except ValueError:
            pass
    raise _Invalid(loc, f"Invalid date: '{_display(value)}'")


def _coerce_datetime(value: Any, loc: str) -> datetime:
    match = _DATETIME_RE.match(value) if isinstance(value, str) else None
    if match:
        year, month, day, hour, minute, second, fraction = match.groups()
        try:
            return datetime(
                int(year),
                int(month),
                int(day),
                int(hour or 0),
                int(minute or 0),
                int(second or 0),
                _micros(fraction),
            )
        except ValueError:
            pass
    raise _Invalid(loc, f'Invalid datetime string "{_display(value)}"')


def _coerce_time(value: Any, loc: str) -> dt_time:
    match = _TIME_RE.match(value) if isinstance(value, str) else None
    if match:
        hour, minute, second, fraction = match.groups()
        try:
            return dt_time(int(hour), int(minute), int(second or 0), _micros(fraction))
        except ValueError:
            pass
    raise _Invalid(loc, f'Invalid time string "{_display(value)}"')


def _coerce_json(value: Any, loc: str) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            raise _Invalid(loc, f"Invalid JSON: {value}") from None
        return value
    return json.dumps(value)


_SCALAR_COERCERS: dict[str, Callable[[Any, str], Any]] = {
    "INTEGER": _coerce_integer,
    "FLOAT": _coerce_float,
    "BOOLEAN": _coerce_boolean,
    "STRING": _coerce_string,
    "BYTES": _coerce_bytes,
    "TIMESTAMP": _coerce_timestamp,
    "DATE": _coerce_date,
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
            raise _Invalid(loc, f"no such field: {key}.")
        result[field.name] = _validate_field_value(value, field, f"{prefix}{field.name}", ignore_unknown)
    for field in fields:
        if _mode(field) == "REQUIRED" and result.get(field.name) is None:
            raise _Invalid(f"{prefix}{field.name}", f"Missing required field: {field.name}.")
    return result


def _validate_field_value(value: Any, field: Any, loc: str, ignore_unknown: bool) -> Any:
    if value is None:
        # NULL for a REPEATED field is an empty array, as in BigQuery.
        # NULL for a REQUIRED field is reported by the caller.
        return None
    if _mode(field) == "REPEATED":
        if not isinstance(value, list):
            raise _Invalid(loc, f"Repeated field must be imported as a JSON array: {field.name}.")
        elements = []
        for index, element in enumerate(value):
            element_loc = f"{loc}[{index}]"
            if element is None:
                raise _Invalid(
                    element_loc, f"Array cannot have a null element; error in writing field {field.name}"
                )
            elements.append(_validate_single_value(element, field, element_loc, ignore_unknown))
        return elements
    return _validate_single_value(value, field, loc, ignore_unknown)


def _validate_single_value(value: Any, field: Any, loc: str, ignore_unknown: bool) -> Any:
    bq_type = _canonical_type(field.type)
    if bq_type == "JSON":
        # Any JSON value is valid here, arrays and objects included.
        return _coerce_json(value, loc)
    if isinstance(value, list):
        raise _Invalid(loc, f"Array specified for non-repeated field: {field.name}.")
    if bq_type == "RECORD":
        if not isinstance(value, dict):
            raise _Invalid(loc, f"Cannot convert value to record (bad value): {_display(value)}")
        return _validate_record(value, field.fields, f"{loc}.", ignore_unknown)
    if isinstance(value, dict):
        raise _Invalid(loc, f"This field: {field.name} is not a record.")
    coercer = _SCALAR_COERCERS.get(bq_type)
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
    except _Invalid as exc:
        return None, exc.error


def invalid_entry(index: int, error: RowError) -> dict[str, Any]:
    return {
        "index": index,
        "errors": [
            {"reason": "invalid", "location": error.location, "debugInfo": "", "message": error.message}
        ],
    }


def stopped_entry(index: int) -> dict[str, Any]:
    return {"index": index, "errors": [{"reason": "stopped", "location": "", "debugInfo": "", "message": ""}]}


def build_insert_errors(
    row_count: int, errors: dict[int, RowError], *, skip_invalid_rows: bool
) -> list[dict[str, Any]]:
    """Give the ``insertErrors`` list BigQuery returns for the given per-row errors.

    Without ``skipInvalidRows`` one bad row stops the whole request: bad rows
    are reported ``invalid`` and every other row ``stopped``.
    """
    if not errors:
        return []
    if skip_invalid_rows:
        return [invalid_entry(i, errors[i]) for i in sorted(errors)]
    return [invalid_entry(i, errors[i]) if i in errors else stopped_entry(i) for i in range(row_count)]


@dataclass(frozen=True, slots=True)
class GoodRow:
    """A row that passed validation: its request index, canonical values and insertId."""

    index: int
    values: dict[str, Any]
    insert_id: str | None


def validate_rows(
    rows: Sequence[Any], fields: Sequence[Any], *, ignore_unknown: bool
) -> tuple[list[GoodRow], dict[int, RowError]]:
    """Split insertAll ``rows`` (``{"insertId": ..., "json": {...}}``) into good rows and errors."""
    good: list[GoodRow] = []
    errors: dict[int, RowError] = {}
    for index, row in enumerate(rows):
        row = row if isinstance(row, dict) else {}
        values, error = validate_row(row.get("json"), fields, ignore_unknown=ignore_unknown)
        if error is not None or values is None:
            errors[index] = error or RowError("", "Cannot convert value to record")
            continue
        insert_id = row.get("insertId")
        good.append(GoodRow(index, values, str(insert_id) if insert_id not in (None, "") else None))
    return good, errors


class InsertIdCache:
    """Remember recent ``insertId``s per table, for best-effort de-duplication.

    BigQuery says it remembers an insertId for at least one minute. Entries
    are kept in insertion order, and all share one TTL, so expiry only has to
    look at the oldest ones.
    """

    def __init__(self, ttl_seconds: float, max_entries: int = 2_000_000) -> None:
        self._ttl = ttl_seconds
        self._max = max_entries
        self._seen: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def _expire(self, now: float) -> None:
        while self._seen:
            key, expiry = next(iter(self._seen.items()))
            if expiry > now and len(self._seen) <= self._max:
                break
            self._seen.pop(key)

    def drop_duplicates(self, table_key: str, rows: list[GoodRow]) -> list[GoodRow]:
        """Leave out rows whose insertId was stored recently or already appears earlier in ``rows``."""
        self._expire(time.monotonic())
        fresh: list[GoodRow] = []
        in_request: set[str] = set()
        for row in rows:
            if row.insert_id is not None:
                if row.insert_id in in_request or (table_key, row.insert_id) in self._seen:
                    continue
                in_request.add(row.insert_id)
            fresh.append(row)
        return fresh

    def remember(self, table_key: str, rows: Iterable[GoodRow]) -> None:
        expiry = time.monotonic() + self._ttl
        for row in rows:
            if row.insert_id is not None:
                self._seen.pop((table_key, row.insert_id), None)
                self._seen[(table_key, row.insert_id)] = expiry
        self._expire(time.monotonic())


# =============================================================================
# Gap 2: the insertAll route
# =============================================================================


def _plain_types_only(fields: Sequence[Any]) -> bool:
    """True when every field, at any depth, is a type this module validates and canonicalises."""
    return all(
        _plain_types_only(f.fields)
        if _canonical_type(f.type) == "RECORD"
        else _canonical_type(f.type) in _SCALAR_COERCERS
        for f in fields
    )


def patch_insert_all(*, insert_id_ttl_seconds: float, snapshot_each_insert: bool) -> list[str]:
    """Gap 2: make ``tabledata.insertAll`` validate rows and report errors as BigQuery does.

    As shipped, the route gives the raw JSON to pyarrow. A badly typed row
    raises, and the client sees HTTP 500 and retries it for up to 600 s.
    Unknown fields and missing REQUIRED fields are accepted without a word.
    ``insertId`` is ignored.

    The replacement route validates every row (recursively, through RECORD and
    REPEATED fields) and answers HTTP 200 with per-row ``insertErrors``. A bad
    row is ``invalid``. Without ``skipInvalidRows`` the other rows are
    ``stopped`` and nothing is inserted. With it, the good rows are inserted.
    Rows whose ``insertId`` was inserted recently are skipped without error,
    like BigQuery's best-effort de-duplication. Table lookup, GEOGRAPHY
    projection, row count and the change event are done as bqemulator does
    them.

    bqemulator also copies the whole table into an AUTO time-travel snapshot
    after every insert, and keeps the copies for 7 days. Streaming 100k rows in
    500-row batches then holds about 10M copied rows (about 0.8 GB) and makes
    each insert slower than the last. Unless ``snapshot_each_insert`` is set,
    the route publishes the change event without the copy, so
    ``FOR SYSTEM_TIME AS OF`` reads the live table for streamed data.
    """
    import pyarrow as pa  # bqemulator dependency
    from fastapi import Request  # bqemulator dependency

    tabledata = _module("bqemulator.api.routes.tabledata")
    arrow_bridge = _module("bqemulator.storage.arrow_bridge")
    sql_ids = _module("bqemulator.storage.sql_identifiers")
    errors_mod = _module("bqemulator.domain.errors")
    events_mod = _module("bqemulator.domain.events")
    router = _require(tabledata, "router")
    ctx_annotation = _require(tabledata, "_Ctx")
    build_arrow_schema = _require(tabledata, "_build_arrow_schema")
    fields_raw_from_schema = _require(tabledata, "_fields_raw_from_schema")
    has_geography = _require(tabledata, "_has_geography_column")
    build_insert_select = _require(tabledata, "_build_insert_select")
    bq_rows_to_arrow = _require(arrow_bridge, "bq_rows_to_arrow")
    quoted_table_ref = _require(sql_ids, "quoted_table_ref")
    register_name = _require(sql_ids, "register_name")
    resource_not_found = _require(errors_mod, "resource_not_found")
    resource_ref = _require(errors_mod, "ResourceRef")
    validation_error = _require(errors_mod, "ValidationError")
    table_data_changed = _require(events_mod, "TableDataChanged")

    routes = [r for r in router.routes if getattr(r, "path", "").endswith("/insertAll")]
    if len(routes) != 1 or "POST" not in getattr(routes[0], "methods", ()):
        raise PatchTargetMissingError("bqemulator.api.routes.tabledata.router: no single POST .../insertAll")
    original_route = routes[0]
    recent_ids = InsertIdCache(insert_id_ttl_seconds)

    def convert(rows: list[GoodRow], fields: Sequence[Any], arrow_schema: Any) -> Any:
        if _plain_types_only(fields):
            # Values are already canonical Python objects, so pyarrow can take
            # them as they are. That is about 4x faster than bqemulator's
            # converter, which dispatches every value again.
            return pa.Table.from_pylist([r.values for r in rows], schema=arrow_schema)
        # GEOGRAPHY, INTERVAL and RANGE need bqemulator's own converter.
        return bq_rows_to_arrow([{"json": r.values} for r in rows], arrow_schema)

    def to_arrow(rows: list[GoodRow], fields: Sequence[Any]) -> tuple[Any, dict[int, RowError]]:
        """Convert rows to Arrow. If that fails, find the rows that cannot be converted.

        Validation should catch everything first, but GEOGRAPHY, INTERVAL and
        RANGE values reach the converter unchecked.
        """
        arrow_schema = build_arrow_schema(fields_raw_from_schema(fields))
        try:
            return convert(rows, fields, arrow_schema), {}
        except Exception:  # noqa: BLE001 - pyarrow and bqemulator raise assorted types
            bad: dict[int, RowError] = {}
            for row in rows:
                try:
                    convert([row], fields, arrow_schema)
                except Exception as exc:  # noqa: BLE001
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    bad[row.index] = RowError("", f"Cannot convert row to the table schema: {reason}")
            good = [r for r in rows if r.index not in bad]
            return (convert(good, fields, arrow_schema) if good else None), bad

    async def append(ctx: Any, table_meta: Any, arrow_table: Any) -> None:
        project_id, dataset_id, table_id = table_meta.project_id, table_meta.dataset_id, table_meta.table_id
        fields = list(table_meta.schema_.fields)
        target_ref = quoted_table_ref(project_id, dataset_id, table_id)
        reg = register_name(f"__bqemu_insertall_{uuid.uuid4().hex[:12]}")
        projection = build_insert_select(fields, reg) if has_geography(fields) else "*"
        async with ctx.engine.write_lock():
            ctx.engine.connection.register(reg, arrow_table)
            try:
                # BY NAME: after gap 3's ADD COLUMN the stored column order can
                # differ from the schema order.
                ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT {projection} FROM {reg}")
            finally:
                ctx.engine.connection.unregister(reg)
            # Re-read under the lock so that concurrent inserts do not lose row counts.
            current = ctx.catalog.get_table(project_id, dataset_id, table_id) or table_meta
            ctx.catalog.update_table(
                current.model_copy(update={"num_rows": current.num_rows + arrow_table.num_rows})
            )
            if snapshot_each_insert:
                ctx.snapshots.record_change(project_id, dataset_id, table_id)
            else:
                ctx.events.publish(table_data_changed(project_id, dataset_id, table_id))

    async def insert_all(
        project_id: str, dataset_id: str, table_id: str, request: Request, ctx: Any
    ) -> dict[str, Any]:
        table_meta = ctx.catalog.get_table(project_id, dataset_id, table_id)
        if table_meta is None:
            raise resource_not_found(resource_ref("table", project_id, dataset_id, table_id))
        body = await request.json()
        if not isinstance(body, dict):
            raise validation_error("insertAll request body must be a JSON object")
        rows = body.get("rows") or []
        skip_invalid = bool(body.get("skipInvalidRows", False))
        fields = list(table_meta.schema_.fields)
        good, errors = validate_rows(rows, fields, ignore_unknown=bool(body.get("ignoreUnknownValues")))

        table_key = f"{project_id}:{dataset_id}.{table_id}"
        to_store = recent_ids.drop_duplicates(table_key, good) if skip_invalid or not errors else []
        if to_store:
            arrow_table, bad = to_arrow(to_store, fields)
            errors.update(bad)
            if arrow_table is not None and (skip_invalid or not bad):
                await append(ctx, table_meta, arrow_table)
                recent_ids.remember(table_key, [r for r in to_store if r.index not in bad])

        response: dict[str, Any] = {"kind": "bigquery#tableDataInsertAllResponse"}
        insert_errors = build_insert_errors(len(rows), errors, skip_invalid_rows=skip_invalid)
        if insert_errors:
            response["insertErrors"] = insert_errors
        return response

    # FastAPI finds the AppContext dependency through this annotation. It is
    # set here rather than in the signature because it is only known at run time.
    insert_all.__annotations__["ctx"] = ctx_annotation
    # create_app() copies router.routes when the server is built, so swapping
    # the route in the router now is enough.
    prefix = router.prefix or ""
    path = original_route.path.removeprefix(prefix)
    position = router.routes.index(original_route)
    router.add_api_route(path, insert_all, methods=["POST"], name=original_route.name)
    router.routes[position] = router.routes.pop()
    return [f"{_dotted(tabledata)}.insert_all (route POST {original_route.path} replaced)"]


# =============================================================================
# Gap 3: schema changes reach the DuckDB storage (and back)
# =============================================================================


def _field_path_changes(old: Sequence[Any], new: Sequence[Any], prefix: str = "") -> str | None:
    """Describe the first schema change BigQuery would refuse, or give ``None``.

    Allowed: new NULLABLE/REPEATED fields (also inside RECORDs), and
    REQUIRED to NULLABLE. Refused: dropping fields, changing types, tightening
    modes, and new REQUIRED fields.
    """
    new_by_name = {f.name.lower(): f for f in new}
    for old_field in old:
        path = f"{prefix}{old_field.name}"
        new_field = new_by_name.get(old_field.name.lower())
        if new_field is None:
            return f"Field {path} is missing in new schema"
        old_type, new_type = _canonical_type(old_field.type), _canonical_type(new_field.type)
        if old_type != new_type:
            return f"Field {path} has changed type from {old_type} to {new_type}"
        old_mode, new_mode = _mode(old_field), _mode(new_field)
        if old_mode != new_mode and not (old_mode == "REQUIRED" and new_mode == "NULLABLE"):
            return f"Field {path} has changed mode from {old_mode} to {new_mode}"
        if old_type == "RECORD":
            nested = _field_path_changes(old_field.fields, new_field.fields, f"{path}.")
            if nested:
                return nested
    old_names = {f.name.lower() for f in old}
    for new_field in new:
        if new_field.name.lower() not in old_names and _mode(new_field) == "REQUIRED":
            return f"Cannot add required fields to an existing schema. (field: {prefix}{new_field.name})"
    return None


def patch_schema_update_validation() -> list[str]:
    """Gap 3, part 1: refuse the schema changes BigQuery refuses in tables.patch/update.

    bqemulator accepts any new schema as metadata. The storage reconciliation
    in ``patch_schema_update_storage`` can only add and relax columns, so
    anything else (dropped columns, changed types) would leave metadata and
    storage out of step. BigQuery answers 400 "Provided Schema does not match
    Table", and so does this patch.
    """
    tables = _module("bqemulator.api.routes.tables")
    errors_mod = _module("bqemulator.domain.errors")
    # patch_table / update_table look this helper up at call time; insert_table passes existing=None.
    original = _require(tables, "_rest_to_table_meta")
    validation_error = _require(errors_mod, "ValidationError")

    def _rest_to_table_meta(
        project_id: str, dataset_id: str, body: dict[str, Any], clock: Any, existing: Any = None
    ) -> Any:
        updated = original(project_id, dataset_id, body, clock, existing)
        if existing is not None and existing.table_type == "TABLE" and existing.schema_.fields:
            problem = _field_path_changes(existing.schema_.fields, updated.schema_.fields)
            if problem:
                ref = f"{project_id}:{dataset_id}.{existing.table_id}"
                raise validation_error(f"Provided Schema does not match Table {ref}. {problem}")
        return updated

    return [_replace(tables, "_rest_to_table_meta", _rest_to_table_meta)]


def _needs_nested_widening(field: Any, storage_type: Any) -> bool:
    """True when ``field`` (a RECORD, maybe REPEATED) has subfields the stored column lacks."""
    import pyarrow as pa  # bqemulator dependency

    if _mode(field) == "REPEATED":
        if not (pa.types.is_list(storage_type) or pa.types.is_large_list(storage_type)):
            return False
        storage_type = storage_type.value_type
    if _canonical_type(field.type) != "RECORD" or not pa.types.is_struct(storage_type):
        return False
    stored = {
        storage_type.field(i).name.lower(): storage_type.field(i).type for i in range(storage_type.num_fields)
    }
    for sub in field.fields:
        sub_type = stored.get(sub.name.lower())
        if sub_type is None or _needs_nested_widening(sub, sub_type):
            return True
    return False


def patch_schema_update_storage() -> list[str]:
    """Gap 3, part 2: make the DuckDB table follow a schema change in the catalog.

    ``tables.patch`` / ``tables.update`` only rewrite the catalog entry. The
    DuckDB table keeps its old columns, so the next insert that uses a new
    column fails with HTTP 500. Every write of a table's metadata goes through
    ``CatalogRepository.update_table``, which is wrapped here. When the schema
    changed, the stored table is brought up to date first:

    * a missing top-level column: ``ALTER TABLE ADD COLUMN`` (old rows read NULL,
      or [] for REPEATED);
    * new subfields inside a RECORD or REPEATED RECORD: ``ALTER COLUMN ... SET
      DATA TYPE``. DuckDB casts structs by field name, so old rows get NULLs;
    * REQUIRED to NULLABLE: ``DROP NOT NULL`` where the column has that constraint;
    * the ``__placeholder`` column of a table created without a schema is
      dropped once real columns exist.

    The step is idempotent: it compares with the stored table, not the old
    metadata, so paths that already altered storage (DDL) cost nothing.
    """
    import duckdb  # bqemulator dependency

    memory_mod = _module("bqemulator.catalog.memory_repository")
    duckdb_mod = _module("bqemulator.catalog.duckdb_repository")
    engine_cls = _require(_module("bqemulator.storage.engine"), "DuckDBEngine")
    _require(engine_cls, "fetch_arrow")
    tables = _module("bqemulator.api.routes.tables")
    sql_ids = _module("bqemulator.storage.sql_identifiers")
    type_map = _module("bqemulator.storage.type_map")
    field_to_rest = _require(tables, "_field_to_rest")
    quoted_table_ref = _require(sql_ids, "quoted_table_ref")
    _require(type_map, "bq_schema_to_duckdb_columns")
    classes = [
        _require(memory_mod, "MemoryCatalogRepository"),
        _require(duckdb_mod, "DuckDBCatalogRepository"),
    ]

    def reconcile(engine: Any, new: Any) -> None:
        target = quoted_table_ref(new.project_id, new.dataset_id, new.table_id)
        try:
            # Fetch the result in full: DuckDB refuses further work on the connection
            # while a result is left unfinished (a lazy reader would be).
            stored_schema = engine.fetch_arrow(f"SELECT * FROM {target} LIMIT 0").schema
            notnull = {
                row[1].lower(): bool(row[3])
                for row in engine.execute(f"PRAGMA table_info({target})").fetchall()
            }
        except duckdb.CatalogException:  # no physical table (a view, or not created yet)
            return
        stored = {
            stored_schema.field(i).name.lower(): stored_schema.field(i).type
            for i in range(len(stored_schema))
        }
        # Look the function up at call time, so the keyword-quoting patch applies.
        columns = type_map.bq_schema_to_duckdb_columns([field_to_rest(f) for f in new.schema_.fields])
        statements: list[str] = []
        for field, (name, duck_type) in zip(new.schema_.fields, columns, strict=True):
            column = _quote_ident(name)
            stored_type = stored.get(name.lower())
            if stored_type is None:
                statements.append(f"ALTER TABLE {target} ADD COLUMN {column} {duck_type}")
                continue
            if _needs_nested_widening(field, stored_type):
                statements.append(f"ALTER TABLE {target} ALTER COLUMN {column} SET DATA TYPE {duck_type}")
            if _mode(field) != "REQUIRED" and notnull.get(name.lower()):
                statements.append(f"ALTER TABLE {target} ALTER COLUMN {column} DROP NOT NULL")
        wanted = {f.name.lower() for f in new.schema_.fields}
        if "__placeholder" in stored and "__placeholder" not in wanted and new.schema_.fields:
            statements.append(f'ALTER TABLE {target} DROP COLUMN "__placeholder"')
        for statement in statements:
            LOG.info(
                "schema change on %s:%s.%s -> %s", new.project_id, new.dataset_id, new.table_id, statement
            )
            engine.execute(statement)

    patched: list[str] = []
    for cls in classes:
        original = _require(cls, "update_table")

        def update_table(self: Any, table: Any, _original: Callable[..., Any] = original) -> Any:
            # The DuckDB repository also calls the update_table of its in-memory
            # cache. The cache has no engine, so storage is reconciled once.
            engine = getattr(self, "_engine", None)
            if engine is not None and table.table_type == "TABLE":
                old = self.get_table(table.project_id, table.dataset_id, table.table_id)
                if old is not None and old.schema_ != table.schema_:
                    reconcile(engine, table)
            return _original(self, table)

        patched.append(_replace(cls, "update_table", update_table))
    return patched


def patch_ddl_alter_table_sync() -> list[str]:
    """Gap 3, part 3: ``ALTER TABLE`` run as a query also updates the table's metadata.

    The query path runs ``ALTER TABLE ADD/DROP/RENAME COLUMN`` in DuckDB but
    only syncs CREATE/DROP into the catalog, so ``get_table`` and insertAll
    validation still see the old schema. After each statement the executor and
    the script interpreter call ``ddl_sync.sync_dropped_object``. The wrapper
    runs it and then, for ALTER TABLE, rebuilds the schema from the stored
    columns. Existing fields keep their metadata (mode, description). Added
    columns take their type from the DDL where bqemulator can map it, and
    otherwise from DuckDB introspection.
    """
    import sqlglot  # bqemulator dependency
    from sqlglot import exp

    ddl_sync = _module("bqemulator.catalog.ddl_sync")
    ddl_result = _module("bqemulator.jobs.ddl_result")
    tables = _module("bqemulator.api.routes.tables")
    executor = _module("bqemulator.jobs.executor")
    interpreter = _module("bqemulator.scripting.interpreter")
    models = _module("bqemulator.catalog.models")
    original = _require(ddl_sync, "sync_dropped_object")
    unwrap_target = _require(ddl_sync, "_unwrap_table_target")
    split_target = _require(ddl_sync, "_split_target")
    introspect_schema = _require(ddl_sync, "_introspect_schema")
    field_from_column_def = _require(ddl_result, "_field_from_column_def")
    parse_schema_fields = _require(tables, "_parse_schema_fields")
    table_schema_cls = _require(models, "TableSchema")
    alter_cls = _require(exp, "Alter")

    def sync_altered_table(bq_sql: str, project_id: str, ctx: Any) -> None:
        try:
            tree = sqlglot.parse_one(bq_sql, read="bigquery")
        except Exception:  # noqa: BLE001 - not parseable, so not an ALTER we understand
            return
        if not isinstance(tree, alter_cls) or (tree.args.get("kind") or "").upper() != "TABLE":
            return
        target = unwrap_target(tree.this)
        if target is None:
            return
        p_id, d_id, t_id = split_target(target, project_id)
        meta = ctx.catalog.get_table(p_id, d_id, t_id) if d_id and t_id else None
        if meta is None or meta.table_type != "TABLE":
            return
        actions = tree.args.get("actions") or []
        declared: dict[str, Any] = {}
        relaxed: set[str] = set()
        for action in actions:
            if isinstance(action, exp.ColumnDef):
                rest = field_from_column_def(action)
                if rest is not None:
                    declared[action.name.lower()] = parse_schema_fields([rest])[0]
            elif isinstance(action, exp.AlterColumn) and "DROP NOT NULL" in action.sql("bigquery").upper():
                relaxed.add(action.name.lower())
        stored_fields = introspect_schema(p_id, d_id, t_id, ctx).fields
        existing = {f.name.lower(): f for f in meta.schema_.fields}
        merged = []
        for stored_field in stored_fields:
            key = stored_field.name.lower()
            if key == "__placeholder" and key not in existing:
                continue
            field = existing.get(key) or declared.get(key) or stored_field
            if key in relaxed and _mode(field) == "REQUIRED":
                field = field.model_copy(update={"mode": "NULLABLE"})
            merged.append(field)
        new_schema = table_schema_cls(fields=tuple(merged))
        if new_schema != meta.schema_:
            ctx.catalog.update_table(
                meta.model_copy(update={"schema_": new_schema, "last_modified_time": ctx.clock.now()})
            )

    def sync_dropped_object(bq_sql: str, project_id: str, ctx: Any) -> None:
        original(bq_sql, project_id, ctx)
        sync_altered_table(bq_sql, project_id, ctx)

    sync_dropped_object.__doc__ = original.__doc__
    # The executor and the interpreter imported the name, so it is rebound in each.
    return [
        _replace(module, "sync_dropped_object", sync_dropped_object)
        for module in (ddl_sync, executor, interpreter)
    ]


# =============================================================================
# Gap 4: multipart upload media part
# =============================================================================


def patch_multipart_media_part() -> list[str]:
    """Gap 4: accept a multipart upload's data part whatever its Content-Type.

    google-cloud-bigquery sends the data part of a multipart load (files under
    5 MB, including every ``load_table_from_json``) as ``Content-Type: */*``.
    bqemulator's allowlist rejects that. The load configuration's
    ``sourceFormat`` says how to read the bytes anyway, so the part's declared
    type carries no information worth refusing over.
    """
    upload = _module("bqemulator.api.routes.upload")
    # _parse_multipart_related looks _parse_media_part up at call time.
    _require(upload, "_parse_multipart_related")

    def _parse_media_part(part: Any) -> bytes:
        payload = part.get_payload(decode=True)
        if payload is None:
            payload = part.get_payload()
            payload = payload.encode("utf-8") if isinstance(payload, str) else b""
        return bytes(payload)

    return [_replace(upload, "_parse_media_part", _parse_media_part)]


# =============================================================================
# Gaps 5 and 6: the Storage Write API (AppendRows)
# =============================================================================


def patch_storage_write_nested_schema() -> list[str]:
    """Gap 5: Storage Write into a table with RECORD columns.

    ``write_servicer._table_arrow_schema`` projects the table schema onto
    name, type and mode only, so a RECORD column becomes an Arrow struct with
    no fields, and the INSERT fails with "Type STRUCT does not match with
    STRUCT(...)". The replacement keeps the subfields, through the same
    projection the insertAll route uses.
    """
    write_servicer = _module("bqemulator.grpc_api.write_servicer")
    tabledata = _module("bqemulator.api.routes.tabledata")
    build_arrow_schema = _require(tabledata, "_build_arrow_schema")
    fields_raw_from_schema = _require(tabledata, "_fields_raw_from_schema")

    def _table_arrow_schema(table_meta: Any) -> Any:
        return build_arrow_schema(fields_raw_from_schema(table_meta.schema_.fields))

    # The servicer looks the name up at call time, when a stream is bound.
    return [_replace(write_servicer, "_table_arrow_schema", _table_arrow_schema)]


def patch_append_rows_remembers_stream() -> list[str]:
    """Gap 6: later requests of an AppendRows connection may omit the stream name.

    BigQuery binds an AppendRows connection to the stream named by its first
    request; later requests may leave ``write_stream`` (and the writer
    schema) out, and the official ``AppendRowsStream`` helper does. bqemulator
    re-resolves the name on every request, so the empty name of the second
    one answers NOT_FOUND "Stream not found" and closes the connection. The
    wrapper keeps the bound stream when the name is empty, and answers
    INVALID_ARGUMENT, as BigQuery does, when the first request has none.
    """
    import grpc  # bqemulator dependency

    write_servicer = _module("bqemulator.grpc_api.write_servicer")
    handler_cls = _require(write_servicer, "BigQueryWriteHandler")
    original = _require(handler_cls, "_ensure_stream_bound")

    def _ensure_stream_bound(self: Any, stream_name: str, bound_ctx: Any, context: Any) -> Any:
        if not stream_name:
            if bound_ctx is not None:
                return bound_ctx
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details("The first AppendRowsRequest of a connection must set write_stream")
            return None
        return original(self, stream_name, bound_ctx, context)

    return [_replace(handler_cls, "_ensure_stream_bound", _ensure_stream_bound)]


# BigQuery's ranges, as the Storage Write API's integer encodings.
_TS_MIN_MICROS = int(_TS_MIN_SECONDS) * 1_000_000
_TS_MAX_MICROS = int(_TS_MAX_SECONDS * 1_000_000)
_DATE_MIN_DAYS = (date(1, 1, 1) - date(1970, 1, 1)).days
_DATE_MAX_DAYS = (date(9999, 12, 31) - date(1970, 1, 1)).days


def _arrow_bq_type(arrow_field: Any) -> str:
    raw = (arrow_field.metadata or {}).get(b"bq_type", b"")
    return _canonical_type(raw.decode("ascii") if isinstance(raw, bytes) else str(raw))


# What a decoded Storage Write value is checked and turned into, per column: None = taken as it is.
_StorageValueFn = Callable[[Any, str], Any]


def _in_range(low: int, high: int, what: str, parse_text: Callable[[Any, str], Any]) -> _StorageValueFn:
    """Integer encodings (TIMESTAMP micros, DATE days) checked against BigQuery's range; text parsed."""

    def check(value: Any, loc: str) -> Any:
        if isinstance(value, str):
            return parse_text(value, loc)
        if not low <= value <= high:
            raise _Invalid(loc, f"{what} field value is out of range: {value}")
        return value

    return check


def _storage_value_fn(arrow_field: Any, arrow_type: Any) -> _StorageValueFn | None:
    """Compile the check of one column's values (``arrow_type``: its type, or a list's element type).

    Storage Write values arrive decoded from protobuf, so they are already
    Python ints, floats, strings, bytes, dicts and lists that pyarrow takes as
    they are. Only BigQuery's ranges, REQUIRED, and the text forms of typed
    columns need a look; everything else passes untouched, which keeps a
    20k-row append fast.
    """
    import pyarrow as pa  # bqemulator dependency

    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = _storage_value_fn(arrow_type.value_field, arrow_type.value_type)
        if inner is None:
            return None
        return lambda value, loc: [inner(e, f"{loc}[{i}]") for i, e in enumerate(value)]
    if pa.types.is_struct(arrow_type):
        record = _storage_row_fn([arrow_type.field(i) for i in range(arrow_type.num_fields)])
        if record is None:
            return None
        return lambda value, loc: record(value, f"{loc}.")
    bq_type = _arrow_bq_type(arrow_field)
    if bq_type == "TIMESTAMP":
        return _in_range(_TS_MIN_MICROS, _TS_MAX_MICROS, "Timestamp", _coerce_timestamp)
    if bq_type == "DATE":
        return _in_range(_DATE_MIN_DAYS, _DATE_MAX_DAYS, "Date", _coerce_date)
    if bq_type in ("DATETIME", "TIME", "NUMERIC", "BIGNUMERIC", "JSON"):
        parse = _SCALAR_COERCERS[bq_type]
        return lambda value, loc: parse(value, loc) if isinstance(value, str) else value
    return None


def _storage_row_fn(arrow_fields: Sequence[Any]) -> Callable[[dict[str, Any], str], dict[str, Any]] | None:
    steps = [(f.name, f.nullable, _storage_value_fn(f, f.type)) for f in arrow_fields]
    if all(nullable and fn is None for _, nullable, fn in steps):
        return None

    def check(row: dict[str, Any], prefix: str) -> dict[str, Any]:
        for name, nullable, fn in steps:
            value = row.get(name)
            if value is None:
                if not nullable:
                    raise _Invalid(f"{prefix}{name}", f"Missing required field: {prefix}{name}.")
            elif fn is not None:
                row[name] = fn(value, f"{prefix}{name}")
        return row

    return check


class _StorageRowErrors(ValueError):
    """Rows of one AppendRows request that BigQuery would reject: request index → message."""

    def __init__(self, errors: dict[int, str]) -> None:
        super().__init__(f"{len(errors)} row(s) rejected")
        self.errors = errors


def patch_append_rows_row_errors(*, snapshot_each_append: bool) -> list[str]:
    """Extra: Storage Write reports bad rows in ``row_errors``, as BigQuery does.

    bqemulator converts a whole AppendRows request at once: a row it cannot
    convert fails the request with a bare INVALID_ARGUMENT that names no row,
    and values BigQuery refuses (a TIMESTAMP past year 9999, a missing
    REQUIRED field, text that is no JSON) are stored without a word. BigQuery
    checks every row, and when any is bad appends nothing and answers
    INVALID_ARGUMENT with one ``row_errors`` entry (index, FIELDS_ERROR,
    message) per bad row, so a writer can send the other rows again.

    ``proto_rows_to_arrow_table`` is replaced by a per-row checking version and
    ``_handle_append_rows`` by bqemulator's own loop that turns those errors
    into such a response. Appends also insert BY NAME (after gap 3's ADD
    COLUMN the stored column order can differ from the schema's), and, like
    the insertAll patch, skip the whole-table time-travel copy after every
    append unless ``snapshot_each_append`` is set.
    """
    import grpc  # bqemulator dependency
    import pyarrow as pa  # bqemulator dependency

    write_servicer = _module("bqemulator.grpc_api.write_servicer")
    arrow_bridge = _module("bqemulator.storage.arrow_bridge")
    sql_ids = _module("bqemulator.storage.sql_identifiers")
    events_mod = _module("bqemulator.domain.events")
    handler_cls = _require(write_servicer, "BigQueryWriteHandler")
    _require(handler_cls, "_handle_append_rows")
    _require(handler_cls, "_flush_to_target")
    _require(write_servicer, "proto_rows_to_arrow_table")
    rows_for_request = _require(write_servicer, "_rows_for_request")
    oversize_error_response = _require(write_servicer, "_oversize_error_response")
    error_response = _require(write_servicer, "_error_response")
    has_offset = _require(write_servicer, "_has_offset")
    coerce = _require(arrow_bridge, "_coerce_to_arrow_value")
    quoted_table_ref = _require(sql_ids, "quoted_table_ref")
    register_name = _require(sql_ids, "register_name")
    table_data_changed = _require(events_mod, "TableDataChanged")

    checks: dict[Any, Any] = {}  # target schema → its compiled row check (one per table version)

    def proto_rows_to_arrow_table(decoder: Any, serialized_rows: list[bytes], target_schema: Any) -> Any:
        if target_schema not in checks:
            # GEOGRAPHY and INTERVAL go through bqemulator's own converter, as before.
            special = [f for f in target_schema if _arrow_bq_type(f) in ("GEOGRAPHY", "INTERVAL")]
            checks[target_schema] = (_storage_row_fn(list(target_schema)), special)
        check, special = checks[target_schema]
        good: list[dict[str, Any]] = []
        errors: dict[int, str] = {}
        for index, raw in enumerate(serialized_rows):
            try:
                row = decoder.decode(raw)
                if check is not None:
                    check(row, "")
                for f in special:
                    row[f.name] = coerce(row.get(f.name), f.type, field=f)
                good.append(row)
            except _Invalid as exc:
                text, loc = exc.error.message, exc.error.location
                # Name the field unless the message already ends with it.
                errors[index] = text if not loc or text.endswith(f"{loc}.") else f"{text} on field {loc}."
            except Exception as exc:  # noqa: BLE001 - undecodable bytes, values pyarrow refuses
                errors[index] = f"Cannot convert the row: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        if not errors:
            try:
                return pa.Table.from_pylist(good, schema=target_schema)
            except Exception:  # noqa: BLE001 - find the rows pyarrow cannot take
                for index, row in enumerate(good):
                    try:
                        pa.Table.from_pylist([row], schema=target_schema)
                    except Exception as exc:  # noqa: BLE001
                        errors[index] = f"Cannot convert the row: {str(exc).splitlines()[0]}"
                if not errors:
                    raise
        raise _StorageRowErrors(errors)

    def row_errors_response(stream_name: str, errors: dict[int, str]) -> bytes:
        from google.cloud.bigquery_storage_v1 import types
        from google.rpc import status_pb2

        response = types.AppendRowsResponse(
            write_stream=stream_name,
            error=status_pb2.Status(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                message="Errors found while processing rows. Please refer to the row_errors field for details. "
                f"The list may not be complete because of the size limitations. Entity: {stream_name}",
            ),
            row_errors=[
                types.RowError(index=index, code=types.RowError.RowErrorCode.FIELDS_ERROR, message=message)
                for index, message in sorted(errors.items())
            ],
        )
        return types.AppendRowsResponse.serialize(response)

    def _handle_append_rows(self: Any, request_iterator: Any, context: Any) -> Any:
        # bqemulator's loop, with row errors answered as such.
        from google.cloud.bigquery_storage_v1 import types

        bound_ctx = None
        proto_decoder = None
        arrow_schema_bytes = None
        max_request_bytes = self._ctx.settings.write_api_max_request_bytes
        max_buffered_rows = self._ctx.settings.write_api_max_stream_rows
        for request_bytes in request_iterator:
            if len(request_bytes) > max_request_bytes:
                yield oversize_error_response(
                    request_bytes_len=len(request_bytes), max_bytes=max_request_bytes, bound_ctx=bound_ctx
                )
                continue
            request = types.AppendRowsRequest.deserialize(request_bytes)
            bound_ctx = self._ensure_stream_bound(request.write_stream, bound_ctx, context)
            if bound_ctx is None:
                return
            bound_stream, target_schema = bound_ctx
            try:
                rows_table, proto_decoder, arrow_schema_bytes = rows_for_request(
                    request, proto_decoder, arrow_schema_bytes, target_schema
                )
            except _StorageRowErrors as exc:
                yield row_errors_response(bound_stream.name, exc.errors)
                continue
            except ValueError as exc:
                yield error_response(bound_stream.name, str(exc))
                continue
            offset = int(request.offset) if has_offset(request) else None
            yield self._perform_append(bound_stream, rows_table, offset, max_buffered_rows)

    def _flush_to_target(self: Any, stream: Any, rows: Any) -> None:
        target_ref = quoted_table_ref(stream.project_id, stream.dataset_id, stream.table_id)
        reg = register_name(f"__bqemu_write_{uuid.uuid4().hex[:12]}")
        with self._write_lock:
            self._ctx.engine.connection.register(reg, rows)
            try:
                self._ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT * FROM {reg}")
            finally:
                self._ctx.engine.connection.unregister(reg)
            meta = self._ctx.catalog.get_table(stream.project_id, stream.dataset_id, stream.table_id)
            if meta is not None:
                self._ctx.catalog.update_table(meta.model_copy(update={"num_rows": meta.num_rows + rows.num_rows}))
            if snapshot_each_append:
                self._ctx.snapshots.record_change(stream.project_id, stream.dataset_id, stream.table_id)
            else:
                self._ctx.events.publish(table_data_changed(stream.project_id, stream.dataset_id, stream.table_id))

    return [
        _replace(write_servicer, "proto_rows_to_arrow_table", proto_rows_to_arrow_table),
        _replace(handler_cls, "_handle_append_rows", _handle_append_rows),
        _replace(handler_cls, "_flush_to_target", _flush_to_target),
    ]


# =============================================================================
# Extras
# =============================================================================


class _SettlingConnection:
    """The engine's DuckDB connection, with ``register`` made safe after an abandoned result.

    DuckDB 2.0 refuses ``register`` while the connection holds a result that was
    not fetched to the end, and bqemulator leaves such results behind: every
    ``engine.execute(...).fetchone()`` (``tabledata.list``'s row count, among
    others) stops one fetch short. Every DuckDB call runs synchronously on the
    server's one event loop, so a result still pending when ``register`` is
    called belongs to a request step that has already finished; aborting it
    loses nothing. Everything else is passed through unchanged.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def register(self, name: str, obj: Any) -> Any:
        self._conn.abort()
        return self._conn.register(name, obj)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._conn, attr)


def patch_settle_abandoned_results() -> list[str]:
    """Extra: insertAll, load jobs and Storage Write register Arrow data on the shared
    connection; after a ``tabledata.list`` (or any ``fetchone``) that failed with
    "connection has an unfinished result" (HTTP 500, retried by clients for minutes).
    """
    engine_mod = _module("bqemulator.storage.engine")
    engine_cls = _require(engine_mod, "DuckDBEngine")
    original = _require(engine_cls, "connection")
    if not isinstance(original, property) or original.fget is None:
        raise PatchTargetMissingError(f"{_dotted(engine_cls)}.connection is no longer a property")
    raw = original.fget

    def connection(self: Any) -> Any:
        return _SettlingConnection(raw(self))

    return [_replace(engine_cls, "connection", property(connection, doc=original.__doc__))]


def patch_quote_nested_field_names() -> list[str]:
    """Extra: quote RECORD subfield names in generated DuckDB DDL.

    ``type_map.bq_schema_to_duckdb_columns`` quotes nothing inside
    ``STRUCT(...)``, so a subfield named like a SQL keyword (``inner``,
    ``order``, ``end``) breaks CREATE TABLE. Callers quote the top-level
    names themselves, so only the nested ones are quoted here. Other fields go
    to the original function.
    """
    type_map = _module("bqemulator.storage.type_map")
    tables = _module("bqemulator.api.routes.tables")
    original = _require(type_map, "bq_schema_to_duckdb_columns")

    def bq_schema_to_duckdb_columns(fields: list[dict[str, Any]]) -> list[tuple[str, str]]:
        columns: list[tuple[str, str]] = []
        for field in fields:
            if str(field.get("type", "")).upper() not in _RECORD_TYPES:
                columns.extend(original([field]))
                continue
            inner = bq_schema_to_duckdb_columns(field.get("fields", []))
            duck_type = "STRUCT(" + ", ".join(f"{_quote_ident(n)} {t}" for n, t in inner) + ")"
            if str(field.get("mode", "NULLABLE")).upper() == "REPEATED":
                duck_type += "[]"
            columns.append((field["name"], duck_type))
        return columns

    bq_schema_to_duckdb_columns.__doc__ = original.__doc__
    # The load executor imports the name from type_map at call time. The tables
    # route imported it at module level, so it is rebound there too.
    return [
        _replace(type_map, "bq_schema_to_duckdb_columns", bq_schema_to_duckdb_columns),
        _replace(tables, "bq_schema_to_duckdb_columns", bq_schema_to_duckdb_columns),
    ]


def patch_load_job_partitioning() -> list[str]:
    """Extra: a load job that creates its destination keeps timePartitioning/clustering.

    ``executor._maybe_create_load_destination`` builds the new table's metadata
    from the schema alone, so ``get_table`` afterwards shows no partitioning.
    The wrapper copies the load configuration's ``timePartitioning`` and
    ``clustering`` onto the new table, parsed by the ``tables`` route's own helpers.
    """
    executor = _module("bqemulator.jobs.executor")
    tables = _module("bqemulator.api.routes.tables")
    original = _require(executor, "_maybe_create_load_destination")
    to_partitioning = _require(tables, "_rest_to_time_partitioning")
    to_clustering = _require(tables, "_rest_to_clustering")

    def _maybe_create_load_destination(
        *,
        dest_project: str,
        dest_dataset: str,
        dest_table_id: str,
        load_config: dict[str, Any],
        now: Any,
        ctx: Any,
    ) -> None:
        existed = ctx.catalog.get_table(dest_project, dest_dataset, dest_table_id) is not None
        original(
            dest_project=dest_project,
            dest_dataset=dest_dataset,
            dest_table_id=dest_table_id,
            load_config=load_config,
            now=now,
            ctx=ctx,
        )
        meta = ctx.catalog.get_table(dest_project, dest_dataset, dest_table_id)
        if existed or meta is None:
            return
        update: dict[str, Any] = {}
        if load_config.get("timePartitioning") and meta.time_partitioning is None:
            update["time_partitioning"] = to_partitioning(load_config["timePartitioning"], None)
        if load_config.get("clustering") and meta.clustering is None:
            update["clustering"] = to_clustering(load_config["clustering"], None)
        if update:
            ctx.catalog.update_table(meta.model_copy(update=update))

    return [_replace(executor, "_maybe_create_load_destination", _maybe_create_load_destination)]


def patch_upload_job_id() -> list[str]:
    """Extra: a load job uploaded from a file keeps the client's job id; a taken id answers 409.

    bqemulator names every uploaded load job ``bqemu_<random>`` and drops the
    ``jobReference`` the client sent, so a load retried under the same id runs
    again. BigQuery keeps the id and answers ``409 duplicate`` when it is taken,
    which is what makes a replayed file load idempotent. The envelope's job id
    is carried inside the upload session's configuration under a private key
    until the load runs.
    """
    upload = _module("bqemulator.api.routes.upload")
    errors = _module("bqemulator.domain.errors")
    original_envelope = _require(upload, "_load_configuration_from_envelope")
    original_run = _require(upload, "_run_load")
    original_new_id = _require(upload, "_new_job_id")
    already_exists = _require(errors, "AlreadyExistsError")
    key = "_firehoseJobId"
    wanted: list[str] = []  # the id _run_load is about to take; the event loop runs one load at a time

    def _load_configuration_from_envelope(envelope: dict[str, Any]) -> dict[str, Any]:
        configuration = original_envelope(envelope)
        job_id = (envelope.get("jobReference") or {}).get("jobId")
        return {**configuration, key: job_id} if job_id else configuration

    def _new_job_id() -> str:
        return wanted.pop() if wanted else original_new_id()

    async def _run_load(*, project_id: str, configuration: dict[str, Any], media_path: str, ctx: Any) -> Any:
        configuration = dict(configuration)
        job_id = configuration.pop(key, None)
        if job_id:
            if ctx.catalog.get_job(project_id, job_id) is not None:
                raise already_exists(f"Already Exists: Job {project_id}:US.{job_id}")
            wanted[:] = [job_id]  # taken by _new_job_id before _run_load's first await
        try:
            return await original_run(project_id=project_id, configuration=configuration,
                                      media_path=media_path, ctx=ctx)
        finally:
            wanted.clear()

    return [
        _replace(upload, "_load_configuration_from_envelope", _load_configuration_from_envelope),
        _replace(upload, "_new_job_id", _new_job_id),
        _replace(upload, "_run_load", _run_load),
    ]


def _base64_decoding(arrow_type: Any, expr: str, depth: int = 0) -> str | None:
    """A DuckDB expression that decodes every BYTES value inside ``expr`` from base64; None if none."""
    pa = _module("pyarrow")
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return f"from_base64({expr})"
    if pa.types.is_struct(arrow_type):
        parts = [(f, _base64_decoding(f.type, f"{expr}.{_quote_ident(f.name)}", depth))
                 for f in arrow_type]
        if all(decoded is None for _, decoded in parts):
            return None
        packed = ", ".join(f"{_quote_ident(f.name)} := {decoded or f'{expr}.{_quote_ident(f.name)}'}"
                           for f, decoded in parts)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE struct_pack({packed}) END"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        var = f"x{depth}"
        inner = _base64_decoding(arrow_type.value_type, var, depth + 1)
        return None if inner is None else f"list_transform({expr}, lambda {var}: {inner})"
    return None


def patch_json_load_bytes() -> list[str]:
    """Extra: a newline-delimited JSON load decodes BYTES values from base64.

    BigQuery reads a BYTES value in a JSON load as base64 text. bqemulator's
    ``COPY ... (FORMAT JSON)`` stores the text's own bytes instead. For a table
    with BYTES columns (at any depth), the rows are read as text and every BYTES
    value goes through ``from_base64``; other tables load as before.
    """
    executor = _module("bqemulator.jobs.executor")
    handlers = _require(executor, "_LOAD_FORMAT_HANDLERS")
    original = _require(executor, "_load_json")
    if handlers.get("NEWLINE_DELIMITED_JSON") is not original:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS no longer maps JSON to _load_json")

    def _load_json(path: str, target_ref: str, ctx: Any) -> None:
        schema = ctx.engine.fetch_arrow(f"SELECT * FROM {target_ref} LIMIT 0").schema
        decoded = [_base64_decoding(f.type, _quote_ident(f.name)) for f in schema]
        if all(d is None for d in decoded):
            original(path, target_ref, ctx)
            return
        # Read BLOBs as the text they are in the file: DuckDB's type names with BLOB → VARCHAR.
        described = ctx.engine.execute(f"DESCRIBE {target_ref}").fetchall()
        columns = {row[0]: re.sub(r"\bBLOB\b", "VARCHAR", row[1]) for row in described}
        select = ", ".join(d or _quote_ident(f.name) for f, d in zip(schema, decoded, strict=True))
        ctx.engine.execute(
            f"INSERT INTO {target_ref} SELECT {select} FROM read_json(?, columns=?, format='newline_delimited')",
            [path, columns],
        )

    for name in [name for name, handler in handlers.items() if handler is original]:
        handlers[name] = _load_json  # "JSON" is an alias of NEWLINE_DELIMITED_JSON
    return [_replace(executor, "_load_json", _load_json) + " (+ _LOAD_FORMAT_HANDLERS)"]


def patch_parquet_load_by_name() -> list[str]:
    """Extra: a Parquet load matches the file's columns to the table's by name.

    bqemulator loads Parquet with ``INSERT INTO t SELECT * FROM read_parquet(?)``,
    which pairs columns by position: a table with a column the file lacks
    fails ("table has 11 columns but 10 values were supplied"), and a file
    whose columns come in another order fills the wrong columns or fails a
    cast. BigQuery matches Parquet columns to the table's by name
    (case-insensitively, as DuckDB's ``BY NAME`` does) and leaves the table's
    other columns NULL. Nested RECORD fields were already matched by name.
    """
    executor = _module("bqemulator.jobs.executor")
    handlers = _require(executor, "_LOAD_FORMAT_HANDLERS")
    original = _require(executor, "_load_parquet")
    if handlers.get("PARQUET") is not original:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS no longer maps PARQUET to "
                                      "_load_parquet")

    def _load_parquet(path: str, target_ref: str, ctx: Any) -> None:
        ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT * FROM read_parquet(?)", [path])

    handlers["PARQUET"] = _load_parquet
    return [_replace(executor, "_load_parquet", _load_parquet) + " (+ _LOAD_FORMAT_HANDLERS)"]


# =============================================================================
# Entry point
# =============================================================================


def apply_patches(args: argparse.Namespace) -> None:
    patches: list[tuple[str, Callable[[], list[str]]]] = [
        (
            "gap1 optional DuckDB extensions",
            lambda: patch_optional_duckdb_extensions(allow_download=args.allow_extension_download),
        ),
        (
            "gap2 insertAll validation + insertErrors + insertId dedup",
            lambda: patch_insert_all(
                insert_id_ttl_seconds=args.insert_id_ttl, snapshot_each_insert=args.insert_all_snapshots
            ),
        ),
        ("gap3 schema-change validation", patch_schema_update_validation),
        ("gap3 schema change alters storage", patch_schema_update_storage),
        ("gap3 DDL ALTER TABLE syncs metadata", patch_ddl_alter_table_sync),
        ("gap4 multipart media part of any Content-Type", patch_multipart_media_part),
        ("gap5 Storage Write into RECORD columns", patch_storage_write_nested_schema),
        ("gap6 AppendRows connection remembers its stream", patch_append_rows_remembers_stream),
        (
            "extra Storage Write row_errors, BY NAME appends",
            lambda: patch_append_rows_row_errors(snapshot_each_append=args.insert_all_snapshots),
        ),
        ("extra quote nested field names", patch_quote_nested_field_names),
        ("extra load job keeps partitioning", patch_load_job_partitioning),
        ("extra register after an abandoned result", patch_settle_abandoned_results),
        ("extra uploaded load job keeps its job id", patch_upload_job_id),
        ("extra JSON load decodes BYTES from base64", patch_json_load_bytes),
        ("extra Parquet load matches columns by name", patch_parquet_load_by_name),
    ]
    for label, apply in patches:
        targets = apply()
        LOG.info("patch applied: %s -> %s", label, ", ".join(targets))


def build_settings(args: argparse.Namespace) -> Any:
    config = _module("bqemulator.config")
    settings_cls = _require(config, "Settings")
    persistence = _require(config, "PersistenceMode")
    overrides: dict[str, Any] = {
        # REST and gRPC both bind to the host given, and nowhere else.
        "rest_host": args.host,
        "rest_port": args.port,
        "grpc_host": args.host,
        "grpc_port": args.grpc_port,
        "persistence_mode": persistence.PERSISTENT if args.data_dir else persistence.EPHEMERAL,
        "log_level": args.log_level,
    }
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.project:
        overrides["default_project_id"] = args.project
    return settings_cls(**overrides)


async def serve(settings: Any) -> None:
    """Run bqemulator's own ``EmulatorServer`` until SIGTERM or SIGINT."""
    server_mod = _module("bqemulator.server")
    server = _require(server_mod, "EmulatorServer")(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers go in before start() so that a signal during start-up still shuts down cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    await server.start()
    try:
        LOG.info(
            "bqemulator ready in %.2fs: rest=%s grpc=%s",
            time.monotonic() - started,
            server.rest_url,
            server.grpc_endpoint,
        )
        await stop.wait()
        LOG.info("signal received, stopping bqemulator")
    finally:
        await server.stop()
    LOG.info("bqemulator stopped")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address for REST and gRPC (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, required=True, help="REST port (0 = any free port)")
    parser.add_argument(
        "--grpc-port", type=int, required=True, help="gRPC (Storage API) port (0 = any free port)"
    )
    parser.add_argument("--data-dir", default=None, help="persist DuckDB state here; default is in-memory")
    parser.add_argument("--project", default=None, help="default project id for requests that omit it")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["trace", "debug", "info", "warning", "error", "critical"],
        help="bqemulator's own log level (default warning); the launcher logs at INFO",
    )
    parser.add_argument(
        "--insert-id-ttl",
        type=float,
        default=60.0,
        help="seconds an insertId is remembered for dedup (BigQuery: at least 60)",
    )
    parser.add_argument(
        "--insert-all-snapshots",
        action="store_true",
        help="copy the table into a time-travel snapshot after every insertAll and Storage Write append, "
        "as bqemulator does "
        "(costs memory and time that grow with the table)",
    )
    parser.add_argument(
        "--allow-extension-download",
        action="store_true",
        help="try to INSTALL missing DuckDB extensions (needs network)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A handler of our own: bqemulator's start() calls logging.basicConfig(force=True),
    # which would remove a root handler and set the root level to its own.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s bqemulator_launcher %(levelname)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    # bqemulator 1.4.0 fetches Arrow through DuckDB's DB-API cursor, and
    # DuckDB 2.x warns about it on every query. That is noise in a test log.
    warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)
    try:
        import bqemulator
    except ImportError as exc:
        LOG.error("bqemulator is not importable from %s: %s", sys.executable, exc)
        return EXIT_PATCH_TARGET_MISSING
    version = getattr(bqemulator, "__version__", "unknown")
    if version != TESTED_BQEMULATOR_VERSION:
        LOG.warning("bqemulator %s found, patches were written for %s", version, TESTED_BQEMULATOR_VERSION)
    try:
        settings = build_settings(args)
        # Set up bqemulator's structlog before the patches import its modules;
        # some of them log at import time.
        logging_mod = _module("bqemulator.observability.logging_")
        _require(logging_mod, "configure_logging")(level=settings.log_level, fmt=settings.log_format)
        apply_patches(args)
    except PatchTargetMissingError as exc:
        LOG.error("cannot patch bqemulator %s: %s", version, exc)
        return EXIT_PATCH_TARGET_MISSING
    try:
        asyncio.run(serve(settings))
    except Exception:
        LOG.exception("bqemulator failed")
        return EXIT_STARTUP_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
