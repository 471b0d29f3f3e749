"""Intermediate tables: their schema, their per-run names, key schema checks, and finding orphans.

An intermediate table (seed 000) holds `key` (the destination's key RECORD), `value` (the destination's
other columns as one nullable RECORD: NULL = delete), `partitionTime`, `i` (order of records of one key:
the Kafka offset), `kafkaPartition` and `kafkaTopic` (with `i`, which record the row is) and `batchNumber`
(the micro-batch that wrote the row). Every run creates its own, named
`{table}_{suffix}_{task}_{uuid}_{epoch ms}`: a table left by an earlier run is never written again.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.errors import SchemaEvolutionError
from firehose_bq.schema import KEY_COLUMN
from firehose_bq.upsert.sql import (BATCH, KEY, ORDER, PARTITION, PARTITION_TIME, TOPIC, VALUE, TableRef,
                                   check_identifier)

# BigQuery's table-name limit.
MAX_TABLE_NAME = 1024
LABEL = "firehose-bq-intermediate"


def intermediate_name(destination: str, suffix: str, task: str | None = None, run_id: str | None = None,
                      epoch_ms: int | None = None) -> str:
    """A fresh name for this run. `task`: the driver's process id by default (one writer per run)."""
    name = (f"{destination}_{suffix}_{task or os.getpid()}_{run_id or uuid.uuid4().hex}_"
            f"{epoch_ms if epoch_ms is not None else int(time.time() * 1000)}")
    if len(name) > MAX_TABLE_NAME:
        raise SchemaEvolutionError(f"intermediate table name for {destination!r} would be {len(name)} characters; "
                                   f"BigQuery allows {MAX_TABLE_NAME}")
    return name


def is_intermediate_of(name: str, destination: str, suffix: str) -> bool:
    return re.fullmatch(rf"{re.escape(destination)}_{re.escape(suffix)}_[A-Za-z0-9]+_[0-9a-f]{{32}}_\d+", name) is not None


def destination_schema(schema: Sequence[SchemaField], key_column: str) -> list[SchemaField]:
    """The planned table schema with its key column (`message_key`) named `key_column`."""
    check_identifier(key_column)
    renamed = []
    for f in schema:
        if f.name == KEY_COLUMN:
            api = f.to_api_repr()
            api["name"] = key_column
            f = SchemaField.from_api_repr(api)
        elif f.name.lower() == key_column.lower():
            raise SchemaEvolutionError(f"SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME={key_column!r} clashes with a column of "
                                       "the message; choose another name")
        renamed.append(f)
    return renamed


def split_key(schema: Sequence[SchemaField], key_column: str) -> tuple[SchemaField, list[SchemaField]]:
    """The key column, and the other columns in table order."""
    keys = [f for f in schema if f.name.lower() == key_column.lower()]
    if not keys or keys[0].field_type.upper() not in ("RECORD", "STRUCT"):
        raise SchemaEvolutionError(f"table has no RECORD key column {key_column!r}")
    return keys[0], [f for f in schema if f.name.lower() != key_column.lower()]


def intermediate_schema(destination: Sequence[SchemaField], key_column: str) -> list[SchemaField]:
    key, values = split_key(destination, key_column)
    return [
        SchemaField(KEY, "RECORD", "NULLABLE", fields=key.fields, description="the Kafka key"),
        SchemaField(VALUE, "RECORD", "NULLABLE", fields=values,
                    description="the destination row without its key; NULL = delete the key"),
        SchemaField(PARTITION_TIME, "TIMESTAMP", "NULLABLE",
                    description="_PARTITIONTIME for the destination (ingestion-time partitioning)"),
        SchemaField(ORDER, "INTEGER", "REQUIRED", description="order of the records of one key: the latest wins"),
        SchemaField(PARTITION, "INTEGER", "REQUIRED", description="the record's Kafka partition (with i, the record)"),
        SchemaField(TOPIC, "STRING", "REQUIRED", description="the record's Kafka topic (with i, the record)"),
        SchemaField(BATCH, "INTEGER", "REQUIRED", description="the micro-batch that wrote the row"),
    ]


def intermediate_table(ref: TableRef, destination: Sequence[SchemaField], key_column: str) -> bigquery.Table:
    table = bigquery.Table(ref.api, schema=intermediate_schema(destination, key_column))
    # Ingestion-time partitioned, as seed 000 says: `_PARTITIONTIME IS NULL` then marks streaming-buffer
    # rows, which the cleanup DELETE must leave alone on real BigQuery.
    table.time_partitioning = bigquery.TimePartitioning(type_="DAY")
    table.labels = {LABEL: "true"}
    table.description = "firehose-bq upsert/delete staging rows; safe to drop when no job runs"
    return table


def key_changes(old: Sequence[SchemaField], new: Sequence[SchemaField], path: str = "") -> list[str]:
    """Key schema changes BigQuery (and MERGE's matching) cannot take, one line each: empty = compatible.

    Compatible: a new NULLABLE field (REPEATED is rejected by the SQL plan anyway) and REQUIRED →
    NULLABLE. Anything else changes which rows a key matches, so the job stops and names it."""
    problems = []
    wanted = {f.name.lower(): f for f in new}
    for f in old:
        name = f"{path}{f.name}"
        g = wanted.get(f.name.lower())
        if g is None:
            problems.append(f"key field {name} was removed")
            continue
        old_type, new_type = _type(f), _type(g)
        if old_type != new_type:
            problems.append(f"key field {name} changed type {old_type} -> {new_type}")
            continue
        old_mode, new_mode = (f.mode or "NULLABLE").upper(), (g.mode or "NULLABLE").upper()
        if old_mode != new_mode and not (old_mode == "REQUIRED" and new_mode == "NULLABLE"):
            problems.append(f"key field {name} changed mode {old_mode} -> {new_mode}")
        if old_type == "RECORD":
            problems.extend(key_changes(f.fields, g.fields, f"{name}."))
    olds = {f.name.lower() for f in old}
    problems.extend(f"key field {path}{g.name} was added as REQUIRED" for g in new
                    if g.name.lower() not in olds and (g.mode or "").upper() == "REQUIRED")
    return problems


def _type(f: SchemaField) -> str:
    kind = f.field_type.upper()
    return {"STRUCT": "RECORD", "INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN"}.get(kind, kind)


@dataclass(frozen=True)
class Orphan:
    table: str
    created: datetime | None
    modified: datetime | None
    rows: int | None


def list_intermediate(client: bigquery.Client, project: str, dataset: str, destination: str,
                      suffix: str) -> list[Orphan]:
    """Every intermediate table of `destination` in the dataset (a running job's included)."""
    found = []
    for item in client.list_tables(f"{project}.{dataset}"):
        if is_intermediate_of(item.table_id, destination, suffix):
            table = client.get_table(item.reference)
            found.append(Orphan(item.table_id, table.created, table.modified, table.num_rows))
    return sorted(found, key=lambda o: o.table)
