"""A load job uploaded from a file keeps the client's job id; a taken id answers 409.

BigQuery keeps the ``jobReference`` the client sent and answers ``409 duplicate`` when the id is taken,
which is what makes a replayed file load idempotent (the file-loads write path relies on it).
bqemulator names every uploaded load job ``bqemu_<random>`` and drops the client's id, so a load retried
under the same id runs again. The envelope's job id is carried inside the upload session's
configuration under a private key until the load runs.

Shown by tests/integration/test_file_loads.py::test_emulator_keeps_an_uploaded_load_jobs_id_and_decodes_bytes
(and ::test_replayed_batch_is_not_loaded_twice, which depends on it).
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Carry the client's job id through the upload and refuse one that is taken."""
    upload = module("bqemulator.api.routes.upload")
    errors = module("bqemulator.domain.errors")
    original_envelope = require(upload, "_load_configuration_from_envelope")
    original_run = require(upload, "_run_load")
    original_new_id = require(upload, "_new_job_id")
    already_exists = require(errors, "AlreadyExistsError")
    key = "_firehoseJobId"
    wanted: list[str] = []  # the id _run_load is about to take; the event loop runs one load at a time

    def _load_configuration_from_envelope(envelope: dict[str, Any]) -> dict[str, Any]:
        configuration = original_envelope(envelope)
        job_id = (envelope.get("jobReference") or {}).get("jobId")
        return {**configuration, key: job_id} if job_id else configuration

    def _new_job_id() -> str:
        return wanted.pop() if wanted else original_new_id()

    async def _run_load(*, project_id: str, configuration: dict[str, Any], media_path: str, ctx: Any) -> Any:
        configuration = dict(configuration)
        job_id = configuration.pop(key, None)
        if job_id:
            if ctx.catalog.get_job(project_id, job_id) is not None:
                raise already_exists(f"Already Exists: Job {project_id}:US.{job_id}")
            wanted[:] = [job_id]  # taken by _new_job_id before _run_load's first await
        try:
            return await original_run(project_id=project_id, configuration=configuration,
                                      media_path=media_path, ctx=ctx)
        finally:
            wanted.clear()

    return [
        replace(upload, "_load_configuration_from_envelope", _load_configuration_from_envelope),
        replace(upload, "_new_job_id", _new_job_id),
        replace(upload, "_run_load", _run_load),
    ]
