"""Open enums' numbers that the descriptors do not name, found in decoded rows: a reason to refresh.

A proto3 (open) enum keeps a number its descriptor does not declare, and both decoders write it as its
decimal text ("2"), the name being unknown. A producer ahead of the sink (`SHIPPED = 2` added) would so
get rows holding "2" beside later rows holding "SHIPPED" for the same value, without a word. Enum value
names are identifiers, so a value starting with a digit or '-' is such a number. A task that holds for
unknown fields holds for these too (core.py): the registry refresh names them, and only a number still
unknown after it is written as its text. The same goes for the Kafka key when it is a message of its own
(INPUT_SCHEMA_PROTO_KEY_CLASS): a key's number named later is another key in upsert/delete.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from firehose_bq.convert import reaches
from firehose_bq.schema import Kind, SchemaOptions, column_name, field_kind

NUMBER = "^-?[0-9]"  # no enum value name starts so


class EnumNumbers:
    """Finds the rows of one message type's decoded values that hold an enum number as text. `depth`: the
    level its columns sit at, as decoded (make_value_decoder's: 1 the value's, 2 the Kafka key's)."""

    def __init__(self, message: Descriptor, options: SchemaOptions, depth: int = 1) -> None:
        self._message, self._options, self._depth = message, options, depth
        self._has_enums = _holds_enum(message)

    def has_enums(self) -> bool:
        return self._has_enums

    def rows(self, values: pa.StructArray) -> list[int]:
        """Indices of `values` (NULL slots never) with an enum number at any depth."""
        if not self.has_enums():
            return []
        hits: list[np.ndarray] = []
        self._walk(values, np.arange(len(values)), self._message, self._depth, hits)
        return sorted(set(np.concatenate(hits).tolist())) if hits else []

    def _walk(self, struct: pa.Array, rows: np.ndarray, message: Descriptor, depth: int,
              hits: list[np.ndarray]) -> None:
        children = dict(zip(struct.type.names, struct.flatten(), strict=True))  # the parent's NULLs applied
        for fd in message.fields:
            kind = field_kind(fd, depth, self._options.max_depth)
            if not _worth_a_look(fd, kind):
                continue
            array, at = children[column_name(fd, self._options.sanitize_names)], rows
            if fd.is_repeated:  # maps too: a list of (key, value) entries
                at = rows[pc.list_parent_indices(array).to_numpy(zero_copy_only=False)]
                array = pc.list_flatten(array)
            if kind is Kind.MAP:
                value = fd.message_type.fields_by_name["value"]
                value_kind = field_kind(value, depth + 1, self._options.max_depth)
                if not _worth_a_look(value, value_kind):
                    continue
                fd, kind, depth_of_value = value, value_kind, depth + 1
                array = dict(zip(array.type.names, array.flatten(), strict=True))[
                    column_name(value, self._options.sanitize_names)]
            else:
                depth_of_value = depth
            if kind is Kind.SCALAR:
                found = pc.fill_null(pc.match_substring_regex(array, NUMBER), False).to_numpy(zero_copy_only=False)
                if found.any():
                    hits.append(at[found])
            else:  # a RECORD holding an enum somewhere
                self._walk(array, at, fd.message_type, depth_of_value + 1, hits)


def _worth_a_look(fd: FieldDescriptor, kind: Kind) -> bool:
    if kind is Kind.SCALAR:
        return fd.type == FieldDescriptor.TYPE_ENUM and not fd.enum_type.is_closed
    if kind is Kind.RECORD:
        return _holds_enum(fd.message_type)
    if kind is Kind.MAP:
        value = fd.message_type.fields_by_name["value"]
        return value.type == FieldDescriptor.TYPE_ENUM or (value.message_type is not None
                                                           and _holds_enum(value.message_type))
    return False  # JSON text, timestamps, wrappers, cut RECORDs: no enum column


def _holds_enum(message: Descriptor) -> bool:
    """Whether an open enum field sits anywhere below `message`."""
    return reaches(message, lambda desc: any(fd.type == FieldDescriptor.TYPE_ENUM and not fd.enum_type.is_closed
                                             for fd in desc.fields))
