"""JSON input's schema layer: the destination table's own schema is the schema (seed 004).

With INPUT_SCHEMA_DATA_TYPE=JSON there are no descriptors: a table is read from BigQuery, or created
from SINK_BIGQUERY_TABLE_SCHEMA_FILE when it does not exist yet, with the Kafka metadata columns and
(when enabled) the `additional_properties` column added. The decoder coerces each document to the
table's payload columns (every column but the metadata ones). The schema is re-read every
SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS, so columns someone adds to the table start being filled.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.bigquery.client import call_options, make_client
from firehose_bq.bigquery.tables import ensure_dataset, ensure_table, table_definition
from firehose_bq.config import Config
from firehose_bq.errors import SchemaError
from firehose_bq.routing import Destination
from firehose_bq.schema import ADDITIONAL_PROPERTIES, ADDITIONAL_PROPERTIES_COLUMN, MetadataColumns

log = logging.getLogger(__name__)


def read_schema_file(path: str | Path) -> list[SchemaField]:
    """A BigQuery JSON schema: a list of fields, or an object holding `fields` (or `schema.fields`)."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SchemaError(f"SINK_BIGQUERY_TABLE_SCHEMA_FILE {path}: {exc}") from None
    if isinstance(data, dict):  # {"fields": [...]} or a table resource's {"schema": {"fields": [...]}}
        holder = data.get("schema", data)
        data = holder.get("fields") if isinstance(holder, dict) else None
    if not isinstance(data, list) or not data or not all(isinstance(f, dict) and "name" in f for f in data):
        raise SchemaError(f"SINK_BIGQUERY_TABLE_SCHEMA_FILE {path}: expected a BigQuery JSON schema (a list of "
                          "fields with name, type, mode, fields)")
    try:
        return [SchemaField.from_api_repr(f) for f in data]
    except (KeyError, TypeError, ValueError) as exc:
        raise SchemaError(f"SINK_BIGQUERY_TABLE_SCHEMA_FILE {path}: {exc}") from None


def payload_columns(schema: Sequence[SchemaField], metadata: MetadataColumns) -> list[SchemaField]:
    """The columns a document fills: the table's, less the metadata columns the sink fills itself."""
    own = {f.name.lower() for f in metadata.fields()}
    return [f for f in schema if f.name.lower() not in own]


def ensure_json_table(client: bigquery.Client, cfg: Config, destination: Destination,
                      metadata: MetadataColumns, dataset_ready: bool = False) -> list[SchemaField]:
    """The destination's live schema, after creating the table from the schema file if it is missing and
    adding what the sink itself writes (metadata columns, `additional_properties`)."""
    bq, call = cfg.bigquery, call_options(cfg.bigquery)
    table_ref = f"{bq.project_id}.{destination.dataset}.{destination.table}"
    if bq.table_schema_file:
        base = read_schema_file(bq.table_schema_file)
    else:
        from google.api_core.exceptions import NotFound

        try:
            base = list(client.get_table(table_ref, **call).schema)
        except NotFound:
            raise SchemaError(f"table {table_ref} does not exist and SINK_BIGQUERY_TABLE_SCHEMA_FILE is not set: with "
                              "JSON input the table's schema is the schema; create the table or give a schema "
                              "file") from None
    names = {f.name.lower() for f in base}
    extra = [f for f in metadata.fields() if f.name.lower() not in names]
    if bq.additional_properties and ADDITIONAL_PROPERTIES not in names:
        extra.append(ADDITIONAL_PROPERTIES_COLUMN)
    wanted = table_definition(table_ref, [*base, *extra], cfg.table,
                              f"Written by firehose-bq from JSON messages of Kafka topic(s) "
                              f"{', '.join(cfg.source.topics)}.")
    if not dataset_ready:  # the caller ensured it just now, for another of its tables
        ensure_dataset(client, bq.project_id, destination.dataset, bq.dataset_location, cfg.table.dataset_labels,
                       **call)
    source = f"SINK_BIGQUERY_TABLE_SCHEMA_FILE {bq.table_schema_file}" if bq.table_schema_file else "the table"
    # Columns the schema file lacks are the table's own, which documents still fill: they keep REQUIRED.
    live = list(ensure_table(client, wanted, relax_missing=False, source=source, **call).schema)
    # Checked here, on the driver, before any task builds a decoder (json_rules.plan refuses the column):
    # a task's error would stop the job in its first batch, as a worker traceback, on every restart.
    column = next((f for f in live if f.name.lower() == ADDITIONAL_PROPERTIES), None)
    if bq.additional_properties and column is not None and (column.field_type, column.mode) != ("STRING", "NULLABLE"):
        raise SchemaError(f"table {table_ref}: column {column.name} is {column.mode} {column.field_type}, but "
                          "SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE keeps unknown values there as JSON text, so it "
                          "must be a NULLABLE STRING; rename the column or turn that setting off")
    return live


def schema_json(columns: Sequence[SchemaField]) -> tuple[str, ...]:
    """Columns as API JSON text: small, and picklable whatever the client library's classes are."""
    return tuple(json.dumps(c.to_api_repr()) for c in columns)


def schema_fields(columns: Sequence[str]) -> list[SchemaField]:
    return [SchemaField.from_api_repr(json.loads(c)) for c in columns]


class JsonTableSchema:
    """The driver's view of a JSON job's one table: read (or created) at start, re-read after the TTL."""

    def __init__(self, config: Config, metadata: MetadataColumns) -> None:
        self.config = config
        self.metadata = metadata
        self._columns: tuple[str, ...] | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def columns(self) -> tuple[str, ...]:
        """The payload columns (as `schema_json`), re-read when older than the TTL."""
        with self._lock:
            ttl = self.config.bigquery.table_schema_cache_ttl_ms / 1000
            if self._columns is None or time.monotonic() - self._read_at >= ttl:
                destination = self.config.router.static_destination()
                with make_client(self.config.bigquery) as client:
                    live = ensure_json_table(client, self.config, destination, self.metadata)
                columns = schema_json(payload_columns(live, self.metadata))
                if columns != self._columns:
                    log.info("table %s: %d payload columns for JSON input", destination.name, len(columns))
                self._columns, self._read_at = columns, time.monotonic()
            return self._columns
