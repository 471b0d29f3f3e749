"""Protobuf bytes → BigQuery rows, through a converter compiled once per message descriptor.

Compilation walks the descriptor once and builds one small closure per field, so converting a message
is a flat loop over closures: no descriptor reflection per message. Values follow BigQuery's JSON
encoding used by insertAll: TIMESTAMP as RFC 3339, BYTES as base64, enums by name (an enum number the
descriptor does not know is kept as its decimal string, never dropped), maps as key/value records.

Proto3 scalars without presence are written with their value even when it is the default (0, "",
false): in proto3 an unset scalar *is* the default. Fields with presence (messages, `optional`,
oneof members) are NULL when unset.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.schema import MAX_RECORD_DEPTH, Kind, MetadataColumns, field_kind

Row = dict[str, Any]
Getter = Callable[[Message], Any]
ValueFn = Callable[[Any], Any]

FD = FieldDescriptor
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def _value_fn(fd: FieldDescriptor, depth: int) -> ValueFn | None:
    """How to convert one value of `fd` (one element, for repeated fields); None = as is."""
    kind = field_kind(fd)
    if kind is Kind.SCALAR:
        if fd.type == FD.TYPE_ENUM:
            return _enum(fd)
        if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
            return _float
        if fd.type == FD.TYPE_BYTES:
            return _bytes
        return None
    if kind is Kind.TIMESTAMP:
        return lambda ts: rfc3339(ts.seconds, ts.nanos)
    if kind is Kind.DURATION:
        return lambda d: {"seconds": d.seconds, "nanos": d.nanos}
    if kind is Kind.JSON_STRING:
        return lambda m: json_format.MessageToJson(m, indent=None, sort_keys=True)
    if kind is Kind.MAP:
        entry = fd.message_type
        key_fn = _value_fn(entry.fields_by_name["key"], depth + 1)
        val_fn = _value_fn(entry.fields_by_name["value"], depth + 1)
        key_fn = key_fn or (lambda v: v)
        val_fn = val_fn or (lambda v: v)
        # Sorted by key: a map has no order, and a stable one makes rows comparable.
        return lambda entries: [{"key": key_fn(k), "value": val_fn(v)} for k, v in sorted(entries.items())]
    return compile_message(fd.message_type, depth + 1)


def _getter(fd: FieldDescriptor, depth: int) -> Getter:
    name = fd.name
    convert = _value_fn(fd, depth)
    if field_kind(fd) is Kind.MAP:
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


def compile_message(descriptor: Descriptor, depth: int = 1) -> Callable[[Message], Row]:
    """A function turning a message of `descriptor` into a BigQuery row dict."""
    if depth > MAX_RECORD_DEPTH:
        # schema.py refuses such schemas before any conversion; this guards direct callers.
        raise RecursionError(f"{descriptor.full_name} nests deeper than {MAX_RECORD_DEPTH} records")
    steps = [(fd.name, _getter(fd, depth)) for fd in sorted(descriptor.fields, key=lambda f: f.number)]

    def convert(msg: Message) -> Row:
        return {name: get(msg) for name, get in steps}

    return convert


@dataclass(frozen=True)
class KafkaRecords:
    """Column-wise Kafka records of one batch (what the source yields, as Python lists)."""

    topics: Sequence[str]
    partitions: Sequence[int]
    offsets: Sequence[int]
    timestamps_ms: Sequence[int | None]
    values: Sequence[bytes | None]

    def __len__(self) -> int:
        return len(self.offsets)

    def insert_id(self, i: int) -> str:
        return f"{self.topics[i]}_{self.partitions[i]}_{self.offsets[i]}"


@dataclass
class ConvertedBatch:
    """Rows ready for BigQuery plus the messages that could not be converted, in input order."""

    rows: list[Row] = field(default_factory=list)
    insert_ids: list[str] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # index in the input of each row
    errors: list[MessageError] = field(default_factory=list)


class RowConverter:
    """Decode + convert for one message type and one metadata layout; build once, use per batch."""

    def __init__(self, message_class: type[Message], metadata: MetadataColumns) -> None:
        self._parse = message_class.FromString
        self._convert = compile_message(message_class.DESCRIPTOR)
        self._metadata = metadata
        # upb parses proto2 messages that lack `required` fields; checking costs a C call per message,
        # so only message types that have such fields pay it.
        self._check_required = _has_required(message_class.DESCRIPTOR, set())

    def convert(self, records: KafkaRecords, load_time: str) -> ConvertedBatch:
        out = ConvertedBatch()
        with_metadata = self._metadata.enabled
        namespace = self._metadata.namespace
        for i, value in enumerate(records.values):
            if value is None:
                reason = "null value (a tombstone); only an upsert/delete sink can apply it"
                out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i, reason))
                continue
            try:
                msg = self._parse(value)
                if self._check_required and not msg.IsInitialized():
                    missing = ", ".join(msg.FindInitializationErrors())
                    out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i,
                                                  f"required field(s) missing: {missing}"))
                    continue
                row = self._convert(msg)
            except DecodeError as exc:
                out.errors.append(self._error(ErrorType.DESERIALIZATION_ERROR, records, i, exc))
                continue
            except (ValueError, OverflowError, OSError) as exc:  # e.g. a Timestamp out of range
                out.errors.append(self._error(ErrorType.INVALID_MESSAGE_ERROR, records, i, exc))
                continue
            if with_metadata:
                ts = records.timestamps_ms[i]
                meta = {
                    "message_topic": records.topics[i],
                    "message_partition": records.partitions[i],
                    "message_offset": records.offsets[i],
                    "message_timestamp": millis_to_rfc3339(ts) if ts is not None and ts >= 0 else None,
                    "load_time": load_time,
                }
                if namespace:
                    row[namespace] = meta
                else:
                    row.update(meta)
            out.rows.append(row)
            out.insert_ids.append(records.insert_id(i))
            out.sources.append(i)
        return out

    @staticmethod
    def _error(kind: ErrorType, records: KafkaRecords, i: int, cause: Exception | str) -> MessageError:
        text = cause if isinstance(cause, str) else (str(cause) or type(cause).__name__)
        return MessageError(kind, records.topics[i], records.partitions[i], records.offsets[i], text)


def _has_required(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(fd.is_required or (fd.message_type is not None and _has_required(fd.message_type, seen))
               for fd in descriptor.fields)
