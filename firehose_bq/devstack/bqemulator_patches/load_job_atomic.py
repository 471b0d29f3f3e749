"""A load job over several source files loads all of them or none.

A BigQuery load job is atomic: when one of its source URIs cannot be read (missing, or rows the table
cannot take), the job fails and the table is as it was. bqemulator inserts the files one by one, each
its own statement, so a job whose second file fails keeps the first file's rows; the retry of that
batch (a new job) then loads them again. The file-loads driver gives a job every object its tasks
staged in Cloud Storage, so this matters as soon as staging is ``gs://``.

The patch runs a load's write disposition and its per-file inserts in one DuckDB transaction, opened
when the write lock is held (``_apply_load_write_disposition`` is the first step under it) and
committed after the job's last file, rolled back on the first error; the event loop cannot run
anything else in between, as there is no ``await`` from the first of these steps to the last.

Shown by tests/integration/test_file_loads.py::test_emulator_load_from_gcs_is_atomic_and_keeps_its_job_id.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Wrap the write disposition (begin) and the per-file insert (commit after the last, or roll back)."""
    executor = module("bqemulator.jobs.executor")
    original_disposition = require(executor, "_apply_load_write_disposition")
    original_insert = require(executor, "_load_path_into_target")
    remaining = [0]  # files of the load in progress still to insert; the write lock runs one load at a time

    def rollback(ctx: Any) -> None:
        remaining[0] = 0
        ctx.engine.execute("ROLLBACK")

    def _apply_load_write_disposition(job: Any, ctx: Any) -> None:
        ctx.engine.execute("BEGIN TRANSACTION")
        remaining[0] = len(job.source_uris)
        try:
            original_disposition(job, ctx)
        except BaseException:
            rollback(ctx)
            raise
        if remaining[0] == 0:  # no files at all: nothing else will close the transaction
            ctx.engine.execute("COMMIT")

    def _load_path_into_target(path: str, job: Any, ctx: Any) -> None:
        try:
            original_insert(path, job, ctx)
        except BaseException:
            rollback(ctx)
            raise
        remaining[0] -= 1
        if remaining[0] == 0:
            ctx.engine.execute("COMMIT")

    return [
        replace(executor, "_apply_load_write_disposition", _apply_load_write_disposition),
        replace(executor, "_load_path_into_target", _load_path_into_target),
    ]
