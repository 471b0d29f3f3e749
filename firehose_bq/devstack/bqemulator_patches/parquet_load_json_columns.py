"""A Parquet load job into a table with a JSON column (at any depth) fails, as on BigQuery.

BigQuery's "Working with JSON data" (Limitations): "If you use a batch load job to ingest JSON data into a
table, the source data must be in CSV, Avro, or JSON format. Other batch load formats are not supported."
Its load job then ends with an `invalid` error (HTTP 400 class) and loads nothing. bqemulator reads the
Parquet into the table's DuckDB JSON column without a word, so a write path staging Parquet for such a
table passed every local test and failed every load on BigQuery. Here a PARQUET load into a table whose
schema holds a JSON column, top level, inside a RECORD or REPEATED, fails before any row is read, with a
ValidationError (`invalid`) naming the format and the column.

Shown by tests/integration/test_file_loads.py::test_emulator_refuses_a_parquet_load_into_a_table_with_a_json_column
(and tests/integration/test_json_input.py::test_file_loads_into_json_columns_land_every_row_once, which
needs the file-loads path to stage newline-delimited JSON for such tables).
"""

from typing import Any

from ._targets import module, replace, require


def json_column(fields: Any, prefix: str = "") -> str | None:
    """The dotted path of the first JSON column among `fields` (bqemulator's TableFieldSchema), at any depth."""
    for field in fields:
        path = f"{prefix}{field.name}"
        if str(field.type).upper() == "JSON":
            return path
        found = json_column(field.fields or (), f"{path}.")
        if found is not None:
            return found
    return None


def apply() -> list[str]:
    """Refuse the PARQUET load of such a table where a load's files are dispatched to their format's reader;
    applied before `load_job_atomic`, whose wrapper then rolls the job's transaction back."""
    executor = module("bqemulator.jobs.executor")
    validation_error = require(module("bqemulator.domain.errors"), "ValidationError")
    original = require(executor, "_load_path_into_target")

    def _load_path_into_target(path: str, job: Any, ctx: Any) -> None:
        if job.source_format == "PARQUET":
            table = ctx.catalog.get_table(job.project_id, job.dataset_id, job.table_id)
            column = json_column(table.schema_.fields) if table is not None else None
            if column is not None:
                raise validation_error(
                    f"Error while reading data, error message: column {column} of table {job.dataset_id}."
                    f"{job.table_id} has type JSON, which a load job cannot fill from PARQUET: JSON columns "
                    "are loaded from CSV, NEWLINE_DELIMITED_JSON or AVRO")
        original(path, job, ctx)

    return [replace(executor, "_load_path_into_target", _load_path_into_target)]
