"""One place that knows how to reach BigQuery: the emulator, a key file, or Application Default Credentials."""

from __future__ import annotations

from pathlib import Path

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import bigquery

from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ConfigError

SCOPES = ("https://www.googleapis.com/auth/bigquery",)


def make_client(cfg: BigQueryConfig) -> bigquery.Client:
    credentials: Credentials | None = None
    options = None
    if cfg.api_endpoint:
        # An emulator (or a private endpoint) takes no Google credentials.
        credentials = AnonymousCredentials()
        options = ClientOptions(api_endpoint=cfg.api_endpoint)
    elif cfg.credential_path:
        from google.oauth2 import service_account

        path = Path(cfg.credential_path)
        if not path.is_file():
            raise ConfigError([f"SINK_BIGQUERY_CREDENTIAL_PATH: no such file {path}"])
        credentials = service_account.Credentials.from_service_account_file(str(path), scopes=SCOPES)
    return bigquery.Client(project=cfg.project_id, credentials=credentials, client_options=options)
