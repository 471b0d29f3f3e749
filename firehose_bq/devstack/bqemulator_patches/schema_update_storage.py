"""Gap 3, part 2: a schema change made through ``tables.patch`` / ``tables.update`` changes the table.

In BigQuery a column added by updating the table's schema can be written at once. bqemulator only
rewrites the catalog entry: the DuckDB table keeps its old columns, and the next insert that uses a new
column fails with HTTP 500. Every write of a table's metadata goes through
``CatalogRepository.update_table``, which is wrapped here; when the schema changed, the stored table is
brought up to date first:

* a missing top-level column: ``ALTER TABLE ADD COLUMN`` (old rows read NULL, or [] for REPEATED);
* new subfields inside a RECORD or REPEATED RECORD: ``ALTER COLUMN ... SET DATA TYPE``. DuckDB casts
  structs by field name, so old rows get NULLs;
* REQUIRED to NULLABLE: ``DROP NOT NULL`` where the column has that constraint;
* the ``__placeholder`` column of a table created without a schema is dropped once real columns exist.

The step is idempotent: it compares with the stored table, not the old metadata, so paths that already
altered storage (DDL) cost nothing.

Shown by tests/integration/test_emulator_gaps.py::test_gap3_update_table_adds_columns_and_relaxes_required and
::test_gap3_update_table_adds_nested_subfields.
"""

from collections.abc import Callable
from typing import Any

from ._bq_types import canonical_type, mode, quote_ident
from ._targets import LOG, module, replace, require


def _needs_nested_widening(field: Any, storage_type: Any) -> bool:
    """True when ``field`` (a RECORD, maybe REPEATED) has subfields the stored column lacks."""
    import pyarrow as pa  # bqemulator dependency

    if mode(field) == "REPEATED":
        if not (pa.types.is_list(storage_type) or pa.types.is_large_list(storage_type)):
            return False
        storage_type = storage_type.value_type
    if canonical_type(field.type) != "RECORD" or not pa.types.is_struct(storage_type):
        return False
    stored = {
        storage_type.field(i).name.lower(): storage_type.field(i).type for i in range(storage_type.num_fields)
    }
    for sub in field.fields:
        sub_type = stored.get(sub.name.lower())
        if sub_type is None or _needs_nested_widening(sub, sub_type):
            return True
    return False


def apply() -> list[str]:
    """Wrap both catalog repositories' ``update_table`` so that storage follows the new schema."""
    import duckdb  # bqemulator dependency

    memory_mod = module("bqemulator.catalog.memory_repository")
    duckdb_mod = module("bqemulator.catalog.duckdb_repository")
    engine_cls = require(module("bqemulator.storage.engine"), "DuckDBEngine")
    require(engine_cls, "fetch_arrow")
    tables = module("bqemulator.api.routes.tables")
    sql_ids = module("bqemulator.storage.sql_identifiers")
    type_map = module("bqemulator.storage.type_map")
    field_to_rest = require(tables, "_field_to_rest")
    quoted_table_ref = require(sql_ids, "quoted_table_ref")
    require(type_map, "bq_schema_to_duckdb_columns")
    classes = [
        require(memory_mod, "MemoryCatalogRepository"),
        require(duckdb_mod, "DuckDBCatalogRepository"),
    ]

    def reconcile(engine: Any, new: Any) -> None:
        target = quoted_table_ref(new.project_id, new.dataset_id, new.table_id)
        try:
            # Fetch the result in full: DuckDB refuses further work on the connection
            # while a result is left unfinished (a lazy reader would be).
            stored_schema = engine.fetch_arrow(f"SELECT * FROM {target} LIMIT 0").schema
            notnull = {
                row[1].lower(): bool(row[3])
                for row in engine.execute(f"PRAGMA table_info({target})").fetchall()
            }
        except duckdb.CatalogException:  # no physical table (a view, or not created yet)
            return
        stored = {
            stored_schema.field(i).name.lower(): stored_schema.field(i).type
            for i in range(len(stored_schema))
        }
        # Look the function up at call time, so the keyword-quoting patch applies.
        columns = type_map.bq_schema_to_duckdb_columns([field_to_rest(f) for f in new.schema_.fields])
        statements: list[str] = []
        for field, (name, duck_type) in zip(new.schema_.fields, columns, strict=True):
            column = quote_ident(name)
            stored_type = stored.get(name.lower())
            if stored_type is None:
                statements.append(f"ALTER TABLE {target} ADD COLUMN {column} {duck_type}")
                continue
            if _needs_nested_widening(field, stored_type):
                statements.append(f"ALTER TABLE {target} ALTER COLUMN {column} SET DATA TYPE {duck_type}")
            if mode(field) != "REQUIRED" and notnull.get(name.lower()):
                statements.append(f"ALTER TABLE {target} ALTER COLUMN {column} DROP NOT NULL")
        wanted = {f.name.lower() for f in new.schema_.fields}
        if "__placeholder" in stored and "__placeholder" not in wanted and new.schema_.fields:
            statements.append(f'ALTER TABLE {target} DROP COLUMN "__placeholder"')
        for statement in statements:
            LOG.info(
                "schema change on %s:%s.%s -> %s", new.project_id, new.dataset_id, new.table_id, statement
            )
            engine.execute(statement)

    patched: list[str] = []
    for cls in classes:
        original = require(cls, "update_table")

        def update_table(self: Any, table: Any, _original: Callable[..., Any] = original) -> Any:
            # The DuckDB repository also calls the update_table of its in-memory
            # cache. The cache has no engine, so storage is reconciled once.
            engine = getattr(self, "_engine", None)
            if engine is not None and table.table_type == "TABLE":
                old = self.get_table(table.project_id, table.dataset_id, table.table_id)
                if old is not None and old.schema_ != table.schema_:
                    reconcile(engine, table)
            return _original(self, table)

        patched.append(replace(cls, "update_table", update_table))
    return patched
