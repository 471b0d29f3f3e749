"""A JSON column refuses a value holding a number beyond FLOAT64's range; in a load job, the whole job.

BigQuery's JSON type "can store integers in the range of -9,223,372,036,854,775,808 ... to
18,446,744,073,709,551,615 and floating point numbers within a domain of FLOAT64"; it rounds other numbers
to FLOAT64, and one that cannot be rounded (1e400, -1e999) is an error. A load job fails as a whole on
such a value. bqemulator stores DuckDB JSON, which keeps `1e400` as it is. Here a newline-delimited JSON
load fails with `invalid` (as BigQuery's load job does) when a line holds such a number (no column of any
type holds one, so every line is read whole), and so does a Parquet load into a table with top-level JSON
columns (which `parquet_load_json_columns`, applied later, now refuses before it is read); insertAll and
Storage Write rows go through `row_values._coerce_json`, which asks `holds_number_beyond_float64` too.

Shown by tests/integration/test_json_input.py::test_a_json_value_bigquery_cannot_store_is_a_dead_letter_not_a_crash_loop
and tests/integration/test_file_loads.py::test_emulator_refuses_a_parquet_load_into_a_table_with_a_json_column.
"""

import json
import math
from typing import Any

from ._targets import PatchTargetMissingError, module, replace, require


def holds_number_beyond_float64(text: str) -> bool:
    """True when the JSON text holds a number (at any depth) that rounds to an infinite FLOAT64."""
    found = False

    def number(literal: str) -> float:
        nonlocal found
        value = float(literal)
        found = found or math.isinf(value)
        return value

    try:
        json.loads(text, parse_float=number, parse_int=number)
    except ValueError:
        return False  # not JSON: refused for that reason elsewhere
    return found


def apply() -> list[str]:
    """Check a JSON load's lines and a Parquet load's JSON columns before the rows are inserted."""
    executor = module("bqemulator.jobs.executor")
    errors = module("bqemulator.domain.errors")
    validation_error = require(errors, "ValidationError")
    handlers = require(executor, "_LOAD_FORMAT_HANDLERS")
    load = handlers.get("PARQUET")
    if load is None:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS has no PARQUET handler")
    parquet = module("pyarrow.parquet")

    def _load_parquet(path: str, target_ref: str, ctx: Any) -> None:
        described = ctx.engine.execute(f"DESCRIBE {target_ref}").fetchall()
        json_columns = {row[0].lower() for row in described if str(row[1]).upper() == "JSON"}
        if json_columns:
            names = [n for n in parquet.read_schema(path).names if n.lower() in json_columns]
            table = parquet.read_table(path, columns=names)
            for name in names:
                for i, value in enumerate(table.column(name).to_pylist()):
                    if isinstance(value, str) and holds_number_beyond_float64(value):
                        raise validation_error(
                            f"Error while reading data, error message: JSON column {name}, row {i + 1}: a number "
                            "that cannot be stored without loss of precision or rounded: out of FLOAT64 range")
        load(path, target_ref, ctx)

    json_load = handlers.get("NEWLINE_DELIMITED_JSON")
    if json_load is None:
        raise PatchTargetMissingError("bqemulator.jobs.executor._LOAD_FORMAT_HANDLERS has no NEWLINE_DELIMITED_JSON "
                                      "handler")

    def _load_json(path: str, target_ref: str, ctx: Any) -> None:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if holds_number_beyond_float64(line):
                    raise validation_error(
                        f"Error while reading data, error message: JSON parsing error in row starting at line "
                        f"{number}: a number that cannot be stored without loss of precision or rounded: out of "
                        "FLOAT64 range")
        json_load(path, target_ref, ctx)

    handlers["PARQUET"] = _load_parquet
    for name in [name for name, handler in handlers.items() if handler is json_load]:
        handlers[name] = _load_json  # "JSON" is an alias of NEWLINE_DELIMITED_JSON
    return [replace(executor, "_load_parquet", _load_parquet) + " (+ _LOAD_FORMAT_HANDLERS)",
            replace(executor, "_load_json", _load_json) + " (+ _LOAD_FORMAT_HANDLERS)"]
