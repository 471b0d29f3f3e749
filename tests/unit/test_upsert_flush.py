"""The driver's merge flush (upsert/flush.py) against a fake BigQuery that keeps jobs by id: one MERGE
job per batch, found again rather than submitted twice, waited for up to the job timeout."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa
import pytest
from google.api_core import exceptions
from google.cloud.bigquery import SchemaField as F

from firehose_bq.bigquery import jobs
from firehose_bq.config import Config
from firehose_bq.errors import ErrorType, PartialWriteError, RowError
from firehose_bq.upsert import flush as flush_mod
from firehose_bq.upsert import writer as writer_mod
from firehose_bq.upsert.sql import MergePlan, TableRef
from firehose_bq.upsert.writer import ChangelogWriter, staged_rows
from tests.unit.test_config import MINIMAL

DESTINATION = TableRef("proj-x1", "ds", "t")
# What the tasks of batch 7 report: one partition, in two pieces (a task held around a descriptor refresh).
REPORTS = [json.dumps({"staged": 10}), json.dumps({"staged": 6})]  # what two tasks' ChangelogWriters staged


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class FakeJob:
    job_id: str
    sql: str = ""
    state: str = "DONE"
    error_result: dict | None = None
    errors: list[dict] | None = None
    num_dml_affected_rows: int = 1
    polls: int = 0

    def done(self, retry: Any, timeout: float) -> bool:
        assert retry is None  # the flush's retry is the only one
        self.polls += 1
        return self.state == "DONE"

    def result(self, **_: Any) -> list:
        return []


class FakeClient:
    """BigQuery's jobs by id; a new MERGE job runs as long as `merge_state` says."""

    def __init__(self, jobs_by_id: dict[str, FakeJob] | None = None, merge_state: str = "DONE") -> None:
        self.jobs = dict(jobs_by_id or {})
        self.merge_state = merge_state
        self.submitted: list[str] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def get_job(self, job_id: str, **_: Any) -> FakeJob:
        if job_id not in self.jobs:
            raise exceptions.NotFound(f"job {job_id}")
        return self.jobs[job_id]

    def query(self, sql: str, job_id: str | None = None, job_retry: Any = "default", **_: Any) -> FakeJob:
        assert job_retry is None
        self.submitted.append(sql.split()[0])
        if sql.startswith("MERGE"):
            assert job_id is not None, "a MERGE is created under its batch's job id"
            if job_id in self.jobs:
                raise exceptions.Conflict(f"Already Exists: Job {job_id}")
            self.jobs[job_id] = FakeJob(job_id, sql, self.merge_state)
            return self.jobs[job_id]
        return FakeJob("cleanup", sql)

    def get_table(self, *_: Any, **__: Any) -> Any:
        return type("T", (), {"streaming_buffer": None})()


def session(monkeypatch: pytest.MonkeyPatch, client: FakeClient, clock: Clock, **env: str) -> flush_mod.UpsertSession:
    monkeypatch.setattr(flush_mod, "make_client", lambda cfg: client)
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_UPSERT_ENABLED": "false", "SINK_BIGQUERY_DELETE_ENABLED": "true",
                           "INPUT_SCHEMA_PROTO_KEY_CLASS": "p.K", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "k",
                           "RETRY_EXPONENTIAL_BACKOFF_INITIAL_MS": "0", "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "proj-x1", **env})
    s = flush_mod.UpsertSession(cfg, identity=lambda: "query-1", sleep=clock.sleep, clock=clock)
    s.schema.merge_plan = MergePlan(DESTINATION, TableRef("proj-x1", "ds", "t_tmp"), "k", (F("id", "STRING"),),
                                    ("v",), upsert=False, delete=True)
    return s


# The batch's plan: the Kafka ranges [start, end) its tasks were given (REPORTS staged within them).
PLAN = [("t", 0, 10, 25), ("t", 1, 3, 4)]


def merge_job_id(batch: int = 7, plan: list = PLAN, identity: str = "query-1") -> str:  # type: ignore[type-arg]
    return jobs.batch_job_id("firehose_bq_merge_", DESTINATION.api, identity, batch, plan)


def test_a_merge_slower_than_a_request_timeout_is_waited_for_and_never_submitted_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The review's case: a MERGE running longer than SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS (60 s).
    client, clock = FakeClient(merge_state="RUNNING"), Clock()
    s = session(monkeypatch, client, clock, SINK_BIGQUERY_RETRY_DEADLINE_MS="200000",
                SINK_BIGQUERY_JOB_TIMEOUT_MS="120000")
    job_id = merge_job_id()

    def finish_late(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 90:
            client.jobs[job_id].state = "DONE"

    s._sleep = finish_late
    s.flush(7, REPORTS, PLAN)

    assert client.submitted == ["MERGE", "DELETE"], "one MERGE job, then the cleanup"
    assert client.jobs[job_id].polls > 1 and 90 < clock.now < 120


def test_a_merge_past_the_job_timeout_fails_the_flush_without_a_second_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    client, clock = FakeClient(merge_state="RUNNING"), Clock()
    s = session(monkeypatch, client, clock, SINK_BIGQUERY_RETRY_DEADLINE_MS="5000",
                SINK_BIGQUERY_JOB_TIMEOUT_MS="2000")

    with pytest.raises(flush_mod.MergeFlushError, match="did not finish within 2 s") as failed:
        s.flush(7, REPORTS, PLAN)

    # Retried within SINK_BIGQUERY_RETRY_DEADLINE_MS, each time finding the same job (its outcome is BigQuery's).
    assert client.submitted == ["MERGE"] and list(client.jobs) == [merge_job_id()]
    assert client.jobs[merge_job_id()].polls > 2 and merge_job_id() in str(failed.value)


def test_a_replayed_batch_whose_merge_ran_is_not_merged_again_but_its_rows_are_cleared(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    done = FakeJob(merge_job_id())
    client = FakeClient({done.job_id: done})
    caplog.set_level("INFO")

    # The replay staged other rows than the run that merged (one record went to the DLQ this time): it is
    # the same batch, planned the same.
    session(monkeypatch, client, Clock()).flush(7, [json.dumps({"staged": 9}), REPORTS[1]],
                                                list(reversed(PLAN)))

    assert client.submitted == ["DELETE"]
    assert f"already merged into {DESTINATION.api} by MERGE job {done.job_id}" in caplog.text


def test_a_merge_created_concurrently_is_taken_as_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    class Racing(FakeClient):
        def get_job(self, job_id: str, **kw: Any) -> FakeJob:
            if not self.submitted:  # the lookup comes just before another attempt's create
                raise exceptions.NotFound(job_id)
            return super().get_job(job_id, **kw)

    client = Racing({merge_job_id(): FakeJob(merge_job_id())})
    session(monkeypatch, client, Clock()).flush(7, REPORTS, PLAN)
    assert client.submitted == ["MERGE", "DELETE"] and len(client.jobs) == 1


def test_after_a_failed_merge_job_the_next_attempt_takes_the_next_id(monkeypatch: pytest.MonkeyPatch) -> None:
    base = merge_job_id()
    client = FakeClient({base: FakeJob(base, error_result={"reason": "backendError", "message": "boom"})})
    session(monkeypatch, client, Clock()).flush(7, REPORTS, PLAN)
    assert sorted(client.jobs) == [base, f"{base}_retry1"] and client.submitted == ["MERGE", "DELETE"]


def test_a_merge_that_fails_stops_the_batch_with_its_error_type(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(FakeClient):
        def query(self, sql: str, job_id: str | None = None, **kw: Any) -> FakeJob:
            job = super().query(sql, job_id, **kw)
            job.error_result = {"reason": "invalidQuery", "message": "no such column"}
            return job

    with pytest.raises(flush_mod.MergeFlushError, match="SINK_4XX_ERROR: MERGE job .* failed: invalidQuery"):
        session(monkeypatch, Failing(), Clock()).flush(7, REPORTS, PLAN)


def test_other_batches_plans_or_checkpoints_get_other_merge_jobs() -> None:
    ids = {merge_job_id(), merge_job_id(batch=8), merge_job_id(identity="query-2"),
           merge_job_id(plan=[("t", 0, 10, 25)])}
    assert len(ids) == 4


def test_a_batch_that_staged_nothing_runs_no_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    session(monkeypatch, client, Clock()).flush(7, [], PLAN)
    assert client.submitted == []


def test_staged_rows_add_up_the_tasks_reports() -> None:
    assert staged_rows(REPORTS) == 16 and staged_rows([]) == 0


def test_a_changelog_writer_reports_the_rows_it_wrote_not_those_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = [RowError(1, ErrorType.SINK_4XX_ERROR, "bad")]
    outcomes: list[Any] = [bad, PartialWriteError(ErrorType.SINK_5XX_ERROR, "down", unsent=(1,))]

    def write(self: Any, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(writer_mod.InsertAllWriter, "write", write)
    w = object.__new__(ChangelogWriter)
    w.staged = 0
    assert w.report() is None  # nothing staged: the batch has nothing to merge
    rows = pa.record_batch({"x": [1, 2, 3]})
    assert w.write(rows, pa.array(["t_0_5", "t_0_6", "t_0_7"])) == bad
    with pytest.raises(PartialWriteError):
        w.write(rows.slice(0, 2), pa.array(["t_0_8", "t_0_9"]))
    assert json.loads(w.report() or "") == {"staged": 3}  # 2 of the first call, 1 of the second
