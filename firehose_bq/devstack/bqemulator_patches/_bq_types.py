"""BigQuery type and mode names as bqemulator's schema objects carry them, and DuckDB identifier quoting."""


from typing import Any

RECORD_TYPES = frozenset({"RECORD", "STRUCT"})
_TYPE_ALIASES = {"INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN", "STRUCT": "RECORD"}


def quote_ident(name: str) -> str:
    """Quote a DuckDB identifier so that keywords and odd names are safe."""
    return '"' + name.replace('"', '""') + '"'


def canonical_type(bq_type: str) -> str:
    upper = (bq_type or "STRING").upper()
    return _TYPE_ALIASES.get(upper, upper)


def mode(field: Any) -> str:
    return (getattr(field, "mode", None) or "NULLABLE").upper()
