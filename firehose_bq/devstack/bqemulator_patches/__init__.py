"""Patches that make bqemulator 1.4.0 behave like BigQuery where this project relies on it.

One module per gap, each naming in its docstring the BigQuery behaviour it restores and the test that
shows the gap; each exposes `apply(...) -> list[str]` (the dotted names it replaced, for the log).
`bqemulator_launcher.py` applies them, in its order, before the server starts.

| Gap | Module | BigQuery behaviour restored |
| --- | --- | --- |
| 1 | `offline_extensions` | starts without downloading DuckDB extensions (offline) |
| 2 | `insert_all` (+ `row_values`) | insertAll answers per-row `insertErrors` (`invalid` / `stopped`), honours `skipInvalidRows`, `ignoreUnknownValues`, de-duplicates `insertId` |
| 3 | `schema_update_validation` | `tables.patch` refuses incompatible schema changes (400) |
| 3 | `schema_update_storage` | a column added by `tables.patch` can be written at once |
| 3 | `ddl_alter_table` | `ALTER TABLE ADD COLUMN` shows in the table's schema |
| 4 | `multipart_upload` | small (multipart) load jobs are accepted |
| 5 | `storage_write_records` | Storage Write into RECORD columns |
| 6 | `append_rows_stream` | an AppendRows connection keeps the stream its first request named |
| - | `storage_write_row_errors` | Storage Write answers bad rows in `row_errors`, appends nothing; a writer schema with columns the table lacks is SCHEMA_MISMATCH_EXTRA_FIELDS |
| - | `storage_write_time_text` | Storage Write Arrow rows take a top-level TIME column as its text |
| - | `nested_field_names` | RECORD subfields named like SQL keywords |
| - | `load_job_partitioning` | a load job that creates its table keeps partitioning and clustering |
| - | `abandoned_results` | writes after a `tabledata.list` (DuckDB 2.0 "unfinished result") |
| - | `upload_job_id` | an uploaded load job keeps its job id; a taken id answers 409 |
| - | `json_load_bytes` | a JSON load reads BYTES as base64 |
| - | `parquet_load_by_name` | a Parquet load matches columns by name |
| - | `json_column_numbers` (+ `row_values`) | a JSON column refuses a number beyond FLOAT64's range; a Parquet load holding one fails |
| - | `thread_connections` | concurrent requests (a query while rows are appended) each get a connection |
| - | `load_job_id_taken` | a load job (`sourceUris`) whose job id is taken answers 409 and runs nothing |
| - | `parquet_load_json_columns` | a Parquet load into a table with a JSON column (any depth) fails `invalid` |
| - | `load_job_atomic` | a load job over several files loads all of them or none |

A load job's `gs://bucket/name` source URIs need no patch: bqemulator reads them from
`<gcs_local_root>/bucket/name`, and the launcher's `--gcs-local-root` (set by `devstack/stack.py`) points that
at the local Cloud Storage emulator's objects on disk.

Gap numbers are those of /work/shared/local-stack.md and of the `test_gapN_*` tests in
tests/integration/test_emulator_gaps.py.

Rules for these modules: they run in the emulator's own venv, so they import only the standard library,
bqemulator and its dependencies (imported inside `apply`, so that this package also imports in the
project's venv for reading and unit tests); never `firehose_bq`, and they use relative imports only.
No `from __future__ import annotations`: FastAPI reads a replaced route's annotations at run time.
"""
