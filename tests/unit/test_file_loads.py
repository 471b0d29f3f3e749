"""File loads: staging, naming, job ids and the driver's one-job-per-batch logic, with a fake client."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import bigquery

from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.file_loads import FileLoader, OffsetRange, StagedFile, StagingWriter
from firehose_bq.config import FILE_LOADS_TRIGGER_MS, BigQueryConfig, Config
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.errors import ConfigError, ErrorType, SinkError
from tests.unit.test_config import MINIMAL

CFG = BigQueryConfig(project_id="p", dataset="ds", table="tbl")


def records(partition: int, offsets: list[int], topic: str = "t") -> KafkaRecords:
    n = len(offsets)
    return KafkaRecords([topic] * n, [partition] * n, offsets, [0] * n, [b""] * n)


def converted(rows: list[dict], sources: list[int] | None = None) -> ConvertedBatch:
    return ConvertedBatch(rows=rows, insert_ids=[""] * len(rows),
                          sources=sources if sources is not None else list(range(len(rows))))


def stage(directory: Path, *parts: tuple[list[dict], KafkaRecords]) -> StagedFile:
    writer = StagingWriter(dataclasses.replace(CFG, file_loads_staging_uri=str(directory)))
    for rows, recs in parts:
        assert writer.write(converted(rows), recs) == []
    writer.close()
    staged = file_loads.staged_json(writer)
    assert staged is not None
    return StagedFile.from_json(staged)


# -- staging (the task side) ----------------------------------------------------------------------------


def test_a_task_stages_one_ndjson_file_with_its_offset_ranges(tmp_path: Path) -> None:
    rows = [{"id": "a", "b": "AQI=", "n": {"x": [1, 2]}}, {"id": "ü"}, {"id": "c"}]
    staged = stage(tmp_path / "batch-3", (rows[:2], records(1, [10, 11])), (rows[2:], records(1, [12])))

    path = Path(staged.path)
    assert path.parent == tmp_path / "batch-3" and path.name.startswith("part-") and path.suffix == ".ndjson"
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", "every row ends with a newline, so staged files concatenate"
    assert [json.loads(line) for line in lines[:-1]] == rows
    assert staged.rows == 3
    assert staged.ranges == [OffsetRange("t", 1, 10, 12, 3)]


def test_ranges_follow_the_rows_sources_not_the_input(tmp_path: Path) -> None:
    # Input 1 failed to convert: the file holds inputs 0 and 2 only, and the ranges say so.
    writer = StagingWriter(dataclasses.replace(CFG, file_loads_staging_uri=str(tmp_path)))
    writer.write(converted([{"i": 0}, {"i": 2}], sources=[0, 2]), records(4, [7, 8, 9]))
    writer.write(converted([{"i": 3}]), records(5, [1], topic="u"))
    writer.close()
    assert writer.staged.ranges == [OffsetRange("t", 4, 7, 9, 2), OffsetRange("u", 5, 1, 1, 1)]


def test_every_task_attempt_gets_its_own_file(tmp_path: Path) -> None:
    first = stage(tmp_path, ([{"i": 1}], records(0, [1])))
    second = stage(tmp_path, ([{"i": 1}], records(0, [1])))
    assert first.path != second.path


def test_writers_of_other_methods_stage_nothing() -> None:
    assert file_loads.staged_json(object()) is None
    assert file_loads.parse_staged([None, "", StagedFile("/x", 1).to_json()]) == [StagedFile("/x", 1)]


# -- where staging happens ----------------------------------------------------------------------------------


def test_staging_defaults_to_the_checkpoint_and_each_batch_has_its_directory() -> None:
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    assert file_loads.staging_root(cfg) == Path("/ck/staging")
    assert file_loads.for_batch(cfg.bigquery, Path("/ck/staging"), 7).file_loads_staging_uri == "/ck/staging/batch-7"
    other = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads",
                             "SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "file:///shared/stage"})
    assert file_loads.staging_root(other) == Path("/shared/stage")


def test_the_trigger_default_keeps_a_table_under_the_daily_load_job_quota() -> None:
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    assert cfg.bigquery.file_loads_trigger_ms == FILE_LOADS_TRIGGER_MS
    assert 86_400_000 // FILE_LOADS_TRIGGER_MS <= 1500


@pytest.mark.parametrize(("env", "problem"), [
    ({"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "gs://bucket/prefix"}, "'gs://bucket/prefix' is not supported yet"),
    ({"SPARK_CHECKPOINT_LOCATION": "hdfs://nn/ck"}, "required with SINK_BIGQUERY_WRITE_METHOD=file_loads"),
])
def test_remote_staging_is_a_config_error_for_now(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads", **env})
    Config.from_env({**MINIMAL, **env})  # other write methods do not stage


# -- job ids --------------------------------------------------------------------------------------------


def staged_files(*ranges: tuple[int, int, int], path: str = "/a") -> list[StagedFile]:
    return [StagedFile(f"{path}{p}", last - first + 1, [OffsetRange("t", p, first, last, last - first + 1)])
            for p, first, last in ranges]


def test_a_replay_of_a_batch_gets_the_same_job_id_whatever_its_file_names() -> None:
    one = file_loads.load_job_id("p.ds.tbl", "ck-id", 5, staged_files((0, 0, 9), (1, 0, 4)))
    replay = file_loads.load_job_id("p.ds.tbl", "ck-id", 5, staged_files((1, 0, 4), (0, 0, 9), path="/other"))
    assert one == replay
    assert one.startswith("firehose_bq_ds_tbl_b5_")
    assert all(c.isalnum() or c in "_-" for c in one) and len(one) <= 1024


@pytest.mark.parametrize("change", [
    {"table_ref": "p.ds.other"}, {"checkpoint": "ck-2"}, {"batch_id": 6}, {"staged": staged_files((0, 0, 10))},
])
def test_anything_else_gives_another_job_id(change: dict[str, Any]) -> None:
    base = {"table_ref": "p.ds.tbl", "checkpoint": "ck-id", "batch_id": 5, "staged": staged_files((0, 0, 9))}
    assert file_loads.load_job_id(**base) != file_loads.load_job_id(**{**base, **change})


def test_attempt_ids() -> None:
    assert file_loads.attempt_job_id("j", 0) == "j"
    assert file_loads.attempt_job_id("j", 2) == "j_retry2"


def test_checkpoint_identity_is_the_query_id_when_the_checkpoint_has_one(tmp_path: Path) -> None:
    assert file_loads.checkpoint_identity(str(tmp_path)) == str(tmp_path)
    (tmp_path / "metadata").write_text('{"id":"6f2c0b7e-1"}\n')
    assert file_loads.checkpoint_identity(f"file://{tmp_path}") == "6f2c0b7e-1"


# -- the driver's load ----------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeJob:
    job_id: str
    error_result: dict | None = None
    errors: list[dict] | None = None
    state: str = "DONE"
    waits: int = 0
    poll_error: Exception | None = None

    def result(self, timeout: float, retry: Any) -> None:
        self.waits += 1
        if self.poll_error:
            raise self.poll_error
        if self.error_result:
            raise exceptions.BadRequest(self.error_result["message"])


class FakeClient:
    """Jobs by id as BigQuery keeps them; a load job's outcome is decided by `fail_with`."""

    def __init__(self, jobs: dict[str, FakeJob] | None = None, fail_with: list[dict] | None = None,
                 conflict_once: FakeJob | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.fail_with = fail_with
        self.conflict_once = conflict_once
        self.loads: list[tuple[str, bytes, Any]] = []

    def get_job(self, job_id: str, **_: Any) -> FakeJob:
        if job_id not in self.jobs:
            raise exceptions.NotFound(f"job {job_id}")
        return self.jobs[job_id]

    def get_table(self, ref: str, **_: Any) -> Any:
        return type("Table", (), {"schema": [bigquery.SchemaField(ref.replace(".", "_"), "STRING")]})()

    def load_table_from_file(self, source: Any, table: Any, *, job_id: str, job_config: Any, timeout: float) -> FakeJob:
        if self.conflict_once is not None:  # another driver created it between our lookup and our request
            self.jobs[job_id], self.conflict_once = self.conflict_once, None
            raise exceptions.Conflict(f"Already Exists: Job {job_id}")
        if job_id in self.jobs:
            raise exceptions.Conflict(f"Already Exists: Job {job_id}")
        self.loads.append((job_id, source.read(), job_config))
        error = self.fail_with[0] if self.fail_with else None
        self.jobs[job_id] = FakeJob(job_id, error, self.fail_with)
        return self.jobs[job_id]


def loader(client: FakeClient, root: Path) -> FileLoader:
    return FileLoader(client, CFG, root, "ck")  # type: ignore[arg-type]


def two_tasks(root: Path, batch_id: int = 2) -> list[StagedFile]:
    directory = file_loads.batch_dir(root, batch_id)
    return [stage(directory, ([{"i": 0}, {"i": 1}], records(0, [0, 1]))),
            stage(directory, ([{"i": 2}], records(1, [0])))]


def test_one_load_job_over_every_staged_file(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    orphan = file_loads.batch_dir(tmp_path, 2) / "part-of-a-failed-attempt.ndjson"
    orphan.write_text('{"i": 99}\n')
    client = FakeClient()

    outcome = loader(client, tmp_path).load(2, staged)

    assert outcome is not None and not outcome.already_loaded and outcome.rows == 3
    [(job_id, data, config)] = client.loads
    assert job_id == file_loads.load_job_id(CFG.table_ref, "ck", 2, staged) == outcome.job_id
    assert [json.loads(line) for line in data.splitlines()] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert (config.source_format, config.write_disposition, config.create_disposition) == (
        "NEWLINE_DELIMITED_JSON", "WRITE_APPEND", "CREATE_NEVER")
    assert config.autodetect is False and [f.name for f in config.schema] == ["p_ds_tbl"]
    # The directory is the write mode's to drop, once every table of the batch is loaded.
    assert orphan.exists() and all(Path(f.path).exists() for f in staged)


def test_a_replay_whose_job_already_ran_loads_nothing(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, staged)
    done = FakeJob(job_id)
    client = FakeClient({job_id: done})

    outcome = loader(client, tmp_path).load(2, staged)

    assert outcome is not None and outcome.already_loaded and outcome.job_id == job_id
    assert client.loads == [] and done.waits == 1


def test_a_job_created_concurrently_is_taken_as_ours(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, staged)
    client = FakeClient(conflict_once=FakeJob(job_id))

    outcome = loader(client, tmp_path).load(2, staged)

    assert outcome is not None and outcome.already_loaded and client.loads == []


def test_after_a_failed_job_the_retry_takes_the_next_id(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    base = file_loads.load_job_id(CFG.table_ref, "ck", 2, staged)
    client = FakeClient({base: FakeJob(base, {"reason": "backendError", "message": "boom"})})

    outcome = loader(client, tmp_path).load(2, staged)

    assert outcome is not None and outcome.job_id == f"{base}_retry1"
    assert [job_id for job_id, _, _ in client.loads] == [f"{base}_retry1"]


def test_a_failed_job_raises_a_classified_error_with_its_errors_and_keeps_the_files(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    errors = [{"reason": "invalid", "location": "file-00000000", "message": f"row {i}: bad value"}
              for i in range(7)]
    client = FakeClient(fail_with=errors)

    with pytest.raises(SinkError) as failed:
        loader(client, tmp_path).load(2, staged)

    assert failed.value.error_type is ErrorType.SINK_4XX_ERROR
    text = str(failed.value)
    assert text.startswith("SINK_4XX_ERROR: load job firehose_bq_ds_tbl_b2_")
    assert "invalid at file-00000000: row 0: bad value" in text and "row 4" in text
    assert "row 5" not in text and "(and 2 more)" in text
    assert all(Path(f.path).exists() for f in staged)


@pytest.mark.parametrize(("reason", "kind"), [("rateLimitExceeded", ErrorType.SINK_RETRYABLE_ERROR),
                                              ("backendError", ErrorType.SINK_5XX_ERROR),
                                              ("somethingNew", ErrorType.SINK_UNKNOWN_ERROR)])
def test_the_job_error_result_names_the_error_type(tmp_path: Path, reason: str, kind: ErrorType) -> None:
    client = FakeClient(fail_with=[{"reason": reason, "message": "x"}])
    with pytest.raises(SinkError) as failed:
        loader(client, tmp_path).load(2, two_tasks(tmp_path))
    assert failed.value.error_type is kind


@pytest.mark.parametrize(("error", "kind"), [(exceptions.ServiceUnavailable("polling failed"), ErrorType.SINK_5XX_ERROR),
                                             (TimeoutError(), ErrorType.SINK_RETRYABLE_ERROR)])
def test_a_job_whose_outcome_is_unknown_fails_the_batch_without_a_second_job(
        tmp_path: Path, error: Exception, kind: ErrorType) -> None:
    staged = two_tasks(tmp_path)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, staged)
    client = FakeClient({job_id: FakeJob(job_id, state="RUNNING", poll_error=error)})

    with pytest.raises(SinkError) as failed:
        loader(client, tmp_path).load(2, staged)

    assert failed.value.error_type is kind and job_id in str(failed.value)
    assert client.loads == [] and all(Path(f.path).exists() for f in staged)


def test_a_staged_file_the_driver_cannot_see_is_named(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    Path(staged[1].path).unlink()  # as if staged on another machine's local disk
    with pytest.raises(SinkError, match="not visible to the driver .*part-.*must be a directory that the driver"):
        loader(FakeClient(), tmp_path).load(2, staged)


def test_a_batch_that_staged_no_rows_runs_no_job(tmp_path: Path) -> None:
    empty = stage(file_loads.batch_dir(tmp_path, 4))
    client = FakeClient()
    assert loader(client, tmp_path).load(4, [empty]) is None
    assert client.loads == []


def test_a_lookup_that_fails_is_a_classified_sink_error(tmp_path: Path) -> None:
    class Down(FakeClient):
        def get_job(self, job_id: str, **_: Any) -> FakeJob:
            raise exceptions.ServiceUnavailable("down")

    with pytest.raises(SinkError) as failed:
        loader(Down(), tmp_path).load(2, two_tasks(tmp_path))
    assert failed.value.error_type is ErrorType.SINK_5XX_ERROR


def test_a_streaming_run_with_file_loads_triggers_at_the_file_loads_interval() -> None:
    from firehose_bq.pipeline import Pipeline

    env = {**MINIMAL, "SPARK_TRIGGER_INTERVAL_MS": "5000", "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "90000"}
    assert Pipeline(Config.from_env(env), None).mode.trigger_interval_ms() == 5000  # type: ignore[arg-type]
    loads = Config.from_env({**env, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    assert Pipeline(loads, None).mode.trigger_interval_ms() == 90_000  # type: ignore[arg-type]
    # Decoding only (benchmarks): nothing is loaded, so nothing paces the trigger but Spark's interval.
    assert Pipeline(loads, None, write=False).mode.trigger_interval_ms() == 5000  # type: ignore[arg-type]
