"""HTTP GET for the registries: secret headers that do not follow redirects, and which failures are worth
retrying (the retrying itself is the descriptor cache's)."""

from __future__ import annotations

import base64
import http.client
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping

from firehose_bq import redact
from firehose_bq.errors import RegistryUnavailableError, SchemaError

# (url, headers, timeout in seconds) → body; tests swap in a fake.
Get = Callable[[str, Mapping[str, str], float], bytes]


def get(url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
    """The body; OSError when the request failed (`is_transient` tells whether to retry), SchemaError when
    `url` cannot be requested at all."""
    try:
        return _get(url, headers, timeout_s)
    except (ValueError, http.client.InvalidURL) as exc:
        # urllib and http.client refuse a malformed URL (a space, a newline, no scheme) with a message
        # that quotes it, query included: a token must not reach the logs through it.
        blank = any(c.isspace() or not c.isprintable() for c in url)
        why = "it contains a space or a control character" if blank else type(exc).__name__
        raise SchemaError(f"{redact.url(url)} is not a URL that can be requested ({why}; the refusal, which "
                          "quotes the URL, is not shown: it may hold a secret)") from None
    except http.client.HTTPException as exc:
        # No OSError, yet a registry (or a proxy) that cut its answer short or spoke garbage HTTP may answer
        # whole next time: as transient as a reset connection.
        raise ConnectionError(f"the answer was cut short or is not HTTP: {exc!r}") from exc


def _get(url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
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


def failure(what: str, exc: OSError) -> SchemaError:
    """A failed GET as the error to raise: RegistryUnavailableError when the registry may answer next time."""
    kind = RegistryUnavailableError if is_transient(exc) else SchemaError
    return kind(f"{what}: {exc}")
