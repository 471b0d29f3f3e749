"""Create datasets and tables when missing; evolve table schemas by adding and relaxing, never dropping."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.errors import SchemaError, SchemaEvolutionError

log = logging.getLogger(__name__)

# Several workers may evolve the same table at once; each retry re-reads the table, so a handful of
# attempts resolves any realistic race.
UPDATE_ATTEMPTS = 5

# Legacy and standard SQL spell some types differently; the API may answer with either.
_TYPE_ALIASES = {"INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN", "STRUCT": "RECORD"}


def _type(f: SchemaField) -> str:
    return _TYPE_ALIASES.get(f.field_type.upper(), f.field_type.upper())


def _mode(f: SchemaField) -> str:
    return (f.mode or "NULLABLE").upper()


def merge_schema(current: Sequence[SchemaField], wanted: Sequence[SchemaField], path: str = "") -> list[SchemaField]:
    """The schema that holds both: `current` in its order, then new fields of `wanted`.

    New fields are added NULLABLE (or REPEATED); REQUIRED relaxes to NULLABLE when `wanted` says so;
    fields `wanted` lacks stay (old rows keep their data). A type change, or a change into or out of
    REPEATED, cannot be applied by BigQuery and raises SchemaEvolutionError naming the field.
    """
    wanted_by_name = {f.name.lower(): f for f in wanted}
    merged = []
    for old in current:
        new = wanted_by_name.pop(old.name.lower(), None)
        merged.append(old if new is None else _merge_field(old, new, f"{path}{old.name}"))
    for new in wanted_by_name.values():
        merged.append(_as_added(new))
    return merged


def _merge_field(old: SchemaField, new: SchemaField, path: str) -> SchemaField:
    if _type(old) != _type(new):
        raise SchemaEvolutionError(
            f"field {path}: type {_type(old)} in the table, {_type(new)} in the proto; BigQuery cannot "
            "change a column's type (add a new field in the proto instead)"
        )
    old_mode, new_mode = _mode(old), _mode(new)
    if (old_mode == "REPEATED") != (new_mode == "REPEATED"):
        raise SchemaEvolutionError(
            f"field {path}: mode {old_mode} in the table, {new_mode} in the proto; BigQuery cannot "
            "change a column into or out of REPEATED"
        )
    mode = "NULLABLE" if old_mode == "REQUIRED" and new_mode == "NULLABLE" else old_mode
    fields = old.fields
    if _type(old) == "RECORD":
        fields = tuple(merge_schema(old.fields, new.fields, f"{path}."))
    if mode == old_mode and fields == old.fields:
        return old
    return _with(old, mode, fields)


def _as_added(f: SchemaField) -> SchemaField:
    mode = "REPEATED" if _mode(f) == "REPEATED" else "NULLABLE"  # BigQuery cannot add REQUIRED columns
    return _with(f, mode, tuple(_as_added(s) for s in f.fields))


def _with(f: SchemaField, mode: str, fields: Sequence[SchemaField]) -> SchemaField:
    """`f` with another mode and subfields; every other property (description, tags) kept."""
    api = f.to_api_repr()
    api["mode"] = mode
    if fields:
        api["fields"] = [s.to_api_repr() for s in fields]
    return SchemaField.from_api_repr(api)


def ensure_dataset(client: bigquery.Client, project: str, dataset: str, location: str) -> None:
    ref = bigquery.DatasetReference(project, dataset)
    try:
        existing = client.get_dataset(ref)
    except api_exceptions.NotFound:
        wanted = bigquery.Dataset(ref)
        wanted.location = location
        client.create_dataset(wanted, exists_ok=True)
        log.info("created dataset %s.%s in %s", project, dataset, location)
        return
    if existing.location and location and existing.location.lower() != location.lower():
        raise SchemaError(
            f"dataset {project}.{dataset} is in {existing.location}, but SINK_BIGQUERY_DATASET_LOCATION "
            f"says {location}; a dataset cannot move: fix the setting or use another dataset"
        )


def ensure_table(client: bigquery.Client, table_ref: str, schema: Sequence[SchemaField]) -> bigquery.Table:
    """Create the table, or add to its schema what the proto has gained; returns the live table."""
    for _ in range(UPDATE_ATTEMPTS):
        try:
            table = client.get_table(table_ref)
        except api_exceptions.NotFound:
            table = client.create_table(bigquery.Table(table_ref, schema=list(schema)), exists_ok=True)
            log.info("created table %s with %d columns", table_ref, len(schema))
            if table.schema:
                return table
            continue  # created concurrently by another worker without our schema: re-read and merge
        merged = merge_schema(table.schema, schema)
        if merged == list(table.schema):
            return table
        added = _names(merged) - _names(table.schema)
        table.schema = merged
        try:
            updated = client.update_table(table, ["schema"])  # sends the etag: a concurrent change fails
        except api_exceptions.PreconditionFailed:
            continue
        log.info("evolved table %s: added %s", table_ref, sorted(added) or "nothing (relaxed modes)")
        return updated
    raise SchemaError(f"table {table_ref}: schema update kept conflicting after {UPDATE_ATTEMPTS} attempts")


def _names(fields: Sequence[SchemaField], prefix: str = "") -> set[str]:
    names = set()
    for f in fields:
        names.add(prefix + f.name)
        names |= _names(f.fields, f"{prefix}{f.name}.")
    return names
