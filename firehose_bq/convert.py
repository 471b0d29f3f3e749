"""Protobuf bytes → BigQuery rows, through Python code generated once per message descriptor.

Compilation walks the descriptor once and writes the source of one function per (message type, depth):
a single dict display that reads each field as an attribute and converts it inline, so converting a
message runs no descriptor reflection and almost no Python calls (see `_Compiler` for why it is source
text and how names from the descriptor are kept out of it).

Values follow BigQuery's JSON encoding used by insertAll: TIMESTAMP as RFC 3339, DATE as YYYY-MM-DD,
BYTES as base64, enums by name (an enum number the descriptor does not know is kept as its decimal
string, never dropped), maps as key/value records, wrappers as their value, and message fields at the
max depth as their proto JSON.

Proto3 scalars without presence are written with their value even when it is the default (0, "",
false): in proto3 an unset scalar *is* the default. Fields with presence (messages, `optional`,
oneof members) are NULL when unset.
"""

from __future__ import annotations

import binascii
import gc
import keyword
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from json.encoder import encode_basestring_ascii
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.registry.confluent import WireFormatError, parse_frame
from firehose_bq.schema import (KEY_COLUMN, UNSIGNED_64, Kind, MetadataColumns, SchemaOptions, column_name, field_kind,
                                is_map, scalar_field)

Row = dict[str, Any]
ValueFn = Callable[[Any], Any]

FD = FieldDescriptor
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE = date(1970, 1, 1)


def rfc3339(seconds: int, nanos: int = 0) -> str:
    """Timestamp as BigQuery's RFC 3339 text with microseconds (BigQuery keeps microseconds)."""
    moment = _EPOCH + timedelta(seconds=seconds)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{nanos // 1000:06d}Z"


def millis_to_rfc3339(millis: int) -> str:
    seconds, rest = divmod(millis, 1000)
    return rfc3339(seconds, rest * 1_000_000)


# Days whose date text a converter keeps: a batch's timestamps fall in few days; the bound keeps a
# converter that meets scattered timestamps small (~60 bytes a day).
TIMESTAMP_CACHE_DAYS = 4096
# "HH:MM:" of each minute of a day and "SS." of each second: formatting a datetime, or even an int with
# a format spec, costs far more than divmods and lookups.
_MINUTES_OF_DAY = tuple(f"{h:02d}:{m:02d}:" for h in range(24) for m in range(60))
_SECONDS_OF_MINUTE = tuple(f"{s:02d}." for s in range(60))


def _timestamp_text() -> Callable[[int, int], str]:
    """`rfc3339`, with each day's "YYYY-MM-DDT" cached. A closure, one per converter (not module-wide, so
    no state is shared), because calling a closure is cheaper than an object's __call__."""
    days: dict[int, str] = {}
    minutes, seconds_text = _MINUTES_OF_DAY, _SECONDS_OF_MINUTE

    def text(seconds: int, nanos: int = 0) -> str:
        day, second = divmod(seconds, 86400)
        head = days.get(day)
        if head is None:
            # The same datetime arithmetic and format as rfc3339, so out-of-range times raise the same errors.
            head = f"{_EPOCH + timedelta(seconds=seconds):%Y-%m-%dT}"
            if len(days) >= TIMESTAMP_CACHE_DAYS:
                days.clear()
            days[day] = head
        minute, second = divmod(second, 60)
        if 0 <= nanos < 1_000_000_000:  # a valid Timestamp: six digits without a format spec, which is slow
            return f"{head}{minutes[minute]}{seconds_text[second]}{str(1_000_000 + nanos // 1000)[1:]}Z"
        return f"{head}{minutes[minute]}{seconds_text[second]}{nanos // 1000:06d}Z"

    return text


def _float(value: float) -> float | str:
    # JSON has no NaN/Infinity; BigQuery reads these spellings for FLOAT.
    if math.isfinite(value):
        return value
    return _nonfinite(value)


def _nonfinite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _bytes(value: bytes) -> str:
    # What base64.b64encode does, without its Python-level wrapper.
    return binascii.b2a_base64(value, newline=False).decode("ascii")


class _EnumNames(dict[int, str]):
    """Enum number → name; a number the descriptor does not know is its decimal string."""

    def __missing__(self, number: int) -> str:
        return str(number)


def _json(msg: Message) -> str:
    # Proto field names, as in the columns around it (not JSON's lowerCamelCase).
    return json_format.MessageToJson(msg, indent=None, sort_keys=True, preserving_proto_field_name=True)


def _date(d: Message) -> str:
    try:
        return date(d.year, d.month, d.day).isoformat()
    except ValueError as exc:  # google.type.Date allows year-less or day-less dates; a DATE does not
        raise ValueError(f"google.type.Date {d.year}-{d.month}-{d.day} is not a valid DATE: {exc}") from None


def _days(d: Message) -> int:
    return (date.fromisoformat(_date(d)) - _EPOCH_DATE).days


def _micros(seconds: int, nanos: int = 0) -> int:
    return seconds * 1_000_000 + nanos // 1000


# The valid ranges of the well-known types (google/protobuf/timestamp.proto, duration.proto): a value
# outside them has no BigQuery form and fails its message, never normalized, clamped or wrapped.
TIMESTAMP_MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
TIMESTAMP_MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
DURATION_MAX_SECONDS = 315_576_000_000  # 10,000 years
NANOS_MAX = 999_999_999
INT64_MAX = 2**63 - 1


def _integer(value: int) -> int:
    return value if value <= INT64_MAX else _too_big(value)


def _bad_timestamp(ts: Message) -> Any:
    raise ValueError(f"Timestamp seconds={ts.seconds} nanos={ts.nanos} is outside 0001-01-01..9999-12-31 or its "
                     "nanos outside 0..999999999")


def _bad_duration(d: Message) -> Any:
    raise ValueError(f"Duration seconds={d.seconds} nanos={d.nanos} is outside +-315576000000 s, its nanos outside "
                     "+-999999999, or their signs differ")


def _too_big(value: int) -> Any:
    raise ValueError(f"{value} is past INTEGER's range (at most 2^63-1); set SINK_BIGQUERY_UINT64_COLUMN_TYPE="
                     "NUMERIC or STRING to keep such values")


@dataclass(frozen=True)
class ValueEncoding:
    """How values that have no native JSON form are written: insertAll and file loads want JSON text,
    the Storage Write API wants proto-native values (micros, days, raw bytes, IEEE floats)."""

    name: str
    timestamp: Callable[[int, int], Any]  # (seconds, nanos) →
    date: ValueFn  # google.type.Date →
    bytes: ValueFn
    float: ValueFn

    def millis(self, millis: int) -> Any:
        seconds, rest = divmod(millis, 1000)
        return self.timestamp(seconds, rest * 1_000_000)


JSON = ValueEncoding("json", rfc3339, _date, _bytes, _float)
STORAGE = ValueEncoding("storage", _micros, _days, lambda b: b, lambda f: f)
ENCODINGS = {e.name: e for e in (JSON, STORAGE)}


def _cached(enc: ValueEncoding) -> ValueEncoding:
    """`enc` for one converter: JSON's timestamps through a per-converter minute cache."""
    return replace(enc, timestamp=_timestamp_text()) if enc.timestamp is rfc3339 else enc


# google.protobuf.Struct/Value/ListValue → the text `_json` gives them (json.dumps with sort_keys, ASCII
# escapes, ", " and ": "), written directly: json_format first builds Python objects through its
# reflection-based printer, which cost more than all the other columns of a row together.

def _struct_text(struct: Message) -> str:
    try:
        return _struct_body(struct)
    except ValueError:  # NaN or ±Infinity: json_format raises its own error for these, in its own words
        return _json(struct)


def _value_text(value: Message) -> str:
    try:
        return _value_body(value)
    except ValueError:
        return _json(value)


def _list_text(values: Message) -> str:
    try:
        return _list_body(values)
    except ValueError:
        return _json(values)


def _struct_body(struct: Message) -> str:
    fields = struct.fields
    if not fields:
        return "{}"
    parts = []
    for key in sorted(fields):
        value = fields[key]
        kind = value.WhichOneof("kind")  # the two common kinds inline: a call per value costs
        if kind == "string_value":
            text = encode_basestring_ascii(value.string_value)
        elif kind == "number_value":
            text = _number_text(value.number_value)
        else:
            text = _value_body(value)
        parts.append(encode_basestring_ascii(key) + ": " + text)
    return "{" + ", ".join(parts) + "}"


def _list_body(values: Message) -> str:
    parts = []
    for value in values.values[:]:
        parts.append(_value_body(value))
    return "[" + ", ".join(parts) + "]"


def _number_text(number: float) -> str:
    if number - number != 0.0:  # NaN or ±Infinity, which JSON cannot hold
        raise ValueError("non-finite number_value")
    return float.__repr__(number)  # what json.dumps writes for a float


def _value_body(value: Message) -> str:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return encode_basestring_ascii(value.string_value)
    if kind == "number_value":
        return _number_text(value.number_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "struct_value":
        return _struct_body(value.struct_value)
    if kind == "list_value":
        return _list_body(value.list_value)
    return "null"  # null_value, or no kind set


_JSON_TEXT: dict[str, Callable[[Message], str]] = {
    "google.protobuf.Struct": _struct_text,
    "google.protobuf.Value": _value_text,
    "google.protobuf.ListValue": _list_text,
}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Levels of nested messages written inline into one function; deeper ones are calls. Python's parser
# refuses expressions nested ~200 parentheses deep, and each level adds a few.
MAX_INLINE_LEVELS = 6


class _Compiler:
    """Writes the converter of a message type as Python source, one function per (message type, depth),
    and compiles it once.

    Why source text: a converter built from closures pays a Python call per field and per value; a
    generated function reads all fields in one dict display, converting values inline. Names from the
    descriptor never become code on their own: an attribute or dict key is written as a literal only when
    it matches a plain identifier (via repr()), and is otherwise passed in as a constant of the namespace,
    like every other object the code uses (enum tables, helpers). The namespace has no builtins.
    """

    def __init__(self, options: SchemaOptions, enc: ValueEncoding) -> None:
        self.options = options
        self.enc = _cached(enc)
        self.json = enc is JSON  # as before: only JSON itself turns floats and bytes into text
        self.namespace: dict[str, Any] = {"__builtins__": {}, "_list": list, "_map": map, "_sorted": sorted,
                                          "_getattr": getattr, "_None": None}
        self.functions: dict[tuple[str, int], str] = {}
        self.source: list[str] = []
        self._temps = 0
        self._inlining: list[str] = []  # full names of the messages being written inline, outermost first

    # -- building blocks ---------------------------------------------------------------------------

    def const(self, value: Any, hint: str = "k") -> str:
        name = f"_{hint}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def literal(self, text: str) -> str:
        """`text` as a string expression: a literal for plain identifiers, else a constant."""
        return repr(text) if _IDENTIFIER.fullmatch(text) else self.const(text, "name")

    def attr(self, obj: str, name: str) -> str:
        if _IDENTIFIER.fullmatch(name) and not keyword.iskeyword(name):
            return f"{obj}.{name}"
        return f"_getattr({obj}, {self.const(name, 'name')})"

    def temp(self) -> str:
        self._temps += 1
        return f"_t{self._temps}"

    def define(self, hint: str, params: str, body: list[str], result: str) -> str:
        name = f"_{hint}{len(self.source)}"
        lines = [f"def {name}({params}):", *(f"    {line}" for line in body), f"    return {result}", ""]
        self.source.append("\n".join(lines))
        return name

    def build(self) -> dict[str, Any]:
        """Compile everything written so far; the namespace then holds the functions by name."""
        exec(compile("\n".join(self.source), "<firehose_bq.convert generated>", "exec"), self.namespace)
        return self.namespace

    # -- messages and fields ----------------------------------------------------------------------

    def message(self, descriptor: Descriptor, depth: int) -> str:
        """Name of the function turning a message of `descriptor` at `depth` into a row dict."""
        key = (descriptor.full_name, depth)
        if key not in self.functions:
            self.functions[key] = f"_message{len(self.functions)}"  # before the fields: they may recurse
            inlining, self._inlining = self._inlining, [descriptor.full_name]
            items = self.items(descriptor, depth, "m")
            self._inlining = inlining
            self.source.append(f"def {self.functions[key]}(m):\n    return {{{', '.join(items)}}}\n")
        return self.functions[key]

    def items(self, descriptor: Descriptor, depth: int, obj: str) -> list[str]:
        """`key: value` entries of a dict display for the fields of `obj`, in field-number order."""
        return [f"{self.literal(column_name(fd, self.options.sanitize_names))}: {self.field(fd, depth, obj)}"
                for fd in sorted(descriptor.fields, key=lambda f: f.number)]

    def field(self, fd: FieldDescriptor, depth: int, obj: str) -> str:
        src = self.attr(obj, fd.name)
        if is_map(fd):
            return f"{self.map_fn(fd, depth)}({src})"
        if fd.is_repeated:
            # A slice is a C-level copy to a list; iterating the container itself is several times slower.
            each = self.element_fn(fd, depth)
            if each is None:
                return f"{src}[:]"
            t = self.temp()  # an empty field (common) is its empty slice: no map, no second list
            return f"(_list(_map({each}, {t})) if ({t} := {src}[:]) else {t})"
        value = self.value(fd, depth, src)
        if fd.has_presence:
            return f"({value} if {obj}.HasField({self.literal(fd.name)}) else _None)"
        return value

    def value(self, fd: FieldDescriptor, depth: int, src: str) -> str:
        """Expression converting one value of `fd` read by `src`, which it evaluates once. It may bind
        temporaries (:=), so it is only used directly in a function's dict display, not in comprehensions."""
        kind = field_kind(fd, depth, self.options.max_depth)
        if kind is Kind.SCALAR:
            return self.scalar(fd, src)
        if kind is Kind.WRAPPER:
            return self.scalar(scalar_field(fd), f"{src}.value")
        if kind is Kind.RECORD:
            return self.record(fd.message_type, depth + 1, src)
        if kind is Kind.TIMESTAMP:
            t = self.temp()
            in_range = (f"{TIMESTAMP_MIN_SECONDS} <= ({t} := {src}).seconds <= {TIMESTAMP_MAX_SECONDS} "
                        f"and 0 <= {t}.nanos <= {NANOS_MAX}")
            return (f"({self.const(self.enc.timestamp, 'timestamp')}({t}.seconds, {t}.nanos) if {in_range} "
                    f"else {self.const(_bad_timestamp, 'bad')}({t}))")
        if kind is Kind.DURATION:
            t = self.temp()
            in_range = (f"-{DURATION_MAX_SECONDS} <= ({t} := {src}).seconds <= {DURATION_MAX_SECONDS} "
                        f"and -{NANOS_MAX} <= {t}.nanos <= {NANOS_MAX} "
                        f"and ({t}.seconds <= 0 or {t}.nanos >= 0) and ({t}.seconds >= 0 or {t}.nanos <= 0)")
            return (f"({{'seconds': {t}.seconds, 'nanos': {t}.nanos}} if {in_range} "
                    f"else {self.const(_bad_duration, 'bad')}({t}))")
        if kind is Kind.DATE:
            return f"{self.const(self.enc.date, 'date')}({src})"
        if kind is Kind.JSON_STRING:
            return f"{self.const(_JSON_TEXT[fd.message_type.full_name], 'json')}({src})"
        assert kind is Kind.CUT and not is_map(fd), kind  # maps are converted whole, in `field`
        return f"{self.const(_json, 'json')}({src})"

    def record(self, descriptor: Descriptor, depth: int, src: str) -> str:
        """A nested message's dict, written inline (a Python call per message costs more than its
        fields), except for a message inside itself and past a few levels (Python's parser limits nesting)."""
        if descriptor.full_name in self._inlining or len(self._inlining) >= MAX_INLINE_LEVELS:
            return f"{self.message(descriptor, depth)}({src})"
        self._inlining.append(descriptor.full_name)
        t = self.temp()
        items = self.items(descriptor, depth, t)
        self._inlining.pop()
        return f"({{{', '.join(items)}}} if ({t} := {src}) is not _None else _None)"

    def scalar(self, fd: FieldDescriptor, src: str) -> str:
        if fd.type == FD.TYPE_ENUM:
            return f"{self.enum_names(fd)}[{src}]"
        if fd.type in UNSIGNED_64:
            return f"{self.unsigned_64()}({src})"
        if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE) and self.json:
            t = self.temp()  # x - x is 0.0 exactly for finite floats, NaN for NaN and ±Infinity
            return f"({t} if ({t} := {src}) - {t} == 0.0 else {self.const(_nonfinite, 'nonfinite')}({t}))"
        if fd.type == FD.TYPE_BYTES and self.json:
            return f"{self.const(_bytes, 'bytes')}({src})"
        return src

    def unsigned_64(self) -> str:
        """The function writing a uint64/fixed64 value in its column's type (SchemaOptions.uint64_type)."""
        column_type = self.options.uint64_type
        if column_type == "STRING":
            return self.const(str, "str")
        if column_type == "NUMERIC":  # JSON: BigQuery reads NUMERIC from a string; Storage: a decimal
            return self.const(str if self.json else Decimal, "numeric")
        return self.const(_integer, "integer")

    def enum_names(self, fd: FieldDescriptor) -> str:
        return self.const(_EnumNames({v.number: v.name for v in fd.enum_type.values}), "enum")

    def element_fn(self, fd: FieldDescriptor, depth: int) -> str | None:
        """A one-argument function converting one value of `fd` (an element of a repeated field, a map
        key or value); None when values are kept as they are."""
        kind = field_kind(fd, depth, self.options.max_depth)
        if kind is Kind.SCALAR:
            if fd.type == FD.TYPE_ENUM:
                return f"{self.enum_names(fd)}.__getitem__"
            if fd.type in UNSIGNED_64:
                return self.unsigned_64()
            if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE) and self.json:
                return self.const(_float, "float")
            if fd.type == FD.TYPE_BYTES and self.json:
                return self.const(_bytes, "bytes")
            return None
        if kind is Kind.RECORD:
            return self.message(fd.message_type, depth + 1)
        return self.define("element", "v", [], self.value(fd, depth, "v"))

    def map_fn(self, fd: FieldDescriptor, depth: int) -> str:
        """A function turning a whole map into its sorted list of key/value records (or JSON texts)."""
        entry = fd.message_type.fields_by_name
        if field_kind(fd, depth, self.options.max_depth) is Kind.CUT:
            entry_class = message_factory.GetMessageClass(fd.message_type)
            return self.define("map", "entries", [], f"[{self.const(_json, 'json')}({self.const(entry_class, 'entry')}"
                                                     "(key=k, value=entries[k])) for k in _sorted(entries)]")
        key_fn = self.element_fn(entry["key"], depth + 1)
        value_fn = self.element_fn(entry["value"], depth + 1)
        key = f"{key_fn}(k)" if key_fn else "k"
        value = f"{value_fn}(entries[k])" if value_fn else "entries[k]"
        # Sorted by key: a map has no order, and a stable one makes rows comparable. A loop, not a
        # comprehension: in Python 3.11 a comprehension is one more function call.
        return self.define("map", "entries", ["if not entries:", "    return []", "records = []",
                                              "for k in _sorted(entries):",
                                              f"    records.append({{'key': {key}, 'value': {value}}})"], "records")


def compile_message(descriptor: Descriptor, depth: int = 1,
                    options: SchemaOptions = SchemaOptions(), enc: ValueEncoding = JSON) -> Callable[[Message], Row]:
    """A function turning a message of `descriptor` into a BigQuery row dict (its fields at `depth`)."""
    compiler = _Compiler(options, enc)
    name = compiler.message(descriptor, depth)
    return compiler.build()[name]


@dataclass(frozen=True)
class KafkaRecords:
    """Column-wise Kafka records of one batch (what the source yields, as Python lists).

    The optional columns are None when the source does not provide them: their metadata columns are
    then NULL (empty for headers), and `message_key` is NULL.
    """

    topics: Sequence[str]
    partitions: Sequence[int]
    offsets: Sequence[int]
    timestamps_ms: Sequence[int | None]
    values: Sequence[bytes | None]
    keys: Sequence[bytes | None] | None = None
    headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None
    timestamp_types: Sequence[int | None] | None = None  # Kafka's: 0 CreateTime, 1 LogAppendTime
    leader_epochs: Sequence[int | None] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def insert_id(self, i: int) -> str:
        return f"{self.topics[i]}_{self.partitions[i]}_{self.offsets[i]}"


# Kafka's TimestampType ids; -1 and None (old message formats) are NoTimestampType.
TIMESTAMP_TYPES: dict[int | None, str] = {0: "CreateTime", 1: "LogAppendTime"}


def _kafka_int(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None  # Kafka says "none" with -1


def _kafka_times(timestamps_ms: Sequence[int | None], enc: ValueEncoding) -> list[Any]:
    """Each Kafka timestamp encoded, NULL for none (Kafka says none with -1); one loop, as this column is
    made for every record."""
    timestamp = enc.timestamp
    return [None if ms is None or ms < 0 else timestamp(ms // 1000, ms % 1000 * 1_000_000) for ms in timestamps_ms]


def _headers(headers: Sequence[tuple[str, bytes | None]], enc: ValueEncoding) -> list[Row]:
    return [{"key": key, "value": None if value is None else enc.bytes(value)} for key, value in headers]


def _each(values: Sequence[Any] | None, convert: Callable[[Any], Any], n: int) -> list[Any]:
    """`convert` of each value of an optional column; NULL for all `n` records when the source lacks it."""
    return [None] * n if values is None else [convert(v) for v in values]


# Each metadata column's values for a batch loaded at `now` (already encoded), one per record:
# column-wise like the records, so a row only indexes them. The keys are METADATA_COLUMNS'.
METADATA_VALUES: dict[str, Callable[[KafkaRecords, Any, ValueEncoding], Sequence[Any]]] = {
    "message_topic": lambda r, now, enc: r.topics,
    "message_partition": lambda r, now, enc: r.partitions,
    "message_offset": lambda r, now, enc: r.offsets,
    "message_timestamp": lambda r, now, enc: _kafka_times(r.timestamps_ms, enc),
    "load_time": lambda r, now, enc: [now] * len(r),
    # REPEATED: no headers rather than NULL when the source lacks them.
    "message_headers": lambda r, now, enc: [_headers(h, enc)
                                            for h in (r.headers if r.headers is not None else [()] * len(r))],
    "message_timestamp_type": lambda r, now, enc: _each(r.timestamp_types,
                                                        lambda t: TIMESTAMP_TYPES.get(t, "NoTimestampType"), len(r)),
    "message_leader_epoch": lambda r, now, enc: _each(r.leader_epochs, _kafka_int, len(r)),
}


@dataclass
class ConvertedBatch:
    """Rows ready for BigQuery plus the messages that could not be converted, in input order."""

    rows: list[Row] = field(default_factory=list)
    insert_ids: list[str] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # index in the input of each row
    errors: list[MessageError] = field(default_factory=list)
    unknown_fields: list[int] = field(default_factory=list)  # inputs with fields the descriptor lacks
    # Positions in `rows` of tombstones (changelog mode only): such a row holds only the key column
    # and the metadata columns, and means "delete this key".
    deletes: list[int] = field(default_factory=list)


TOMBSTONE = "null value (a tombstone); only an upsert/delete sink can apply it"
NULL_KEY = "null key; a changelog (upsert/delete) needs a key per record"

# What decoding or converting one message may raise, by what it says about the message. Anything else
# is a bug of the sink, not of the message, and propagates.
_UNDECODABLE = (DecodeError, WireFormatError)
# e.g. a Timestamp out of range, a partial Date, an Any whose type no descriptor knows (cut to JSON)
_INVALID = (ValueError, OverflowError, OSError, TypeError, json_format.Error)
_MESSAGE_FAULTS = _UNDECODABLE + _INVALID


class RowConverter:
    """Decode + convert for one message type (and key type) and one metadata layout; build once, use per
    batch. `key_class` adds the Kafka key as the RECORD column `message_key`, as `table_schema(key=...)`."""

    def __init__(self, message_class: type[Message], metadata: MetadataColumns,
                 options: SchemaOptions = SchemaOptions(), key_class: type[Message] | None = None,
                 detect_unknown_fields: bool = False, confluent_framed: bool = False,
                 changelog: bool = False, encoding: ValueEncoding = JSON) -> None:
        """`confluent_framed`: values start with Confluent's wire-format frame (magic byte, schema id,
        message indexes); the payload after it is decoded as `message_class`.

        `changelog` (upsert/delete, needs `key_class`): every record must have a key, and a null value
        is a tombstone, returned as a key-only row listed in `ConvertedBatch.deletes`.

        `encoding`: JSON (insertAll, file loads) or STORAGE (Storage Write API) values."""
        if changelog and key_class is None:
            raise ValueError("a changelog converter needs the key's message class")
        self._changelog = changelog
        self._encoding = encoding
        compiler = _Compiler(options, encoding)
        self._values_encoding = compiler.enc  # JSON's with the converter's timestamp cache
        self._parse = _parser(message_class, confluent_framed)
        self._unknown = _has_unknown_fields if detect_unknown_fields else None
        self._metadata = [(name, METADATA_VALUES[name]) for name in metadata.columns] if metadata.enabled else []
        row, tombstone = _row_functions(compiler, message_class.DESCRIPTOR, key_class is not None,
                                        [name for name, _ in self._metadata], metadata.namespace)
        key = compiler.message(key_class.DESCRIPTOR, 2) if key_class is not None else None
        namespace = compiler.build()
        self._row, self._tombstone = namespace[row], namespace[tombstone]
        self._key: tuple[Callable[[bytes], Message], Callable[[Message], Row]] | None = None
        if key_class is not None and key is not None:
            self._key = (_parser(key_class, False), namespace[key])

    def convert(self, records: KafkaRecords, load_time: str) -> ConvertedBatch:
        """`load_time`: the write time as RFC 3339 text (UTC, `Z`), one for the whole batch."""
        out = ConvertedBatch()
        now: Any = load_time
        if self._encoding is not JSON and self._metadata:
            moment = datetime.fromisoformat(load_time.replace("Z", "+00:00")) - _EPOCH
            now = self._encoding.timestamp(moment.days * 86400 + moment.seconds, moment.microseconds * 1000)
        with _collector_paused():
            columns = [values(records, now, self._values_encoding) for _, values in self._metadata]
            # One tuple of metadata values per record, made in C; the row function unpacks it.
            metadata: Sequence[tuple[Any, ...]] = list(zip(*columns)) if columns else [()] * len(records)
            if self._key is None and not self._changelog:
                self._convert_values(records, metadata, out)
            else:
                self._convert_records(records, metadata, out)
            ids = [f"{t}_{p}_{o}" for t, p, o in zip(records.topics, records.partitions, records.offsets)]
            out.insert_ids = ids if len(out.sources) == len(ids) else [ids[i] for i in out.sources]
        return out

    def _convert_values(self, records: KafkaRecords, metadata: Sequence[tuple[Any, ...]],
                        out: ConvertedBatch) -> None:
        """The common case, one tight loop: no key column, no changelog."""
        parse, to_row, unknown_fields, rows, sources = self._parse, self._row, self._unknown, out.rows, out.sources
        for i, value in enumerate(records.values):
            try:
                msg = parse(value)
                unknown = unknown_fields is not None and unknown_fields(msg)
                row = to_row(msg, metadata[i])
            except _MESSAGE_FAULTS as exc:
                out.errors.append(self._error(records, i, TOMBSTONE) if value is None else
                                  self._fault(records, i, exc))
                continue
            if unknown:
                out.unknown_fields.append(i)
            rows.append(row)
            sources.append(i)

    def _convert_records(self, records: KafkaRecords, metadata: Sequence[tuple[Any, ...]],
                         out: ConvertedBatch) -> None:
        """Every case: keys, tombstones (changelog) and unknown-field detection."""
        parse, to_row, unknown_fields = self._parse, self._row, self._unknown
        changelog, keys = self._changelog, records.keys
        for i, value in enumerate(records.values):
            key = None if keys is None else keys[i]
            if changelog and key is None:
                out.errors.append(self._error(records, i, NULL_KEY))
                continue
            unknown = False
            if value is None:
                if not changelog:
                    out.errors.append(self._error(records, i, TOMBSTONE))
                    continue
                row = self._tombstone(metadata[i])
            else:
                try:
                    msg = parse(value)
                    unknown = unknown_fields is not None and unknown_fields(msg)
                    row = to_row(msg, metadata[i])
                except _MESSAGE_FAULTS as exc:
                    out.errors.append(self._fault(records, i, exc))
                    continue
            if unknown:
                out.unknown_fields.append(i)
            if self._key is not None and key is not None:  # a null key is the row's NULL already
                parse_key, key_row = self._key
                try:
                    row[KEY_COLUMN] = key_row(parse_key(key))
                except _MESSAGE_FAULTS as exc:
                    out.errors.append(self._fault(records, i, exc, "key: "))
                    continue
            if value is None:
                out.deletes.append(len(out.rows))
            out.rows.append(row)
            out.sources.append(i)

    @classmethod
    def _fault(cls, records: KafkaRecords, i: int, exc: Exception, part: str = "") -> MessageError:
        kind = ErrorType.DESERIALIZATION_ERROR if isinstance(exc, _UNDECODABLE) else ErrorType.INVALID_MESSAGE_ERROR
        return cls._error(records, i, exc, part, kind)

    @staticmethod
    def _error(records: KafkaRecords, i: int, cause: Exception | str, part: str = "",
               kind: ErrorType = ErrorType.INVALID_MESSAGE_ERROR) -> MessageError:
        text = cause if isinstance(cause, str) else (str(cause) or type(cause).__name__)
        return MessageError(kind, records.topics[i], records.partitions[i], records.offsets[i], part + text)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a batch is converted, as it was before afterwards.

    Converting allocates several lists and dicts per row and keeps them all, so the collector runs every
    few hundred rows and its older generations walk every row made so far: a quarter of the CPU time of a
    10,000-record batch, for nothing, since rows hold no cycles. Process-wide, but the converter runs
    alone in its task's thread and restores the collector right after; cycles made meanwhile (there
    should be none) are collected then."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _row_functions(compiler: _Compiler, descriptor: Descriptor, key: bool, metadata: Sequence[str],
                   namespace: str) -> tuple[str, str]:
    """Names of the generated (message, metadata values) → row and (metadata values) → tombstone row
    functions: message columns, then `message_key` (NULL until the key is converted), then metadata."""
    params = [f"_a{i}" for i in range(len(metadata))]
    unpack = [f"{', '.join(params)}, = meta"] if params else []
    meta = [f"{compiler.literal(name)}: {param}" for name, param in zip(metadata, params)]
    if meta and namespace:
        meta = [f"{compiler.literal(namespace)}: {{{', '.join(meta)}}}"]
    keys = [f"{compiler.literal(KEY_COLUMN)}: _None"] if key else []
    row = compiler.define("row", "m, meta", unpack, "{" + ", ".join(compiler.items(descriptor, 1, "m") + keys + meta) + "}")
    tombstone = compiler.define("tombstone", "meta", unpack, "{" + ", ".join(keys + meta) + "}")
    return row, tombstone


def _parser(message_class: type[Message], confluent_framed: bool) -> Callable[[bytes], Message]:
    """bytes → message. Raises DecodeError (or WireFormatError) for bytes that do not parse, ValueError
    for a proto2 message that lacks required fields."""
    parse = message_class.FromString
    # upb parses proto2 messages that lack `required` fields; checking costs a C call per message, so
    # only message types that have such fields pay it.
    if _has_required(message_class.DESCRIPTOR, set()):
        parse_partial = parse

        def parse(data: bytes) -> Message:
            msg = parse_partial(data)
            if not msg.IsInitialized():
                raise ValueError(f"required field(s) missing: {', '.join(missing_required(msg))}")
            return msg

    if confluent_framed:
        parse_payload = parse
        return lambda data: parse_payload(data[parse_frame(data).payload_offset:])
    return parse


def missing_required(msg: Message, prefix: str = "") -> list[str]:
    """Paths of the proto2 `required` fields `msg` lacks, at any depth (`items[0].id`, `by_key['k'].id`).

    Not upb's FindInitializationErrors: with a map field present, protobuf 7.36's upb builds wrong paths
    and can read past its buffers (a segfault, e.g. testdata.Proto2All from bytes 4a002200), which a
    producer's bad message must never cause."""
    missing = [prefix + fd.name for fd in msg.DESCRIPTOR.fields if fd.is_required and not msg.HasField(fd.name)]
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if is_map(fd):
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for key in sorted(value):
                    missing += missing_required(value[key], f"{prefix}{fd.name}[{key!r}].")
        elif fd.is_repeated:
            for i, item in enumerate(value):
                missing += missing_required(item, f"{prefix}{fd.name}[{i}].")
        else:
            missing += missing_required(value, f"{prefix}{fd.name}.")
    return missing


def _has_unknown_fields(msg: Message) -> bool:
    """Whether `msg` carried fields its descriptor lacks; drops them. Exact and recursive: unknown fields
    are what discarding them takes out of the encoding."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return msg.ByteSize() != size


def _has_required(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(fd.is_required or (fd.message_type is not None and _has_required(fd.message_type, seen))
               for fd in descriptor.fields)
