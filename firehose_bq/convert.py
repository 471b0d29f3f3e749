"""Protobuf bytes → BigQuery rows, through a converter compiled once per message descriptor.

Compilation walks the descriptor once and builds one small closure per field, so converting a message
is a flat loop over closures: no descriptor reflection per message. Values follow BigQuery's JSON
encoding used by insertAll: TIMESTAMP as RFC 3339, DATE as YYYY-MM-DD, BYTES as base64, enums by name
(an enum number the descriptor does not know is kept as its decimal string, never dropped), maps as
key/value records, wrappers as their value, and message fields at the max depth as their proto JSON.

Proto3 scalars without presence are written with their value even when it is the default (0, "",
false): in proto3 an unset scalar *is* the default. Fields with presence (messages, `optional`,
oneof members) are NULL when unset.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.registry.confluent import WireFormatError, parse_frame
from firehose_bq.schema import (KEY_COLUMN, Kind, MetadataColumns, SchemaOptions, column_name, field_kind, is_map,
                                scalar_field)

Row = dict[str, Any]
Getter = Callable[[Message], Any]
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


def _float(value: float) -> float | str:
    # JSON has no NaN/Infinity; BigQuery reads these spellings for FLOAT.
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _enum(fd: FieldDescriptor) -> ValueFn:
    names = {v.number: v.name for v in fd.enum_type.values}
    return lambda number: names.get(number) or str(number)


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


def _scalar_fn(fd: FieldDescriptor, enc: ValueEncoding) -> ValueFn | None:
    if fd.type == FD.TYPE_ENUM:
        return _enum(fd)
    if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return enc.float if enc is JSON else None
    return enc.bytes if fd.type == FD.TYPE_BYTES and enc is JSON else None


def _message_fn(kind: Kind, enc: ValueEncoding) -> ValueFn:
    if kind is Kind.TIMESTAMP:
        return lambda ts: enc.timestamp(ts.seconds, ts.nanos)
    if kind is Kind.DURATION:
        return lambda d: {"seconds": d.seconds, "nanos": d.nanos}
    if kind is Kind.DATE:
        return enc.date
    return _json


def _value_fn(fd: FieldDescriptor, depth: int, options: SchemaOptions, enc: ValueEncoding) -> ValueFn | None:
    """How to convert one value of `fd` (one element of a repeated field, or a whole map); None = as is."""
    kind = field_kind(fd, depth, options.max_depth)
    if kind is Kind.SCALAR:
        return _scalar_fn(fd, enc)
    if kind is Kind.WRAPPER:
        inner = _scalar_fn(scalar_field(fd), enc)
        return (lambda w: inner(w.value)) if inner else (lambda w: w.value)
    if kind is Kind.RECORD:
        return compile_message(fd.message_type, depth + 1, options, enc)
    if kind is Kind.MAP:
        entry = fd.message_type.fields_by_name
        key_fn = _value_fn(entry["key"], depth + 1, options, enc) or (lambda v: v)
        val_fn = _value_fn(entry["value"], depth + 1, options, enc) or (lambda v: v)
        # Sorted by key: a map has no order, and a stable one makes rows comparable.
        return lambda entries: [{"key": key_fn(k), "value": val_fn(v)} for k, v in sorted(entries.items())]
    if kind is Kind.CUT and is_map(fd):
        entry_class = message_factory.GetMessageClass(fd.message_type)
        return lambda entries: [_json(entry_class(key=k, value=v)) for k, v in sorted(entries.items())]
    if kind is Kind.CUT:
        return _json
    return _message_fn(kind, enc)


def _getter(fd: FieldDescriptor, depth: int, options: SchemaOptions, enc: ValueEncoding) -> Getter:
    name = fd.name
    convert = _value_fn(fd, depth, options, enc)
    if is_map(fd):
        assert convert is not None
        return lambda msg: convert(getattr(msg, name))
    if fd.is_repeated:
        if convert is None:
            return lambda msg: list(getattr(msg, name))
        return lambda msg: [convert(v) for v in getattr(msg, name)]
    if fd.has_presence:
        if convert is None:
            return lambda msg: getattr(msg, name) if msg.HasField(name) else None
        return lambda msg: convert(getattr(msg, name)) if msg.HasField(name) else None
    if convert is None:
        return lambda msg: getattr(msg, name)
    return lambda msg: convert(getattr(msg, name))


def compile_message(descriptor: Descriptor, depth: int = 1,
                    options: SchemaOptions = SchemaOptions(), enc: ValueEncoding = JSON) -> Callable[[Message], Row]:
    """A function turning a message of `descriptor` into a BigQuery row dict (its fields at `depth`)."""
    steps = [(column_name(fd, options.sanitize_names), _getter(fd, depth, options, enc))
             for fd in sorted(descriptor.fields, key=lambda f: f.number)]

    def convert(msg: Message) -> Row:
        return {name: get(msg) for name, get in steps}

    return convert


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


def _kafka_time(millis: int | None, enc: ValueEncoding) -> Any:
    return None if (millis := _kafka_int(millis)) is None else enc.millis(millis)


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
    "message_timestamp": lambda r, now, enc: [_kafka_time(ms, enc) for ms in r.timestamps_ms],
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
        self._value = _decoder(message_class, 1, options, encoding, detect_unknown_fields)
        if confluent_framed:
            self._value = _unframed(self._value)
        self._key = _decoder(key_class, 2, options, encoding) if key_class is not None else None
        self._metadata = [(name, METADATA_VALUES[name]) for name in metadata.columns] if metadata.enabled else []
        self._namespace = metadata.namespace

    def convert(self, records: KafkaRecords, load_time: str) -> ConvertedBatch:
        """`load_time`: the write time as RFC 3339 text (UTC, `Z`), one for the whole batch."""
        out = ConvertedBatch()
        now: Any = load_time
        if self._encoding is not JSON and self._metadata:
            moment = datetime.fromisoformat(load_time.replace("Z", "+00:00")) - _EPOCH
            now = self._encoding.timestamp(moment.days * 86400 + moment.seconds, moment.microseconds * 1000)
        metadata = [(name, values(records, now, self._encoding)) for name, values in self._metadata]
        for i, value in enumerate(records.values):
            key = None if records.keys is None else records.keys[i]
            if self._changelog and key is None:
                out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i, NULL_KEY))
                continue
            if value is None and not self._changelog:
                out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i, TOMBSTONE))
                continue
            if value is None:
                row: Row | None = {}
                unknown = False
            else:
                row, unknown = self._decode(self._value, value, records, i, out)
            if row is None:
                continue
            if unknown:
                out.unknown_fields.append(i)
            if self._key is not None:
                row[KEY_COLUMN] = None if key is None else self._decode(self._key, key, records, i, out, "key: ")[0]
                if key is not None and row[KEY_COLUMN] is None:
                    continue  # recorded in out.errors
            if metadata:
                meta = {name: values[i] for name, values in metadata}
                if self._namespace:
                    row[self._namespace] = meta
                else:
                    row.update(meta)
            if value is None:
                out.deletes.append(len(out.rows))
            out.rows.append(row)
            out.insert_ids.append(records.insert_id(i))
            out.sources.append(i)
        return out

    def _decode(self, decode: Decoder, data: bytes, records: KafkaRecords, i: int, out: ConvertedBatch,
                part: str = "") -> tuple[Row | None, bool]:
        """`decode(data)`, or None with the failure recorded in `out`, its text prefixed by `part`."""
        try:
            return decode(data)
        except (DecodeError, WireFormatError) as exc:
            out.errors.append(self._error(ErrorType.DESERIALIZATION_ERROR, records, i, exc, part))
        # e.g. a Timestamp out of range, a partial Date, an Any whose type no descriptor knows (cut to JSON)
        except (ValueError, OverflowError, OSError, TypeError, json_format.Error) as exc:
            out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i, exc, part))
        return None, False

    @staticmethod
    def _error(kind: ErrorType, records: KafkaRecords, i: int, cause: Exception | str,
               part: str = "") -> MessageError:
        text = cause if isinstance(cause, str) else (str(cause) or type(cause).__name__)
        return MessageError(kind, records.topics[i], records.partitions[i], records.offsets[i], part + text)


# bytes → (row, whether the message carried fields the descriptor does not know).
Decoder = Callable[[bytes], tuple[Row, bool]]


def _decoder(message_class: type[Message], depth: int, options: SchemaOptions, enc: ValueEncoding,
             detect_unknown_fields: bool = False) -> Decoder:
    """Raises DecodeError for bytes that do not parse, ValueError for invalid messages."""
    parse = message_class.FromString
    convert = compile_message(message_class.DESCRIPTOR, depth, options, enc)
    # upb parses proto2 messages that lack `required` fields; checking costs a C call per message, so
    # only message types that have such fields pay it.
    check_required = _has_required(message_class.DESCRIPTOR, set())

    def decode(data: bytes) -> tuple[Row, bool]:
        msg = parse(data)
        if check_required and not msg.IsInitialized():
            raise ValueError(f"required field(s) missing: {', '.join(msg.FindInitializationErrors())}")
        unknown = False
        if detect_unknown_fields:
            # Exact and recursive: unknown fields are what discarding them takes out of the encoding.
            size = msg.ByteSize()
            msg.DiscardUnknownFields()
            unknown = msg.ByteSize() != size
        return convert(msg), unknown

    return decode


def _unframed(decode: Decoder) -> Decoder:
    return lambda data: decode(data[parse_frame(data).payload_offset:])


def _has_required(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(fd.is_required or (fd.message_type is not None and _has_required(fd.message_type, seen))
               for fd in descriptor.fields)
