"""One place that knows how to reach BigQuery: the emulator, a key file, or Application Default Credentials."""

from __future__ import annotations

from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import GoogleAPIError
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import bigquery
from requests import exceptions as http_exceptions

from firehose_bq.config import BigQueryConfig
from firehose_bq.gcp_auth import service_account_credentials

SCOPES = ("https://www.googleapis.com/auth/bigquery",)
# What a BigQuery call raises when it fails as a whole and the client did not retry it: an API error, the
# HTTP library's own (refused, reset, timed out), or a token refresh that could not reach Google.
REQUEST_ERRORS = (GoogleAPIError, http_exceptions.RequestException, ConnectionError, TimeoutError,
                  auth_exceptions.TransportError)


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
