"""A micro-batch's driver-side BigQuery job, run at most once however often the batch is tried.

The load job of file loads and the MERGE of upsert/delete share this: the job id is derived from the
table, the checkpoint's query id, the batch id and what the driver planned the batch to read
(`BatchPlan`), never from the attempt nor from what an attempt staged (see `batch_job_id`). Each attempt looks that id up before creating it: a job that is running is
waited for, one that is done is not run again (a batch replayed after a crash between "job done" and
"offsets committed"), and a 409 on creation means an earlier attempt created it between the lookup and
the request. A job id that exists but failed cannot be reused, so the next job takes `<id>_retryN`.

Waiting is polling, each poll one request with the read timeout, up to the job timeout: never
`job.result()`, whose polls wait up to 128 s each whatever the settings say, and whose timeout (a
`TimeoutError` the retry layer takes for a failed request) used to make the caller submit a second job
while the first still ran.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as api_exceptions

from firehose_bq.bigquery.classify import REASON_TYPES, classify_exception, classify_row_errors, describe_row_errors
from firehose_bq.bigquery.client import REQUEST_ERRORS
from firehose_bq.errors import ErrorType, SinkError

log = logging.getLogger(__name__)

# BigQuery job ids: letters, digits, `_` and `-`, at most 1,024 characters.
_JOB_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# A job id that exists but failed cannot be reused; the retry of such a batch takes the next suffix.
# Each attempt counts against the table's daily job quotas, so a batch that keeps failing stops here.
MAX_JOB_ATTEMPTS = 20
# Job errors kept in the SinkError's text; BigQuery returns up to ~100 per job.
ERRORS_SHOWN = 5
# Polling a running job: soon at first (small jobs take about a second), then less often.
FIRST_POLL_S, MAX_POLL_S = 0.2, 5.0
# What the driver planned a batch to read, fixed before its first run: JSON-able items in any order. The
# streaming job: the Kafka ranges [topic, partition, start, end) Spark handed its tasks (the batch's
# entry in the checkpoint's offset log); replay-dlq: the DLQ position its letters were read up to.
BatchPlan = Iterable[Any]


def batch_job_id(prefix: str, table_ref: str, checkpoint: str, batch_id: int, plan: BatchPlan) -> str:
    """`prefix<table>_b<batch>_<digest>`: the same for every run of one batch (table, checkpoint, batch and
    its plan), whatever each run staged.

    Why the plan, not what was staged: a run of a batch may stage its records in pieces (a task held for a
    descriptor refresh stages a partition as two ranges) and its replay in one, or dead-letter other
    records; an id over the staged rows then differed between them, and a replay after a crash between
    the job and the offset commit ran the job again: the batch loaded (or, delete-only, merged) twice.

    Why one id per plan loses nothing although runs of it may stage different rows: a job is only created
    by `modes.settle` once every record of the run is written, staged or dead-lettered (none failed, no task
    stopped), and the dead letters are stored before that (batch/core.py `_Task.finish`). So a job found
    DONE under this id means an earlier run of the same plan put each of its records in the table (that
    job, or Storage Write for `mixed`'s streamed tables) or in the DLQ. Skipping this run's job loses
    nothing; a record this run would treat otherwise (loaded where the earlier run dead-lettered it, or
    the reverse) is then in both places at most: a duplicate, never a gap. A job that exists but FAILED
    loaded nothing, and the next id (`_retryN`) loads this run's files. Two plans give one id only on a
    96-bit digest collision. The plan is the same on every run: Spark replays a batch from its offset
    log entry, which holds a new partition's start too (source/kafka_source.py), and a range whose
    records retention deleted since stops the reader instead of shrinking the run; compaction can only
    remove records an earlier run already covered. replay-dlq numbers its batches from 0 in every run, so
    its plan is the DLQ position and the replay run (DLQ offsets or blob objects are read twice only on
    purpose, a replay group reset, which must write again; a crashed replay's batch is finished from its
    pending record first, with the same position and run); the
    letters' original offsets would not do: one record can be dead-lettered, replayed and dead-lettered
    again, and two batches holding it could then share an id while loading different records.

    The argument needs each record to go to the same table in every run: a record moved by a routing
    change from a table whose job failed into one whose job is done would be in neither. So file loads
    add the routing settings to the plan (modes.FileLoadsMode): after such a change every job id is new,
    and the batch is loaded again (duplicates at most). Moving a table between streamed and loaded
    (SINK_BIGQUERY_MIXED_STREAMING_TABLES) keeps its records' table, so it can only write them twice."""
    content = sorted(json.dumps(item, sort_keys=True) for item in plan)
    digest = hashlib.sha256(json.dumps([table_ref, checkpoint, batch_id, content]).encode()).hexdigest()[:24]
    table = _JOB_ID_UNSAFE.sub("_", table_ref.split(".", 1)[-1])[:200]
    return f"{prefix}{table}_b{batch_id}_{digest}"


def attempt_job_id(base: str, attempt: int) -> str:
    return base if attempt == 0 else f"{base}_retry{attempt}"


@dataclass(frozen=True)
class JobRun:
    job: Any
    job_id: str
    already: bool  # an earlier attempt (or run) had run it: nothing was written again


class BatchJobs:
    """Runs a batch's job by its derived id on `client`. `noun` names the kind in messages ("load job");
    `call` is the one-attempt `retry`/`timeout` of each request; `timeout_s` bounds the wait for a job."""

    def __init__(self, client: Any, noun: str, target: str, call: Mapping[str, Any], timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self._client, self._noun, self._target = client, noun, target
        self._call = dict(call)
        self._timeout_s = timeout_s
        self._sleep, self._clock = sleep, clock

    def run(self, base: str, create: Callable[[str], Any]) -> JobRun:
        """The job `base` (or its first `_retryN` not failed): found and waited for, or created by
        `create(job_id)` and waited for. A job this call created that fails raises its SinkError; one an
        earlier attempt created that failed is followed by the next id. Raises SinkError when the outcome
        cannot be known (a lookup or poll failed, the job timeout passed): the caller's retry looks the
        same id up again."""
        for attempt in range(MAX_JOB_ATTEMPTS):
            job_id = attempt_job_id(base, attempt)
            job = self.existing(job_id)
            already = job is not None
            if job is None:
                job = self._begin(job_id, create)
            if job is None:  # 409: created by an earlier attempt between our lookup and our request
                job, already = self.existing(job_id), True
                if job is None:
                    raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"{self._noun} {job_id} exists (409) but cannot "
                                    "be read")
            self.wait(job)
            if job.error_result:
                if already:
                    log.info("earlier %s %s failed; trying a new one", self._noun, job_id)
                    continue
                raise self.failure(job)
            return JobRun(job, job_id, already)
        raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"{MAX_JOB_ATTEMPTS} {self._noun}s into {self._target} failed "
                        f"({base}...); stopping")

    def done(self, base: str) -> Any | None:
        """The job `base` (or its first `_retryN` not failed) that an earlier run created, waited for if it
        runs; None when none of them exists or every one failed: nothing was written under `base`."""
        for attempt in range(MAX_JOB_ATTEMPTS):
            job = self.existing(attempt_job_id(base, attempt))
            if job is None:
                return None
            self.wait(job)
            if not job.error_result:
                return job
        return None

    def existing(self, job_id: str) -> Any | None:
        try:
            return self._client.get_job(job_id, **self._call)
        except api_exceptions.NotFound:
            return None
        except REQUEST_ERRORS as exc:
            raise SinkError(classify_exception(exc), f"looking up {self._noun} {job_id} failed: {exc}") from exc

    def _begin(self, job_id: str, create: Callable[[str], Any]) -> Any | None:
        """Create the job; None when its id is taken (409: an earlier attempt created it)."""
        try:
            return create(job_id)
        except api_exceptions.Conflict:
            return None
        except REQUEST_ERRORS as exc:
            raise SinkError(classify_exception(exc), f"{self._noun} {job_id} into {self._target} could not be "
                            f"started: {exc}") from exc

    def wait(self, job: Any) -> None:
        """Poll until the job is done (its outcome is then in `error_result`). A poll that fails, or the job
        timeout, leaves the outcome unknown: SinkError, and the retry (or the batch's replay) looks the
        same job id up again instead of writing the rows a second time."""
        deadline = self._clock() + self._timeout_s
        interval = FIRST_POLL_S
        while True:
            try:
                if job.done(retry=None, timeout=self._call["timeout"]):
                    return
            except REQUEST_ERRORS as exc:
                raise SinkError(classify_exception(exc), f"waiting for {self._noun} {job.job_id} failed: "
                                f"{exc}") from exc
            if self._clock() >= deadline:
                raise SinkError(ErrorType.SINK_RETRYABLE_ERROR, f"{self._noun} {job.job_id} did not finish within "
                                f"{self._timeout_s:.0f} s")
            self._sleep(min(interval, max(0.0, deadline - self._clock())))
            interval = min(interval * 1.5, MAX_POLL_S)

    def failure(self, job: Any) -> SinkError:
        """A failed job's SinkError: typed by its error reason, with its first errors. They name a file
        position or a statement, not a Kafka record: they are reported for the job."""
        result = job.error_result or {}
        errors = [e for e in (job.errors or []) if isinstance(e, dict)] or [result]
        kind = REASON_TYPES.get(str(result.get("reason", ""))) or classify_row_errors(errors)
        shown = describe_row_errors(errors[:ERRORS_SHOWN])
        more = f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
        return SinkError(kind, f"{self._noun} {job.job_id} into {self._target} failed: {shown}{more}")
