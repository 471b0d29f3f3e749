"""A routed job's tables, created from inside its tasks: what a refusal by BigQuery becomes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery

from firehose_bq import sink_schema
from firehose_bq.bigquery import client as client_module
from firehose_bq.bigquery.client import Clients
from firehose_bq.config import Config
from firehose_bq.errors import ErrorType, SchemaError, SinkError
from firehose_bq.routing import Destination
from firehose_bq.sink_schema import CheckedTables, Ensured, TableKeeper

BASE = {"SOURCE_KAFKA_BROKERS": "b", "SOURCE_KAFKA_TOPIC": "t", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
        "INPUT_SCHEMA_DATA_TYPE": "JSON", "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "p",
        "SINK_BIGQUERY_DATASET_NAME": "ds", "SINK_BIGQUERY_TABLE_NAME": "ev_${header.type}",
        "SPARK_CHECKPOINT_LOCATION": "/c"}


class RefusingClient:
    """A BigQuery client whose dataset does not exist and whose create_dataset fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __enter__(self) -> RefusingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def get_dataset(self, *args: Any, **kwargs: Any) -> None:
        raise api_exceptions.NotFound("Not found: Dataset p:ds")

    def create_dataset(self, *args: Any, **kwargs: Any) -> None:
        raise self.error


class KeepingClient:
    """A BigQuery client whose dataset exists and which keeps the tables it is asked to create."""

    def __init__(self) -> None:
        self.tables: dict[str, bigquery.Table] = {}
        self.closed = False
        self.dataset_gets = 0
        self.table_gets = 0

    def get_dataset(self, ref: bigquery.DatasetReference, **kwargs: Any) -> bigquery.Dataset:
        self.dataset_gets += 1
        return bigquery.Dataset(ref)

    def get_table(self, ref: str, **kwargs: Any) -> bigquery.Table:
        self.table_gets += 1
        if ref not in self.tables:
            raise api_exceptions.NotFound(f"Not found: Table {ref}")
        return self.tables[ref]

    def create_table(self, table: bigquery.Table, **kwargs: Any) -> None:
        self.tables[f"{table.project}.{table.dataset_id}.{table.table_id}"] = table

    def close(self) -> None:
        self.closed = True


def lending(monkeypatch: pytest.MonkeyPatch, client: object) -> tuple[Clients, list[object]]:
    """Clients that make `client` (no credentials looked up), and each client they made."""
    made: list[object] = []

    def make(cfg: object, creds: object = None) -> object:
        made.append(client)
        return client

    monkeypatch.setattr(client_module, "make_client", make)
    monkeypatch.setattr(client_module, "credentials", lambda cfg: object())
    return Clients(), made


def schema_file(tmp_path: Path) -> Config:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps([{"name": "id", "type": "INTEGER"}]))
    return Config.from_env({**BASE, "SINK_BIGQUERY_TABLE_SCHEMA_FILE": str(schema)})


def refusing(monkeypatch: pytest.MonkeyPatch, error: Exception) -> Clients:
    return lending(monkeypatch, RefusingClient(error))[0]


def test_a_tasks_tables_are_ensured_with_the_workers_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A routed job ensures each table its records name in every task of every micro-batch: with 200
    tables, 400 calls a batch on two partitions. Each made a client of its own before, and with it new
    credentials and their token (ADC: a metadata-server lookup) and a new connection; they borrow the
    worker's clients now, as the writers do, and the clients stay open for the next task."""
    client = KeepingClient()
    clients, made = lending(monkeypatch, client)
    tables = TableKeeper(schema_file(tmp_path))
    for _batch in range(2):
        for name in ("ev_a", "ev_b", "ev_c"):
            ensured = tables.ensure(None, Destination("ds", name), clients)
            assert [json.loads(c)["name"] for c in ensured.json_columns or ()] == ["id"]
            assert "id" in [f.name for f in ensured.schema]  # the live columns, for the task's writer
    assert sorted(client.tables) == ["p.ds.ev_a", "p.ds.ev_b", "p.ds.ev_c"]
    assert len(made) == 1 and not client.closed
    assert client.dataset_gets == 6
    # A dataset the task ensured already, for another table: not asked for again.
    tables.ensure(None, Destination("ds", "ev_d"), clients, dataset_ready=True)
    assert client.dataset_gets == 6 and "p.ds.ev_d" in client.tables


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_workers_later_tasks_reuse_its_table_checks_until_the_ttl(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of a worker's tasks, in every micro-batch, checked every table its records named: a tables.get
    each (tens of ms on BigQuery, one after another). Kept, a check is made again only after
    SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS (60 s), or for other settings."""
    client = KeepingClient()
    clients, _ = lending(monkeypatch, client)
    clock = Clock()
    kept = CheckedTables(clock)
    cfg = schema_file(tmp_path)
    first = TableKeeper(cfg).ensure(None, Destination("ds", "ev_a"), clients, kept=kept)
    gets = client.table_gets
    for _task in range(3):  # each task unpickles a keeper of its own, of the same settings
        clock.now += 15
        again = TableKeeper(cfg).ensure(None, Destination("ds", "ev_a"), clients, kept=kept)
        assert again.kept and again.schema == first.schema and not first.kept
    assert client.table_gets == gets and client.dataset_gets == 1
    clock.now += 15  # 60 s since the first check: past the TTL
    TableKeeper(cfg).ensure(None, Destination("ds", "ev_a"), clients, kept=kept)
    assert client.table_gets > gets and client.dataset_gets == 2
    # Another table, or another job's settings for the same table (a table is planned from them too): a check.
    TableKeeper(cfg).ensure(None, Destination("ds", "ev_b"), clients, kept=kept)
    other = Config.from_env({**BASE, "SINK_BIGQUERY_TABLE_SCHEMA_FILE": cfg.bigquery.table_schema_file,
                             "SOURCE_KAFKA_CONSUMER_GROUP_ID": "another-job"})
    TableKeeper(other).ensure(None, Destination("ds", "ev_a"), clients, kept=kept)
    assert client.dataset_gets == 4 and len(kept) == 3
    # TTL 0: every task checks, as without kept checks.
    zero = Config.from_env({**BASE, "SINK_BIGQUERY_TABLE_SCHEMA_FILE": cfg.bigquery.table_schema_file,
                            "SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS": "0"})
    for _task in range(2):
        TableKeeper(zero).ensure(None, Destination("ds", "ev_a"), clients, kept=kept)
    assert client.dataset_gets == 6


def test_new_descriptors_check_a_kept_table_again_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check evolves the table to the descriptors the task decodes with: a newer version must be applied
    before the first row of it is written, not a TTL later."""
    checks: list[str] = []

    def check(self: TableKeeper, loaded: Any, destination: Destination, clients: Clients,
              dataset_ready: bool = False) -> Ensured:
        checks.append(loaded.fingerprint)
        return Ensured([])

    monkeypatch.setattr(TableKeeper, "check", check)
    kept, keeper = CheckedTables(), TableKeeper(schema_file(tmp_path))
    for version in ("v1", "v1", "v2", "v2", "v1"):
        keeper.ensure(SimpleNamespace(fingerprint=version), Destination("ds", "ev_a"), Clients(),  # type: ignore[arg-type]
                      kept=kept)
    assert checks == ["v1", "v2"]  # v1's check is still kept when a task of the older version comes last


def test_a_check_that_fails_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table BigQuery refused, or could not be reached for: the next task asks again (a fixed name, a dataset
    created meanwhile, an outage over)."""
    kept = CheckedTables()
    refusal = api_exceptions.BadRequest("Invalid table id", errors=[{"reason": "invalid", "message": "Invalid id"}])
    for _task in range(2):
        with pytest.raises(SchemaError):
            TableKeeper(schema_file(tmp_path)).ensure(None, Destination("ds", "ev_a"), refusing(monkeypatch, refusal),
                                                      kept=kept)
    assert len(kept) == 0


def test_kept_checks_are_bounded_oldest_first() -> None:
    """A template over a high-cardinality attribute names tables without end: a worker keeps the newest."""
    kept = CheckedTables()
    kept.LIMIT = 3  # type: ignore[misc]
    for name in "abcd":
        kept.put(name, Ensured([]), 60)
    assert [k for k in "abcd" if kept.get(k, 60) is not None] == ["b", "c", "d"]
    kept.put("b", Ensured([]), 60)  # checked again: the newest now
    kept.put("e", Ensured([]), 60)
    assert [k for k in "bcde" if kept.get(k, 60) is not None] == ["b", "d", "e"]


def test_a_routed_table_bigquery_refuses_as_invalid_is_unusable_not_a_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name a record's header made, which BigQuery will not take (the local emulator refuses ids past 255
    characters with HTTP 400 `invalid`): a SchemaError, which the batch core turns into ROUTING_ERRORs of
    that destination's records. A SinkError would stop the job, and the restart would meet it again."""
    refusal = api_exceptions.BadRequest("Invalid table id", errors=[{"reason": "invalid", "message": "Invalid id"}])
    with pytest.raises(SchemaError, match="BigQuery refused to create or evolve it: 400 Invalid table id"):
        TableKeeper(schema_file(tmp_path)).ensure(None, Destination("ds", "ev_" + "x" * 300),
                                                      refusing(monkeypatch, refusal))


@pytest.mark.parametrize(("error", "error_type"), [
    (api_exceptions.InternalServerError("backend"), ErrorType.SINK_5XX_ERROR),
    (api_exceptions.Forbidden("denied", errors=[{"reason": "accessDenied"}]), ErrorType.SINK_4XX_ERROR),
    (api_exceptions.TooManyRequests("quota", errors=[{"reason": "rateLimitExceeded"}]),
     ErrorType.SINK_RETRYABLE_ERROR),
])
def test_an_outage_or_a_permission_still_stops_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       error: Exception, error_type: ErrorType) -> None:
    """Not the destination's fault: every table would fail alike, and its records must not be dead-lettered."""
    with pytest.raises(SinkError) as raised:
        TableKeeper(schema_file(tmp_path)).ensure(None, Destination("ds", "ev_a"), refusing(monkeypatch, error))
    assert raised.value.error_type is error_type
    assert "creating or evolving table ds.ev_a failed" in str(raised.value)


def test_the_stencil_fetch_requires_every_class_the_job_decodes() -> None:
    protobuf = {**BASE, "INPUT_SCHEMA_DATA_TYPE": "PROTOBUF", "SCHEMA_REGISTRY_STENCIL_URLS": "/d.desc",
                "INPUT_SCHEMA_PROTO_CLASS": "shop.Click", "INPUT_SCHEMA_PROTO_CLASS_HEADER": "type",
                "INPUT_SCHEMA_PROTO_CLASS_ROUTES": "buy=shop.Purchase,see=shop.View",
                "INPUT_SCHEMA_PROTO_KEY_CLASS": "shop.Key"}
    assert sink_schema.job_classes(Config.from_env(protobuf)) == ("shop.Click", "shop.Key", "shop.Purchase", "shop.View")
