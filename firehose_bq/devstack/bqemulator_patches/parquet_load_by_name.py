"""A Parquet load matches the file's columns to the table's by name.

bqemulator loads Parquet with ``INSERT INTO t SELECT * FROM read_parquet(?)``, which pairs columns by
position: a table with a column the file lacks fails ("table has 11 columns but 10 values were
supplied"), and a file whose columns come in another order fills the wrong columns or fails a cast.
BigQuery matches Parquet columns to the table's by name (case-insensitively, as DuckDB's ``BY NAME``
does) and leaves the table's other columns NULL. Nested RECORD fields were already matched by name.

Shown by tests/integration/test_emulator_gaps.py::test_parquet_load_matches_columns_by_name.
"""

from typing import Any

from ._targets import PatchTargetMissingError, module, replace, require


def apply() -> list[str]:
    """Route Parquet loads through an ``INSERT ... BY NAME``."""
    executor = module("bqemulator.jobs.executor")
    handlers = require(executor, "_LOAD_FORMAT_HANDLERS")
    original = require(executor, "_load_parquet")
    if handlers.get("PARQUET") is not original:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS no longer maps PARQUET to "
                                      "_load_parquet")

    def _load_parquet(path: str, target_ref: str, ctx: Any) -> None:
        ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT * FROM read_parquet(?)", [path])

    handlers["PARQUET"] = _load_parquet
    return [replace(executor, "_load_parquet", _load_parquet) + " (+ _LOAD_FORMAT_HANDLERS)"]
