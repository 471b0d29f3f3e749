"""Changelog keys that BigQuery cannot hold exactly: a Timestamp finer than a microsecond.

The key column keeps microseconds (TIMESTAMP), so the decoders cut a key Timestamp's nanoseconds past
them, and two Kafka keys differing only there become one key: the MERGE groups and matches by the key's
columns, and one key's record would overwrite or delete the other key's row. Such a key is refused, as a
key with unknown fields is (rows.py). Only key classes with a Timestamp field pay for the check: those
keys are parsed once more (keys are small), every other key class is never looked at.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

TIMESTAMP = "google.protobuf.Timestamp"


def _timestamp_paths(descriptor: Descriptor, path: tuple[str, ...] = (),
                     seen: frozenset[str] = frozenset()) -> Iterator[tuple[str, ...]]:
    """Paths of the singular Timestamp fields, through singular message fields (repeated key fields are
    refused by the MERGE plan; a recursive message is followed once)."""
    for f in descriptor.fields:
        if f.type != FieldDescriptor.TYPE_MESSAGE or f.is_repeated:
            continue
        if f.message_type.full_name == TIMESTAMP:
            yield (*path, f.name)
        elif f.message_type.full_name not in seen:
            yield from _timestamp_paths(f.message_type, (*path, f.name), seen | {descriptor.full_name})


class SubMicrosecondKeys:
    """Finds the keys of a batch whose Timestamp fields hold nanoseconds past the microsecond."""

    def __init__(self, key_class: type[Message], paths: list[tuple[str, ...]]) -> None:
        self._key_class = key_class
        self._paths = paths

    @classmethod
    def of(cls, key_class: type[Message]) -> SubMicrosecondKeys | None:
        """The check for `key_class`, or None when it has no Timestamp field (nothing to check)."""
        paths = list(_timestamp_paths(key_class.DESCRIPTOR))
        return cls(key_class, paths) if paths else None

    def refused(self, keys: pa.Array, skip: np.ndarray) -> list[tuple[int, str]]:
        """(index, message) of each key, but those in `skip` (failed or NULL already), that cannot be kept."""
        found = []
        for i in np.flatnonzero(~skip):
            try:
                key = self._key_class.FromString(keys[int(i)].as_py())
            except DecodeError:
                continue  # the decoders refused it already; `skip` holds it
            for path in self._paths:
                nanos = _nanos(key, path)
                if nanos % 1000:
                    found.append((int(i), f"key: {'.'.join(path)} has nanos {nanos}, finer than the microsecond "
                                          "BigQuery keeps; keys differing only past it would be merged into one row"))
                    break
        return found


def _nanos(message: Message, path: tuple[str, ...]) -> int:
    for name in path[:-1]:
        if not message.HasField(name):
            return 0
        message = getattr(message, name)
    return getattr(message, path[-1]).nanos if message.HasField(path[-1]) else 0
