"""HTTP GET for the registries: secret headers that do not follow redirects, and retries with backoff."""

from __future__ import annotations

import base64
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import TypeVar

from firehose_bq.errors import SchemaError

log = logging.getLogger(__name__)

T = TypeVar("T")
# (url, headers, timeout in seconds) → body; tests swap in a fake.
Get = Callable[[str, Mapping[str, str], float], bytes]


def get(url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
    target, user_info = _split_user_info(url)
    request = urllib.request.Request(target)
    if user_info is not None and not any(name.lower() == "authorization" for name in headers):
        # `https://user:pass@host/...` means basic auth (as curl reads it); urllib would take it for a host name.
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(user_info.encode()).decode())
    for name, value in headers.items():
        # urllib copies ordinary headers onto a redirect, even to another host; these may be credentials.
        request.add_unredirected_header(name, value)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
        return response.read()  # type: ignore[no-any-return]


def _split_user_info(url: str) -> tuple[str, str | None]:
    """`url` without its `user:password@`, and that user info (percent-decoded), or None when it has none."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    user_info = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), user_info


def is_transient(exc: OSError) -> bool:
    """Worth retrying: the registry may answer next time (5xx, 429, refused, reset, timed out)."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return True


def with_retries(call: Callable[[], T], *, retries: int, backoff_s: float, stop: threading.Event,
                 what: str) -> T:
    """Run `call`, retrying transient OSErrors after backoff_s, 2×backoff_s, ...; `stop` cuts a wait short."""
    attempt = 0
    while True:
        try:
            return call()
        except OSError as exc:
            if attempt == retries or not is_transient(exc):
                raise
            delay = backoff_s * 2**attempt
            attempt += 1
            log.info("%s failed (%s); retry %d of %d in %.3gs", what, exc, attempt, retries, delay)
            if stop.wait(delay):
                raise SchemaError(f"{what}: stopped while waiting to retry after: {exc}") from exc
