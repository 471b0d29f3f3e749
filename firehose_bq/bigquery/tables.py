"""Create datasets and tables when missing; evolve table schemas by adding and relaxing, never dropping."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.config import TableConfig
from firehose_bq.errors import ErrorType, SchemaError, SchemaEvolutionError, SinkError
from firehose_bq.schema import TYPE_ALIASES

log = logging.getLogger(__name__)

# Several workers may evolve the same table at once; each retry re-reads the table, so a handful of
# attempts resolves any realistic race.
UPDATE_ATTEMPTS = 5

def _type(f: SchemaField) -> str:
    return TYPE_ALIASES.get(f.field_type.upper(), f.field_type.upper())


def _mode(f: SchemaField) -> str:
    return (f.mode or "NULLABLE").upper()


def merge_schema(current: Sequence[SchemaField], wanted: Sequence[SchemaField], path: str = "",
                 relax_missing: bool = True, source: str = "the proto") -> list[SchemaField]:
    """The schema that holds both: `current` in its order, then new fields of `wanted`.

    New fields are added NULLABLE (or REPEATED); REQUIRED relaxes to NULLABLE when `wanted` says so;
    fields `wanted` lacks stay (old rows keep their data), relaxed to NULLABLE when REQUIRED: no new row
    can hold a value there, and BigQuery would refuse every one of them (not with `relax_missing` False:
    a JSON table's own columns, which documents still fill). A type change, or a change into or out of
    REPEATED, cannot be applied by BigQuery and raises SchemaEvolutionError naming the field and
    `source`, where `wanted` comes from (the proto, or JSON input's schema file): what the user must edit.
    """
    wanted_by_name = {f.name.lower(): f for f in wanted}
    merged = []
    for old in current:
        new = wanted_by_name.pop(old.name.lower(), None)
        if new is None:
            merged.append(_with(old, "NULLABLE", old.fields) if relax_missing and _mode(old) == "REQUIRED" else old)
        else:
            merged.append(_merge_field(old, new, f"{path}{old.name}", relax_missing, source))
    for new in wanted_by_name.values():
        merged.append(_as_added(new))
    return merged


def _merge_field(old: SchemaField, new: SchemaField, path: str, relax_missing: bool, source: str) -> SchemaField:
    if _type(old) != _type(new):
        raise SchemaEvolutionError(
            f"field {path}: type {_type(old)} in the table, {_type(new)} in {source}; BigQuery cannot "
            f"change a column's type (add a new field in {source} instead)"
        )
    old_mode, new_mode = _mode(old), _mode(new)
    if (old_mode == "REPEATED") != (new_mode == "REPEATED"):
        raise SchemaEvolutionError(
            f"field {path}: mode {old_mode} in the table, {new_mode} in {source}; BigQuery cannot "
            "change a column into or out of REPEATED"
        )
    mode = "NULLABLE" if old_mode == "REQUIRED" and new_mode == "NULLABLE" else old_mode
    fields = old.fields
    if _type(old) == "RECORD":
        fields = tuple(merge_schema(old.fields, new.fields, f"{path}.", relax_missing, source))
    if mode == old_mode and fields == old.fields:
        return old
    return _with(old, mode, fields)


def _as_added(f: SchemaField) -> SchemaField:
    mode = "REPEATED" if _mode(f) == "REPEATED" else "NULLABLE"  # BigQuery cannot add REQUIRED columns
    return _with(f, mode, tuple(_as_added(s) for s in f.fields))


def _with(f: SchemaField, mode: str, fields: Sequence[SchemaField]) -> SchemaField:
    """`f` with another mode and subfields; every other property (description, tags) kept."""
    api = copy.deepcopy(f.to_api_repr())  # to_api_repr hands out the field's own dict
    api["mode"] = mode
    if fields:
        api["fields"] = [s.to_api_repr() for s in fields]
    return SchemaField.from_api_repr(api)


# Column types BigQuery can cluster by (top-level, not REPEATED).
CLUSTERABLE = {"STRING", "INTEGER", "BOOLEAN", "DATE", "TIMESTAMP", "DATETIME", "NUMERIC", "BIGNUMERIC",
               "GEOGRAPHY", "RANGE"}
PARTITIONABLE = {"TIMESTAMP", "DATE", "DATETIME"}


def table_definition(table_ref: str, schema: Sequence[SchemaField], cfg: TableConfig,
                     description: str) -> bigquery.Table:
    """The table as configuration wants it; partition and clustering columns checked against `schema`."""
    columns = {f.name.lower(): f for f in schema}
    table = bigquery.Table(table_ref, schema=list(schema))
    table.description = description
    table.labels = dict(cfg.table_labels)
    if cfg.partitioning_enable:
        key = cfg.partition_key or None
        if key:
            _check_column(columns, key, PARTITIONABLE, "SINK_BIGQUERY_TABLE_PARTITION_KEY")
        table.time_partitioning = bigquery.TimePartitioning(
            type_=cfg.partitioning_type, field=key,
            expiration_ms=cfg.partition_expiry_ms if cfg.partition_expiry_ms > 0 else None,
        )
    if cfg.clustering_enable:
        for key in cfg.clustering_keys:
            _check_column(columns, key, CLUSTERABLE, "SINK_BIGQUERY_TABLE_CLUSTERING_KEYS")
        table.clustering_fields = list(cfg.clustering_keys)
    return table


def _check_column(columns: dict[str, SchemaField], name: str, allowed: set[str], setting: str) -> None:
    column = columns.get(name.lower())
    if column is None:
        raise SchemaError(f"{setting}: {name!r} is not a top-level column of the table "
                          f"(columns: {', '.join(sorted(columns))})")
    if _type(column) not in allowed or _mode(column) == "REPEATED":
        raise SchemaError(f"{setting}: column {name!r} is {_mode(column)} {_type(column)}; it must be a "
                          f"non-repeated {' / '.join(sorted(allowed))} column")


def ensure_dataset(client: bigquery.Client, project: str, dataset: str, location: str,
                   labels: dict[str, str] | None = None, **call: Any) -> None:
    """`call`: retry/timeout for each API call (bigquery.client.call_options)."""
    ref = bigquery.DatasetReference(project, dataset)
    try:
        existing = client.get_dataset(ref, **call)
    except api_exceptions.NotFound:
        wanted = bigquery.Dataset(ref)
        wanted.location = location
        wanted.labels = dict(labels or {})
        client.create_dataset(wanted, exists_ok=True, **call)
        log.info("created dataset %s.%s in %s", project, dataset, location)
        return
    if existing.location and location and existing.location.lower() != location.lower():
        raise SchemaError(
            f"dataset {project}.{dataset} is in {existing.location}, but SINK_BIGQUERY_DATASET_LOCATION "
            f"says {location}; a dataset cannot move: fix the setting or use another dataset"
        )
    if labels and any(existing.labels.get(k) != v for k, v in labels.items()):
        existing.labels = {**existing.labels, **labels}
        client.update_dataset(existing, ["labels"], **call)


def ensure_table(client: bigquery.Client, wanted: bigquery.Table, on_change: Callable[[str], None] | None = None,
                 relax_missing: bool = True, source: str = "the proto", **call: Any) -> bigquery.Table:
    """Create the table, or bring a live one up to `wanted`: add to its schema, set its labels.
    `on_change(what)` is told when the table was created or its schema changed (metrics). `relax_missing`
    and `source` (where `wanted`'s schema comes from, for its errors): see merge_schema.

    Partitioning cannot change on a live table; a difference is logged, not applied.
    """
    table_ref = f"{wanted.project}.{wanted.dataset_id}.{wanted.table_id}"
    for _ in range(UPDATE_ATTEMPTS):
        try:
            table = client.get_table(table_ref, **call)
        except api_exceptions.NotFound:
            client.create_table(wanted, exists_ok=True, **call)
            log.info("created table %s with %d columns", table_ref, len(wanted.schema))
            if on_change is not None:
                on_change("created")
            continue  # another worker may have created it first, with an older schema: re-read and merge
        _warn_on_layout_drift(table, wanted)
        merged = merge_schema(table.schema, wanted.schema, relax_missing=relax_missing, source=source)
        changes = schema_changes(table.schema, merged)
        fields = ["schema"] if changes else []
        if wanted.labels and any(table.labels.get(k) != v for k, v in wanted.labels.items()):
            table.labels = {**table.labels, **wanted.labels}
            fields.append("labels")
        if not fields:
            return table
        table.schema = merged
        try:
            updated = client.update_table(table, fields, **call)  # sends the etag: a concurrent change fails
        except api_exceptions.PreconditionFailed:
            continue
        if changes:
            log.info("evolved table %s: %s", table_ref, "; ".join(changes))
            if on_change is not None:
                on_change("evolved")
        return updated
    # Other writers kept changing the table under this one: a race, not the table's or the records' fault, so
    # retryable (a stop and restart settles it), never a SchemaError, whose routed records would be
    # dead-lettered as ROUTING_ERRORs.
    raise SinkError(ErrorType.SINK_RETRYABLE_ERROR,
                    f"table {table_ref}: its update kept conflicting with concurrent ones after {UPDATE_ATTEMPTS} attempts")


def schema_changes(current: Sequence[SchemaField], merged: Sequence[SchemaField], path: str = "") -> list[str]:
    """What turning `current` into `merged` does, one readable line per change."""
    before = {f.name.lower(): f for f in current}
    changes = []
    for f in merged:
        old = before.get(f.name.lower())
        name = f"{path}{f.name}"
        if old is None:
            changes.append(f"add {name} {_mode(f)} {_type(f)}")
            continue
        if _mode(old) != _mode(f):
            changes.append(f"relax {name} {_mode(old)} -> {_mode(f)}")
        if _type(f) == "RECORD":
            changes.extend(schema_changes(old.fields, f.fields, f"{name}."))
    return changes


def _warn_on_layout_drift(live: bigquery.Table, wanted: bigquery.Table) -> None:
    def partitioning(t: bigquery.Table) -> tuple[str | None, str | None]:
        p = t.time_partitioning
        return (p.type_, p.field) if p else (None, None)

    if partitioning(live) != partitioning(wanted) or (live.clustering_fields or []) != (
            wanted.clustering_fields or []):
        log.warning(
            "table %s exists with partitioning %s and clustering %s, configuration asks for %s and %s; "
            "BigQuery cannot change partitioning of a live table, so it is left as it is",
            live.table_id, partitioning(live), live.clustering_fields, partitioning(wanted),
            wanted.clustering_fields,
        )
