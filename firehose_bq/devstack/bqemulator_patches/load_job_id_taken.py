"""A load job created with a job id that is taken answers 409; the job it names is not run again.

BigQuery keeps job ids unique per project: ``jobs.insert`` with the id of an existing job answers
``409 duplicate`` and runs nothing. google-cloud-bigquery relies on it when it retries a ``jobs.insert``
whose answer was lost, and so does the file-loads driver: a batch's load job id is derived from its
Kafka offsets, and a 409 tells it that an earlier attempt created the job (it then waits for that one).
bqemulator's ``jobs.insert`` runs the job again and overwrites the old record, loading the rows twice.
(``upload_job_id`` does the same for load jobs uploaded with their data; this is the ``sourceUris`` kind,
e.g. ``gs://`` objects.)

Shown by tests/integration/test_file_loads.py::test_emulator_load_from_gcs_is_atomic_and_keeps_its_job_id.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Refuse a taken id before bqemulator's load handler runs the job."""
    jobs = module("bqemulator.api.routes.jobs")
    errors = module("bqemulator.domain.errors")
    original = require(jobs, "_handle_load_job_with_async_envelope")  # looked up by insert_job at call time
    already_exists = require(errors, "AlreadyExistsError")

    async def _handle_load_job_with_async_envelope(project_id: str, job_id: str, config: dict[str, Any],
                                                   ctx: Any) -> Any:
        if ctx.catalog.get_job(project_id, job_id) is not None:
            raise already_exists(f"Already Exists: Job {project_id}:US.{job_id}")
        return await original(project_id, job_id, config, ctx)

    return [replace(jobs, "_handle_load_job_with_async_envelope", _handle_load_job_with_async_envelope)]
