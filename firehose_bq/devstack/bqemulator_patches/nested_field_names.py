"""A RECORD subfield may be named like a SQL keyword (``inner``, ``order``, ``end``).

BigQuery allows any valid field name at any depth. ``type_map.bq_schema_to_duckdb_columns`` quotes
nothing inside ``STRUCT(...)``, so such a subfield breaks CREATE TABLE. Callers quote the top-level
names themselves, so only the nested ones are quoted here; other fields go to the original function.

Shown by tests/integration/test_emulator_gaps.py::test_record_subfields_named_like_sql_keywords.
"""

from typing import Any

from ._bq_types import RECORD_TYPES, quote_ident
from ._targets import module, replace, require


def apply() -> list[str]:
    """Rebind ``bq_schema_to_duckdb_columns`` (in ``type_map`` and the tables route) to quote subfields."""
    type_map = module("bqemulator.storage.type_map")
    tables = module("bqemulator.api.routes.tables")
    original = require(type_map, "bq_schema_to_duckdb_columns")

    def bq_schema_to_duckdb_columns(fields: list[dict[str, Any]]) -> list[tuple[str, str]]:
        columns: list[tuple[str, str]] = []
        for field in fields:
            if str(field.get("type", "")).upper() not in RECORD_TYPES:
                columns.extend(original([field]))
                continue
            inner = bq_schema_to_duckdb_columns(field.get("fields", []))
            duck_type = "STRUCT(" + ", ".join(f"{quote_ident(n)} {t}" for n, t in inner) + ")"
            if str(field.get("mode", "NULLABLE")).upper() == "REPEATED":
                duck_type += "[]"
            columns.append((field["name"], duck_type))
        return columns

    bq_schema_to_duckdb_columns.__doc__ = original.__doc__
    # The load executor imports the name from type_map at call time. The tables
    # route imported it at module level, so it is rebound there too.
    return [
        replace(type_map, "bq_schema_to_duckdb_columns", bq_schema_to_duckdb_columns),
        replace(tables, "bq_schema_to_duckdb_columns", bq_schema_to_duckdb_columns),
    ]
