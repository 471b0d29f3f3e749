"""Schema registry settings; header and password values are `Secret`s (firehose_bq.settings), kept out of logs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from firehose_bq.errors import ConfigError
from firehose_bq.retrying import Backoff
from firehose_bq.settings import Secret, setting

LONG_POLLING = "LONG_POLLING"
VERSION_BASED_REFRESH = "VERSION_BASED_REFRESH"

# A fetch someone waits for (the start, a batch held for its unknown fields) retries once after a second,
# not for the minutes a background refresh may take.
QUICK_RETRIES = 1
QUICK_BACKOFF_MS = 1000

# RFC 9110 token characters: anything else in a header name is a typo or a value pasted in its place.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class RegistryConfig:
    fetch_timeout_ms: int = setting(
        "SCHEMA_REGISTRY_STENCIL_FETCH_TIMEOUT_MS",
        "Timeout of one HTTP request to a schema registry (Stencil URLs and the Confluent registry).",
        10_000,
        minimum=1,
    )
    fetch_retries: int = setting(
        "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES",
        "Retries of a background descriptor refresh (Stencil URLs or the Confluent registry) after a "
        "connection error, timeout, HTTP 429 or 5xx; other HTTP errors fail at once. The job keeps running on "
        "the last good descriptors meanwhile. The first load and a refresh a batch waits for retry at most "
        "once, after at most 1 s: a dead registry stops the start within 2 fetch timeouts and 1 s.",
        4,
        minimum=0,
        maximum=10,
    )
    fetch_backoff_min_ms: int = setting(
        "SCHEMA_REGISTRY_STENCIL_FETCH_BACKOFF_MIN_MS",
        "Wait before the first retry of a background descriptor refresh; it doubles with each further retry "
        "(so the defaults wait 1, 2, 4 and 8 minutes before the refresh fails).",
        60_000,
        minimum=0,
    )
    fetch_headers: Secret | None = setting(
        "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS",
        "Extra HTTP headers for Stencil URLs: `Name: value` pairs, comma-separated (so values cannot "
        "contain commas), e.g. `Authorization: Bearer x`. Secret: never logged, not sent on redirects.",
        None,
    )
    cache_ttl_ms: int = setting(
        "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS",
        "Interval of the background re-fetch of the Stencil descriptors while the job runs.",
        900_000,
        minimum=1000,
    )
    cache_auto_refresh: bool = setting(
        "SCHEMA_REGISTRY_STENCIL_CACHE_AUTO_REFRESH",
        "Re-fetch the descriptors every CACHE_TTL_MS; false = load them once at start (on-demand "
        "refreshes still happen).",
        True,
    )
    refresh_strategy: str = setting(
        "SCHEMA_REGISTRY_STENCIL_REFRESH_STRATEGY",
        "How a refresh reads an `http(s)` URL: LONG_POLLING downloads the set every time; "
        "VERSION_BASED_REFRESH reads Stencil's `<url>/versions` (`{\"versions\": [1, 2]}`) and downloads "
        "`<url>/versions/<newest>` only when the newest version changed. Files are re-read either way.",
        LONG_POLLING,
        choices=(LONG_POLLING, VERSION_BASED_REFRESH),
    )
    confluent_url: str | None = setting(
        "SCHEMA_REGISTRY_CONFLUENT_URL",
        "Confluent Schema Registry base URL, for messages in Confluent's wire format (magic byte 0, "
        "schema id, message indexes); unset = off.",
        None,
    )
    confluent_subject: str | None = setting(
        "SCHEMA_REGISTRY_CONFLUENT_SUBJECT",
        "Subject whose latest schema defines the table and decodes the topic; unset = `<first topic>-value` "
        "(Confluent's TopicNameStrategy).",
        None,
    )
    confluent_basic_auth: Secret | None = setting(
        "SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO",
        "`user:password` for HTTP basic auth to the Confluent registry; unset = no auth. Secret: never logged.",
        None,
    )
    unknown_fields_refresh_min_interval_ms: int = setting(
        "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS",
        "Least time between two on-demand refreshes (asked for by messages with fields the descriptors "
        "lack), so a burst of such messages costs one fetch, not one per message.",
        30_000,
        minimum=0,
    )

    def __post_init__(self) -> None:
        try:
            self.stencil_headers()
        except ValueError as exc:
            raise ConfigError([f"SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS: {exc}"]) from None
        if self.confluent_basic_auth is not None and ":" not in self.confluent_basic_auth.reveal():
            raise ConfigError(["SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO: expected `user:password`"])

    def backoff(self) -> Backoff:
        """How a background refresh retries a registry that does not answer."""
        return Backoff(self.fetch_retries + 1, self.fetch_backoff_min_ms / 1000)

    def quick_backoff(self) -> Backoff:
        """How a fetch someone waits for retries: once, soon."""
        return Backoff(min(self.fetch_retries, QUICK_RETRIES) + 1, min(self.fetch_backoff_min_ms, QUICK_BACKOFF_MS) / 1000)

    def stencil_headers(self) -> dict[str, str]:
        return parse_headers(self.fetch_headers.reveal()) if self.fetch_headers else {}


def parse_headers(raw: str) -> dict[str, str]:
    """`Name: value, Name: value` → dict; errors name the bad item by position, never by content (secret)."""
    headers = {}
    for number, item in enumerate((i for i in raw.split(",") if i.strip()), start=1):
        name, sep, value = (part.strip() for part in item.partition(":"))
        # Control characters would let a value inject headers, and http.client echoes bad values in errors.
        printable = value.isascii() and value.isprintable()
        if not sep or not HEADER_NAME.fullmatch(name) or not value or not printable:
            raise ValueError(f"item {number} is not `Name: value` (not shown: it may be secret)")
        headers[name] = value
    return headers
