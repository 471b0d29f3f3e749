"""Stencil-style descriptor sources: FileDescriptorSets from http(s) URLs, files and paths.

LONG_POLLING downloads every set on each fetch. VERSION_BASED_REFRESH follows Stencil's client: GET
`<url>/versions` answers `{"versions": [1, 2, 3]}`, and `<url>/versions/<newest>` is downloaded only
when the newest version differs from the one already held.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence

from google.protobuf import descriptor_pb2

from firehose_bq import descriptors, redact
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.registry import transport
from firehose_bq.registry.config import VERSION_BASED_REFRESH, RegistryConfig


class StencilFetcher:
    """Fetches the sets behind SCHEMA_REGISTRY_STENCIL_URLS, one request per URL (the descriptor cache
    retries a fetch). Remembers versions: one caller at a time."""

    def __init__(self, urls: Sequence[str], config: RegistryConfig, get: transport.Get = transport.get,
                 messages: Sequence[str] = ()) -> None:
        """`messages`: the classes the job decodes, which every fetched set must hold (see `fetch`)."""
        if not urls:
            raise SchemaError("no descriptor source configured (SCHEMA_REGISTRY_STENCIL_URLS is empty)")
        self.urls = tuple(urls)
        self._config = config
        self._headers = config.stencil_headers()
        self._get = get
        self._messages = tuple(messages)
        self._versions: dict[str, tuple[int, bytes]] = {}  # url → (newest version, its set)

    def fetch(self) -> Descriptors:
        """All sets, merged; SchemaError naming the URL when one cannot be fetched (RegistryUnavailableError
        when worth retrying) or does not fit."""
        result = Descriptors(tuple(self._fetch_one(url) for url in self.urls), self.urls)
        result.pool()  # a set with a missing import fails here, not in a Spark worker later
        # A set that parses but lacks the job's classes (an empty body, a namespace published half-way, a
        # package renamed) is a bad fetch like a corrupt one: the first load fails naming the URL, and a
        # refresh keeps the last good descriptors instead of handing the running job a set it must stop on.
        for name in self._messages:
            result.find_message(name)
        return result

    def _fetch_one(self, url: str) -> bytes:
        if urllib.parse.urlparse(url).scheme not in ("http", "https"):
            return descriptors._fetch(url)  # local: cheap enough to re-read on every refresh
        if self._config.refresh_strategy == VERSION_BASED_REFRESH:
            return self._fetch_versioned(url.rstrip("/"))
        return _checked(url, self._download(url))

    def _fetch_versioned(self, url: str) -> bytes:
        listing = self._download(f"{url}/versions")
        try:
            versions = json.loads(listing)["versions"]
            newest = max(int(v) for v in versions)
        except (ValueError, TypeError, KeyError) as exc:
            raise SchemaError(f"{redact.url(url + '/versions')} is not Stencil's {{\"versions\": [...]}}: {exc!r}") from None
        held = self._versions.get(url)
        if held and held[0] == newest:
            return held[1]
        blob = _checked(url, self._download(f"{url}/versions/{newest}"))
        self._versions[url] = (newest, blob)
        return blob

    def _download(self, url: str) -> bytes:
        try:
            return self._get(url, self._headers, self._config.fetch_timeout_ms / 1000)
        except OSError as exc:
            raise transport.failure(f"cannot fetch descriptors from {redact.url(url)}", exc) from exc


def _checked(url: str, data: bytes) -> bytes:
    try:
        descriptor_pb2.FileDescriptorSet.FromString(data)
    except Exception as exc:  # the error type differs between protobuf backends
        raise SchemaError(f"{redact.url(url)} is not a serialized FileDescriptorSet: {exc}") from exc
    return data
