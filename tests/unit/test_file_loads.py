"""File loads: Parquet staging into a blob store, naming, job ids and the driver's one-job-per-table logic,
with fake BigQuery and Cloud Storage clients."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.api_core import exceptions
from google.cloud.bigquery import SchemaField as F

from firehose_bq.bigquery import file_loads, ndjson
from firehose_bq.bigquery.file_loads import FileLoader, StagedFile, StagingArea, StagingWriter
from firehose_bq.blobstore import GcsOptions, LocalBlobStore
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


class FakeGcs:
    """A bucket prefix as the blob store presents it: objects by name, `gs://` URIs; `fail` breaks every call."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail: Exception | None = None

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def put_file(self, name: str, source: Path) -> str:
        self._check()
        self.objects[name] = source.read_bytes()
        return self.uri(name)

    def get(self, name: str) -> bytes:
        self._check()
        return self.objects[name]

    def names(self, prefix: str = "") -> list[str]:
        self._check()
        return sorted(n for n in self.objects if n.startswith(prefix))

    def delete_prefix(self, prefix: str) -> int:
        self._check()
        gone = self.names(prefix)
        for name in gone:
            del self.objects[name]
        return len(gone)

    def uri(self, name: str = "") -> str:
        return f"gs://bucket/stage/{name}"


Store = LocalBlobStore | FakeGcs


def rows(values: list[int], **extra: list[Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"i": pa.array(values, pa.int64()), "s": [f"v{v}" for v in values], **extra})


def ids(partition: int, offsets: list[int], topic: str = "t") -> pa.StringArray:
    return pa.array([f"{topic}_{partition}_{o}" for o in offsets])


def writer_in(store: Store, prefix: str = "batch-3/", client: FakeTableClient | None = None) -> StagingWriter:
    return StagingWriter(client or FakeTableClient(), CFG, store, prefix)  # type: ignore[arg-type]


def stage(store: Store, *parts: tuple[pa.RecordBatch, pa.StringArray], prefix: str = "batch-2/") -> StagedFile:
    writer = writer_in(store, prefix)
    for batch, insert_ids in parts:
        assert writer.write(batch, insert_ids) == []
    writer.close()
    staged = file_loads.staged_json(writer)
    assert staged is not None
    return StagedFile.from_json(staged)


def staged_rows(store: Store, staged: StagedFile) -> list[dict[str, Any]]:
    return [row for name in staged.objects for row in pq.read_table(pa.BufferReader(store.get(name))).to_pylist()]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Spark's local directory, where tasks write their Parquet before storing it."""
    directory = tmp_path / "spark-local"
    directory.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{directory},/elsewhere")
    return directory


# -- staging (the task side) ----------------------------------------------------------------------------


def test_a_task_stores_one_parquet_object_in_the_tables_spelling_with_its_offset_ranges(
        tmp_path: Path, scratch: Path) -> None:
    client = FakeTableClient()
    store = LocalBlobStore(tmp_path / "staging")
    writer = writer_in(store, "batch-3/", client)
    assert writer.write(rows([0, 1], tags=[[], None]), ids(1, [10, 11])) == []
    assert writer.write(rows([2], tags=[["a", "ü"]]), ids(1, [12])) == []
    assert list(scratch.rglob("*.parquet")), "written on the task's local disk first"
    assert store.names() == [], "nothing is stored before the task ends"
    writer.close()
    staged = StagedFile.from_json(file_loads.staged_json(writer) or "")

    [name] = staged.objects
    assert name.startswith("batch-3/part-") and name.endswith(".parquet") and store.names() == [name]
    assert pq.read_schema(store.uri(name)).names == ["I", "s", "tags"]
    assert staged_rows(store, staged) == [{"I": 0, "s": "v0", "tags": []}, {"I": 1, "s": "v1", "tags": []},
                                          {"I": 2, "s": "v2", "tags": ["a", "ü"]}]
    assert staged.rows == 3 and len(staged.schemas) == 1
    assert list(scratch.iterdir()) == [], "the local copy is gone"
    assert not client.closed, "the client is borrowed: its maker closes it"


def test_rows_that_do_not_fit_fail_in_the_task_and_stay_out_of_the_file(scratch: Path) -> None:
    store = FakeGcs()
    writer = writer_in(store)
    failures = writer.write(rows([0, 1, 2], nope=[None, "x", None]), ids(4, [7, 8, 9]))
    writer.write(rows([3]), ids(5, [1], topic="a_topic_with_underscores"))
    writer.close()

    assert [(f.index, f.error_type) for f in failures] == [(1, ErrorType.SINK_4XX_ERROR)]
    assert [r["I"] for r in staged_rows(store, writer.staged)] == [0, 2, 3] and writer.staged.rows == 3


def test_a_table_that_grows_during_the_task_starts_another_object(scratch: Path) -> None:
    client, store = FakeTableClient(), FakeGcs()
    writer = writer_in(store, client=client)
    writer.write(rows([0]), ids(0, [0]))
    client.schema = [*TABLE, F("coupon", "STRING")]
    writer.write(rows([1], coupon=["FREE"]), ids(0, [1]))
    writer.close()

    assert len(writer.staged.objects) == 2 and len(set(writer.staged.schemas)) == 2
    assert staged_rows(store, writer.staged) == [{"I": 0, "s": "v0"}, {"I": 1, "s": "v1", "coupon": "FREE"}]


def test_staging_needs_no_insert_ids(scratch: Path) -> None:
    # The load job's id comes from the batch's plan (bigquery/jobs.py), and a load job has no insertIds:
    # SINK_BIGQUERY_ROW_INSERT_ID_ENABLE=false changes nothing here.
    writer = writer_in(FakeGcs())
    assert writer.write(rows([0]), None) == [] and writer.staged.rows == 1


def test_every_task_attempt_gets_its_own_object(scratch: Path) -> None:
    store = FakeGcs()
    first = stage(store, (rows([1]), ids(0, [1])))
    second = stage(store, (rows([1]), ids(0, [1])))
    assert first.objects != second.objects and first.schemas == second.schemas


def test_an_object_that_cannot_be_stored_fails_the_close_with_its_type_and_leaves_nothing_local(
        scratch: Path) -> None:
    store = FakeGcs()
    store.fail = exceptions.ServiceUnavailable("gcs is down")
    client = FakeTableClient()
    writer = writer_in(store, client=client)
    writer.write(rows([1]), ids(0, [1]))

    with pytest.raises(SinkError) as failed:
        writer.close()

    assert failed.value.error_type is ErrorType.SINK_5XX_ERROR
    assert "staging rows as gs://bucket/stage/batch-3/part-" in str(failed.value) and "gcs is down" in str(failed.value)
    assert writer.staged.objects == [] and list(scratch.iterdir()) == []


def test_a_task_that_staged_no_rows_stores_nothing(scratch: Path) -> None:
    store = FakeGcs()
    assert stage(store) == StagedFile() and store.objects == {}


def test_writers_of_other_methods_stage_nothing() -> None:
    assert file_loads.staged_json(object()) is None
    one = StagedFile(["batch-0/x.parquet"], 1, ["d"])
    assert file_loads.parse_staged([None, "", one.to_json()]) == [one]


def test_staged_files_with_different_columns_are_combined_under_their_union(tmp_path: Path, scratch: Path) -> None:
    store = LocalBlobStore(tmp_path)
    old = stage(store, (rows([0]), ids(0, [0])))
    client = FakeTableClient([*TABLE, F("rec", "RECORD", fields=[F("a", "INTEGER")]), F("more", "INTEGER",
                                                                                         mode="REPEATED")])
    grown = writer_in(store, client=client)
    grown.write(rows([1], rec=[{"a": 5}], more=[[1, 2]], tags=[["t"]]), ids(0, [1]))
    grown.close()
    paths = [Path(store.uri(name)) for f in (old, grown.staged) for name in f.objects]

    combined = file_loads.combine(paths, tmp_path / "all.parquet")

    assert pq.read_table(combined).to_pylist() == [
        {"I": 0, "s": "v0", "rec": None, "more": [], "tags": []},
        {"I": 1, "s": "v1", "rec": {"a": 5}, "more": [1, 2], "tags": ["t"]}]
    assert file_loads.combine(paths[:1], tmp_path / "unused.parquet") == paths[0]


def test_the_load_job_appends_parquet_with_list_inference() -> None:
    config = file_loads.load_job_config()
    assert (config.source_format, config.write_disposition, config.create_disposition) == (
        "PARQUET", "WRITE_APPEND", "CREATE_NEVER")
    assert config.parquet_options.enable_list_inference is True
    assert config.to_api_repr()["load"]["parquetOptions"] == {"enableListInference": True}
    assert config.schema is None  # Parquet describes itself; the table exists


# -- where staging happens ----------------------------------------------------------------------------------


def loads_config(**env: str) -> Config:
    return Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads", **env})


def test_staging_defaults_to_the_checkpoint_and_each_batch_has_its_prefix() -> None:
    area = file_loads.staging_area(loads_config())
    assert area.location == "/ck/staging" and area.prefix == ""
    assert isinstance(area.store(), LocalBlobStore) and area.store().uri() == "/ck/staging"
    assert area.batch(7) == "batch-7/"
    replay = file_loads.staging_area(loads_config(), prefix="dlq-replay-1/")
    assert replay.batch(7) == "dlq-replay-1/batch-7/"
    shared = file_loads.staging_area(loads_config(SINK_BIGQUERY_FILE_LOADS_STAGING_URI="file:///shared/stage"))
    assert shared.location == "/shared/stage"


def test_gcs_staging_uses_its_own_endpoint_and_the_bigquery_identity_unless_told_otherwise(
        tmp_path: Path) -> None:
    cfg = loads_config(SINK_BIGQUERY_FILE_LOADS_STAGING_URI="gs://bucket/stage",
                       SINK_BIGQUERY_CREDENTIAL_PATH="/keys/bq.json")
    assert file_loads.staging_area(cfg) == StagingArea(
        "gs://bucket/stage", GcsOptions(None, "/keys/bq.json", "proj", "SINK_BIGQUERY_CREDENTIAL_PATH"))
    # Its own key, and its own endpoint (an emulator's, which takes no key: both at once is a config error).
    own = loads_config(SINK_BIGQUERY_FILE_LOADS_STAGING_URI="gs://bucket/stage",
                       SINK_BIGQUERY_CREDENTIAL_PATH="/keys/bq.json",
                       SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH="/keys/gcs.json",
                       DLQ_GCS_CREDENTIAL_PATH="/keys/dlq.json")
    assert file_loads.staging_area(own).gcs == GcsOptions(
        None, "/keys/gcs.json", "proj", "SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH")
    emulated = loads_config(SINK_BIGQUERY_FILE_LOADS_STAGING_URI="gs://bucket/stage",
                            SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT="http://127.0.0.1:1",
                            DLQ_GCS_API_ENDPOINT="http://127.0.0.1:2")
    assert file_loads.staging_area(emulated).gcs == GcsOptions("http://127.0.0.1:1", None, "proj",
                                                               "SINK_BIGQUERY_CREDENTIAL_PATH")
    # A bad key file is named by the setting it came from, when the store is opened (driver or task).
    with pytest.raises(ConfigError, match="SINK_BIGQUERY_CREDENTIAL_PATH: no such file /keys/bq.json"):
        file_loads.staging_area(cfg).store()


def test_the_trigger_default_keeps_a_table_under_the_daily_load_job_quota() -> None:
    cfg = loads_config()
    assert cfg.bigquery.file_loads_trigger_ms == FILE_LOADS_TRIGGER_MS
    assert 86_400_000 // FILE_LOADS_TRIGGER_MS <= 1500


@pytest.mark.parametrize("env", [
    {"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "gs://bucket/prefix"},
    {"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "gs://bucket"},
    {"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "gs://bucket/prefix", "SPARK_CHECKPOINT_LOCATION": "gs://b/ck"},
    {"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "/mnt/shared", "SPARK_CHECKPOINT_LOCATION": "hdfs://nn/ck"},
])
def test_staging_in_cloud_storage_or_a_shared_directory_is_accepted(env: dict[str, str]) -> None:
    for method in ("file_loads", "mixed"):
        loads_config(SINK_BIGQUERY_WRITE_METHOD=method, SINK_BIGQUERY_STORAGE_API_ENDPOINT="h:1", **env)


@pytest.mark.parametrize(("env", "problem"), [
    ({"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "s3://bucket/prefix"}, "'s3://bucket/prefix': use gs://bucket/prefix"),
    ({"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": "gs:///prefix"}, "names no bucket"),
    ({"SPARK_CHECKPOINT_LOCATION": "hdfs://nn/ck"}, "required with file loads when SPARK_CHECKPOINT_LOCATION"),
    ({"SPARK_CHECKPOINT_LOCATION": "gs://b/ck"}, "is not a local directory: set gs://bucket/prefix"),
])
def test_staging_nowhere_every_process_reaches_is_a_config_error(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        loads_config(**env)
    Config.from_env({**MINIMAL, **env})  # other write methods do not stage


# -- job ids --------------------------------------------------------------------------------------------


# A batch's plan as the Spark job's driver has it: the Kafka ranges [start, end) its tasks were given.
PLAN = [("t", 0, 0, 3), ("t", 1, 0, 1)]


def test_a_replay_of_a_batch_gets_the_same_job_id_whatever_order_its_tasks_came_in() -> None:
    one = file_loads.load_job_id("p.ds.tbl", "ck-id", 5, [("t", 0, 0, 10), ("t", 1, 0, 5)])
    replay = file_loads.load_job_id("p.ds.tbl", "ck-id", 5, [("t", 1, 0, 5), ("t", 0, 0, 10)])
    assert one == replay
    assert one.startswith("firehose_bq_ds_tbl_b5_")
    assert all(c.isalnum() or c in "_-" for c in one) and len(one) <= 1024


@pytest.mark.parametrize("change", [
    {"table_ref": "p.ds.other"}, {"checkpoint": "ck-2"}, {"batch_id": 6}, {"plan": [("t", 0, 0, 11)]},
])
def test_anything_else_gives_another_job_id(change: dict[str, Any]) -> None:
    base = {"table_ref": "p.ds.tbl", "checkpoint": "ck-id", "batch_id": 5, "plan": [("t", 0, 0, 10)]}
    assert file_loads.load_job_id(**base) != file_loads.load_job_id(**{**base, **change})


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


@dataclasses.dataclass
class Load:
    job_id: str
    config: Any
    data: bytes | None = None  # an upload through the driver
    uris: list[str] | None = None  # objects BigQuery reads itself


class FakeClient:
    """Jobs by id as BigQuery keeps them; a load job's outcome is decided by `fail_with`."""

    def __init__(self, jobs: dict[str, FakeJob] | None = None, fail_with: list[dict] | None = None,
                 conflict_once: FakeJob | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.fail_with = fail_with
        self.conflict_once = conflict_once
        self.loads: list[Load] = []

    def get_job(self, job_id: str, **_: Any) -> FakeJob:
        if job_id not in self.jobs:
            raise exceptions.NotFound(f"job {job_id}")
        return self.jobs[job_id]

    def load_table_from_file(self, source: Any, table: Any, *, job_id: str, job_config: Any, num_retries: int,
                             timeout: float) -> FakeJob:
        assert num_retries == 0  # the upload's own retries are off: the loader's are the only ones
        return self._create(Load(job_id, job_config, data=source.read()))

    def load_table_from_uri(self, uris: list[str], table: Any, *, job_id: str, job_config: Any, retry: Any,
                            timeout: float) -> FakeJob:
        assert retry is None  # the loader's retries are the only ones
        return self._create(Load(job_id, job_config, uris=list(uris)))

    def _create(self, load: Load) -> FakeJob:
        if self.conflict_once is not None:  # another driver created it between our lookup and our request
            self.jobs[load.job_id], self.conflict_once = self.conflict_once, None
            raise exceptions.Conflict(f"Already Exists: Job {load.job_id}")
        if load.job_id in self.jobs:
            raise exceptions.Conflict(f"Already Exists: Job {load.job_id}")
        self.loads.append(load)
        error = self.fail_with[0] if self.fail_with else None
        self.jobs[load.job_id] = FakeJob(load.job_id, error, self.fail_with)
        return self.jobs[load.job_id]


def loader(client: FakeClient, store: Store, clock: Clock | None = None) -> FileLoader:
    clock = clock or Clock()
    return FileLoader(client, CFG, store, "ck", sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]


def two_tasks(store: Store, batch_id: int = 2) -> list[StagedFile]:
    prefix = f"batch-{batch_id}/"
    return [stage(store, (rows([0, 1]), ids(0, [0, 1])), prefix=prefix), stage(store, (rows([2]), ids(1, [0])),
                                                                              prefix=prefix)]


def loaded_rows(data: bytes) -> list[dict[str, Any]]:
    return pq.read_table(pa.BufferReader(data)).to_pylist()


@pytest.fixture(params=["directory", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path, scratch: Path) -> Store:
    return LocalBlobStore(tmp_path / "staging") if request.param == "directory" else FakeGcs()


def test_from_a_directory_the_driver_uploads_every_staged_file_as_one(tmp_path: Path, scratch: Path) -> None:
    store = LocalBlobStore(tmp_path / "staging")
    staged = two_tasks(store)
    orphan = tmp_path / "staging" / "batch-2" / "part-of-a-failed-attempt.parquet"
    orphan.write_bytes(b"partial")
    client = FakeClient()

    outcome = loader(client, store).load(2, staged, PLAN)

    assert outcome is not None and not outcome.already_loaded and outcome.rows == 3
    [load] = client.loads
    assert load.job_id == file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN) == outcome.job_id
    assert load.uris is None and loaded_rows(load.data or b"") == [{"I": i, "s": f"v{i}"} for i in range(3)]
    assert load.config.to_api_repr() == file_loads.load_job_config().to_api_repr()
    # The prefix is the write mode's to drop, once every table of the batch is loaded; no combined file is left.
    orphan_name = "batch-2/part-of-a-failed-attempt.parquet"
    assert store.names() == sorted([*(n for f in staged for n in f.objects), orphan_name])


def test_from_cloud_storage_bigquery_reads_exactly_the_reported_objects(scratch: Path) -> None:
    store = FakeGcs()
    staged = two_tasks(store)
    store.objects["batch-2/part-of-a-failed-attempt.parquet"] = b"partial"
    client = FakeClient()

    outcome = loader(client, store).load(2, staged, PLAN)

    assert outcome is not None and outcome.rows == 3 and not outcome.already_loaded
    [load] = client.loads
    assert load.data is None, "nothing goes through the driver"
    assert load.uris == [f"gs://bucket/stage/{n}" for f in staged for n in f.objects]
    assert load.job_id == file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    assert load.config.to_api_repr() == file_loads.load_job_config().to_api_repr()


def test_objects_whose_columns_differ_are_combined_and_uploaded_by_the_driver(scratch: Path) -> None:
    store = FakeGcs()
    old = stage(store, (rows([0]), ids(0, [0])))
    grown = writer_in(store, "batch-2/", FakeTableClient([*TABLE, F("coupon", "STRING")]))
    grown.write(rows([1], coupon=["FREE"]), ids(1, [0]))
    grown.close()
    client = FakeClient()

    loader(client, store).load(2, [old, grown.staged], PLAN)

    [load] = client.loads
    assert load.uris is None
    assert loaded_rows(load.data or b"") == [{"I": 0, "s": "v0", "coupon": None}, {"I": 1, "s": "v1", "coupon": "FREE"}]
    assert list(scratch.iterdir()) == [], "the downloaded copies are gone"


def test_more_objects_than_one_job_takes_are_uploaded_by_the_driver(scratch: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_loads, "MAX_SOURCE_URIS", 1)
    store = FakeGcs()
    client = FakeClient()
    loader(client, store).load(2, two_tasks(store), PLAN)
    [load] = client.loads
    assert load.uris is None and len(loaded_rows(load.data or b"")) == 3


def test_a_replay_whose_job_already_ran_loads_nothing(store: Store) -> None:
    staged = two_tasks(store)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    done = FakeJob(job_id)
    client = FakeClient({job_id: done})

    outcome = loader(client, store).load(2, staged, PLAN)

    assert outcome is not None and outcome.already_loaded and outcome.job_id == job_id
    assert client.loads == [] and done.waits == 1


def test_a_batch_staged_in_pieces_and_its_replay_staged_in_one_load_once(store: Store) -> None:
    """A task held for a descriptor refresh stages its partition as two ranges, the rest of the batch run
    again from where it stopped; the replay after a crash between the load and the offset commit runs in one
    go and stages one. Both are the same batch, planned the same: the replay finds the load job."""
    client = FakeClient()
    held = [stage(store, (rows([0, 1]), ids(0, [0, 1]))), stage(store, (rows([2]), ids(0, [2]))),
            stage(store, (rows([3]), ids(1, [0])))]
    first = loader(client, store).load(2, held, PLAN)
    replay = [stage(store, (rows([0, 1, 2]), ids(0, [0, 1, 2]))), stage(store, (rows([3]), ids(1, [0])))]

    again = loader(client, store).load(2, replay, list(reversed(PLAN)))

    assert first is not None and again is not None and again.already_loaded and again.job_id == first.job_id
    assert len(client.loads) == 1


def test_a_job_created_concurrently_is_taken_as_ours(store: Store) -> None:
    staged = two_tasks(store)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    client = FakeClient(conflict_once=FakeJob(job_id))

    outcome = loader(client, store).load(2, staged, PLAN)

    assert outcome is not None and outcome.already_loaded and client.loads == []


def test_after_a_failed_job_the_retry_takes_the_next_id(store: Store) -> None:
    staged = two_tasks(store)
    base = file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    client = FakeClient({base: FakeJob(base, {"reason": "backendError", "message": "boom"})})

    outcome = loader(client, store).load(2, staged, PLAN)

    assert outcome is not None and outcome.job_id == f"{base}_retry1"
    assert [load.job_id for load in client.loads] == [f"{base}_retry1"]


def test_a_failed_job_raises_a_classified_error_with_its_errors_and_keeps_the_objects(store: Store) -> None:
    staged = two_tasks(store)
    errors = [{"reason": "invalid", "location": "file-00000000", "message": f"row {i}: bad value"}
              for i in range(7)]
    client = FakeClient(fail_with=errors)

    with pytest.raises(SinkError) as failed:
        loader(client, store).load(2, staged, PLAN)

    assert failed.value.error_type is ErrorType.SINK_4XX_ERROR
    text = str(failed.value)
    assert text.startswith("SINK_4XX_ERROR: load job firehose_bq_ds_tbl_b2_")
    assert "invalid at file-00000000: row 0: bad value" in text and "row 4" in text
    assert "row 5" not in text and "(and 2 more)" in text
    assert store.names() == sorted(n for f in staged for n in f.objects)


@pytest.mark.parametrize(("reason", "kind"), [("rateLimitExceeded", ErrorType.SINK_RETRYABLE_ERROR),
                                              ("backendError", ErrorType.SINK_5XX_ERROR),
                                              ("somethingNew", ErrorType.SINK_UNKNOWN_ERROR)])
def test_the_job_error_result_names_the_error_type(store: Store, reason: str, kind: ErrorType) -> None:
    client = FakeClient(fail_with=[{"reason": reason, "message": "x"}])
    with pytest.raises(SinkError) as failed:
        loader(client, store).load(2, two_tasks(store), PLAN)
    assert failed.value.error_type is kind


@pytest.mark.parametrize(("error", "kind"), [(exceptions.ServiceUnavailable("polling failed"), ErrorType.SINK_5XX_ERROR),
                                             (TimeoutError(), ErrorType.SINK_RETRYABLE_ERROR)])
def test_a_job_whose_outcome_is_unknown_fails_the_batch_without_a_second_job(
        store: Store, error: Exception, kind: ErrorType) -> None:
    staged = two_tasks(store)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    job = FakeJob(job_id, state="RUNNING", poll_error=error)
    client = FakeClient({job_id: job})
    clock = Clock()

    with pytest.raises(SinkError, match="gave up after") as failed:
        loader(client, store, clock).load(2, staged, PLAN)

    assert failed.value.error_type is kind and job_id in str(failed.value)
    assert client.loads == [] and store.names() == sorted(n for f in staged for n in f.objects)
    # Retried, each time finding the same job again, for SINK_BIGQUERY_RETRY_DEADLINE_MS and no longer.
    assert job.waits > 1 and clock.now == pytest.approx(CFG.retry_deadline_ms / 1000)


def test_a_running_job_is_polled_until_done_and_a_slow_one_fails_after_the_job_timeout(store: Store) -> None:
    class Finishing(FakeJob):
        def done(self, retry: Any, timeout: float) -> bool:
            self.state = "DONE" if self.waits >= 3 else "RUNNING"
            return super().done(retry, timeout)

    staged = two_tasks(store)
    job_id = file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN)
    clock = Clock()
    outcome = loader(FakeClient({job_id: Finishing(job_id)}), store, clock).load(2, staged, PLAN)
    assert outcome is not None and outcome.already_loaded
    assert clock.waits == [0.2, pytest.approx(0.3), pytest.approx(0.45)]

    slow = FakeJob(job_id, state="RUNNING")
    with pytest.raises(SinkError, match="did not finish within 600 s"):
        loader(FakeClient({job_id: slow}), store).load(2, staged, PLAN)


def test_a_staged_object_the_driver_cannot_see_is_named(store: Store) -> None:
    staged = two_tasks(store)
    store.delete_prefix(staged[1].objects[0])  # as if staged on another machine's local disk
    client = FakeClient()
    with pytest.raises(SinkError, match="not visible to the driver .*batch-2/part-.*must be gs://bucket/prefix or "
                                        "a directory that the driver and every executor share"):
        loader(client, store).load(2, staged, PLAN)
    assert client.loads == []


def test_a_staging_area_the_driver_cannot_list_is_a_classified_error(scratch: Path) -> None:
    store = FakeGcs()
    staged = two_tasks(store)
    store.fail = exceptions.Forbidden("no storage.objects.list")
    with pytest.raises(SinkError, match="listing the staged objects under gs://bucket/stage/batch-2 failed") as failed:
        loader(FakeClient(), store).load(2, staged, PLAN)
    assert failed.value.error_type is ErrorType.SINK_4XX_ERROR


def test_a_batch_that_staged_no_rows_runs_no_job(store: Store) -> None:
    client = FakeClient()
    assert loader(client, store).load(4, [stage(store, prefix="batch-4/")], PLAN) is None
    assert client.loads == []


def test_a_lookup_that_fails_is_a_classified_sink_error(store: Store) -> None:
    class Down(FakeClient):
        def get_job(self, job_id: str, **_: Any) -> FakeJob:
            raise exceptions.ServiceUnavailable("down")

    with pytest.raises(SinkError) as failed:
        loader(Down(), store).load(2, two_tasks(store), PLAN)
    assert failed.value.error_type is ErrorType.SINK_5XX_ERROR


def test_discarding_a_batch_drops_its_prefix_only_and_never_fails_the_batch(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    two_tasks(store, 1)
    kept = two_tasks(store, 10)
    file_loads.discard(store, "batch-1/")
    assert store.names() == sorted(n for f in kept for n in f.objects)

    if isinstance(store, FakeGcs):
        store.fail = exceptions.ServiceUnavailable("gcs is down")
        with caplog.at_level(logging.WARNING):
            file_loads.discard(store, "batch-10/")
        assert "could not delete the staged objects under gs://bucket/stage/batch-10/" in caplog.text


def test_a_streaming_run_with_file_loads_triggers_at_the_file_loads_interval() -> None:
    from firehose_bq.pipeline import Pipeline

    spark = SimpleNamespace(dataSource=SimpleNamespace(register=lambda source: None))  # all a Pipeline asks first
    env = {**MINIMAL, "SPARK_TRIGGER_INTERVAL_MS": "5000", "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "90000"}
    assert Pipeline(Config.from_env(env), spark).mode.trigger_interval_ms() == 5000  # type: ignore[arg-type]
    loads = Config.from_env({**env, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    assert Pipeline(loads, spark).mode.trigger_interval_ms() == 90_000  # type: ignore[arg-type]
    # Decoding only (benchmarks): nothing is loaded, so nothing paces the trigger but Spark's interval.
    assert Pipeline(loads, spark, write=False).mode.trigger_interval_ms() == 5000  # type: ignore[arg-type]


# -- tables with a JSON column: newline-delimited JSON ----------------------------------------------------

JSON_TABLE = [*TABLE, F("rec", "RECORD", fields=[F("doc", "JSON"), F("n", "INTEGER")])]


def json_rows(values: list[int], docs: list[str | None]) -> pa.RecordBatch:
    return rows(values, rec=[None if d is None else {"doc": d, "n": 2**60} for d in docs])


def staged_lines(store: Store, staged: StagedFile) -> list[dict[str, Any]]:
    return [json.loads(line) for name in staged.objects for line in store.get(name).decode().splitlines()]


def test_a_table_with_a_json_column_anywhere_stages_newline_delimited_json(scratch: Path) -> None:
    # A load job fills JSON columns only from CSV, Avro or JSON files: BigQuery refuses the Parquet.
    store = FakeGcs()
    writer = writer_in(store, client=FakeTableClient(JSON_TABLE))
    assert writer.write(json_rows([0, 1], ['{"a": [1, "x"]}', None]), ids(0, [0, 1])) == []
    writer.close()

    [name] = writer.staged.objects
    assert name.startswith("batch-3/part-") and name.endswith(".ndjson") and writer.staged.formats == [ndjson.NDJSON]
    assert staged_lines(store, writer.staged) == [
        {"I": 0, "s": "v0", "rec": {"doc": {"a": [1, "x"]}, "n": str(2**60)}},
        {"I": 1, "s": "v1"}]
    assert stage(FakeGcs(), (rows([0]), ids(0, [0]))).formats == [ndjson.PARQUET], "other tables keep Parquet"


def test_json_values_that_would_break_the_load_job_fail_their_rows_alone(scratch: Path) -> None:
    store = FakeGcs()
    writer = writer_in(store, client=FakeTableClient(JSON_TABLE))
    failures = writer.write(json_rows([0, 1, 2, 3], ["{}", "{}", "not json", '[1e999]']).append_column(
        "nope", pa.array([None, "x", None, None])), ids(0, [0, 1, 2, 3]))
    writer.close()

    assert [(f.index, f.error_type) for f in failures] == [
        (1, ErrorType.SINK_4XX_ERROR), (2, ErrorType.SINK_4XX_ERROR), (3, ErrorType.INVALID_MESSAGE_ERROR)]
    assert failures[1].message.startswith("table p.ds.tbl: column rec.doc: the value is not JSON text")
    assert [r["I"] for r in staged_lines(store, writer.staged)] == [0] and writer.staged.rows == 1


def test_a_json_null_in_a_required_json_column_fails_its_row_not_the_load_job(scratch: Path) -> None:
    # The load job reads the line's `null` as NULL, which a REQUIRED column refuses for the whole job.
    store = FakeGcs()
    writer = writer_in(store, client=FakeTableClient([*TABLE, F("Doc", "JSON", mode="REQUIRED")]))
    failures = writer.write(rows([0, 1, 2], doc=["null", "{}", "[null]"]), ids(0, [0, 1, 2]))
    writer.close()

    assert [(f.index, f.error_type) for f in failures] == [(0, ErrorType.SINK_4XX_ERROR)]
    assert failures[0].message == ("table p.ds.tbl: column Doc: a JSON null, which a load job reads as NULL: the "
                                   "REQUIRED column cannot hold it")
    assert staged_lines(store, writer.staged) == [{"I": 1, "s": "v1", "Doc": {}}, {"I": 2, "s": "v2", "Doc": [None]}]


def test_a_table_that_gains_a_json_column_during_the_task_starts_a_json_object(scratch: Path) -> None:
    client, store = FakeTableClient(), FakeGcs()
    writer = writer_in(store, client=client)
    writer.write(rows([0]), ids(0, [0]))
    client.schema = JSON_TABLE
    writer.write(json_rows([1], ["[1]"]), ids(0, [1]))
    writer.close()

    assert writer.staged.formats == [ndjson.PARQUET, ndjson.NDJSON]
    assert [Path(n).suffix for n in writer.staged.objects] == [".parquet", ".ndjson"]
    assert StagedFile.from_json(writer.staged.to_json()) == writer.staged


def test_a_pending_batch_staged_before_formats_were_recorded_is_parquet() -> None:
    old = '{"objects": ["batch-0/a.parquet", "batch-0/b.parquet"], "rows": 2, "schemas": ["d", "e"]}'
    assert StagedFile.from_json(old).formats == [ndjson.PARQUET, ndjson.PARQUET]


def test_the_load_job_of_a_json_table_reads_newline_delimited_json() -> None:
    config = file_loads.load_job_config(ndjson.NDJSON)
    assert (config.source_format, config.write_disposition, config.create_disposition) == (
        "NEWLINE_DELIMITED_JSON", "WRITE_APPEND", "CREATE_NEVER")
    assert "parquetOptions" not in config.to_api_repr()["load"] and config.schema is None


def json_tasks(store: Store, batch_id: int = 2) -> list[StagedFile]:
    prefix = f"batch-{batch_id}/"
    staged = []
    for partition, values in enumerate(([0, 1], [2])):
        writer = writer_in(store, prefix, FakeTableClient(JSON_TABLE))
        writer.write(json_rows(values, [f'{{"v": {v}}}' for v in values]), ids(partition, values))
        writer.close()
        staged.append(writer.staged)
    return staged


def test_a_json_tables_batch_loads_in_one_newline_delimited_json_job(store: Store) -> None:
    staged = json_tasks(store)
    client = FakeClient()

    outcome = loader(client, store).load(2, staged, PLAN)

    [load] = client.loads
    assert outcome is not None and outcome.rows == 3
    assert load.job_id == file_loads.load_job_id(CFG.table_ref, "ck", 2, PLAN), "the job id ignores the format"
    assert load.config.to_api_repr() == file_loads.load_job_config(ndjson.NDJSON).to_api_repr()
    if isinstance(store, FakeGcs):  # BigQuery reads the JSON objects itself
        assert load.data is None and load.uris == [store.uri(n) for f in staged for n in f.objects]
    else:  # the driver uploads them as one file
        assert [json.loads(line)["rec"]["doc"] for line in (load.data or b"").decode().splitlines()] == \
            [{"v": 0}, {"v": 1}, {"v": 2}]


def test_parquet_and_json_objects_of_one_table_load_in_one_json_job(store: Store) -> None:
    # The table gained its JSON column while the batch ran: one task staged Parquet before, one JSON after.
    # One job has one source format: the Parquet rows go in as JSON lines, in one uploaded file.
    before = stage(store, (rows([7], tags=[["t"]]), ids(1, [0])))
    staged = [before, *json_tasks(store)]
    client = FakeClient()

    loader(client, store).load(2, staged, PLAN)

    [load] = client.loads
    assert load.uris is None and load.config.source_format == ndjson.NDJSON
    assert [json.loads(line) for line in (load.data or b"").decode().splitlines()] == [
        {"I": 7, "s": "v7", "tags": ["t"]},
        *({"I": v, "s": f"v{v}", "rec": {"doc": {"v": v}, "n": str(2**60)}} for v in (0, 1, 2))]
    assert list(scratch_files(store)) == [], "no combined or downloaded copy is left"


def scratch_files(store: Store) -> list[Path]:
    return [] if isinstance(store, FakeGcs) else [p for p in Path(store.uri()).rglob(".load-*")]


# -- a staging directory that is, or turns, read-only -------------------------------------------------------

class Mount:
    """A directory bind-mounted onto itself, which the test turns read-only as a disk that fails does
    (ext4's errors=remount-ro) or as a read-only volume would be: only root can."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(path), str(path)],
                                               capture_output=True).returncode != 0:
            pytest.skip("needs to mount a directory read-only (root)")

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(self.path)], check=True)

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], check=True)


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Mount]:
    mount = Mount(tmp_path / "staging")
    try:
        yield mount
    finally:
        mount.close()


def test_a_staging_directory_read_only_to_the_driver_fails_the_batch_naming_the_directory(
        mounted: Mount, scratch: Path) -> None:
    store = LocalBlobStore(mounted.path)
    staged = two_tasks(store)
    mounted.read_only()
    client = FakeClient()

    with pytest.raises(SinkError) as failed:
        loader(client, store).load(2, staged, PLAN)

    assert f"{mounted.path / 'batch-2'}" in failed.value.message and "Read-only file system" in failed.value.message
    assert client.loads == []


def test_a_failed_upload_is_the_error_even_when_its_scratch_directory_cannot_be_removed(
        mounted: Mount, scratch: Path) -> None:
    """The disk turns read-only while the load uploads: the upload's failure is what the job reports, not
    the cleanup's `Read-only file system: 'load.parquet'` that named neither the cause nor the directory."""
    store = LocalBlobStore(mounted.path)
    staged = two_tasks(store)

    class Failing(FakeClient):
        def load_table_from_file(self, source: Any, table: Any, **_: Any) -> FakeJob:
            mounted.read_only()
            raise exceptions.BadRequest("the upload was refused")

    with pytest.raises(SinkError) as failed:
        loader(Failing(), store).load(2, staged, PLAN)

    assert "the upload was refused" in failed.value.message, failed.value.message
