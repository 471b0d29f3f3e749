"""BigQuery columns → Arrow types: the one in-memory shape of rows between decode and write.

Every decoder (native or the Python reference) produces rows in exactly these types, and every write
path reads them: Storage Write appends them as Arrow, file loads stage them, insertAll serializes them.
The mapping is data, like `schema.SCALAR_TYPES`; the cases that need a choice say why.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from google.cloud.bigquery import SchemaField

# BigQuery keeps microseconds; TIMESTAMP is always UTC.
TIMESTAMP = pa.timestamp("us", tz="UTC")
# NUMERIC is a 38-digit decimal with 9 after the point (BigQuery's fixed precision and scale).
NUMERIC = pa.decimal128(38, 9)
BIGNUMERIC = pa.decimal256(76, 38)

LEAF_TYPES: dict[str, pa.DataType] = {
    "STRING": pa.string(),
    "BYTES": pa.binary(),
    "INTEGER": pa.int64(),
    "INT64": pa.int64(),
    "FLOAT": pa.float64(),
    "FLOAT64": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "BOOL": pa.bool_(),
    "TIMESTAMP": TIMESTAMP,
    "DATE": pa.date32(),
    "NUMERIC": NUMERIC,
    "BIGNUMERIC": BIGNUMERIC,
    # Text forms BigQuery parses itself (Storage Write and loads accept them as strings).
    "DATETIME": pa.string(),
    "TIME": pa.string(),
    "JSON": pa.string(),
    "GEOGRAPHY": pa.string(),
    "INTERVAL": pa.string(),
}
RECORD_TYPES = ("RECORD", "STRUCT")


class UnsupportedColumnError(ValueError):
    """A column type with no Arrow form here (e.g. RANGE)."""


def arrow_field(column: SchemaField) -> pa.Field:
    """One column as an Arrow field. REPEATED is a list that is never NULL (BigQuery has no NULL array:
    an absent repeated field is the empty list); REQUIRED is a non-nullable field."""
    kind = column.field_type.upper()
    if kind in RECORD_TYPES:
        value_type: pa.DataType = pa.struct([arrow_field(c) for c in column.fields])
    elif kind in LEAF_TYPES:
        value_type = LEAF_TYPES[kind]
    else:
        raise UnsupportedColumnError(f"column {column.name}: BigQuery type {kind} has no Arrow form here")
    mode = (column.mode or "NULLABLE").upper()
    if mode == "REPEATED":
        # Elements of a repeated field are never NULL either.
        return pa.field(column.name, pa.list_(pa.field("item", value_type, nullable=False)), nullable=False)
    return pa.field(column.name, value_type, nullable=mode != "REQUIRED")


def arrow_struct(columns: Sequence[SchemaField]) -> pa.StructType:
    return pa.struct([arrow_field(c) for c in columns])


def arrow_schema(columns: Sequence[SchemaField]) -> pa.Schema:
    return pa.schema([arrow_field(c) for c in columns])
