"""Protobuf descriptor → BigQuery schema (seed 001's type table, plus maps and well-known types).

The mapping is data: `SCALAR_TYPES` for protobuf scalars, `WELL_KNOWN_TYPES` for message types that
map to something other than a RECORD, `METADATA_COLUMNS` for Kafka's. `convert.py` walks descriptors
with the same `field_kind` and `column_name` rules, so the rows it builds always fit the schema built here.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from google.cloud.bigquery import SchemaField
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pb2 import DescriptorProto, FileDescriptorProto, FileDescriptorSet

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
    WRAPPER = "wrapper"  # google.protobuf.*Value → its `value` field's scalar, NULL when unset
    DATE = "date"  # google.type.Date → DATE
    CUT = "cut"  # a RECORD, MAP or DURATION at the depth limit → STRING holding JSON (per element)


WRAPPERS = ("DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue",
            "StringValue", "BytesValue")

WELL_KNOWN_TYPES: dict[str, Kind] = {
    "google.protobuf.Timestamp": Kind.TIMESTAMP,
    "google.protobuf.Duration": Kind.DURATION,
    "google.protobuf.Struct": Kind.JSON_STRING,
    "google.protobuf.Value": Kind.JSON_STRING,
    "google.protobuf.ListValue": Kind.JSON_STRING,
    **{f"google.protobuf.{name}": Kind.WRAPPER for name in WRAPPERS},
    "google.type.Date": Kind.DATE,
}

# uint64 and fixed64 reach 2^64-1, past INTEGER's 2^63-1. INTEGER (the default, as before) keeps the
# column type users have, and a value past it fails its message (INVALID_MESSAGE_ERROR) instead of being
# wrapped or clamped; NUMERIC (38 digits) and STRING hold every value exactly.
UINT64_COLUMN_TYPES = ("INTEGER", "NUMERIC", "STRING")
UNSIGNED_64 = frozenset({FD.TYPE_UINT64, FD.TYPE_FIXED64})

# Column types of the kinds that are one column; SCALAR and WRAPPER take theirs from SCALAR_TYPES.
LEAF_TYPES: dict[Kind, str] = {Kind.TIMESTAMP: "TIMESTAMP", Kind.DATE: "DATE", Kind.JSON_STRING: "STRING",
                               Kind.CUT: "STRING"}
# Kinds with sub-columns: they cannot sit at the deepest level, so there they are cut to JSON.
NESTED_KINDS = frozenset({Kind.RECORD, Kind.MAP, Kind.DURATION})

# BigQuery allows 15 levels of nested RECORDs. Depth counts column levels (top-level columns are 1) and
# only leaves sit at max_depth, the strict reading of that limit: with the default of 15, every message
# accepted before cutting existed keeps its schema exactly (a column can never change type).
MAX_RECORD_DEPTH = 15
MAX_COLUMNS = 10_000  # BigQuery's limit per table, nested columns included
DESCRIPTION_LIMIT = 1024  # characters

KEY_COLUMN = "message_key"
# SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE's column: values the table has no column for, as one JSON object.
ADDITIONAL_PROPERTIES = "additional_properties"
ADDITIONAL_PROPERTIES_COLUMN = SchemaField(ADDITIONAL_PROPERTIES, "STRING", description=(
    "Values the table had no column for when they were written, as one JSON object (firehose-bq)"))
MAX_COLUMN_NAME = 300  # characters

_VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,299}")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_]")
# A table name may also hold dashes (BigQuery allows more: Unicode letters, spaces; this sink takes ASCII).
_INVALID_TABLE_CHAR = re.compile(r"[^A-Za-z0-9_-]")
# Prefixes BigQuery keeps for pseudo-columns; compared upper-cased.
RESERVED_PREFIXES = ("_TABLE_", "_FILE_", "_PARTITION", "_ROW_TIMESTAMP", "__ROOT__", "_COLIDENTIFIER")


@dataclass(frozen=True)
class SchemaOptions:
    """How messages map to columns; plain data, so it pickles to Spark workers with the job spec.

    max_depth: column level at which message fields stop being RECORDs and hold their value as JSON
    (recursive messages would otherwise nest forever). 15, BigQuery's limit, keeps every message that
    fits BigQuery as it was; a recursive message then gets 14 levels of mostly-NULL RECORDs (each level
    repeats its columns, and a message that recurses through several fields multiplies them), so lower
    it for those. sanitize_names: map names BigQuery rejects to valid ones instead of refusing them.
    uint64_type: the column type of uint64/fixed64 fields (UINT64_COLUMN_TYPES).
    """

    max_depth: int = MAX_RECORD_DEPTH
    sanitize_names: bool = False
    uint64_type: str = "INTEGER"

    def __post_init__(self) -> None:
        if not 1 <= self.max_depth <= MAX_RECORD_DEPTH:
            raise ValueError(f"max_depth must be between 1 and {MAX_RECORD_DEPTH}, not {self.max_depth}")
        if self.uint64_type not in UINT64_COLUMN_TYPES:
            raise ValueError(f"uint64_type must be one of {', '.join(UINT64_COLUMN_TYPES)}, not {self.uint64_type!r}")


def is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def field_kind(fd: FieldDescriptor, depth: int = 1, max_depth: int = MAX_RECORD_DEPTH) -> Kind:
    """How `fd` is represented when its column is at level `depth` (top-level columns are 1)."""
    if fd.message_type is None:  # a proto2 group is a message too (TYPE_GROUP: only its wire form differs)
        return Kind.SCALAR
    kind = Kind.MAP if is_map(fd) else WELL_KNOWN_TYPES.get(fd.message_type.full_name, Kind.RECORD)
    # BigQuery has no RECORD without fields (google.protobuf.Empty, a oneof's marker message): such a
    # message is its JSON text, "{}" when set, as a cut one is.
    empty = kind is Kind.RECORD and not fd.message_type.fields
    return Kind.CUT if kind in NESTED_KINDS and (depth >= max_depth or empty) else kind


def scalar_field(fd: FieldDescriptor) -> FieldDescriptor:
    """The field that holds a SCALAR's or a WRAPPER's value: `fd` itself, or the wrapper's `value`."""
    return fd.message_type.fields_by_name["value"] if fd.message_type is not None else fd


def scalar_type(fd: FieldDescriptor, options: SchemaOptions) -> str:
    """The column type of a SCALAR's or a WRAPPER's value."""
    value = scalar_field(fd)
    return options.uint64_type if value.type in UNSIGNED_64 else SCALAR_TYPES[value.type]


def field_mode(fd: FieldDescriptor) -> str:
    if fd.is_repeated:
        return "REPEATED"
    if fd.is_required:
        return "REQUIRED"
    return "NULLABLE"


def column_name(fd: FieldDescriptor, sanitize: bool = False) -> str:
    """`fd`'s column: its proto name, or with `sanitize` the nearest name BigQuery accepts."""
    if _VALID_NAME.fullmatch(fd.name) and not fd.name.upper().startswith(RESERVED_PREFIXES):
        return fd.name
    if not sanitize:
        raise SchemaError(
            f"field {fd.full_name}: BigQuery does not accept the column name {fd.name!r} (letters, digits and "
            f"_ only, not starting with a digit or {'/'.join(RESERVED_PREFIXES)}, at most 300 characters); "
            "set SINK_BIGQUERY_SANITIZE_FIELD_NAMES=true to map it"
        )
    return sanitize_name(fd.name)


def sanitize_chars(text: str) -> str:
    """Every character a column name may not hold → `_`."""
    return _INVALID_CHAR.sub("_", text)


def sanitize_name(name: str, limit: int | None = MAX_COLUMN_NAME, dashes: bool = False) -> str:
    """Invalid characters → `_`; a leading digit or a reserved prefix gets a `_` in front (`_PARTITIONTIME`
    → `__PARTITIONTIME`: no reserved prefix starts with `_` + another one); at most `limit` characters
    (a column name's; None: not cut, for names that must be refused rather than merged when too long).
    `dashes`: keep `-` (a table's name may hold them, a column's not)."""
    name = (_INVALID_TABLE_CHAR if dashes else _INVALID_CHAR).sub("_", name)
    if name[:1].isdigit() or name.upper().startswith(RESERVED_PREFIXES):
        name = f"_{name}"
    return name if limit is None else name[:limit]


def bigquery_fields(message: Descriptor, depth: int = 1, options: SchemaOptions = SchemaOptions(),
                    descriptor_sets: Sequence[bytes] = ()) -> list[SchemaField]:
    """The BigQuery columns for a protobuf message, in field-number order.

    `descriptor_sets` (serialized FileDescriptorSets built with --include_source_info) supply the proto
    comments that become column descriptions: upb descriptors drop source info, so `message` has none.
    """
    return _Builder(options, descriptor_sets).fields(message, depth)


class _Builder:
    """One schema build: the options, each file's field comments (parsed once) and a column count."""

    def __init__(self, options: SchemaOptions, descriptor_sets: Sequence[bytes]) -> None:
        self.options = options
        self.columns = 0
        self._files: dict[str, FileDescriptorProto] = {}
        for blob in descriptor_sets:
            for file in FileDescriptorSet.FromString(blob).file:
                self._files.setdefault(file.name, file)  # first set wins, as in descriptors.load
        self._comments: dict[str, dict[str, str]] = {}
        self._recursive: dict[str, bool] = {}

    def fields(self, message: Descriptor, depth: int) -> list[SchemaField]:
        columns = [self.field(fd, depth) for fd in sorted(message.fields, key=lambda f: f.number)]
        unique(message.full_name, [c.name for c in columns])
        return columns

    def field(self, fd: FieldDescriptor, depth: int) -> SchemaField:
        kind = field_kind(fd, depth, self.options.max_depth)
        name = column_name(fd, self.options.sanitize_names)
        sub: list[SchemaField] = []
        if kind is Kind.RECORD:
            sub = self.fields(fd.message_type, depth + 1)
        elif kind is Kind.MAP:
            entry = fd.message_type.fields_by_name
            sub = [self.field(entry["key"], depth + 1), self.field(entry["value"], depth + 1)]
        elif kind is Kind.DURATION:
            sub = [SchemaField("seconds", "INTEGER"), SchemaField("nanos", "INTEGER")]
        self.columns += 1 + (len(sub) if kind is Kind.DURATION else 0)  # the others count in their own call
        if self.columns > MAX_COLUMNS:
            raise SchemaError(f"field {fd.full_name} takes the table past BigQuery's {MAX_COLUMNS:,} columns "
                              "(a message that recurses through several fields?); lower the max depth")
        description = self._description(fd, kind, depth)
        if kind in NESTED_KINDS:
            return column(name, "RECORD", field_mode(fd), description, sub)
        return column(name, LEAF_TYPES.get(kind) or scalar_type(fd, self.options), field_mode(fd), description)

    def _description(self, fd: FieldDescriptor, kind: Kind, depth: int) -> str:
        text = self._comment(fd)
        if kind is Kind.CUT and not fd.message_type.fields:
            text = f"{fd.message_type.full_name} as JSON: a message without fields ({{}} when set). {text}".strip()
        elif kind is Kind.CUT:
            why = "the message is recursive" if self._is_recursive(fd.message_type) else "it nests deeper"
            text = f"{fd.message_type.full_name} as JSON: cut at depth {depth} because {why}. {text}".strip()
        return text if len(text) <= DESCRIPTION_LIMIT else text[:DESCRIPTION_LIMIT - 1] + "…"

    def _comment(self, fd: FieldDescriptor) -> str:
        name = fd.file.name
        if name not in self._comments:
            file = self._files.get(name) or FileDescriptorProto.FromString(fd.file.serialized_pb)
            self._comments[name] = field_comments(file)
        return self._comments[name].get(fd.full_name, "")

    def _is_recursive(self, message: Descriptor) -> bool:
        """Whether `message` contains itself, directly or through other messages."""
        if message.full_name not in self._recursive:
            seen: set[str] = set()
            todo = [message]
            while todo and message.full_name not in seen:
                for fd in todo.pop().fields:
                    if fd.message_type is not None and fd.message_type.full_name not in seen:
                        seen.add(fd.message_type.full_name)
                        todo.append(fd.message_type)
            self._recursive[message.full_name] = message.full_name in seen
        return self._recursive[message.full_name]


def field_comments(file: FileDescriptorProto) -> dict[str, str]:
    """Each field's leading (else trailing) comment in `file`, by the field's full name."""
    by_path = {tuple(loc.path): loc.leading_comments or loc.trailing_comments
               for loc in file.source_code_info.location}
    comments: dict[str, str] = {}

    def walk(messages: Iterable[DescriptorProto], prefix: str, path: tuple[int, ...]) -> None:
        for i, message in enumerate(messages):
            name = prefix + message.name
            for j, fd in enumerate(message.field):
                if text := by_path.get((*path, i, DescriptorProto.FIELD_FIELD_NUMBER, j), "").strip():
                    comments[f"{name}.{fd.name}"] = "\n".join(line.strip() for line in text.splitlines())
            walk(message.nested_type, f"{name}.", (*path, i, DescriptorProto.NESTED_TYPE_FIELD_NUMBER))

    package = f"{file.package}." if file.package else ""
    walk(file.message_type, package, (FileDescriptorProto.MESSAGE_TYPE_FIELD_NUMBER,))
    return comments


def column(name: str, type_: str, mode: str = "NULLABLE", description: str | None = None,
           fields: Sequence[SchemaField] = ()) -> SchemaField:
    if description:
        return SchemaField(name, type_, mode=mode, description=description, fields=fields)
    return SchemaField(name, type_, mode=mode, fields=fields)  # not description=None: that writes a null


def unique(where: str, names: Iterable[str]) -> None:
    """BigQuery column names are case-insensitive: two that differ only in case clash."""
    names = list(names)
    counts = Counter(n.lower() for n in names)
    clashes = sorted(n for n in names if counts[n.lower()] > 1)
    if clashes:
        raise SchemaError(f"{where} has more than one column named {clashes} (BigQuery ignores case)")


METADATA_COLUMNS: dict[str, SchemaField] = {c.name: c for c in (
    SchemaField("message_topic", "STRING"),
    SchemaField("message_partition", "INTEGER"),
    SchemaField("message_offset", "INTEGER"),
    SchemaField("message_timestamp", "TIMESTAMP"),
    SchemaField("load_time", "TIMESTAMP"),
    # Flink FLIP-107's Kafka metadata keys:
    SchemaField("message_headers", "RECORD", mode="REPEATED",
                fields=(SchemaField("key", "STRING"), SchemaField("value", "BYTES"))),
    SchemaField("message_timestamp_type", "STRING"),  # NoTimestampType | CreateTime | LogAppendTime
    SchemaField("message_leader_epoch", "INTEGER"),
)}
# Standard SQL names for the legacy type names used here, accepted in SINK_BIGQUERY_METADATA_COLUMNS_TYPES.
TYPE_ALIASES = {"INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN", "STRUCT": "RECORD"}


@dataclass(frozen=True)
class MetadataColumns:
    """Kafka metadata columns, in `columns` order, at the root or inside one RECORD named `namespace`."""

    NAMES: ClassVar[tuple[str, ...]] = ("message_topic", "message_partition", "message_offset",
                                        "message_timestamp", "load_time")  # seed 001's: the default

    enabled: bool = True
    namespace: str = ""
    columns: tuple[str, ...] = NAMES

    def __post_init__(self) -> None:
        unknown = [n for n in self.columns if n not in METADATA_COLUMNS]
        if unknown:
            raise ValueError(f"unknown metadata column(s) {unknown}; known: {', '.join(METADATA_COLUMNS)}")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"metadata columns listed more than once: {list(self.columns)}")

    def fields(self) -> list[SchemaField]:
        if not self.enabled:
            return []
        columns = [METADATA_COLUMNS[name] for name in self.columns]
        if self.namespace:
            return [SchemaField(self.namespace, "RECORD", fields=columns)]
        return columns


def parse_metadata_columns(spec: str) -> tuple[str, ...]:
    """The columns of SINK_BIGQUERY_METADATA_COLUMNS_TYPES (`name=type,...`, in order; blank = the default).

    A column's type is Kafka's, not a choice: a type that differs from it is refused, not cast.
    """
    names = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, equals, type_ = (part.strip() for part in item.partition("="))
        if not equals:
            raise ValueError(f"metadata column {item!r}: expected name=type")
        if name not in METADATA_COLUMNS:
            known = ", ".join(f"{n}={c.field_type.lower()}" for n, c in METADATA_COLUMNS.items())
            raise ValueError(f"unknown metadata column {name!r}; known: {known}")
        real = METADATA_COLUMNS[name].field_type
        if TYPE_ALIASES.get(type_.upper(), type_.upper()) != real:
            raise ValueError(f"metadata column {name} has type {real.lower()}, not {type_!r}")
        if name in names:
            raise ValueError(f"metadata column {name} is listed twice")
        names.append(name)
    return tuple(names) or MetadataColumns.NAMES


def table_schema(message: Descriptor, metadata: MetadataColumns, options: SchemaOptions = SchemaOptions(),
                 key: Descriptor | None = None, descriptor_sets: Sequence[bytes] = (),
                 additional_properties: bool = False) -> list[SchemaField]:
    """Message columns, then the Kafka key's RECORD `message_key` (when `key` is given), then metadata
    columns, then (with `additional_properties`) the STRING column `additional_properties` for unknown
    fields: last, where adding it to a live table puts it too, and where JSON input's tables have it. A
    name clash between them is an error."""
    build = _Builder(options, descriptor_sets)
    columns = build.fields(message, 1)
    if key is not None:
        note = f"Kafka message key ({key.full_name}); NULL for a null key"
        columns.append(column(KEY_COLUMN, "RECORD", "NULLABLE", note, build.fields(key, 2)))
    extra = metadata.fields()
    clashes = {c.name.lower() for c in columns} & {c.name.lower() for c in extra}
    if clashes:
        raise SchemaError(
            f"{message.full_name} has field(s) {sorted(clashes)} that clash with Kafka metadata columns; "
            "set SINK_BIGQUERY_METADATA_NAMESPACE to put the metadata in a RECORD column"
        )
    unique(message.full_name, [c.name for c in columns])  # a field named message_key
    if not additional_properties:
        return columns + extra
    taken = [c.name for c in columns + extra if c.name.lower() == ADDITIONAL_PROPERTIES]
    if taken:
        raise SchemaError(
            f"{message.full_name} has a column named {taken[0]!r} (a field, or SINK_BIGQUERY_METADATA_NAMESPACE), "
            "which SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE needs for unknown fields; rename it or turn that off"
        )
    return columns + extra + [ADDITIONAL_PROPERTIES_COLUMN]


def schema_json(fields: list[SchemaField]) -> list[dict[str, object]]:
    """The JSON that `bq show --schema` prints, for display and tests."""
    return [f.to_api_repr() for f in fields]
