"""Protobuf bytes → row values, through Python code generated once per message descriptor: the converter
of the reference decoder (`decode/reference.py`), which builds Arrow columns from what it returns.

Compilation walks the descriptor once and writes the source of one function per (message type, depth):
a single dict display that reads each field as an attribute and converts it inline, so converting a
message runs no descriptor reflection and almost no Python calls (see `_Compiler` for why it is source
text and how names from the descriptor are kept out of it).

Values are what pyarrow builds the table's Arrow types from: TIMESTAMP as microseconds since the epoch,
DATE as days since it, BYTES as bytes, a uint64 NUMERIC as a Decimal, enums by name (an enum number the
descriptor does not know is kept as its decimal string, never dropped), maps as key/value records,
wrappers as their value, and Struct/Value/ListValue and message fields at the max depth as their proto
JSON text.

Proto3 scalars without presence are written with their value even when it is the default (0, "",
false): in proto3 an unset scalar *is* the default. Fields with presence (messages, `optional`,
oneof members) are NULL when unset.
"""

from __future__ import annotations

import gc
import keyword
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from decimal import Decimal
from json.encoder import encode_basestring_ascii
from typing import Any, NoReturn

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pb2 import FeatureSet
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from firehose_bq.registry.confluent import WireFormatError, frame_payload, message_indexes
from firehose_bq.schema import UNSIGNED_64, Kind, SchemaOptions, column_name, field_kind, is_map, scalar_field

Row = dict[str, Any]

FD = FieldDescriptor
_EPOCH_DATE = date(1970, 1, 1)
_VALUE = "google.protobuf.Value"
# The message fields of the well-known types whose column is their JSON text (_JSON_TEXT): a path through
# them is JSON's (_messages)
_JSON_INNER = frozenset({"google.protobuf.Struct.fields", f"{_VALUE}.struct_value", f"{_VALUE}.list_value",
                         "google.protobuf.ListValue.values"})


class _EnumNames(dict[int, str]):
    """Enum number → name; a number the descriptor does not know is its decimal string."""

    def __missing__(self, number: int) -> str:
        return str(number)


def _json(msg: Message) -> str:
    # Proto field names, as in the columns around it (not JSON's lowerCamelCase). An Any inside is
    # unpacked through the message's own pool, the job's descriptors: the default pool lacks their types.
    return json_format.MessageToJson(msg, indent=None, sort_keys=True, preserving_proto_field_name=True,
                                     descriptor_pool=msg.DESCRIPTOR.file.pool)


def _checked_json(msg: Message) -> str:
    # json_format writes a non-UTF-8 proto2 string (which upb hands as bytes) as its Python repr, "b'..'":
    # the row fails instead, as it does when the string has a column of its own.
    if path := non_utf8_string(msg):
        raise ValueError(f"{path}: invalid UTF-8 in a string field of {msg.DESCRIPTOR.full_name} (a column of "
                         "JSON text); JSON and STRING columns hold UTF-8 only")
    return _cut_json(msg)


def _cut_json(msg: Message) -> str:
    try:
        return _json(msg)
    except (json_format.Error, ValueError) as exc:
        # json_format refuses NaN and ±Infinity in a google.protobuf.Value without saying where
        if (path := non_finite_number(msg)) is None:
            raise
        raise ValueError(f"{path}: {exc} (in {msg.DESCRIPTOR.full_name}, a column of JSON text)") from None


def json_writer(descriptor: Descriptor) -> Callable[[Message], str]:
    """The JSON text of a message of `descriptor` cut to a STRING column: json_format, after a look for
    strings that are not UTF-8 where the type can hold them (proto2), so proto3 types pay nothing. Chosen
    once per column, not cached by descriptor: every task builds its own pool, a cache would keep them."""
    return _checked_json if _unvalidated_strings(descriptor) else _cut_json


def _entry_json(entry_class: type[Message], key: Any, value: Any, to_json: Callable[[Message], str]) -> str:
    """The JSON text of a cut map's entry, rebuilt from its key and value (a missing message value
    becomes set, as upb's map holds it). upb hands a non-UTF-8 proto2 string key or value as bytes, which
    the entry's constructor refuses in words naming nothing."""
    fields = entry_class.DESCRIPTOR.fields_by_name
    for name, item in (("key", key), ("value", value)):
        if isinstance(item, bytes) and fields[name].type == FD.TYPE_STRING:
            raise ValueError(f"{name}: invalid UTF-8 in a string field of {entry_class.DESCRIPTOR.full_name} (a "
                             "column of JSON text); JSON and STRING columns hold UTF-8 only")
    return to_json(entry_class(key=key, value=value))


def validates_utf8(fd: FieldDescriptor) -> bool:
    """Whether upb rejects invalid UTF-8 in string field `fd` at parse time (proto3, or the editions
    feature); proto2 strings are not checked. Raises AttributeError should protobuf's private API for it
    go away (protobuf has no public one)."""
    return bool(fd._GetFeatures().utf8_validation == FeatureSet.VERIFY)  # noqa: SLF001


def reaches(descriptor: Descriptor, test: Callable[[Descriptor], bool]) -> bool:
    """Whether `test` holds for `descriptor` or a message type reachable from it through its fields."""
    seen: set[str] = set()
    todo = [descriptor]
    while todo:
        desc = todo.pop()
        if desc.full_name in seen:
            continue
        seen.add(desc.full_name)
        if test(desc):
            return True
        todo.extend(fd.message_type for fd in desc.fields if fd.message_type is not None)
    return False


def _unvalidated_strings(descriptor: Descriptor) -> bool:
    """Whether a message of `descriptor` can hold, at any depth, a string upb did not check for UTF-8."""
    return reaches(descriptor, lambda desc: any(fd.type == FD.TYPE_STRING and not _checks_utf8(fd)
                                                 for fd in desc.fields))


def _checks_utf8(fd: FieldDescriptor) -> bool:
    try:
        return validates_utf8(fd)
    except AttributeError:
        return False  # cannot tell: look


def _messages(msg: Message, prefix: str = "") -> Iterator[tuple[str, Message, list[tuple[FieldDescriptor, Any]]]]:
    """`msg` and every message inside it, at any depth, each with the prefix of the paths of its fields
    (`a.b[0].`, `m['k'].`) and its set fields (ListFields: listed once, for the caller and the walk):
    parents first, fields in number order, map entries by key.

    Inside a Struct, Value or ListValue the path is JSON's (`attrs['k'][0].`), not the types' own fields
    (`attrs.fields['k'].list_value.values[0].`). Map entries whose key upb hands as bytes (a proto2 string
    key that is not UTF-8) are left out: upb cannot look their values up, and they fail the row anyway."""
    fields = msg.ListFields()
    yield prefix, msg, fields
    for fd, value in fields:
        if fd.message_type is None:
            continue
        name = prefix[:-1] if fd.full_name in _JSON_INNER else prefix + fd.name
        if is_map(fd):
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for key in sorted(k for k in value if not isinstance(k, bytes)):
                    yield from _messages(value[key], f"{name}[{key!r}].")
        elif fd.is_repeated:
            for i, item in enumerate(value):
                yield from _messages(item, f"{name}[{i}].")
        else:
            yield from _messages(value, f"{name}.")


def non_utf8_string(msg: Message) -> str | None:
    """The path (`a.b[0].c`, `m['k']`, `m.key`) of the first string in `msg`, at any depth, that is not
    UTF-8 (upb hands an unchecked proto2 string's bytes as they are); None when there is none."""
    for prefix, _, fields in _messages(msg):
        for fd, value in fields:
            if fd.type == FD.TYPE_STRING:
                if not fd.is_repeated:
                    if isinstance(value, bytes):
                        return prefix + fd.name
                    continue
                for i, item in enumerate(value):
                    if isinstance(item, bytes):
                        return f"{prefix}{fd.name}[{i}]"
            elif is_map(fd):
                key, val = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
                for k in value:
                    if key.type == FD.TYPE_STRING and isinstance(k, bytes):
                        return f"{prefix}{fd.name}.key"
                    if val.type == FD.TYPE_STRING and isinstance(value[k], bytes):
                        return f"{prefix}{fd.name}[{k!r}]"
    return None


def non_finite_number(msg: Message) -> str | None:
    """The path (`payload.attrs['k'][0]`) of the first google.protobuf.Value in `msg`, at any depth, holding
    NaN or ±Infinity, which JSON (the text of its column) cannot hold; None when there is none."""
    for prefix, message, _ in _messages(msg):
        if message.DESCRIPTOR.full_name == _VALUE and message.HasField("number_value") \
                and not math.isfinite(message.number_value):
            return prefix[:-1]
    return None


def non_utf8_problem(path: str) -> str:
    """The failure of a row whose string at `path` is not UTF-8 (upb does not check proto2 strings)."""
    return f"{path}: invalid UTF-8 in a string field; a STRING column holds UTF-8 only"


def _days(d: Message) -> int:
    """A google.type.Date as days since the epoch."""
    try:
        day = date(d.year, d.month, d.day)
    except ValueError as exc:  # google.type.Date allows year-less or day-less dates; a DATE does not
        raise ValueError(f"google.type.Date {d.year}-{d.month}-{d.day} is not a valid DATE: {exc}") from None
    return (day - _EPOCH_DATE).days


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


# google.protobuf.Struct/Value/ListValue → the text `_json` gives them (json.dumps with sort_keys, ASCII
# escapes, ", " and ": "), written directly: json_format first builds Python objects through its
# reflection-based printer, which cost more than all the other columns of a row together.

class NonFiniteNumber(ValueError):
    """NaN or ±Infinity in a google.protobuf.Value of a JSON column, in json_format's words; raised where the
    Value's path is not known: the decoder adds it (`non_finite_number`)."""


def _refused(msg: Message) -> NoReturn:
    """json_format's refusal of `msg`, which holds NaN or ±Infinity, as a NonFiniteNumber."""
    try:
        _json(msg)
    except (json_format.Error, ValueError) as exc:  # protobuf 7 raises a plain ValueError for these
        raise NonFiniteNumber(str(exc)) from None
    raise AssertionError(f"json_format wrote a {msg.DESCRIPTOR.full_name} holding a number JSON cannot hold")


def _struct_text(struct: Message) -> str:
    try:
        return _struct_body(struct)
    except ValueError:  # NaN or ±Infinity
        _refused(struct)


def _value_text(value: Message) -> str:
    try:
        return _value_body(value)
    except ValueError:
        _refused(value)


def _list_text(values: Message) -> str:
    try:
        return _list_body(values)
    except ValueError:
        _refused(values)


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
    _VALUE: _value_text,
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

    def __init__(self, options: SchemaOptions) -> None:
        self.options = options
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
            return (f"({self.const(_micros, 'timestamp')}({t}.seconds, {t}.nanos) if {in_range} "
                    f"else {self.const(_bad_timestamp, 'bad')}({t}))")
        if kind is Kind.DURATION:
            t = self.temp()
            in_range = (f"-{DURATION_MAX_SECONDS} <= ({t} := {src}).seconds <= {DURATION_MAX_SECONDS} "
                        f"and -{NANOS_MAX} <= {t}.nanos <= {NANOS_MAX} "
                        f"and ({t}.seconds <= 0 or {t}.nanos >= 0) and ({t}.seconds >= 0 or {t}.nanos <= 0)")
            return (f"({{'seconds': {t}.seconds, 'nanos': {t}.nanos}} if {in_range} "
                    f"else {self.const(_bad_duration, 'bad')}({t}))")
        if kind is Kind.DATE:
            return f"{self.const(_days, 'date')}({src})"
        if kind is Kind.JSON_STRING:
            return f"{self.const(_JSON_TEXT[fd.message_type.full_name], 'json')}({src})"
        assert kind is Kind.CUT and not is_map(fd), kind  # maps are converted whole, in `field`
        return f"{self.const(json_writer(fd.message_type), 'json')}({src})"

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
        return src

    def unsigned_64(self) -> str:
        """The function writing a uint64/fixed64 value in its column's type (SchemaOptions.uint64_type)."""
        column_type = self.options.uint64_type
        if column_type == "STRING":
            return self.const(str, "str")
        if column_type == "NUMERIC":
            return self.const(Decimal, "numeric")
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
            return None
        if kind is Kind.RECORD:
            return self.message(fd.message_type, depth + 1)
        return self.define("element", "v", [], self.value(fd, depth, "v"))

    def map_fn(self, fd: FieldDescriptor, depth: int) -> str:
        """A function turning a whole map into its sorted list of key/value records (or JSON texts)."""
        entry = fd.message_type.fields_by_name
        if field_kind(fd, depth, self.options.max_depth) is Kind.CUT:
            entry_class = message_factory.GetMessageClass(fd.message_type)
            return self.define("map", "entries", [], f"[{self.const(_entry_json, 'entry_json')}("
                                                     f"{self.const(entry_class, 'entry')}, k, entries[k], "
                                                     f"{self.const(json_writer(fd.message_type), 'json')}) "
                                                     "for k in _sorted(entries)]")
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
                    options: SchemaOptions = SchemaOptions()) -> Callable[[Message], Row]:
    """A function turning a message of `descriptor` into a row dict (its fields at `depth`), each value in
    the Python form of its column's Arrow type."""
    compiler = _Compiler(options)
    name = compiler.message(descriptor, depth)
    return compiler.build()[name]


# What decoding or converting one message may raise, by what it says about the message. Anything else
# is a bug of the sink, not of the message, and propagates.
_UNDECODABLE = (DecodeError, WireFormatError)
# e.g. a Timestamp out of range, a partial Date, an Any whose type no descriptor knows (cut to JSON)
_INVALID = (ValueError, OverflowError, OSError, TypeError, json_format.Error)
_MESSAGE_FAULTS = _UNDECODABLE + _INVALID


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


def _parser(message_class: type[Message], confluent_framed: bool) -> Callable[[bytes], Message]:
    """bytes → message. Raises DecodeError (or WireFormatError: a malformed Confluent frame, or one naming
    another message type) for bytes that do not parse, ValueError
    for a proto2 message that lacks required fields."""
    parse = message_class.FromString
    # upb parses proto2 messages that lack `required` fields; checking costs a C call per message, so
    # only message types that have such fields pay it.
    if reaches(message_class.DESCRIPTOR, lambda desc: any(fd.is_required for fd in desc.fields)):
        parse_partial = parse

        def parse(data: bytes) -> Message:
            msg = parse_partial(data)
            if not msg.IsInitialized():
                if missing := missing_required(msg):
                    raise ValueError(f"required field(s) missing: {', '.join(missing)}")
                # what is missing sits under a map key that is not UTF-8, which hides it from Python
                raise ValueError(non_utf8_problem(non_utf8_string(msg) or "a map key"))
            return msg

    if confluent_framed:
        parse_payload = parse
        # A frame naming another message of the schema is refused (WireFormatError), never parsed as this one.
        expected, name = message_indexes(message_class.DESCRIPTOR), message_class.DESCRIPTOR.full_name
        return lambda data: parse_payload(data[frame_payload(data, expected, name):])
    return parse


def missing_required(msg: Message) -> list[str]:
    """Paths of the proto2 `required` fields `msg` lacks, at any depth (`items[0].id`, `by_key['k'].id`).

    Not upb's FindInitializationErrors: with a map field present, protobuf 7.36's upb builds wrong paths
    and can read past its buffers (a segfault, e.g. testdata.Proto2All from bytes 4a002200), which a
    producer's bad message must never cause. What sits under a map key that is not UTF-8 cannot be looked
    up (`_messages`): that key fails the row instead (_parser)."""
    return [prefix + fd.name for prefix, message, _ in _messages(msg) for fd in message.DESCRIPTOR.fields
            if fd.is_required and not message.HasField(fd.name)]


def _has_unknown_fields(msg: Message) -> bool:
    """Whether `msg` carried fields its descriptor lacks; drops them. Exact and recursive: unknown fields
    are what discarding them takes out of the encoding."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return msg.ByteSize() != size


def unknown_fields_check(descriptor: Descriptor) -> Callable[[Message], bool]:
    """What flags a message of `descriptor` as holding fields the table has no column for, dropping them:
    unknown fields, and for a type that can hold known extensions (proto2 `extend`) their values as well,
    which would otherwise vanish without a word (decode/unknown.py keeps both in additional_properties)."""
    if not reaches(descriptor, lambda desc: bool(desc.extension_ranges and desc.file.pool.FindAllExtensions(desc))):
        return _has_unknown_fields
    return lambda msg: _take_extensions(msg) | _has_unknown_fields(msg)  # both: each drops what it finds


def _take_extensions(msg: Message) -> bool:
    """Whether `msg`, or a message inside it, has an extension set; clears them all.

    Its own walk, not `_messages`: it runs on every message of a type with extensions, and building the
    paths it has no use for made it half again slower (bench: 48 µs → 72 µs for a 40-message tree)."""
    found = False
    for fd, value in msg.ListFields():
        if fd.is_extension:
            msg.ClearExtension(fd)
            found = True
        elif fd.message_type is None:
            continue
        elif is_map(fd):
            if fd.message_type.fields_by_name["value"].message_type is not None:
                found = any([_take_extensions(value[key]) for key in value]) or found
        elif fd.is_repeated:
            found = any([_take_extensions(item) for item in value]) or found
        else:
            found = _take_extensions(value) or found
    return found
