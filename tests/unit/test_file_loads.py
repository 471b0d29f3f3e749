"""File loads: Parquet staging, naming, job ids and the driver's one-job-per-batch logic, with a fake client."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.api_core import exceptions
from google.cloud.bigquery import SchemaField as F

from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.file_loads import FileLoader, OffsetRange, StagedFile, StagingWriter
from firehose_bq.config import FILE_LOADS_TRIGGER_MS, BigQueryConfig, Config
from firehose_bq.errors import ConfigError, ErrorType, SinkError
from tests.unit.clock import Clock
from tests.unit.test_config import MINIMAL

CFG = BigQueryConfig(project_id="p", dataset="ds", table="tbl")
TABLE = [F("I", "INTEGER"), F("s", "STRING"), F("tags", "STRING", mode="REPEATED")]


class FakeTableClient:
    """What a staging task asks BigQuery: the table's schema (changeable), and nothing else."""

    def __init__(self, schema: list[F] = TABLE) -> None:
        self.schema = schema
        self.closed = False

    def get_table(self, ref: str, **_: Any) -> Any:
        return type("Table", (), {"schema": self.schema})()

    def close(self) -> None:
        self.closed = True


def rows(values: list[int], **extra: list[Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"i": pa.array(values, pa.int64()), "s": [f"v{v}" for v in values], **extra})


def ids(partition: int, offsets: list[int], topic: str = "t") -> pa.StringArray:
    return pa.array([f"{topic}_{partition}_{o}" for o in offsets])


def writer_in(directory: Path, client: FakeTableClient | None = None) -> StagingWriter:
    cfg = dataclasses.replace(CFG, file_loads_staging_uri=str(directory))
    return StagingWriter(client or FakeTableClient(), cfg)  # type: ignore[arg-type]


def stage(directory: Path, *parts: tuple[pa.RecordBatch, pa.StringArray]) -> StagedFile:
    writer = writer_in(directory)
    for batch, insert_ids in parts:
        assert writer.write(batch, insert_ids) == []
    writer.close()
    staged = file_loads.staged_json(writer)
    assert staged is not None
    return StagedFile.from_json(staged)


def staged_rows(staged: StagedFile) -> list[dict[str, Any]]:
    return [row for path in staged.paths for row in pq.read_table(path).to_pylist()]


# -- staging (the task side) ----------------------------------------------------------------------------


def test_a_task_stages_one_parquet_file_in_the_tables_spelling_with_its_offset_ranges(tmp_path: Path) -> None:
    client = FakeTableClient()
    writer = writer_in(tmp_path / "batch-3", client)
    assert writer.write(rows([0, 1], tags=[[], None]), ids(1, [10, 11])) == []
    assert writer.write(rows([2], tags=[["a", "ü"]]), ids(1, [12])) == []
    writer.close()
    staged = StagedFile.from_json(file_loads.staged_json(writer) or "")

    [path] = map(Path, staged.paths)
    assert path.parent == tmp_path / "batch-3" and path.name.startswith("part-") and path.suffix == ".parquet"
    assert pq.read_schema(path).names == ["I", "s", "tags"]
    assert staged_rows(staged) == [{"I": 0, "s": "v0", "tags": []}, {"I": 1, "s": "v1", "tags": []},
                                   {"I": 2, "s": "v2", "tags": ["a", "ü"]}]
    assert staged.rows == 3
    assert staged.ranges == [OffsetRange("t", 1, 10, 12, 3)]
    assert client.closed


def test_rows_that_do_not_fit_fail_in_the_task_and_stay_out_of_the_file_and_its_ranges(tmp_path: Path) -> None:
    writer = writer_in(tmp_path)
    failures = writer.write(rows([0, 1, 2], nope=[None, "x", None]), ids(4, [7, 8, 9]))
    writer.write(rows([3]), ids(5, [1], topic="a_topic_with_underscores"))
    writer.close()

    assert [(f.index, f.error_type) for f in failures] == [(1, ErrorType.SINK_4XX_ERROR)]
    assert [r["I"] for r in staged_rows(writer.staged)] == [0, 2, 3]
    assert writer.staged.ranges == [OffsetRange("a_topic_with_underscores", 5, 1, 1, 1), OffsetRange("t", 4, 7, 9, 2)]


def test_a_table_that_grows_during_the_task_starts_another_file(tmp_path: Path) -> None:
    client = FakeTableClient()
    writer = writer_in(tmp_path, client)
    writer.write(rows([0]), ids(0, [0]))
    client.schema = [*TABLE, F("coupon", "STRING")]
    writer.write(rows([1], coupon=["FREE"]), ids(0, [1]))
    writer.close()

    assert len(writer.staged.paths) == 2
    assert staged_rows(writer.staged) == [{"I": 0, "s": "v0"}, {"I": 1, "s": "v1", "coupon": "FREE"}]


def test_staging_needs_the_rows_kafka_coordinates(tmp_path: Path) -> None:
    writer = writer_in(tmp_path)
    with pytest.raises(ValueError, match="insert ids"):
        writer.write(rows([0]), None)
    with pytest.raises(ValueError, match="not topic_partition_offset"):
        writer.write(rows([0]), pa.array(["no-coordinates"]))


def test_every_task_attempt_gets_its_own_file(tmp_path: Path) -> None:
    first = stage(tmp_path, (rows([1]), ids(0, [1])))
    second = stage(tmp_path, (rows([1]), ids(0, [1])))
    assert first.paths != second.paths


def test_writers_of_other_methods_stage_nothing() -> None:
    assert file_loads.staged_json(object()) is None
    assert file_loads.parse_staged([None, "", StagedFile(["/x"], 1).to_json()]) == [StagedFile(["/x"], 1)]


def test_staged_files_with_different_columns_are_combined_under_their_union(tmp_path: Path) -> None:
    old = stage(tmp_path, (rows([0]), ids(0, [0])))
    client = FakeTableClient([*TABLE, F("rec", "RECORD", fields=[F("a", "INTEGER")]), F("more", "INTEGER",
                                                                                         mode="REPEATED")])
    grown = writer_in(tmp_path, client)
    grown.write(rows([1], rec=[{"a": 5}], more=[[1, 2]], tags=[["t"]]), ids(0, [1]))
    grown.close()

    combined = file_loads.combine([old, grown.staged], tmp_path / "all.parquet")

    assert pq.read_table(combined).to_pylist() == [
        {"I": 0, "s": "v0", "rec": None, "more": [], "tags": []},
        {"I": 1, "s": "v1", "rec": {"a": 5}, "more": [1, 2], "tags": ["t"]}]
    assert file_loads.combine([old], tmp_path / "unused.parquet") == Path(old.paths[0])


def test_the_load_job_appends_parquet_with_list_inference() -> None:
    config = file_loads.load_job_config()
    assert (config.source_format, config.write_disposition, config.create_disposition) == (
        "PARQUET", "WRITE_APPEND", "CREATE_NEVER")
    assert config.parquet_options.enable_list_inference is True
    assert config.to_api_repr()["load"]["parquetOptions"] == {"enableListInference": True}
    assert config.schema is None  # Parquet describes itself; the table exists


# -- where staging happens ----------------------------------------------------------------------------------


def test_staging_defaults_to_the_checkpoint_and_each_batch_has_its_directory() -> None:
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    assert file_loads.staging_root(cfg) == Path("/ck/staging")
    assert file_loads.batch_dir(Path("/ck/staging"), 7) == Path("/ck/staging/batch-7")
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
    return [StagedFile([f"{path}{p}"], last - first + 1, [OffsetRange("t", p, first, last, last - first + 1)])
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

    def done(self, retry: Any, timeout: float) -> bool:
        assert retry is None  # the loader's retry is the only one
        self.waits += 1
        if self.poll_error:
            raise self.poll_error
        return self.state == "DONE"


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

    def load_table_from_file(self, source: Any, table: Any, *, job_id: str, job_config: Any, num_retries: int,
                             timeout: float) -> FakeJob:
        assert num_retries == 0  # the upload's own retries are off: the loader's are the only ones
        if self.conflict_once is not None:  # another driver created it between our lookup and our request
            self.jobs[job_id], self.conflict_once = self.conflict_once, None
            raise exceptions.Conflict(f"Already Exists: Job {job_id}")
        if job_id in self.jobs:
            raise exceptions.Conflict(f"Already Exists: Job {job_id}")
        self.loads.append((job_id, source.read(), job_config))
        error = self.fail_with[0] if self.fail_with else None
        self.jobs[job_id] = FakeJob(job_id, error, self.fail_with)
        return self.jobs[job_id]


def loader(client: FakeClient, root: Path, clock: Clock | None = None) -> FileLoader:
    clock = clock or Clock()
    return FileLoader(client, CFG, root, "ck", sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]


def two_tasks(root: Path, batch_id: int = 2) -> list[StagedFile]:
    directory = file_loads.batch_dir(root, batch_id)
    return [stage(directory, (rows([0, 1]), ids(0, [0, 1]))), stage(directory, (rows([2]), ids(1, [0])))]


def test_one_load_job_over_every_staged_file(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    orphan = file_loads.batch_dir(tmp_path, 2) / "part-of-a-failed-attempt.parquet"
    orphan.write_bytes(b"partial")
    client = FakeClient()

    outcome = loader(client, tmp_path).load(2, staged)

    assert outcome is not None and not outcome.already_loaded and outcome.rows == 3
    [(job_id, data, config)] = client.loads
    assert job_id == file_loads.load_job_id(CFG.table_ref, "ck", 2, staged) == outcome.job_id
    assert pq.read_table(pa.py_buffer(data)).to_pylist() == [{"I": i, "s": f"v{i}"} for i in range(3)]
    assert config.to_api_repr() == file_loads.load_job_config().to_api_repr()
    # The directory is the write mode's to drop, once every table of the batch is loaded.
    assert orphan.exists() and all(Path(p).exists() for f in staged for p in f.paths)


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
    assert all(Path(p).exists() for f in staged for p in f.paths)


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
    job = FakeJob(job_id, state="RUNNING", poll_error=error)
    client = FakeClient({job_id: job})
    clock = Clock()

    with pytest.raises(SinkError, match="gave up after") as failed:
        loader(client, tmp_path, clock).load(2, staged)

    assert failed.value.error_type is kind and job_id in str(failed.value)
    assert client.loads == [] and all(Path(p).exists() for f in staged for p in f.paths)
    # Retried, each time finding the same job again, for SINK_BIGQUERY_RETRY_DEADLINE_MS and no longer.
    assert job.waits > 1 and clock.now == pytest.approx(CFG.retry_deadline_ms / 1000)


def test_a_running_job_is_polled_until_done_and_a_slow_one_fails_after_the_job_timeout(tmp_path: Path) -> None:
    class Finishing(FakeJob):
        def done(self, retry: Any, timeout: float) -> bool:
            self.state = "DONE" if self.waits >= 3 else "RUNNING"
            return super().done(retry, timeout)

    staged = two_tasks(tmp_path)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, staged)
    clock = Clock()
    outcome = loader(FakeClient({job_id: Finishing(job_id)}), tmp_path, clock).load(2, staged)
    assert outcome is not None and outcome.already_loaded
    assert clock.waits == [0.2, pytest.approx(0.3), pytest.approx(0.45)]

    slow = FakeJob(job_id, state="RUNNING")
    with pytest.raises(SinkError, match="did not finish within 600 s"):
        loader(FakeClient({job_id: slow}), tmp_path).load(2, staged)


def test_a_staged_file_the_driver_cannot_see_is_named(tmp_path: Path) -> None:
    staged = two_tasks(tmp_path)
    Path(staged[1].paths[0]).unlink()  # as if staged on another machine's local disk
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
