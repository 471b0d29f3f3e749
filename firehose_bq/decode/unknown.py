"""Protobuf unknown fields → the JSON object of the `additional_properties` column.

With SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE, a message carrying fields the job's descriptor lacks (a
producer on a newer proto than the registry has) keeps their raw values in the STRING column
`additional_properties`, so the column added later can be backfilled from it with JSON functions. The
decoders only flag such rows (`DecodedValues.unknown_fields`, in their one pass over the batch); this
module parses just those values once more with protobuf's runtime and writes what upb kept as unknown, so
rows without unknown fields never pay for it.

The encoding (stable; README "Decoding" documents it for users):

- a message is an object: each unknown field number (as a string key, ascending) → the list of its
  values in wire order (a field may occur many times), a set extension's number among them (the table has
  no column for it), then each known field whose value holds unknown fields below it, by its proto field
  name (a known extension as `[full.name]`);
- a value by wire type: varint → the unsigned 64-bit integer as on the wire (an int32/int64 -1 is
  18446744073709551615; a sint's zigzag is not undone: the type is unknown); fixed64 / fixed32 → the
  unsigned integer of its 8 / 4 little-endian bytes (a double's or float's bits); length-delimited →
  standard padded base64 of the bytes (a string, bytes, a nested message or a packed run: the type is
  unknown, so it stays lossless); a group → an object of its fields, encoded the same way;
- a repeated message field → a list with one object per element, by position (`{}` for elements without
  unknown fields); a map with message values → an object by map key (its text: `true`/`false`, decimal,
  or the string), with only the entries holding unknown fields.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import empty_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from firehose_bq.convert import _MESSAGE_FAULTS, _parser
from firehose_bq.errors import ErrorType, RowError
from firehose_bq.schema import is_map

LEN, START_GROUP = 2, 3  # protobuf wire types; varint (0), fixed64 (1) and fixed32 (5) are integers
MAP, LIST, ONE = "map", "list", "one"  # how a message field holds its messages


class UnknownFieldsJson:
    """Encodes the unknown fields of `message_class` values (Confluent-framed or not) as JSON text."""

    def __init__(self, message_class: type[Message], confluent_framed: bool = False) -> None:
        self._parse = _parser(message_class, confluent_framed)
        # Per message type met: its message fields' JSON keys and shapes (`_plan`). Asking the descriptor
        # each time, or ListFields (which builds every scalar's Python value), costs more than the walk.
        self._plans: dict[Descriptor, Plan | None] = {}

    def encode(self, value: bytes) -> str | None:
        """The JSON object of `value`'s unknown fields at every depth; None when it has none."""
        tree = self.tree(self._parse(value))
        return json.dumps(tree, ensure_ascii=False, separators=(",", ":")) if tree else None

    def column(self, values: pa.Array, rows: Sequence[int]) -> tuple[pa.StringArray, list[RowError]]:
        """One slot per input of `values`: the JSON of inputs `rows`, NULL elsewhere; an input of `rows`
        that does not parse here (the decoder parsed it: a divergence, never expected) fails as data."""
        if not rows:
            return pa.nulls(len(values), pa.string()), []
        texts: list[str | None] = []
        failures = []
        for i in rows:
            try:
                texts.append(self.encode(values[i].as_py()))
            except (*_MESSAGE_FAULTS, UnicodeError) as exc:
                texts.append(None)
                failures.append(RowError(i, ErrorType.DESERIALIZATION_ERROR,
                                         f"unknown fields for additional_properties: {exc or type(exc).__name__}"))
        # Scattered in Arrow: every other slot points at the NULL after the flagged rows' texts.
        positions = np.full(len(values), len(texts), dtype=np.int64)
        positions[np.asarray(rows, dtype=np.int64)] = np.arange(len(texts))
        return pa.array(texts + [None], pa.string()).take(pa.array(positions)), failures

    def tree(self, msg: Message) -> dict[str, Any]:
        """`msg`'s unknown fields, and those of the messages inside it, as the module docstring says."""
        tree: dict[str, Any] = _field_set(UnknownFieldSet(msg))
        if msg.DESCRIPTOR.extension_ranges and (extensions := _extension_values(msg)):
            tree = {str(n): v for n, v in sorted({int(k): v for k, v in {**tree, **extensions}.items()}.items())}
        for name, kind, value in self._messages(msg):
            below: Any
            if kind == MAP:
                # upb's map order is a hash order: by key, like the decoders' map columns.
                below = {_map_key(k): sub for k in sorted(value) if (sub := self.tree(value[k]))}
            elif kind == LIST:
                below = [self.tree(item) for item in value]
                below = below if any(below) else None
            else:
                below = self.tree(value)
            if below:
                tree[name] = below
        return tree

    def _messages(self, msg: Message) -> list[tuple[str, str, Any]]:
        """The message-holding fields `msg` has set: JSON key, shape, value."""
        desc = msg.DESCRIPTOR
        if desc not in self._plans:
            self._plans[desc] = None if desc.extension_ranges else tuple(
                (fd.name, *shape) for fd in desc.fields if fd.message_type is not None and (shape := _shape(fd)))
        plan = self._plans[desc]
        if plan is None:  # extensions may be set: only ListFields lists them
            return [(shape[0], shape[1], value) for fd, value in msg.ListFields()
                    if fd.message_type is not None and (shape := _shape(fd))]
        present = []
        for field, name, kind in plan:
            if kind == ONE:
                if msg.HasField(field):
                    present.append((name, kind, getattr(msg, field)))
            elif value := getattr(msg, field):
                present.append((name, kind, value))
        return present


# A message type's message fields: attribute name, JSON key, shape.
Plan = tuple[tuple[str, str, str], ...]


def _shape(fd: FieldDescriptor) -> tuple[str, str] | None:
    """A message field's JSON key and shape; None for a map of scalars (nothing unknown can hide there
    that upb does not keep in the parent)."""
    name = f"[{fd.full_name}]" if fd.is_extension else fd.name
    if is_map(fd):
        return (name, MAP) if fd.message_type.fields_by_name["value"].message_type is not None else None
    return name, LIST if fd.is_repeated else ONE


def _extension_values(msg: Message) -> dict[str, Any]:
    """The extensions set on `msg` itself, encoded as its unknown fields are: the table has no column for
    them either. Their wire values, read back as unknown fields of a message that declares none."""
    numbers = {fd.number for fd, _ in msg.ListFields() if fd.is_extension}
    if not numbers:
        return {}
    carrier = empty_pb2.Empty()
    carrier.MergeFromString(msg.SerializePartialToString())
    return {number: values for number, values in _field_set(UnknownFieldSet(carrier)).items()
            if int(number) in numbers}


def _field_set(fields: UnknownFieldSet) -> dict[str, Any]:
    by_number: dict[int, list[Any]] = {}
    for f in fields:
        by_number.setdefault(f.field_number, []).append(_value(f.wire_type, f.data))
    return {str(n): by_number[n] for n in sorted(by_number)}


def _value(wire_type: int, data: Any) -> Any:
    if wire_type == LEN:
        return base64.b64encode(data).decode("ascii")
    if wire_type == START_GROUP:
        return _field_set(data)
    return data  # VARINT, I64, I32: upb hands the unsigned integer


def _map_key(key: object) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)
