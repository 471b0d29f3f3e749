"""One place that knows how to reach BigQuery: the emulator, a key file, or Application Default Credentials."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import GoogleAPIError
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import bigquery
from requests import exceptions as http_exceptions
from requests.adapters import DEFAULT_POOLSIZE

from firehose_bq.config import BigQueryConfig
from firehose_bq.gcp_auth import service_account_credentials
from firehose_bq.threads import in_threads

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from google.cloud.bigquery_storage_v1 import BigQueryWriteClient

T = TypeVar("T")
R = TypeVar("R")

SCOPES = ("https://www.googleapis.com/auth/bigquery",)
# What both clients ask Application Default Credentials for when they resolve them themselves.
ADC_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# What a BigQuery call raises when it fails as a whole and the client did not retry it: an API error, the
# HTTP library's own (refused, reset, timed out), or a token refresh that could not reach Google.
REQUEST_ERRORS = (GoogleAPIError, http_exceptions.RequestException, ConnectionError, TimeoutError,
                  auth_exceptions.TransportError)


def call_options(cfg: BigQueryConfig) -> dict[str, object]:
    """`retry` and `timeout` for a BigQuery call that no layer of ours retries (creating and evolving
    tables, reading a schema on the driver): the client retries it until SINK_BIGQUERY_RETRY_DEADLINE_MS.
    Without them it would retry for 600 s."""
    return {"retry": bigquery.DEFAULT_RETRY.with_timeout(cfg.retry_deadline_ms / 1000),
            "timeout": cfg.request_timeout_s}


def attempt_options(cfg: BigQueryConfig) -> dict[str, object]:
    """`retry` and `timeout` for a BigQuery call that is one attempt of a write our retry layer repeats
    (policy.py, the load job, the MERGE): the client does not retry it, or the retries would multiply."""
    return {"retry": None, "timeout": cfg.request_timeout_s}


def make_client(cfg: BigQueryConfig, creds: Credentials | None = None) -> bigquery.Client:
    """A BigQuery (REST) client; `creds` None = cfg's credentials (`credentials`). Its location is the
    datasets' (ensure_dataset refuses one elsewhere): jobs.get finds a job outside the US and EU
    multi-regions only when told where it ran, and a batch's MERGE or load job must be found again."""
    options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
    return bigquery.Client(project=cfg.project_id, credentials=creds if creds is not None else credentials(cfg),
                           client_options=options, location=cfg.dataset_location or None)


def make_write_client(cfg: BigQueryConfig, creds: Credentials | None = None) -> BigQueryWriteClient:
    """A Storage Write (gRPC) client; `creds` None = cfg's credentials (`credentials`)."""
    from google.cloud.bigquery_storage_v1 import BigQueryWriteClient

    if cfg.storage_api_endpoint and cfg.api_endpoint:
        # The local emulator: plaintext gRPC, no credentials.
        import grpc
        from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

        channel = grpc.insecure_channel(cfg.storage_api_endpoint)
        return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))
    options = ClientOptions(api_endpoint=cfg.storage_api_endpoint) if cfg.storage_api_endpoint else None
    return BigQueryWriteClient(credentials=creds if creds is not None else credentials(cfg), client_options=options)


# What a client is made from: a destination's dataset and table are not part of it.
_Endpoint = tuple[str, str | None, str | None, str | None]


class Clients:
    """The BigQuery clients of one process, made once per endpoint and kept: every writer a task opens,
    in every micro-batch, borrows them instead of making its own.

    A fresh client per writer cost each task, per batch and table, a token for each of its two clients
    (a key file's: a signed request to Google's OAuth endpoint; ADC's: the metadata server), a TLS
    handshake for each, and a new gRPC channel for Storage Write, whose guidance is to keep connections
    rather than open one per append. Kept here, the process pays them once and its credentials refresh
    their token when it expires.

    After a task saw a request fail as a whole, `reset` drops every client, so that the next task (or the
    batch's rerun) starts on new ones: a gRPC channel that lost its connection waits out a reconnect
    backoff of its own (growing to minutes) before it tries again, which a fresh channel does not.
    Clients found in a forked child are the parent's and are forgotten: a gRPC channel must not cross a
    fork (Spark's worker daemon imports the module holding the workers' pool before it forks them)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._credentials: dict[_Endpoint, Credentials] = {}
        self._rest: dict[_Endpoint, bigquery.Client] = {}
        self._grpc: dict[_Endpoint, BigQueryWriteClient] = {}
        self._slots: dict[_Endpoint, threading.BoundedSemaphore] = {}

    def bigquery_client(self, cfg: BigQueryConfig) -> bigquery.Client:
        key = self._key(cfg)
        if key not in self._rest:
            self._rest[key] = make_client(cfg, self._creds(key, cfg))
        return self._rest[key]

    def write_client(self, cfg: BigQueryConfig) -> BigQueryWriteClient:
        key = self._key(cfg)
        if key not in self._grpc:
            self._grpc[key] = make_write_client(cfg, self._creds(key, cfg))
        return self._grpc[key]

    def request_slots(self, cfg: BigQueryConfig) -> threading.BoundedSemaphore:
        """What every writer of this process holds while a request of its own is in flight on the REST client
        for cfg's endpoint: as many as the client's connections per host. Writers send several requests at
        once, and a task writes several tables at once; past the pool's size, the HTTP library would open a
        connection per extra request, and drop it afterwards with a warning."""
        key = self._key(cfg)
        if key not in self._slots:
            self._slots[key] = threading.BoundedSemaphore(DEFAULT_POOLSIZE)
        return self._slots[key]

    def reset(self) -> None:
        """Close every client; the next writer gets new ones (credentials and their token are kept)."""
        rest, grpc_clients = list(self._rest.values()), list(self._grpc.values())
        self._rest.clear()
        self._grpc.clear()
        for client in rest:
            client.close()
        for write_client in grpc_clients:
            write_client.transport.close()

    def close(self) -> None:
        self.reset()
        self._credentials.clear()

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _key(self, cfg: BigQueryConfig) -> _Endpoint:
        if os.getpid() != self._pid:  # inherited through a fork: the parent's channels are not ours
            self._pid = os.getpid()
            self._credentials, self._rest, self._grpc, self._slots = {}, {}, {}, {}
        return cfg.project_id, cfg.api_endpoint, cfg.storage_api_endpoint, cfg.credential_path

    def _creds(self, key: _Endpoint, cfg: BigQueryConfig) -> Credentials:
        """One credentials object per endpoint, shared by its two clients: one token between them."""
        if key not in self._credentials:
            log.debug("BigQuery credentials for project %s looked up in process %d, kept for its clients",
                      cfg.project_id, self._pid)
            self._credentials[key] = shared_credentials(cfg)
        return self._credentials[key]


def shared_credentials(cfg: BigQueryConfig) -> Credentials:
    """cfg's credentials as one object that several clients can share (one token between them): Application
    Default Credentials looked up here, not by each client."""
    creds = credentials(cfg)
    if creds is None:
        import google.auth

        creds, _ = google.auth.default(scopes=ADC_SCOPES)
    return creds


def concurrently(work: Callable[[R, T], None], items: Sequence[T], most: int, open_each: Callable[[], R],
                 close: Callable[[R], None]) -> None:
    """`work(resource, item)` for every item, on up to `most` threads at once, each thread with a resource of its
    own (`open_each()`, e.g. its own client, so that each thread's calls have connections of their own; `close`d
    once all are done) and the caller's log context. Every item runs even when another fails; once all are
    done, the first failure in item order is raised."""
    local = threading.local()
    opened: list[R] = []

    def run(item: T) -> None:
        if not hasattr(local, "resource"):
            local.resource = open_each()
            opened.append(local.resource)
        work(local.resource, item)

    try:
        futures = in_threads([functools.partial(run, item) for item in items], most, "bigquery")
        for future in futures:
            future.result()
    finally:
        for resource in opened:
            close(resource)


def credentials(cfg: BigQueryConfig) -> Credentials | None:
    """The credentials of every BigQuery client; None = Application Default Credentials."""
    if cfg.api_endpoint:
        # An emulator takes no Google credentials (a key set with an endpoint is a configuration error).
        return AnonymousCredentials()
    if not cfg.credential_path:
        return None
    return service_account_credentials(cfg.credential_path, SCOPES, "SINK_BIGQUERY_CREDENTIAL_PATH")
