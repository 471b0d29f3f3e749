"""One place that knows how to reach BigQuery: the emulator, a key file, or Application Default Credentials."""

from __future__ import annotations

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import bigquery

from firehose_bq.config import BigQueryConfig
from firehose_bq.gcp_auth import service_account_credentials

SCOPES = ("https://www.googleapis.com/auth/bigquery",)


def call_options(cfg: BigQueryConfig) -> dict[str, object]:
    """`retry` and `timeout` for a BigQuery call that no layer of ours retries (creating and evolving
    tables, reading a schema on the driver): the client retries it until SINK_BIGQUERY_RETRY_DEADLINE_MS.
    Without them it would retry for 600 s."""
    return {"retry": bigquery.DEFAULT_RETRY.with_timeout(cfg.retry_deadline_ms / 1000),
            "timeout": cfg.client_timeout_ms / 1000}


def attempt_options(cfg: BigQueryConfig) -> dict[str, object]:
    """`retry` and `timeout` for a BigQuery call that is one attempt of a write our retry layer repeats
    (policy.py, the load job, the MERGE): the client does not retry it, or the retries would multiply."""
    return {"retry": None, "timeout": cfg.client_timeout_ms / 1000}


def make_client(cfg: BigQueryConfig) -> bigquery.Client:
    options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
    return bigquery.Client(project=cfg.project_id, credentials=credentials(cfg), client_options=options)


def credentials(cfg: BigQueryConfig) -> Credentials | None:
    """The credentials of every BigQuery client; None = Application Default Credentials."""
    if cfg.api_endpoint:
        # An emulator (or a private endpoint) takes no Google credentials.
        return AnonymousCredentials()
    if not cfg.credential_path:
        return None
    return service_account_credentials(cfg.credential_path, SCOPES, "SINK_BIGQUERY_CREDENTIAL_PATH")
