"""The process's BigQuery clients (bigquery/client.py `Clients`): made once per endpoint, shared by the
writers of every task, credentials shared between the REST and gRPC clients, dropped after a failure."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from firehose_bq.bigquery import client as client_module
from firehose_bq.bigquery.client import Clients
from firehose_bq.config import BigQueryConfig

EMULATOR = BigQueryConfig(project_id="p", dataset="d", table="t", api_endpoint="http://127.0.0.1:1",
                          storage_api_endpoint="127.0.0.1:2")
REAL = BigQueryConfig(project_id="p", dataset="d", table="t")


class Made:
    """make_client / make_write_client stand-ins: what each call was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def rest(self, cfg: BigQueryConfig, creds: Any = None) -> Any:
        self.calls.append(("rest", cfg.table_ref, creds))
        return FakeRest()

    def grpc(self, cfg: BigQueryConfig, creds: Any = None) -> Any:
        self.calls.append(("grpc", cfg.table_ref, creds))
        return FakeGrpc()


class FakeRest:
    closed = False

    def close(self) -> None:
        self.closed = True


class FakeGrpc:
    def __init__(self) -> None:
        self.transport = FakeRest()


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    made = Made()
    monkeypatch.setattr(client_module, "make_client", made.rest)
    monkeypatch.setattr(client_module, "make_write_client", made.grpc)
    return made


@pytest.fixture
def adc(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """google.auth.default, counted: each call is a credentials lookup (and later a token of its own)."""
    import google.auth

    asked: list[tuple[str, ...]] = []

    def default(scopes: tuple[str, ...]) -> tuple[object, str]:
        asked.append(tuple(scopes))
        return object(), "p"

    monkeypatch.setattr(google.auth, "default", default)
    return asked


def test_every_table_of_an_endpoint_shares_one_client_of_each_kind_and_one_credentials(
        made: Made, adc: list[tuple[str, ...]]) -> None:
    clients = Clients()
    other_table = dataclasses.replace(REAL, dataset="d2", table="u")
    rest, grpc = clients.bigquery_client(REAL), clients.write_client(REAL)
    assert clients.bigquery_client(other_table) is rest and clients.write_client(other_table) is grpc
    assert [kind for kind, _, _ in made.calls] == ["rest", "grpc"]
    # Application Default Credentials are looked up once, for both clients: one token between them.
    assert adc == [client_module.ADC_SCOPES]
    assert made.calls[0][2] is made.calls[1][2] is not None


def test_another_endpoint_or_key_gets_clients_of_its_own(made: Made, adc: list[tuple[str, ...]]) -> None:
    clients = Clients()
    clients.bigquery_client(REAL)
    clients.bigquery_client(dataclasses.replace(REAL, project_id="other"))
    clients.bigquery_client(dataclasses.replace(REAL, storage_api_endpoint="bqs.example:443"))
    assert len(made.calls) == 3 and len(adc) == 3


def test_reset_closes_the_clients_and_keeps_the_credentials(made: Made, adc: list[tuple[str, ...]]) -> None:
    clients = Clients()
    rest, grpc = clients.bigquery_client(REAL), clients.write_client(REAL)
    clients.reset()
    assert rest.closed and grpc.transport.closed
    assert clients.bigquery_client(REAL) is not rest and clients.write_client(REAL) is not grpc
    assert len(adc) == 1, "the credentials (and their token) outlive a reset"


def test_close_closes_everything(made: Made, adc: list[tuple[str, ...]]) -> None:
    with Clients() as clients:
        rest, grpc = clients.bigquery_client(REAL), clients.write_client(REAL)
    assert rest.closed and grpc.transport.closed
    clients.bigquery_client(REAL)
    assert len(adc) == 2


def test_a_forked_child_starts_without_the_parents_clients(made: Made, adc: list[tuple[str, ...]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    clients = Clients()
    parents = clients.write_client(REAL)
    monkeypatch.setattr(os, "getpid", lambda: -1)
    child = clients.write_client(REAL)
    assert child is not parents and not parents.transport.closed, "the parent's channel is left alone"
    assert len(adc) == 2


def test_real_clients_for_the_emulator_need_no_credentials_lookup(adc: list[tuple[str, ...]]) -> None:
    with Clients() as clients:
        rest = clients.bigquery_client(EMULATOR)
        assert clients.bigquery_client(dataclasses.replace(EMULATOR, table="u")) is rest
        assert clients.write_client(EMULATOR) is clients.write_client(EMULATOR)
    assert adc == []


def test_concurrently_runs_every_item_on_a_client_per_thread_then_raises_the_first_failure(
        made: Made, adc: list[tuple[str, ...]]) -> None:
    """A file-loads batch's load jobs, one per table (modes.py): at most `most` at once, each thread on a REST
    client of its own, in the caller's log context; a failure leaves the other items running to their end."""
    import threading
    import time

    from firehose_bq import logs
    from firehose_bq.bigquery.client import concurrently

    lock = threading.Lock()
    running, peak, seen = [0], [0], []

    def work(client: Any, item: int) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
            seen.append((item, client, threading.get_ident(), dict(logs._context.get())))
        if item in (5, 3):
            raise ValueError(f"item {item}")

    with logs.log_context(batch_id=7), pytest.raises(ValueError, match="item 3"):
        concurrently(work, list(range(8)), 3, lambda: client_module.make_client(REAL), lambda c: c.close())
    assert sorted(item for item, *_ in seen) == list(range(8))
    assert peak[0] == 3 and all(fields == {"batch_id": 7} for *_, fields in seen)
    by_thread: dict[int, set[int]] = {}
    for _, client, thread, _ in seen:
        by_thread.setdefault(thread, set()).add(id(client))
    assert all(len(ids) == 1 for ids in by_thread.values()) and len(made.calls) == len(by_thread) <= 3
    assert all(client.closed for _, client, _, _ in seen)
