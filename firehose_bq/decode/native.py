"""The native value decoder: `_native.c` walks the wire bytes once, straight into Arrow buffers.

Python compiles the descriptor once into a plan (this module) and handles what is rare:

- failures become `RowError`s (C collects them without Python objects);
- fields cut at the max depth (`Kind.CUT`): C validates their bytes exactly as upb would and hands them
  over; they become json_format text here, as the reference writes them;
- escaped rows: where exactness would need protobuf's merge semantics on columns already written (a
  singular message field occurring twice in one message, a oneof switching away from a message member,
  a Struct value or map value message occurring twice in one entry), a proto2 string holding invalid
  UTF-8, or a google.protobuf.Value holding NaN or Infinity (the row fails naming its path, which the
  reference finds), C rolls the row back and the reference decoder decodes that row alone.

Descriptor shapes the plan cannot express (proto2 groups, messages with known extensions, a well-known
type with an unexpected layout, more than 64 oneofs or 1024 message/required fields in one message)
raise `UnsupportedShape`; `make_value_decoder` then uses the reference decoder.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pyarrow as pa
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from firehose_bq.arrow_schema import arrow_struct
from firehose_bq.convert import _INVALID, _entry_json, json_writer, validates_utf8
from firehose_bq.decode import NativeUnavailable, native_unavailable
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType, RowError
from firehose_bq.registry.confluent import message_indexes
from firehose_bq.schema import WRAPPERS, Kind, SchemaOptions, bigquery_fields, field_kind, is_map, scalar_field

FD = FieldDescriptor


class UnsupportedShape(ValueError):
    """A descriptor shape the native decoder does not implement."""


# protobuf type → the plan's value type name (the constants live in _native.c)
_VALUE_TYPES = {
    FD.TYPE_INT32: "VT_INT32", FD.TYPE_INT64: "VT_INT64", FD.TYPE_UINT32: "VT_UINT32", FD.TYPE_UINT64: "VT_UINT64",
    FD.TYPE_SINT32: "VT_SINT32", FD.TYPE_SINT64: "VT_SINT64", FD.TYPE_BOOL: "VT_BOOL", FD.TYPE_ENUM: "VT_ENUM",
    FD.TYPE_FIXED32: "VT_FIXED32", FD.TYPE_SFIXED32: "VT_SFIXED32", FD.TYPE_FLOAT: "VT_FLOAT",
    FD.TYPE_FIXED64: "VT_FIXED64", FD.TYPE_SFIXED64: "VT_SFIXED64", FD.TYPE_DOUBLE: "VT_DOUBLE",
    FD.TYPE_STRING: "VT_STRING", FD.TYPE_BYTES: "VT_BYTES", FD.TYPE_MESSAGE: "VT_MESSAGE",
}

# The well-known types the C code reads with fixed layouts: each must look exactly like this, a
# descriptor set that redefines one is decoded by the reference.
_LAYOUTS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "google.protobuf.Timestamp": (("seconds", 1, FD.TYPE_INT64), ("nanos", 2, FD.TYPE_INT32)),
    "google.protobuf.Duration": (("seconds", 1, FD.TYPE_INT64), ("nanos", 2, FD.TYPE_INT32)),
    "google.type.Date": (("year", 1, FD.TYPE_INT32), ("month", 2, FD.TYPE_INT32), ("day", 3, FD.TYPE_INT32)),
    "google.protobuf.Struct": (("fields", 1, FD.TYPE_MESSAGE),),
    "google.protobuf.Value": (("null_value", 1, FD.TYPE_ENUM), ("number_value", 2, FD.TYPE_DOUBLE),
                              ("string_value", 3, FD.TYPE_STRING), ("bool_value", 4, FD.TYPE_BOOL),
                              ("struct_value", 5, FD.TYPE_MESSAGE), ("list_value", 6, FD.TYPE_MESSAGE)),
    "google.protobuf.ListValue": (("values", 1, FD.TYPE_MESSAGE),),
}
_WRAPPERS = frozenset(f"google.protobuf.{name}" for name in WRAPPERS)
_JSON_KINDS = {"google.protobuf.Struct": "K_STRUCT", "google.protobuf.Value": "K_VALUE",
               "google.protobuf.ListValue": "K_LIST"}
_LEAF_KINDS = {Kind.TIMESTAMP: "K_TIMESTAMP", Kind.DURATION: "K_DURATION", Kind.DATE: "K_DATE",
               Kind.WRAPPER: "K_WRAPPER", Kind.CUT: "K_CUT"}


@dataclass(frozen=True)
class CutField:
    """How the bytes of a cut column become text: json_format of `message_class` (a map entry is rebuilt
    from its key and value, as the reference builds it)."""

    message_class: type[Message]
    entry: bool
    to_json: Callable[[Message], str]  # convert.json_writer's, chosen once


@dataclass
class Plan:
    """The plan's tables, as `_native.Plan` takes them (see _native.c for their meaning)."""

    columns: list[tuple[int, int, tuple[int, ...], int, int]] = field(default_factory=list)
    enums: list[tuple[int, tuple[int, ...], tuple[str, ...]]] = field(default_factory=list)
    messages: list[tuple[str, list[tuple[Any, ...]], int] | None] = field(default_factory=list)
    cuts: dict[int, CutField] = field(default_factory=dict)
    json_plans: dict[str, int] = field(default_factory=dict)  # Struct/Value/ListValue → type plan


class _PlanBuilder:
    """Walks the descriptor with schema.py's rules (field_kind, the same depth) beside the Arrow type the
    schema maps to, so every column of the plan is the Arrow array at the same place."""

    def __init__(self, native: ModuleType, options: SchemaOptions) -> None:
        self.n = native
        self.options = options
        self.plan = Plan()
        self._enum_ids: dict[str, int] = {}
        self._type_plans: dict[str, int] = {}

    def c(self, name: str) -> int:
        value: int = getattr(self.n, name)
        return value

    # -- columns -------------------------------------------------------------------------------------

    def column(self, kind: str, nullable: bool, children: Sequence[int] = (), enum_id: int = -1,
               enum_default: int = 0) -> int:
        self.plan.columns.append((self.c(kind), int(nullable), tuple(children), enum_id, enum_default))
        return len(self.plan.columns) - 1

    def enum(self, enum: EnumDescriptor) -> int:
        if enum.full_name not in self._enum_ids:
            names: dict[int, str] = {}
            for value in enum.values:  # aliases: the last name of a number, as convert's table has it
                names[value.number] = value.name
            numbers = tuple(sorted(names))
            self.plan.enums.append((int(enum.is_closed), numbers, tuple(names[n] for n in numbers)))
            self._enum_ids[enum.full_name] = len(self.plan.enums) - 1
        return self._enum_ids[enum.full_name]

    def scalar_column(self, fd: FieldDescriptor, arrow: pa.DataType, nullable: bool) -> int:
        """The column of a scalar (or a wrapper's value) `fd`, of Arrow type `arrow`."""
        if fd.type == FD.TYPE_ENUM:
            default = 0 if fd.is_repeated else int(fd.default_value)  # what an absent value reads as
            return self.column("C_ENUM", nullable, enum_id=self.enum(fd.enum_type), enum_default=default)
        if pa.types.is_boolean(arrow):
            return self.column("C_BOOL", nullable)
        if pa.types.is_floating(arrow):
            return self.column("C_F64", nullable)
        if pa.types.is_string(arrow) and fd.type in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
            return self.column("C_U64TXT", nullable)
        if pa.types.is_string(arrow) or pa.types.is_binary(arrow):
            return self.column("C_VAR", nullable)
        if pa.types.is_decimal(arrow):
            return self.column("C_DEC", nullable)
        if pa.types.is_int64(arrow):
            return self.column("C_I64", nullable)
        raise UnsupportedShape(f"field {fd.full_name}: no column for Arrow type {arrow}")

    # -- plans ---------------------------------------------------------------------------------------

    def reserve(self) -> int:
        self.plan.messages.append(None)
        return len(self.plan.messages) - 1

    def position(self, desc: Descriptor, depth: int, arrow: pa.StructType, entry: bool = False) -> tuple[int, list[int]]:
        """Plan of `desc` whose columns sit at `depth` with Arrow type `arrow`, and its columns. `entry`: a
        map entry, whose key and value are never NULL (a missing value is its default)."""
        plan_id = self.reserve()
        self.check_message(desc)
        fields, columns = [], []
        for i, fd in enumerate(sorted(desc.fields, key=lambda f: f.number)):
            column, spec = self.field(fd, depth, arrow.field(i), entry)
            fields.append(spec)
            columns.append(column)
        self.plan.messages[plan_id] = (desc.full_name, fields, len(desc.oneofs))
        return plan_id, columns

    def field(self, fd: FieldDescriptor, depth: int, arrow: pa.Field, entry: bool) -> tuple[int, tuple[Any, ...]]:
        kind = field_kind(fd, depth, self.options.max_depth)
        sub = -1
        nullable = fd.has_presence and not fd.is_required and not fd.is_repeated and not entry
        if is_map(fd):
            if kind is Kind.CUT:
                item = self.column("C_CUT", False)
                self.plan.cuts[item] = CutField(message_factory.GetMessageClass(fd.message_type), True,
                                                json_writer(fd.message_type))
                sub = self.type_plan(fd.message_type)
                code = "K_CUT"
            else:
                sub, children = self.position(fd.message_type, depth + 1, arrow.type.value_type, entry=True)
                item = self.column("C_STRUCT", False, children)
                code = "K_RECORD"
            column = self.column("C_LIST", False, (item,))
            return column, self.spec(fd, code, "S_MAP", column, sub)
        shape = "S_REPEATED" if fd.is_repeated else "S_SINGULAR"
        value_type = arrow.type.value_type if fd.is_repeated else arrow.type
        value, sub, code = self.value(fd, kind, depth, value_type, nullable)
        column = self.column("C_LIST", False, (value,)) if fd.is_repeated else value
        return column, self.spec(fd, code, shape, column, sub)

    def value(self, fd: FieldDescriptor, kind: Kind, depth: int, arrow: pa.DataType,
              nullable: bool) -> tuple[int, int, str]:
        """(column, sub plan, kind code) of one value of `fd`."""
        if kind is Kind.SCALAR:
            return self.scalar_column(fd, arrow, nullable), -1, "K_SCALAR"
        if kind is Kind.RECORD:
            sub, children = self.position(fd.message_type, depth + 1, arrow)
            return self.column("C_STRUCT", nullable, children), sub, "K_RECORD"
        name = fd.message_type.full_name
        if kind is Kind.JSON_STRING:
            for json_type in _JSON_KINDS:  # the three reach each other: all three plans are needed
                self.plan.json_plans[json_type] = self.type_plan(fd.message_type.file.pool.FindMessageTypeByName(json_type))
            return self.column("C_VAR", nullable), -1, _JSON_KINDS[name]
        if kind is Kind.WRAPPER:
            return self.scalar_column(scalar_field(fd), arrow, nullable), -1, "K_WRAPPER"
        if kind is Kind.CUT:
            column = self.column("C_CUT", nullable)
            self.plan.cuts[column] = CutField(message_factory.GetMessageClass(fd.message_type), False,
                                              json_writer(fd.message_type))
            return column, self.type_plan(fd.message_type), "K_CUT"
        if kind is Kind.DURATION:
            children = (self.column("C_I64", False), self.column("C_I64", False))
            return self.column("C_STRUCT", nullable, children), -1, "K_DURATION"
        return self.column("C_I32" if kind is Kind.DATE else "C_I64", nullable), -1, _LEAF_KINDS[kind]

    def type_plan(self, desc: Descriptor) -> int:
        """Plan of `desc` without columns: for bytes that are validated (upb's rules, unknown fields,
        required fields) but not written."""
        if desc.full_name in self._type_plans:
            return self._type_plans[desc.full_name]
        plan_id = self.reserve()
        self._type_plans[desc.full_name] = plan_id
        self.check_message(desc)
        fields = []
        for fd in sorted(desc.fields, key=lambda f: f.number):
            shape = "S_MAP" if is_map(fd) else "S_REPEATED" if fd.is_repeated else "S_SINGULAR"
            sub = self.type_plan(fd.message_type) if fd.type == FD.TYPE_MESSAGE else -1
            fields.append(self.spec(fd, "K_MSG" if sub >= 0 else "K_SCALAR", shape, -1, sub))
        self.plan.messages[plan_id] = (desc.full_name, fields, len(desc.oneofs))
        return plan_id

    def spec(self, fd: FieldDescriptor, kind: str, shape: str, column: int, sub: int) -> tuple[Any, ...]:
        """One field of a plan: (number, value type, kind, shape, flags, wrapper value type, oneof, column,
        sub plan, type plan, enum, name)."""
        if fd.type not in _VALUE_TYPES:
            raise UnsupportedShape(f"field {fd.full_name}: groups (delimited message encoding) are not supported")
        flags = 0
        if fd.type == FD.TYPE_STRING and _validates_utf8(fd):
            flags |= self.c("F_UTF8")
        if fd.type == FD.TYPE_ENUM and fd.enum_type.is_closed:
            flags |= self.c("F_CLOSED")
        if fd.is_required:
            flags |= self.c("F_REQUIRED")
        aux = 0
        if kind == "K_WRAPPER":
            inner = scalar_field(fd)
            aux = self.c(_VALUE_TYPES[inner.type])
            if inner.type == FD.TYPE_STRING and _validates_utf8(inner):
                flags |= self.c("F_AUX_UTF8")
        tsub = self.type_plan(fd.message_type) if fd.type == FD.TYPE_MESSAGE else -1
        oneof = fd.containing_oneof.index if fd.containing_oneof is not None else -1
        enum = self.enum(fd.enum_type) if fd.type == FD.TYPE_ENUM else -1
        return (fd.number, self.c(_VALUE_TYPES[fd.type]), self.c(kind), self.c(shape), flags, aux, oneof, column,
                sub, tsub, enum, fd.full_name)

    def check_message(self, desc: Descriptor) -> None:
        found = tuple((fd.name, fd.number, fd.type) for fd in sorted(desc.fields, key=lambda f: f.number))
        layout = _LAYOUTS.get(desc.full_name)
        if desc.full_name in _WRAPPERS:  # a wrapper is one field, `value` = 1, of whatever scalar type
            layout = (("value", 1, found[0][2]),) if found else ()
        if layout is not None and found != layout:
            raise UnsupportedShape(f"{desc.full_name} does not have the standard layout")
        if len(desc.oneofs) > 64:
            raise UnsupportedShape(f"{desc.full_name} has more than 64 oneofs")
        tracked = sum(1 for fd in desc.fields if fd.is_required or (fd.type == FD.TYPE_MESSAGE and not fd.is_repeated))
        if tracked > 1024:
            raise UnsupportedShape(f"{desc.full_name} has more than 1024 message and required fields")
        if desc.extension_ranges and desc.file.pool.FindAllExtensions(desc):
            raise UnsupportedShape(f"{desc.full_name} has extensions")


def _validates_utf8(fd: FieldDescriptor) -> bool:
    """Whether upb rejects invalid UTF-8 in this string field at parse time (proto3, or the editions
    feature); proto2 strings are not checked. protobuf has no public API for it: should the private one
    go away, the reference decoder takes over rather than the job failing."""
    try:
        return validates_utf8(fd)
    except AttributeError as exc:
        raise UnsupportedShape(f"field {fd.full_name}: this protobuf does not say whether it checks UTF-8 ({exc})") from None


def build_plan(native: ModuleType, descriptor: Descriptor, depth: int, options: SchemaOptions,
               arrow: pa.StructType) -> tuple[Plan, int, int]:
    """The plan of `descriptor` at `depth`: (tables, root plan, root column)."""
    builder = _PlanBuilder(native, options)
    root, children = builder.position(descriptor, depth, arrow)
    root_column = builder.column("C_STRUCT", True, children)
    return builder.plan, root, root_column


_FAILURE_TYPES = {1: ErrorType.DESERIALIZATION_ERROR, 2: ErrorType.INVALID_MESSAGE_ERROR}


class NativeDecoder:
    """Values of `message_class` whose columns sit at level `depth`, decoded by `_native.c`. Same
    contract and results as `ReferenceDecoder`."""

    def __init__(self, message_class: type[Message], depth: int = 1, options: SchemaOptions = SchemaOptions(),
                 confluent_framed: bool = False, detect_unknown_fields: bool = True) -> None:
        why = native_unavailable()
        if why:
            raise NativeUnavailable(why)
        native = importlib.import_module("firehose_bq.decode._native")
        descriptor = message_class.DESCRIPTOR
        self._arrow_type = arrow_struct(bigquery_fields(descriptor, depth, options))
        plan, root, root_column = build_plan(native, descriptor, depth, options, self._arrow_type)
        self._cuts = plan.cuts
        json_plans = [plan.json_plans.get(name, -1) for name in _JSON_KINDS]
        # Framed values must name this class's message indexes (registry/confluent.py frame_payload).
        frame = message_indexes(descriptor) if confluent_framed else None
        self._plan = native.Plan(plan.columns, plan.enums, plan.messages, root, root_column, *json_plans,
                                 frame, detect_unknown_fields)
        self._reference_args = (message_class, depth, options, confluent_framed, detect_unknown_fields)
        self._reference: Any = None
        self.escaped_rows = 0  # rows handed to the reference decoder so far (see the module doc)

    @property
    def arrow_type(self) -> pa.StructType:
        return self._arrow_type

    def decode(self, values: pa.Array) -> DecodedValues:
        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            raise TypeError(f"values must be a binary array, not {values.type}")
        try:
            return self._decode(values)
        except OverflowError:
            # a column of this batch would pass Arrow's 2 GiB offsets: decode it in halves
            if len(values) < 2:
                raise
            half = len(values) // 2
            return _concatenated(self.decode(values.slice(0, half)), self.decode(values.slice(half)), half)

    def _decode(self, values: pa.Array) -> DecodedValues:
        validity, offsets, data = values.buffers()[:3]
        batch = self._plan.decode(len(values), values.offset, validity.address if validity is not None else 0,
                                  offsets.address if offsets is not None else 0,
                                  data.address if data is not None else 0, data.size if data is not None else 0,
                                  pa.types.is_large_binary(values.type))
        failures, unknown, escapes, cuts = batch.results()
        out = DecodedValues(pa.array([], self._arrow_type),
                            [RowError(row, _FAILURE_TYPES[kind], text) for row, kind, text in failures], unknown)
        texts = self._cut_texts(cuts, out.failures)
        values_array = pa.Array._import_from_c(batch.export(texts, sorted({f.index for f in out.failures})),
                                               self._arrow_type)
        out.values = values_array
        if escapes:
            self._escaped(values, escapes, out)
        out.failures.sort(key=lambda f: f.index)
        return out

    def _cut_texts(self, cuts: list[tuple[int, int, int, bytes]], failures: list[RowError]) -> list[bytes | None]:
        """json_format text of each cut value; a value json_format refuses fails its row, as in the reference."""
        texts: list[bytes | None] = []
        failed: set[int] = set()
        for column, row, _kind, data in cuts:
            if row in failed:
                texts.append(None)
                continue
            cut = self._cuts[column]
            try:
                msg = cut.message_class.FromString(data)
                # an entry is rebuilt, as the reference builds it: a missing message value becomes set
                text = (_entry_json(cut.message_class, msg.key, msg.value, cut.to_json)  # type: ignore[attr-defined]
                        if cut.entry else cut.to_json(msg))
                texts.append(text.encode())
            except (DecodeError, *_INVALID) as exc:
                kind = ErrorType.DESERIALIZATION_ERROR if isinstance(exc, DecodeError) else ErrorType.INVALID_MESSAGE_ERROR
                failures.append(RowError(row, kind, str(exc) or type(exc).__name__))
                failed.add(row)
                texts.append(None)
        return texts

    def _escaped(self, values: pa.Array, escapes: list[int], out: DecodedValues) -> None:
        """Decode the escaped rows with the reference decoder and put them in their places."""
        if self._reference is None:
            from firehose_bq.decode.reference import ReferenceDecoder

            self._reference = ReferenceDecoder(*self._reference_args)
        self.escaped_rows += len(escapes)
        sub = self._reference.decode(values.take(pa.array(escapes, pa.int64())))
        out.failures.extend(RowError(escapes[f.index], f.error_type, f.message) for f in sub.failures)
        out.unknown_fields = sorted(out.unknown_fields + [escapes[i] for i in sub.unknown_fields])
        n = len(out.values)
        positions = list(range(n))
        for j, row in enumerate(escapes):
            positions[row] = n + j
        out.values = pa.concat_arrays([out.values, sub.values]).take(pa.array(positions, pa.int64()))


def _concatenated(first: DecodedValues, second: DecodedValues, offset: int) -> DecodedValues:
    """Two decoded halves as one batch (the second's indexes shifted by `offset`)."""
    return DecodedValues(
        pa.concat_arrays([first.values, second.values]),
        first.failures + [RowError(f.index + offset, f.error_type, f.message) for f in second.failures],
        first.unknown_fields + [i + offset for i in second.unknown_fields],
    )
