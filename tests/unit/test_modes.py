"""Write modes: chosen once from config, each owning its task plan, driver step and trigger."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from firehose_bq import modes
from firehose_bq.batch.core import TaskResult
from firehose_bq.bigquery import file_loads
from firehose_bq.blobstore import LocalBlobStore
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.errors import BatchFailedError, ErrorType, FirehoseError, MessageError
from firehose_bq.metrics import BatchStats
from firehose_bq.policy import ErrorHandling
from firehose_bq.modes import (
    FileLoadsMode,
    StagingTask,
    StorageWriteMode,
    StreamingTask,
    UpsertMode,
    WriteMode,
    batch_stats,
    settle,
    write_mode,
)
from firehose_bq.upsert.writer import ChangelogTask

BASE = {"SOURCE_KAFKA_BROKERS": "b", "SOURCE_KAFKA_TOPIC": "t", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
        "INPUT_SCHEMA_PROTO_CLASS": "x.Y", "SCHEMA_REGISTRY_STENCIL_URLS": "/d",
        "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "my-project", "SINK_BIGQUERY_DATASET_NAME": "d",
        "SINK_BIGQUERY_TABLE_NAME": "t", "SPARK_CHECKPOINT_LOCATION": "/c"}


def config(**env: str) -> Config:
    return Config.from_env({**BASE, **env})


@pytest.mark.parametrize(("env", "kind", "trigger"), [
    ({}, StorageWriteMode, 5000),
    ({"SINK_BIGQUERY_WRITE_METHOD": "insertall"}, WriteMode, 5000),
    ({"SINK_BIGQUERY_STORAGE_API_ENABLE": "true"}, StorageWriteMode, 5000),
    ({"SINK_BIGQUERY_WRITE_METHOD": "file_loads", "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "60000"}, FileLoadsMode,
     60000),
    ({"SINK_BIGQUERY_UPSERT_ENABLED": "true", "INPUT_SCHEMA_PROTO_KEY_CLASS": "x.K",
      "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "key", "SINK_BIGQUERY_WRITE_METHOD": "file_loads",
      "SINK_BIGQUERY_MERGE_INTERVAL_MS": "30000"}, UpsertMode, 30000),
])
def test_the_mode_is_chosen_once_from_config(env: dict[str, str], kind: type, trigger: int) -> None:
    mode = write_mode(config(**env))
    assert type(mode) is kind and mode.trigger_interval_ms() == trigger


def test_each_mode_plans_its_tasks(tmp_path: Path) -> None:
    assert write_mode(config()).task(3) == StreamingTask(config().bigquery, "storage_write")
    area = file_loads.StagingArea(str(tmp_path), prefix="dlq-replay-1/")
    loads = write_mode(config(SINK_BIGQUERY_WRITE_METHOD="file_loads"), staging=area, identity=lambda: "q")
    task = loads.task(7)
    assert isinstance(task, StagingTask) and task.staging == area and task.prefix == "dlq-replay-1/batch-7/"
    assert pickle.loads(pickle.dumps(task)) == task  # Spark ships it to every task
    upsert = write_mode(config(SINK_BIGQUERY_UPSERT_ENABLED="true", INPUT_SCHEMA_PROTO_KEY_CLASS="x.K",
                               SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME="key"))
    plan = upsert.task(4)
    assert isinstance(plan, ChangelogTask) and plan.changelog and plan.batch == 4


class Recording(WriteMode):
    def __init__(self) -> None:
        super().__init__(config(), None)  # type: ignore[arg-type]
        self.calls: list[tuple[str, int]] = []

    def finish(self, batch: int, results: object, plan: object) -> None:
        self.calls.append(("finish", batch))

    def abort(self, batch: int) -> None:
        self.calls.append(("abort", batch))


def result(messages: int, written: int, failed: list[MessageError] = (), fatal: str | None = None) -> TaskResult:
    stats = BatchStats(messages=messages, rows_written=written)
    stats.add_outcome("failed", list(failed))
    return TaskResult(stats, fatal)


def test_settle_runs_the_driver_step_only_when_every_record_landed() -> None:
    mode = Recording()
    results = [result(2, 2), result(1, 1)]
    settle(mode, 5, results, batch_stats(results), [])
    assert mode.calls == [("finish", 5)] and batch_stats(results).messages == 3

    failed = [result(2, 1, [MessageError(ErrorType.SINK_4XX_ERROR, "t", 0, 9, "bad")])]
    with pytest.raises(BatchFailedError) as stopped:
        settle(mode, 6, failed, batch_stats(failed), [])
    assert mode.calls[-1] == ("abort", 6) and "t/0@9" in str(stopped.value)

    fatal = [result(1, 1), result(1, 0, fatal="SINK_5XX_ERROR: backend down")]
    with pytest.raises(FirehoseError, match="batch 7 stopped, offsets not committed: SINK_5XX_ERROR"):
        settle(mode, 7, fatal, batch_stats(fatal), [])
    assert mode.calls[-1] == ("abort", 7)


def test_file_loads_load_each_table_once_then_drop_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[tuple[str, int, list[str]]] = []
    plans: list[list] = []  # type: ignore[type-arg]

    class Loader:
        def __init__(self, client: object, cfg: BigQueryConfig, store: LocalBlobStore, identity: str,
                     handling: ErrorHandling) -> None:
            assert store.uri() == str(tmp_path) and identity == "query-1"
            assert handling.retry_deadline_ms == cfg.retry_deadline_ms  # a failed load retries like a write
            self.table = cfg.table_ref

        def load(self, batch: int, staged: list[file_loads.StagedFile], plan: list) -> None:  # type: ignore[type-arg]
            # Every table's job is identified by the batch's plan, and by where the routing sends records.
            assert plan[:1] == [("t", 0, 0, 9)] and plan[1][0] == "routing"
            plans.append(plan)
            loads.append((self.table, batch, [name for f in staged for name in f.objects]))

    monkeypatch.setattr(file_loads, "FileLoader", Loader)
    at_once: list[int] = []

    def one_by_one(work, items, most, open_each, close):  # noqa: ANN001, ANN202 - client.concurrently, in this thread
        at_once.append(most)
        for item in items:  # each as if on a thread of its own: its own client and store
            opened = open_each()
            work(opened, item)
            close(opened)

    class Client:
        def close(self) -> None:
            pass

    token, looked_up, made_with = object(), [], []  # type: ignore[var-annotated]

    def make_client(cfg: BigQueryConfig, creds: object) -> Client:
        made_with.append(creds)
        return Client()

    monkeypatch.setattr(modes, "concurrently", one_by_one)
    monkeypatch.setattr(modes, "shared_credentials", lambda cfg: looked_up.append(cfg) or token)
    monkeypatch.setattr(modes, "make_client", make_client)
    mode = write_mode(config(SINK_BIGQUERY_WRITE_METHOD="file_loads", SINK_BIGQUERY_FILE_LOADS_CONCURRENT_JOBS="3"),
                      staging=file_loads.StagingArea(str(tmp_path)), identity=lambda: "query-1")
    store = LocalBlobStore(tmp_path)
    for name in ("batch-3/a", "batch-3/ds.other/b", "batch-3/c", "batch-30/x"):
        store.put(name, b"")

    def report(table: str, name: str) -> str:
        return json.dumps({"table": table, "staged": json.loads(file_loads.StagedFile([name], 1).to_json())})

    results = [TaskResult(reports=[report("", "batch-3/a"), report("ds.other", "batch-3/ds.other/b")]),
               TaskResult(reports=[report("", "batch-3/c")])]
    mode.finish(3, results, [("t", 0, 0, 9)])
    assert loads == [("my-project.d.t", 3, ["batch-3/a", "batch-3/c"]),
                     ("my-project.ds.other", 3, ["batch-3/ds.other/b"])]
    assert store.names() == ["batch-30/x"] and at_once == [3]
    # One credentials lookup for the batch, shared by every thread's client (one token, not one per thread).
    assert len(looked_up) == 1 and made_with == [token, token]
    # Another routing, the same batch: other job ids (a record it moves between tables is loaded again).
    rerouted = write_mode(config(SINK_BIGQUERY_WRITE_METHOD="file_loads", SINK_BIGQUERY_TABLE_NAME="t_${header.kind}"),
                          staging=file_loads.StagingArea(str(tmp_path)), identity=lambda: "query-1")
    rerouted.finish(3, [TaskResult(reports=[report("", "batch-3/a")])], [("t", 0, 0, 9)])
    assert plans[-1] != plans[0]
    mode.abort(30)
    assert store.names() == [] and list(tmp_path.iterdir()) == []


def test_the_spark_jobs_plan_is_each_range_its_tasks_were_given_once() -> None:
    """A batch held for a refresh: its tasks report their ranges from both runs."""
    first = [TaskResult(planned=[("t", 1, 5, 9)]), TaskResult(planned=[("t", 0, 0, 4)])]
    rerun = [TaskResult(planned=[("t", 0, 0, 4)]), TaskResult(planned=[("t", 1, 5, 9)])]
    assert modes.planned_ranges(first + rerun) == modes.planned_ranges(rerun) == [("t", 0, 0, 4), ("t", 1, 5, 9)]
