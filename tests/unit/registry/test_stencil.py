"""Stencil fetching: retries with exponential backoff, headers, LONG_POLLING and VERSION_BASED_REFRESH."""

from __future__ import annotations

import threading
import urllib.error
from pathlib import Path

import pytest

from firehose_bq.errors import SchemaError
from firehose_bq.registry.config import RegistryConfig
from firehose_bq.registry.stencil import StencilFetcher
from firehose_bq.registry.transport import with_retries
from tests.unit.registry.fixtures import FakeGet, regtest_set, with_new_field

URL = "http://stencil.test/v1/namespaces/ns/schemas/orders"


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(URL, code, "status", None, None)  # type: ignore[arg-type]


class RecordingStop(threading.Event):
    """Records the backoff waits instead of sleeping through them."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return False


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return regtest_set(tmp_path_factory.mktemp("stencil"))


def fetcher(get: FakeGet, **settings: object) -> StencilFetcher:
    return StencilFetcher([URL], RegistryConfig(**{"fetch_backoff_min_ms": 1, **settings}), get=get)  # type: ignore[arg-type]


def test_transient_failures_are_retried_with_doubling_backoff() -> None:
    answers = [urllib.error.URLError("refused"), http_error(503), http_error(429), b"ok"]
    stop = RecordingStop()
    assert with_retries(lambda: FakeGet({URL: answers})(URL, {}, 1), retries=3, backoff_s=0.5, stop=stop,
                        what="GET") == b"ok"
    assert stop.waits == [0.5, 1.0, 2.0]


def test_the_last_error_is_raised_once_retries_are_spent() -> None:
    get = FakeGet({URL: [TimeoutError("timed out")]})
    with pytest.raises(TimeoutError):
        with_retries(lambda: get(URL, {}, 1), retries=2, backoff_s=0.001, stop=threading.Event(), what="GET")
    assert len(get.requests) == 3


def test_client_errors_are_not_retried() -> None:
    get = FakeGet({URL: [http_error(404)]})
    with pytest.raises(urllib.error.HTTPError):
        with_retries(lambda: get(URL, {}, 1), retries=4, backoff_s=0.001, stop=threading.Event(), what="GET")
    assert len(get.requests) == 1


def test_stopping_cuts_the_backoff_short() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(SchemaError, match="stopped while waiting to retry"):
        with_retries(lambda: FakeGet({URL: [http_error(500)]})(URL, {}, 1), retries=4, backoff_s=60, stop=stop,
                     what="GET")


def test_long_polling_downloads_every_time_with_headers_and_timeout(v1: bytes) -> None:
    get = FakeGet({URL: [http_error(502), v1]})
    stencil = fetcher(get, fetch_headers="Authorization: Bearer t0ken", fetch_timeout_ms=2500)
    first, second = stencil.fetch(threading.Event()), stencil.fetch(threading.Event())
    assert first == second and first.sources == (URL,)
    assert "regtest.Order" in first.message_names()
    assert get.requests == [(URL, {"Authorization": "Bearer t0ken"}, 2.5)] * 3  # one retry, then two fetches


def test_version_based_refresh_downloads_only_a_new_version(v1: bytes) -> None:
    v2 = with_new_field(v1)
    get = FakeGet({f"{URL}/versions": [b'{"versions": [1, 2]}', b'{"versions": [2, 1]}', b'{"versions": [1, 2, 3]}'],
                   f"{URL}/versions/2": v1, f"{URL}/versions/3": v2})
    stencil = fetcher(get, refresh_strategy="VERSION_BASED_REFRESH")
    fetched = [stencil.fetch(threading.Event()).fingerprint for _ in range(3)]
    assert get.urls() == [f"{URL}/versions", f"{URL}/versions/2", f"{URL}/versions", f"{URL}/versions",
                          f"{URL}/versions/3"]
    assert fetched[0] == fetched[1] != fetched[2]


@pytest.mark.parametrize("listing", [b"<html>", b'{"versions": []}', b'{"items": [1]}'])
def test_a_bad_version_listing_is_a_schema_error_naming_the_url(listing: bytes) -> None:
    stencil = fetcher(FakeGet({f"{URL}/versions": listing}), refresh_strategy="VERSION_BASED_REFRESH")
    with pytest.raises(SchemaError, match=f"{URL}/versions is not Stencil's"):
        stencil.fetch(threading.Event())


def test_failures_name_the_url_but_never_the_headers() -> None:
    stencil = fetcher(FakeGet({URL: [http_error(401)]}), fetch_headers="Authorization: Bearer s3cr3t")
    with pytest.raises(SchemaError) as raised:
        stencil.fetch(threading.Event())
    assert f"cannot fetch descriptors from {URL}: HTTP Error 401" in str(raised.value)
    assert "s3cr3t" not in str(raised.value)


def test_a_body_that_is_not_a_descriptor_set_is_rejected() -> None:
    with pytest.raises(SchemaError, match=f"{URL} is not a serialized FileDescriptorSet"):
        fetcher(FakeGet({URL: b"\xff\xff\xff"})).fetch(threading.Event())


def test_files_and_plain_paths_are_read_with_the_descriptors_module(v1: bytes, tmp_path: Path) -> None:
    (tmp_path / "a.desc").write_bytes(v1)
    stencil = StencilFetcher([str(tmp_path / "a.desc"), (tmp_path / "a.desc").as_uri()], RegistryConfig())
    assert len(stencil.fetch(threading.Event()).sets) == 2


def test_no_urls_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="SCHEMA_REGISTRY_STENCIL_URLS is empty"):
        StencilFetcher([], RegistryConfig())
