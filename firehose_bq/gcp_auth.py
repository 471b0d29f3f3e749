"""Service-account key files, for every Google client of the job (BigQuery, Cloud Storage)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from google.auth.credentials import Credentials

from firehose_bq.errors import ConfigError


def key_content_problem(setting: str, path: str | None) -> str | None:
    """The problem of a key pasted where its path belongs (CI secrets often hold the key itself): said
    without the value, which holds a private key."""
    if path and path.lstrip().startswith("{"):
        return (f"{setting}: holds a JSON key's content, not the path of a key file (not shown: it holds a private "
                "key); write the key to a file and set its path")
    return None


def service_account_credentials(path: str, scopes: Sequence[str], setting: str) -> Credentials:
    """The key in `path`; a ConfigError naming `setting` when it is missing or is no service-account key."""
    from google.oauth2 import service_account

    if problem := key_content_problem(setting, path):
        raise ConfigError([problem])
    key = Path(path)
    if not key.is_file():
        raise ConfigError([f"{setting}: no such file {key}"])
    try:
        return service_account.Credentials.from_service_account_file(str(key), scopes=list(scopes))
    except (ValueError, KeyError) as exc:  # not JSON, or not a service-account key
        # The type only: the message of a half-parsed key file may quote it.
        raise ConfigError([f"{setting}: {key} is not a service-account key file: {type(exc).__name__}"]) from None
