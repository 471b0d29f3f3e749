"""Kafka records (the source's Arrow batch) → table rows (Arrow), with failures by record index.

The value decoder turns the `value` column into one struct slot per record; this module adds what
the table holds besides the message: the Kafka key as the RECORD `message_key` (decoded the same way)
and the Kafka metadata columns, all built column-wise in Arrow from the source's own columns; with
additional_properties on, the unknown fields of the records the decoder flagged (decode/unknown.py). Both
decoders flag unknown fields, the key's as the value's: a key cut short is a different key. A
Confluent-framed value must carry the schema id of a version of its subject (`SchemaIds`), checked here
once for both decoders (which check the frame's message indexes). Records
that failed are left out of `Rows`; each becomes a `RowError` naming its index in the source batch,
which is how a row is identified from here to the policy (`Rows.sources`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from firehose_bq.arrow_schema import TIMESTAMP, arrow_field
from firehose_bq.batch.enums import EnumNumbers
from firehose_bq.batch.keys import SubMicrosecondKeys
from firehose_bq.decode import ValueDecoder
from firehose_bq.decode.unknown import UnknownFieldsJson
from firehose_bq.errors import ErrorType, RowError
from firehose_bq.registry.confluent import (NOT_DECLARED, WireFormatError, another_message_type, encode_frame,
                                            parse_frame, shown_indexes)
from firehose_bq.schema import ADDITIONAL_PROPERTIES, KEY_COLUMN, METADATA_COLUMNS, MetadataColumns

TOMBSTONE = "null value (a tombstone); only an upsert/delete sink can apply it"
NULL_KEY = "null key; a changelog (upsert/delete) needs a key per record"
KEY_UNKNOWN = ("key: fields that no known descriptor version has; a changelog (upsert/delete) merges by the whole "
               "key, so one cut short would merge into another key's row")

# Kafka's TimestampType ids (0 CreateTime, 1 LogAppendTime); anything else is NoTimestampType.
TIMESTAMP_TYPE_NAMES = pa.array(["CreateTime", "LogAppendTime", "NoTimestampType"])


def insert_ids(source: pa.RecordBatch) -> pa.Array:
    """`topic_partition_offset` of every record: the insertId BigQuery drops replayed duplicates by."""
    return pc.binary_join_element_wise(source["topic"], pc.cast(source["partition"], pa.string()),
                                       pc.cast(source["offset"], pa.string()), "_")


def _non_negative(column: pa.Array) -> pa.Array:
    """Kafka says "none" with -1: such values (and NULLs) become NULL."""
    return pc.if_else(pc.less(column, 0), pa.scalar(None, column.type), column)


def _timestamps(source: pa.RecordBatch, load_time_us: int) -> pa.Array:
    raw = source["timestamp"]
    return pc.if_else(pc.less(raw.cast(pa.int64()), 0), pa.scalar(None, TIMESTAMP), raw.cast(TIMESTAMP))


def _timestamp_types(source: pa.RecordBatch, load_time_us: int) -> pa.Array:
    kinds = source["timestamp_type"].cast(pa.int64())
    known = pc.and_kleene(pc.greater_equal(kinds, 0), pc.less_equal(kinds, 1))
    return TIMESTAMP_TYPE_NAMES.take(pc.if_else(pc.fill_null(known, False), kinds, 2))


def _headers(source: pa.RecordBatch, load_time_us: int) -> pa.Array:
    headers = source["headers"]
    # REPEATED: a record without headers has the empty list, never NULL.
    filled = pc.fill_null(headers, pa.scalar([], headers.type)) if headers.null_count else headers
    return filled.cast(arrow_field(METADATA_COLUMNS["message_headers"]).type)


# Each metadata column from the source batch and the batch's load time (µs since the epoch). The keys
# are schema.METADATA_COLUMNS'.
METADATA_VALUES: dict[str, Callable[[pa.RecordBatch, int], pa.Array]] = {
    "message_topic": lambda s, now: s["topic"],
    "message_partition": lambda s, now: s["partition"].cast(pa.int64()),
    "message_offset": lambda s, now: s["offset"].cast(pa.int64()),
    "message_timestamp": _timestamps,
    "load_time": lambda s, now: pa.array(np.full(s.num_rows, now, dtype=np.int64), TIMESTAMP),
    "message_headers": _headers,
    "message_timestamp_type": _timestamp_types,
    "message_leader_epoch": lambda s, now: _non_negative(s["leader_epoch"].cast(pa.int64())),
}


# How many allowed ids an unknown schema id's message lists: a subject may have hundreds of versions.
SHOWN_IDS = 20


@dataclass(frozen=True)
class SchemaIds:
    """The schema ids a Confluent-framed value may carry: those of the versions of `subject`."""

    subject: str
    ids: frozenset[int]
    # The class (`message`), its message indexes in the latest version, and those in the older versions
    # where they differ (Descriptors.moved_indexes): a writer on such a version names it by those.
    message: str = ""
    indexes: tuple[int, ...] = (0,)
    moved: Mapping[int, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def reframed(self, values: pa.Array) -> tuple[pa.Array, list[RowError]]:
        """`values` as the decoders check them, against the latest version's indexes of the class: a frame
        of an older version (`moved`) that names the class by that version's indexes is rewritten to the
        latest's; one that names anything else there is refused here (its slot NULL), since the latest's
        indexes mean another message. The records themselves (DLQ letters) keep their own bytes."""
        if not self.moved:
            return values, []
        moved_ids = pa.array([i.to_bytes(4, "big") for i in sorted(self.moved) if 0 <= i < 2 ** 32], pa.binary())
        hit = pc.fill_null(pc.is_in(pc.binary_slice(values.cast(pa.binary()), 1, 5), value_set=moved_ids), False)
        rows = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
        if not len(rows):
            return values, []
        out, refused = values.to_pylist(), []
        for i in rows:
            try:
                frame = parse_frame(out[i])
            except WireFormatError:
                continue  # the decoder refuses it with its own words
            expected = self.moved[frame.schema_id]
            if frame.message_indexes == expected:
                out[i] = encode_frame(frame.schema_id, self.indexes, out[i][frame.payload_offset:])
                continue
            out[i] = None
            where = ("not declared in that version" if expected == NOT_DECLARED
                     else f"{shown_indexes(expected)} in that version")
            refused.append(RowError(int(i), ErrorType.DESERIALIZATION_ERROR,
                                    another_message_type(frame, self.message, where)))
        return pa.array(out, values.type), refused

    def refusal(self, schema_id: int) -> str:
        known = sorted(self.ids)
        shown = ", ".join(map(str, known[:SHOWN_IDS])) + (", ..." if len(known) > SHOWN_IDS else "")
        return f"schema id {schema_id} is not a version of subject {self.subject} (known: {shown})"


def framed_schema_id(value: bytes) -> int:
    """The schema id of a Confluent-framed value (bytes 1..4, big-endian)."""
    return int.from_bytes(value[1:5], "big")


@dataclass
class Rows:
    """The records of one source batch that decoded, as table columns, and what became of the others.

    `values` is the message's struct (one slot per row; NULL for a changelog's tombstone), `key` the
    Kafka key's (when the table has a key column), `metadata` the metadata columns in their order,
    `additional` the `additional_properties` column (when the table has it for unknown fields).
    `sources[n]` is the index in the source batch of row n."""

    values: pa.StructArray
    key: pa.StructArray | None
    metadata: list[tuple[str, pa.Array]]
    metadata_namespace: str
    sources: np.ndarray
    load_time_us: int  # when the batch was decoded: its `load_time`
    failures: list[RowError] = field(default_factory=list)
    # Source indices, rows or not, of the records whose value or key carried fields the descriptors lack;
    # `key_unknown_fields` those whose key did (additional_properties keeps only the value's).
    unknown_fields: list[int] = field(default_factory=list)
    key_unknown_fields: list[int] = field(default_factory=list)
    # Source indices of the records whose Confluent frame carries a schema id that is no version of the
    # subject (as far as the descriptors know): failed (DESERIALIZATION_ERROR), and a reason to refresh.
    unknown_schema_ids: list[int] = field(default_factory=list)
    # Source indices of the rows holding an open enum's number that the descriptors do not name (enums.py):
    # written as its decimal text, unless a refresh names it first (a task holds for them as for unknown fields).
    enum_numbers: list[int] = field(default_factory=list)
    deletes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # per row: a tombstone
    additional: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.sources)

    def metadata_columns(self) -> list[tuple[str, pa.Array]]:
        """The metadata as the table holds it: top-level columns, or one RECORD named by the namespace."""
        if not self.metadata or not self.metadata_namespace:
            return self.metadata
        names, arrays = zip(*self.metadata, strict=True)
        return [(self.metadata_namespace, pa.StructArray.from_arrays(list(arrays), list(names)))]

    def columns(self, with_key: bool = True) -> list[tuple[str, pa.Array]]:
        """The table's columns in schema.table_schema's order: message fields, `message_key` (unless not
        `with_key`), metadata, `additional_properties`."""
        columns = list(zip(self.values.type.names, self.values.flatten(), strict=True))
        if self.key is not None and with_key:
            columns.append((KEY_COLUMN, self.key))
        columns += self.metadata_columns()
        if self.additional is not None:
            columns.append((ADDITIONAL_PROPERTIES, self.additional))
        return columns

    def table(self) -> pa.RecordBatch:
        """The rows in the table's columns."""
        columns = self.columns()
        return pa.RecordBatch.from_arrays([c for _, c in columns], names=[n for n, _ in columns])

    def take(self, positions: Sequence[int] | np.ndarray) -> Rows:
        """The rows at `positions`, as Rows of their own (no failures)."""
        index = pa.array(np.asarray(positions, dtype=np.int64))
        return Rows(self.values.take(index), self.key.take(index) if self.key is not None else None,
                    [(n, a.take(index)) for n, a in self.metadata], self.metadata_namespace,
                    self.sources[np.asarray(positions, dtype=np.int64)], self.load_time_us,
                    deletes=self.deletes[np.asarray(positions, dtype=np.int64)],
                    additional=self.additional.take(index) if self.additional is not None else None)


class RowBuilder:
    """Decodes a source batch into table rows for one message type, key type and metadata layout.

    `changelog` (upsert/delete): every record needs a key, and a NULL value is a tombstone row (its
    message columns NULL) marked in `Rows.deletes`; otherwise a NULL value is an INVALID_MESSAGE_ERROR.
    A changelog's key carrying unknown fields is an UNKNOWN_FIELDS_ERROR whatever the policy says: the
    MERGE groups by the key's columns, so keys differing only in those fields would collapse into one
    row. (It is still in `unknown_fields`, so a task holding on them refreshes the descriptors first.)
    `key_precision` (changelog only): for the same reason, a key whose Timestamp is finer than the
    microsecond the key column keeps is an INVALID_MESSAGE_ERROR (batch/keys.py).
    `unknown` (additional_properties on): what writes the flagged records' unknown fields into the column
    `Rows.additional`; the others' slots are NULL. `schema_ids` (Confluent-framed values): a value that
    decoded but whose frame names another schema id is a DESERIALIZATION_ERROR listed in
    `Rows.unknown_schema_ids`: an id of an unrelated subject's schema with the same message indexes would
    otherwise decode, silently, into a wrong row."""

    def __init__(self, values: ValueDecoder, metadata: MetadataColumns, key: ValueDecoder | None = None,
                 changelog: bool = False, unknown: UnknownFieldsJson | None = None,
                 schema_ids: SchemaIds | None = None, key_precision: SubMicrosecondKeys | None = None,
                 enum_numbers: EnumNumbers | None = None, key_enum_numbers: EnumNumbers | None = None) -> None:
        if changelog and key is None:
            raise ValueError("a changelog needs the key's decoder")
        self._values = values
        self._key = key
        self._key_precision = key_precision if changelog else None
        self._metadata = metadata
        self._changelog = changelog
        self._unknown = unknown
        self._schema_ids = schema_ids
        # The value's and the key's (the Kafka key's own message): either's holds the task (core.py).
        self._enum_numbers, self._key_enum_numbers = enum_numbers, key_enum_numbers
        # The allowed ids as the frame holds them, for one vectorized membership test per batch (an id a
        # registry answered outside 4 unsigned bytes is in no frame).
        self._id_bytes = (pa.array([i.to_bytes(4, "big") for i in sorted(schema_ids.ids) if 0 <= i < 2 ** 32],
                                   pa.binary())
                          if schema_ids is not None else None)

    def build(self, source: pa.RecordBatch, load_time_us: int) -> Rows:
        framed, refused = (self._schema_ids.reframed(source["value"]) if self._schema_ids is not None
                           else (source["value"], []))
        decoded = self._values.decode(framed)
        failures = list(decoded.failures) + refused
        failed = np.zeros(source.num_rows, dtype=bool)
        for f in failures:
            failed[f.index] = True
        null_values = source["value"].is_null().to_numpy(zero_copy_only=False)
        unknown_ids = self._unknown_ids(source["value"], failed | null_values)
        if unknown_ids:
            assert self._schema_ids is not None
            failures += [RowError(i, ErrorType.DESERIALIZATION_ERROR,
                                  self._schema_ids.refusal(framed_schema_id(source["value"][i].as_py())))
                         for i in unknown_ids]
            failed[unknown_ids] = True
        if not self._changelog:
            for i in np.flatnonzero(null_values & ~failed):
                failures.append(RowError(int(i), ErrorType.INVALID_MESSAGE_ERROR, TOMBSTONE))
            failed |= null_values
        key = decoded_key = None
        key_unknown: list[int] = []
        if self._key is not None:
            keys = self._key.decode(source["key"])
            decoded_key = keys.values
            null_keys = source["key"].is_null().to_numpy(zero_copy_only=False)
            for f in keys.failures:
                if not failed[f.index]:
                    failures.append(RowError(f.index, f.error_type, f"key: {f.message}"))
                    failed[f.index] = True
            key_unknown = list(keys.unknown_fields)
            if self._changelog:
                for i in key_unknown:
                    if not failed[i]:
                        failures.append(RowError(i, ErrorType.UNKNOWN_FIELDS_ERROR, KEY_UNKNOWN))
                        failed[i] = True
                for i in np.flatnonzero(null_keys & ~failed):
                    failures.append(RowError(int(i), ErrorType.INVALID_MESSAGE_ERROR, NULL_KEY))
                failed |= null_keys
                if self._key_precision is not None:
                    for i, message in self._key_precision.refused(source["key"], failed):
                        failures.append(RowError(i, ErrorType.INVALID_MESSAGE_ERROR, message))
                        failed[i] = True
            key = keys.values
        additional = None
        if self._unknown is not None:
            additional, unreadable = self._unknown.column(framed, [i for i in decoded.unknown_fields
                                                                   if not failed[i]])
            failures += unreadable
            failed[[f.index for f in unreadable]] = True
        failures.sort(key=lambda f: f.index)
        metadata = [(name, METADATA_VALUES[name](source, load_time_us)) for name in self._metadata.columns] \
            if self._metadata.enabled else []
        sources = np.flatnonzero(~failed)
        if failed.any():
            keep = pa.array(sources)
            values = decoded.values.take(keep)
            key = key.take(keep) if key is not None else None
            metadata = [(n, a.take(keep)) for n, a in metadata]
            additional = additional.take(keep) if additional is not None else None
        else:
            values = decoded.values
        unknown = sorted({*decoded.unknown_fields, *key_unknown}) if key_unknown else decoded.unknown_fields
        enum_numbers = sorted({i for finder, decoded_values in ((self._enum_numbers, decoded.values),
                                                                (self._key_enum_numbers, decoded_key))
                               if finder is not None and decoded_values is not None
                               for i in finder.rows(decoded_values) if not failed[i]})
        return Rows(values, key, metadata, self._metadata.namespace, sources, load_time_us, failures,
                    unknown, key_unknown, unknown_ids, enum_numbers,
                    deletes=null_values[sources] if self._changelog else np.zeros(len(sources), dtype=bool),
                    additional=additional)

    def _unknown_ids(self, values: pa.Array, skip: np.ndarray) -> list[int]:
        """Source indices of the values, but those in `skip`, whose frame's schema id is not allowed. A
        value that decoded has a well-formed frame (at least 6 bytes, magic byte 0): no length check."""
        if self._id_bytes is None:
            return []
        ids = pc.binary_slice(values.cast(pa.binary()), 1, 5)
        allowed = pc.fill_null(pc.is_in(ids, value_set=self._id_bytes), True).to_numpy(zero_copy_only=False)
        return np.flatnonzero(~allowed & ~skip).tolist()


@dataclass(frozen=True)
class Writable:
    """Rows as a writer takes them (the table's columns, or a mode's own shape of them), with their
    insertIds and, for each row, the index of its record in the source batch (ascending)."""

    rows: pa.RecordBatch
    insert_ids: pa.Array | None
    sources: np.ndarray

    def __len__(self) -> int:
        return self.rows.num_rows

    @classmethod
    def empty(cls) -> Writable:
        return cls(pa.RecordBatch.from_pydict({}), None, np.zeros(0, dtype=np.int64))

    def of_sources(self, indices: Sequence[int]) -> Writable:
        """The rows of the records at source `indices`, in source order."""
        positions = np.searchsorted(self.sources, np.sort(np.asarray(indices, dtype=np.int64)))
        take = pa.array(positions)
        return Writable(self.rows.take(take), self.insert_ids.take(take) if self.insert_ids is not None else None,
                        self.sources[positions])
