"""A newline-delimited JSON load reads BYTES values as base64, at any depth.

BigQuery reads a BYTES value in a JSON load as base64 text. bqemulator's ``COPY ... (FORMAT JSON)``
stores the text's own bytes instead. For a table with BYTES columns (at any depth), the rows are read as
text and every BYTES value goes through ``from_base64``; other tables load as before.

Shown by tests/integration/test_file_loads.py::test_emulator_keeps_an_uploaded_load_jobs_id_and_decodes_bytes.
"""

import re
from typing import Any

from ._bq_types import quote_ident
from ._targets import PatchTargetMissingError, module, replace, require


def _base64_decoding(arrow_type: Any, expr: str, depth: int = 0) -> str | None:
    """A DuckDB expression that decodes every BYTES value inside ``expr`` from base64; None if none."""
    pa = module("pyarrow")
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return f"from_base64({expr})"
    if pa.types.is_struct(arrow_type):
        parts = [(f, _base64_decoding(f.type, f"{expr}.{quote_ident(f.name)}", depth))
                 for f in arrow_type]
        if all(decoded is None for _, decoded in parts):
            return None
        packed = ", ".join(f"{quote_ident(f.name)} := {decoded or f'{expr}.{quote_ident(f.name)}'}"
                           for f, decoded in parts)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE struct_pack({packed}) END"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        var = f"x{depth}"
        inner = _base64_decoding(arrow_type.value_type, var, depth + 1)
        return None if inner is None else f"list_transform({expr}, lambda {var}: {inner})"
    return None


def apply() -> list[str]:
    """Route JSON loads of tables with BYTES columns through a base64-decoding INSERT."""
    executor = module("bqemulator.jobs.executor")
    handlers = require(executor, "_LOAD_FORMAT_HANDLERS")
    original = require(executor, "_load_json")
    if handlers.get("NEWLINE_DELIMITED_JSON") is not original:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS no longer maps JSON to _load_json")

    def _load_json(path: str, target_ref: str, ctx: Any) -> None:
        schema = ctx.engine.fetch_arrow(f"SELECT * FROM {target_ref} LIMIT 0").schema
        decoded = [_base64_decoding(f.type, quote_ident(f.name)) for f in schema]
        if all(d is None for d in decoded):
            original(path, target_ref, ctx)
            return
        # Read BLOBs as the text they are in the file: DuckDB's type names with BLOB → VARCHAR.
        described = ctx.engine.execute(f"DESCRIBE {target_ref}").fetchall()
        columns = {row[0]: re.sub(r"\bBLOB\b", "VARCHAR", row[1]) for row in described}
        select = ", ".join(d or quote_ident(f.name) for f, d in zip(schema, decoded, strict=True))
        ctx.engine.execute(
            f"INSERT INTO {target_ref} SELECT {select} FROM read_json(?, columns=?, format='newline_delimited')",
            [path, columns],
        )

    for name in [name for name, handler in handlers.items() if handler is original]:
        handlers[name] = _load_json  # "JSON" is an alias of NEWLINE_DELIMITED_JSON
    return [replace(executor, "_load_json", _load_json) + " (+ _LOAD_FORMAT_HANDLERS)"]
