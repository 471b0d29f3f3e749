"""Gap 3, part 3: ``ALTER TABLE`` run as a query also changes the table's schema as ``get_table`` shows it.

In BigQuery ``ALTER TABLE ADD COLUMN`` is a schema change like any other. bqemulator's query path runs
``ALTER TABLE ADD/DROP/RENAME COLUMN`` in DuckDB but syncs only CREATE/DROP into the catalog, so
``get_table`` and insertAll validation still see the old schema. After each statement the executor and
the script interpreter call ``ddl_sync.sync_dropped_object``; the wrapper runs it and then, for ALTER
TABLE, rebuilds the schema from the stored columns. Existing fields keep their metadata (mode,
description); added columns take their type from the DDL where bqemulator can map it, and otherwise
from DuckDB introspection.

Shown by tests/integration/test_emulator_gaps.py::test_gap3_ddl_alter_table_add_column_updates_metadata.
"""

from typing import Any

from ._bq_types import mode
from ._targets import module, replace, require


def apply() -> list[str]:
    """Rebind ``sync_dropped_object`` (where it is defined and where it was imported) to also sync ALTER TABLE."""
    import sqlglot  # bqemulator dependency
    from sqlglot import exp

    ddl_sync = module("bqemulator.catalog.ddl_sync")
    ddl_result = module("bqemulator.jobs.ddl_result")
    tables = module("bqemulator.api.routes.tables")
    executor = module("bqemulator.jobs.executor")
    interpreter = module("bqemulator.scripting.interpreter")
    models = module("bqemulator.catalog.models")
    original = require(ddl_sync, "sync_dropped_object")
    unwrap_target = require(ddl_sync, "_unwrap_table_target")
    split_target = require(ddl_sync, "_split_target")
    introspect_schema = require(ddl_sync, "_introspect_schema")
    field_from_column_def = require(ddl_result, "_field_from_column_def")
    parse_schema_fields = require(tables, "_parse_schema_fields")
    table_schema_cls = require(models, "TableSchema")
    alter_cls = require(exp, "Alter")

    def sync_altered_table(bq_sql: str, project_id: str, ctx: Any) -> None:
        try:
            tree = sqlglot.parse_one(bq_sql, read="bigquery")
        except Exception:  # noqa: BLE001 - not parseable, so not an ALTER we understand
            return
        if not isinstance(tree, alter_cls) or (tree.args.get("kind") or "").upper() != "TABLE":
            return
        target = unwrap_target(tree.this)
        if target is None:
            return
        p_id, d_id, t_id = split_target(target, project_id)
        meta = ctx.catalog.get_table(p_id, d_id, t_id) if d_id and t_id else None
        if meta is None or meta.table_type != "TABLE":
            return
        actions = tree.args.get("actions") or []
        declared: dict[str, Any] = {}
        relaxed: set[str] = set()
        for action in actions:
            if isinstance(action, exp.ColumnDef):
                rest = field_from_column_def(action)
                if rest is not None:
                    declared[action.name.lower()] = parse_schema_fields([rest])[0]
            elif isinstance(action, exp.AlterColumn) and "DROP NOT NULL" in action.sql("bigquery").upper():
                relaxed.add(action.name.lower())
        stored_fields = introspect_schema(p_id, d_id, t_id, ctx).fields
        existing = {f.name.lower(): f for f in meta.schema_.fields}
        merged = []
        for stored_field in stored_fields:
            key = stored_field.name.lower()
            if key == "__placeholder" and key not in existing:
                continue
            field = existing.get(key) or declared.get(key) or stored_field
            if key in relaxed and mode(field) == "REQUIRED":
                field = field.model_copy(update={"mode": "NULLABLE"})
            merged.append(field)
        new_schema = table_schema_cls(fields=tuple(merged))
        if new_schema != meta.schema_:
            ctx.catalog.update_table(
                meta.model_copy(update={"schema_": new_schema, "last_modified_time": ctx.clock.now()})
            )

    def sync_dropped_object(bq_sql: str, project_id: str, ctx: Any) -> None:
        original(bq_sql, project_id, ctx)
        sync_altered_table(bq_sql, project_id, ctx)

    sync_dropped_object.__doc__ = original.__doc__
    # The executor and the interpreter imported the name, so it is rebound in each.
    return [
        replace(owner, "sync_dropped_object", sync_dropped_object)
        for owner in (ddl_sync, executor, interpreter)
    ]
