"""The SQL of merge flushes, built only from validated, backtick-quoted identifiers.

Every project, dataset, table and column name that enters a statement goes through `check_*` first:
a name BigQuery would not accept (a backtick, a quote, a dot in a column, a reserved prefix...) is
rejected with IdentifierError before any query runs, so a table or field name can never change what a
statement does. Values (the batch number) are integers formatted by Python, never strings.

Three statements per destination: the MERGE of one batch (upsert-only, delete-only or both), and the
DELETE that clears merged batches from the intermediate table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from google.cloud.bigquery import SchemaField

from firehose_bq.errors import SchemaError

# https://cloud.google.com/bigquery/docs/schemas#column_names (ASCII subset: what this sink creates)
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,299}")
# Prefixes BigQuery keeps for pseudo-columns (case-insensitive).
_RESERVED_PREFIXES = ("_TABLE_", "_FILE_", "_PARTITION", "_ROW_TIMESTAMP", "__ROOT__", "_COLIDENTIFIER")
# https://cloud.google.com/bigquery/docs/datasets#dataset-naming
_DATASET = re.compile(r"[A-Za-z0-9_]{1,1024}")
# Table names may hold more (Unicode letters, spaces); this sink takes ASCII ones and dashes only.
_TABLE = re.compile(r"[A-Za-z0-9_-]{1,1024}")
# Project ids: 6–30 lowercase letters, digits, dashes, optionally `domain.com:` in front.
_PROJECT = re.compile(r"(?:[a-z0-9][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
# Key leaves MERGE groups and matches on: BigQuery cannot GROUP BY these types.
_UNGROUPABLE = {"JSON", "GEOGRAPHY", "RANGE"}
# Text put into SQL as a literal as it is: no quote, no backslash, no line break.
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.-]*")
# Key leaves a window cannot be partitioned by ("Partitioning by expressions of type FLOAT64 is not allowed").
_FLOATS = {"FLOAT", "FLOAT64"}

# The intermediate table's own columns (seed 000), besides the destination's key column.
KEY = "key"
VALUE = "value"
PARTITION_TIME = "partitionTime"
ORDER = "i"
# The record's Kafka partition and topic: with `i` (its offset) what tells two records apart. Offsets of
# different partitions are no order, but a key on two partitions (producers with different partitioners,
# partitions added to the topic), or on the same partition number of two topics of one job, must not lose
# one of two records that share an offset.
PARTITION = "kafkaPartition"
TOPIC = "kafkaTopic"
BATCH = "batchNumber"


class IdentifierError(SchemaError):
    """A name that BigQuery does not allow, or that this sink will not put into SQL."""


def check_identifier(name: str) -> str:
    """`name` as a column name, or IdentifierError naming what is wrong."""
    if not _COLUMN.fullmatch(name):
        raise IdentifierError(f"{name!r} is not a valid BigQuery column name (letters, digits and _, not "
                              "starting with a digit, at most 300 characters)")
    if name.upper().startswith(_RESERVED_PREFIXES):
        raise IdentifierError(f"{name!r} starts with a prefix BigQuery reserves for pseudo-columns")
    return name


def quote(name: str) -> str:
    return f"`{check_identifier(name)}`"


@dataclass(frozen=True)
class TableRef:
    project: str
    dataset: str
    table: str

    def __post_init__(self) -> None:
        for kind, pattern, value in (("project", _PROJECT, self.project), ("dataset", _DATASET, self.dataset),
                                     ("table", _TABLE, self.table)):
            if not pattern.fullmatch(value):
                raise IdentifierError(f"{kind} name {value!r} is not one BigQuery allows (or contains characters "
                                      "this sink will not put into SQL)")

    @classmethod
    def parse(cls, ref: str) -> TableRef:
        # A project id may hold a dot only in its domain part (`example.com:proj`): split from the right.
        parts = ref.rsplit(".", 2)
        if len(parts) != 3:
            raise IdentifierError(f"{ref!r} is not `project.dataset.table`")
        return cls(*parts)

    @property
    def sql(self) -> str:
        return f"`{self.project}`.`{self.dataset}`.`{self.table}`"

    @property
    def api(self) -> str:
        return f"{self.project}.{self.dataset}.{self.table}"


def key_leaves(fields: Sequence[SchemaField], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the key's leaf fields, depth first: BigQuery groups by scalars, never by a STRUCT."""
    leaves = []
    for f in fields:
        where = ".".join((*path, f.name))
        check_identifier(f.name)
        if (f.mode or "").upper() == "REPEATED":
            raise IdentifierError(f"key field {where} is repeated; MERGE cannot match or group on arrays")
        kind = f.field_type.upper()
        if kind in ("RECORD", "STRUCT"):
            if not f.fields:
                raise IdentifierError(f"key field {where} is a RECORD without fields")
            leaves.extend(key_leaves(f.fields, (*path, f.name)))
        elif kind in _UNGROUPABLE:
            raise IdentifierError(f"key field {where} is {kind}; BigQuery cannot group or match on it")
        else:
            leaves.append((*path, f.name))
    if not path and not leaves:
        raise IdentifierError("the key has no fields to match rows on")
    return leaves


def _leaf_type(fields: Sequence[SchemaField], leaf: tuple[str, ...]) -> str:
    field = next(f for f in fields if f.name == leaf[0])
    return _leaf_type(field.fields, leaf[1:]) if len(leaf) > 1 else field.field_type.upper()


def _literal(kind: str, value: object) -> str | None:
    """`value` as a SQL literal of BigQuery type `kind`, or None for a type this sink does not write so."""
    if kind in ("INTEGER", "INT64") and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if kind in _FLOATS and isinstance(value, float) and value == value and abs(value) != float("inf"):
        return repr(value)
    if kind in ("BOOLEAN", "BOOL") and isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if kind == "STRING" and isinstance(value, str) and _PLAIN_TEXT.fullmatch(value):  # "" or an enum's name
        return f"'{value}'"
    if kind == "BYTES" and value == b"":
        return "b''"
    if kind in ("NUMERIC", "BIGNUMERIC") and isinstance(value, (int, Decimal)) and not isinstance(value, bool):
        return f"{kind} '{value}'"
    return None


def _path(alias: str, *names: str) -> str:
    return ".".join([alias, *(quote(n) for n in names)])


@dataclass(frozen=True)
class MergePlan:
    """Everything a merge flush statement depends on; built once per schema version."""

    destination: TableRef
    intermediate: TableRef
    key_column: str
    key_fields: tuple[SchemaField, ...]
    value_columns: tuple[str, ...]  # the destination's other top-level columns, in table order
    upsert: bool
    delete: bool
    # Set when the destination is ingestion-time partitioned: the granularity `_PARTITIONTIME` is cut to.
    ingestion_partitioning: str | None = None
    # (top-level key field, value) for the key fields without presence (proto3 scalars and enums): what a
    # key that lacks the field decodes it to. Rows written before the field joined the key class hold NULL
    # there, and are the same key as a record whose bytes still lack it (`absent_key_values`).
    absent_key: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if not (self.upsert or self.delete):
            raise ValueError("a merge plan needs upsert, delete or both")
        check_identifier(self.key_column)
        for name in self.value_columns:
            check_identifier(name)
        if self.ingestion_partitioning not in (None, "HOUR", "DAY", "MONTH", "YEAR"):
            raise ValueError(f"unknown partitioning {self.ingestion_partitioning!r}")
        key_leaves(self.key_fields)  # rejects what cannot be grouped on, before any query

    def merge(self, batch: int) -> str:
        """The MERGE applying intermediate rows of `batch` to the destination."""
        if self.upsert:
            return self._upsert_merge(int(batch))
        return self._delete_merge(int(batch))

    def cleanup(self, batch: int, streaming_buffer: bool) -> str:
        """Clear merged batches. Real BigQuery refuses DML on rows still in the streaming buffer, whose
        `_PARTITIONTIME` is NULL: with a buffer, only the rows already out of it go (seed step 8)."""
        guard = " AND _PARTITIONTIME IS NOT NULL" if streaming_buffer else ""
        return f"DELETE FROM {self.intermediate.sql} WHERE {quote(BATCH)} <= {int(batch)}{guard}"

    # --- pieces ----------------------------------------------------------------------------------

    def _leaves(self) -> list[tuple[str, ...]]:
        return key_leaves(self.key_fields)

    def _matches(self, target: str, target_key: str, source: str) -> str:
        # Null-safe: a NULL key field must match a NULL, as GROUP BY put them together. A field the key
        # class gained later, without presence: the table's NULL there (rows from before) is its default.
        absent = dict(self.absent_key)
        parts = []
        for leaf in self._leaves():
            target_leaf = _path(target, target_key, *leaf)
            default = (_literal(_leaf_type(self.key_fields, leaf), absent[leaf[0]])
                       if len(leaf) == 1 and leaf[0] in absent else None)
            if default is not None:
                target_leaf = f"IFNULL({target_leaf}, {default})"
            parts.append(f"{target_leaf} IS NOT DISTINCT FROM {_path(source, KEY, *leaf)}")
        return " AND ".join(parts)

    def _group_by(self, alias: str) -> str:
        return ", ".join(_path(alias, KEY, *leaf) for leaf in self._leaves())

    def _partition_by(self, alias: str) -> str:
        # BigQuery refuses FLOAT64 in PARTITION BY: a float leaf partitions by its text (NULL stays NULL,
        # NaNs are one "nan"; -0 and 0 differ there, a key nobody should have).
        return ", ".join(f"CAST({_path(alias, KEY, *leaf)} AS STRING)" if _leaf_type(self.key_fields, leaf) in _FLOATS
                         else _path(alias, KEY, *leaf) for leaf in self._leaves())

    def _batch_rows(self, batch: int) -> str:
        return f"{self.intermediate.sql} AS x WHERE x.{quote(BATCH)} = {batch}"

    def _insert(self) -> str:
        columns = [quote(self.key_column), *(quote(c) for c in self.value_columns)]
        values = [_path("src", KEY), *(_path("src", VALUE, c) for c in self.value_columns)]
        if self.ingestion_partitioning:
            # The pseudo-column picks the partition; the row's own partitionTime, as streaming-buffer rows
            # of the intermediate table have no _PARTITIONTIME yet.
            columns.append("_PARTITIONTIME")
            values.append(f"TIMESTAMP_TRUNC({_path('src', PARTITION_TIME)}, {self.ingestion_partitioning})")
        return f"INSERT ({', '.join(columns)}) VALUES ({', '.join(values)})"

    def _update(self) -> str:
        sets = ", ".join(f"{quote(c)} = {_path('src', VALUE, c)}" for c in self.value_columns)
        return f"UPDATE SET {sets}"

    def _upsert_merge(self, batch: int) -> str:
        # One row per key, the latest (highest i) of the batch: MERGE fails when two source rows match
        # one target row, and the latest is what a KTable holds.
        # Equal offsets (a key on two partitions or topics) are no order: the partition, then the topic, break
        # the tie, so that what is kept does not change from one run of the statement to the next.
        source = (f"SELECT latest.* FROM (SELECT ARRAY_AGG(x ORDER BY x.{quote(ORDER)} DESC, x.{quote(PARTITION)} DESC, "
                  f"x.{quote(TOPIC)} DESC LIMIT 1)[OFFSET(0)] "
                  f"AS latest FROM {self._batch_rows(batch)} GROUP BY {self._group_by('x')})")
        lines = [f"MERGE {self.destination.sql} AS dst",
                 f"USING ({source}) AS src",
                 f"ON {self._matches('dst', self.key_column, 'src')}"]
        if self.delete:
            lines += [f"WHEN MATCHED AND src.{quote(VALUE)} IS NOT NULL THEN {self._update()}",
                      f"WHEN MATCHED AND src.{quote(VALUE)} IS NULL THEN DELETE",
                      f"WHEN NOT MATCHED AND src.{quote(VALUE)} IS NOT NULL THEN {self._insert()}"]
        else:
            # Upsert-only: tombstones never reach the intermediate table, every value is set.
            lines += [f"WHEN MATCHED THEN {self._update()}",
                      f"WHEN NOT MATCHED THEN {self._insert()}"]
        return "\n".join(lines)

    def _delete_merge(self, batch: int) -> str:
        # Delete-only keeps append semantics for values: every value after the key's last tombstone of
        # the batch is inserted, and that tombstone deletes the key's rows written before this batch.
        # One row per record (key, topic, partition and offset `i`): a record staged twice (a retried task's
        # insertAll whose insertId dedup missed) would otherwise be appended twice, or, a tombstone, fail
        # the MERGE for two source rows matching one target row.
        once = (f"SELECT one.* FROM (SELECT ARRAY_AGG(x LIMIT 1)[OFFSET(0)] AS one FROM {self._batch_rows(batch)} "
                f"GROUP BY {self._group_by('x')}, x.{quote(TOPIC)}, x.{quote(PARTITION)}, x.{quote(ORDER)})")
        # Each record with its key's last tombstone of the batch (a window: NULL key fields partition
        # together, as they group in the upsert MERGE), then the key's records from that tombstone on. No
        # join: real BigQuery refuses a LEFT JOIN whose condition has no plain equality of both sides
        # ("LEFT OUTER JOIN cannot be used without a condition that is an equality of fields from both
        # sides of the join"), which a NULL-safe match is not. No ARRAY_AGG of a key's records either: a
        # hot key's appends in one batch would make one row past BigQuery's 100 MB.
        order = quote(ORDER)
        marked = (f"SELECT r.*, MAX(CASE WHEN r.{quote(VALUE)} IS NULL THEN r.{order} END) "
                  f"OVER (PARTITION BY {self._partition_by('r')}) AS last_delete FROM ({once}) AS r")
        source = (f"SELECT x.* FROM ({marked}) AS x "
                  f"WHERE x.last_delete IS NULL OR x.{order} >= x.last_delete")
        return "\n".join([
            f"MERGE {self.destination.sql} AS dst",
            f"USING ({source}) AS src",
            # Only tombstones match: values never update, they are appended.
            f"ON src.{quote(VALUE)} IS NULL AND {self._matches('dst', self.key_column, 'src')}",
            "WHEN MATCHED THEN DELETE",
            f"WHEN NOT MATCHED AND src.{quote(VALUE)} IS NOT NULL THEN {self._insert()}",
        ])
