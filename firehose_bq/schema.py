"""Protobuf descriptor → BigQuery schema (seed 001's type table, plus maps and well-known types).

The mapping is data: `SCALAR_TYPES` for protobuf scalars and `WELL_KNOWN_TYPES` for message types that
map to something other than a RECORD. `convert.py` walks descriptors with the same `field_kind` rules
so the rows it builds always fit the schema built here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.cloud.bigquery import SchemaField
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from firehose_bq.errors import SchemaError

FD = FieldDescriptor

SCALAR_TYPES: dict[int, str] = {
    FD.TYPE_BYTES: "BYTES",
    FD.TYPE_STRING: "STRING",
    FD.TYPE_ENUM: "STRING",  # enum values are written as their names
    FD.TYPE_FLOAT: "FLOAT",
    FD.TYPE_DOUBLE: "FLOAT",
    FD.TYPE_BOOL: "BOOLEAN",
    **dict.fromkeys(
        (FD.TYPE_INT64, FD.TYPE_UINT64, FD.TYPE_INT32, FD.TYPE_UINT32, FD.TYPE_FIXED64, FD.TYPE_FIXED32,
         FD.TYPE_SFIXED64, FD.TYPE_SFIXED32, FD.TYPE_SINT64, FD.TYPE_SINT32),
        "INTEGER",
    ),
}


class Kind(enum.Enum):
    """How a field's value is represented in BigQuery."""

    SCALAR = "scalar"
    RECORD = "record"
    MAP = "map"
    TIMESTAMP = "timestamp"  # google.protobuf.Timestamp → TIMESTAMP
    DURATION = "duration"  # google.protobuf.Duration → RECORD(seconds, nanos)
    JSON_STRING = "json"  # google.protobuf.Struct/Value/ListValue → STRING holding JSON


WELL_KNOWN_TYPES: dict[str, Kind] = {
    "google.protobuf.Timestamp": Kind.TIMESTAMP,
    "google.protobuf.Duration": Kind.DURATION,
    "google.protobuf.Struct": Kind.JSON_STRING,
    "google.protobuf.Value": Kind.JSON_STRING,
    "google.protobuf.ListValue": Kind.JSON_STRING,
}

# BigQuery allows 15 levels of nested RECORDs; deeper (or recursive) messages are cut there.
MAX_RECORD_DEPTH = 15


def field_kind(fd: FieldDescriptor) -> Kind:
    if fd.type != FD.TYPE_MESSAGE:
        return Kind.SCALAR
    if fd.message_type.GetOptions().map_entry:
        return Kind.MAP
    return WELL_KNOWN_TYPES.get(fd.message_type.full_name, Kind.RECORD)


def field_mode(fd: FieldDescriptor) -> str:
    if fd.is_repeated:
        return "REPEATED"
    if fd.is_required:
        return "REQUIRED"
    return "NULLABLE"


def bigquery_fields(message: Descriptor, depth: int = 1) -> list[SchemaField]:
    """The BigQuery columns for a protobuf message, in field-number order."""
    return [_field(fd, depth) for fd in sorted(message.fields, key=lambda f: f.number)]


def _field(fd: FieldDescriptor, depth: int) -> SchemaField:
    kind = field_kind(fd)
    mode = field_mode(fd)
    if kind is Kind.SCALAR:
        return SchemaField(fd.name, SCALAR_TYPES[fd.type], mode=mode)
    if kind is Kind.TIMESTAMP:
        return SchemaField(fd.name, "TIMESTAMP", mode=mode)
    if kind is Kind.JSON_STRING:
        return SchemaField(fd.name, "STRING", mode=mode)
    if kind is Kind.DURATION:
        sub = (SchemaField("seconds", "INTEGER"), SchemaField("nanos", "INTEGER"))
        return SchemaField(fd.name, "RECORD", mode=mode, fields=sub)
    if depth >= MAX_RECORD_DEPTH:
        raise SchemaError(
            f"field {fd.full_name} nests records deeper than BigQuery's limit of {MAX_RECORD_DEPTH} "
            "(a recursive message?)"
        )
    if kind is Kind.MAP:
        key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        sub = (_field(key_fd, depth + 1), _field(value_fd, depth + 1))
        return SchemaField(fd.name, "RECORD", mode="REPEATED", fields=sub)
    return SchemaField(fd.name, "RECORD", mode=mode, fields=bigquery_fields(fd.message_type, depth + 1))


@dataclass(frozen=True)
class MetadataColumns:
    """Kafka metadata columns (seed 001), at the root or inside one RECORD named `namespace`."""

    enabled: bool = True
    namespace: str = ""

    NAMES = ("message_topic", "message_partition", "message_offset", "message_timestamp", "load_time")

    def fields(self) -> list[SchemaField]:
        if not self.enabled:
            return []
        columns = [
            SchemaField("message_topic", "STRING"),
            SchemaField("message_partition", "INTEGER"),
            SchemaField("message_offset", "INTEGER"),
            SchemaField("message_timestamp", "TIMESTAMP"),
            SchemaField("load_time", "TIMESTAMP"),
        ]
        if self.namespace:
            return [SchemaField(self.namespace, "RECORD", fields=columns)]
        return columns


def table_schema(message: Descriptor, metadata: MetadataColumns) -> list[SchemaField]:
    """Message columns followed by metadata columns; a name clash between them is an error."""
    columns = bigquery_fields(message)
    extra = metadata.fields()
    clashes = {c.name.lower() for c in columns} & {c.name.lower() for c in extra}
    if clashes:
        raise SchemaError(
            f"{message.full_name} has field(s) {sorted(clashes)} that clash with Kafka metadata columns; "
            "set SINK_BIGQUERY_METADATA_NAMESPACE to put the metadata in a RECORD column"
        )
    return columns + extra


def schema_json(fields: list[SchemaField]) -> list[dict[str, object]]:
    """The JSON that `bq show --schema` prints, for display and tests."""
    return [f.to_api_repr() for f in fields]
