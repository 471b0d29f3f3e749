"""Stencil fetching: which failures are worth a retry, headers, LONG_POLLING and VERSION_BASED_REFRESH."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest

from google.protobuf import descriptor_pb2

from firehose_bq.errors import RegistryUnavailableError, SchemaError
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.registry.stencil import StencilFetcher
from tests.unit.registry.fixtures import FakeGet, regtest_set, with_new_field

URL = "http://stencil.test/v1/namespaces/ns/schemas/orders"


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(URL, code, "status", None, None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return regtest_set(tmp_path_factory.mktemp("stencil"))


def fetcher(get: FakeGet, **settings: object) -> StencilFetcher:
    return StencilFetcher([URL], RegistryConfig(**{"fetch_backoff_min_ms": 1, **settings}), get=get)  # type: ignore[arg-type]


def test_a_registry_that_does_not_answer_is_worth_a_retry_and_one_that_refuses_is_not() -> None:
    # One request per URL: retrying is the descriptor cache's (tests/unit/registry/test_cache.py).
    for transient in (urllib.error.URLError("refused"), http_error(503), http_error(429), TimeoutError("slow")):
        get = FakeGet({URL: [transient]})
        with pytest.raises(RegistryUnavailableError, match=f"cannot fetch descriptors from {URL}"):
            fetcher(get).fetch()
        assert len(get.requests) == 1
    with pytest.raises(SchemaError) as refused:
        fetcher(FakeGet({URL: [http_error(404)]})).fetch()
    assert not isinstance(refused.value, RegistryUnavailableError)


def test_long_polling_downloads_every_time_with_headers_and_timeout(v1: bytes) -> None:
    get = FakeGet({URL: v1})
    stencil = fetcher(get, fetch_headers=Secret("Authorization: Bearer t0ken"), fetch_timeout_ms=2500)
    first, second = stencil.fetch(), stencil.fetch()
    assert first == second and first.sources == (URL,)
    assert "regtest.Order" in first.message_names()
    assert get.requests == [(URL, {"Authorization": "Bearer t0ken"}, 2.5)] * 2


def test_version_based_refresh_downloads_only_a_new_version(v1: bytes) -> None:
    v2 = with_new_field(v1)
    get = FakeGet({f"{URL}/versions": [b'{"versions": [1, 2]}', b'{"versions": [2, 1]}', b'{"versions": [1, 2, 3]}'],
                   f"{URL}/versions/2": v1, f"{URL}/versions/3": v2})
    stencil = fetcher(get, refresh_strategy="VERSION_BASED_REFRESH")
    fetched = [stencil.fetch().fingerprint for _ in range(3)]
    assert get.urls() == [f"{URL}/versions", f"{URL}/versions/2", f"{URL}/versions", f"{URL}/versions",
                          f"{URL}/versions/3"]
    assert fetched[0] == fetched[1] != fetched[2]


@pytest.mark.parametrize("listing", [b"<html>", b'{"versions": []}', b'{"items": [1]}'])
def test_a_bad_version_listing_is_a_schema_error_naming_the_url(listing: bytes) -> None:
    stencil = fetcher(FakeGet({f"{URL}/versions": listing}), refresh_strategy="VERSION_BASED_REFRESH")
    with pytest.raises(SchemaError, match=f"{URL}/versions is not Stencil's"):
        stencil.fetch()


def test_failures_name_the_url_but_never_the_headers() -> None:
    stencil = fetcher(FakeGet({URL: [http_error(401)]}), fetch_headers=Secret("Authorization: Bearer s3cr3t"))
    with pytest.raises(SchemaError) as raised:
        stencil.fetch()
    assert f"cannot fetch descriptors from {URL}: HTTP Error 401" in str(raised.value)
    assert "s3cr3t" not in str(raised.value)


def test_a_body_that_is_not_a_descriptor_set_is_rejected() -> None:
    with pytest.raises(SchemaError, match=f"{URL} is not a serialized FileDescriptorSet"):
        fetcher(FakeGet({URL: b"\xff\xff\xff"})).fetch()


def test_files_and_plain_paths_are_read_with_the_descriptors_module(v1: bytes, tmp_path: Path) -> None:
    (tmp_path / "a.desc").write_bytes(v1)
    stencil = StencilFetcher([str(tmp_path / "a.desc"), (tmp_path / "a.desc").as_uri()], RegistryConfig())
    assert len(stencil.fetch().sets) == 2


def test_no_urls_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="SCHEMA_REGISTRY_STENCIL_URLS is empty"):
        StencilFetcher([], RegistryConfig())


def test_a_set_that_parses_but_lacks_the_jobs_class_is_a_failed_fetch_naming_the_url(v1: bytes) -> None:
    # An empty body is a valid, empty FileDescriptorSet; a set published without the class's file lacks it
    # too. Either is a bad fetch like a corrupt body: the descriptor cache keeps the last good set
    # (tests/unit/registry/test_cache.py).
    full = descriptor_pb2.FileDescriptorSet.FromString(v1)
    partial = descriptor_pb2.FileDescriptorSet(file=[f for f in full.file if f.name != "regtest/order.proto"])
    get = FakeGet({URL: [b"", partial.SerializeToString(), v1]})
    stencil = StencilFetcher([URL], RegistryConfig(), get=get, messages=["regtest.Order"])
    with pytest.raises(SchemaError, match=rf"'regtest.Order' is not in the descriptors from {URL}; known messages: "
                                          r"none \(the set holds no message\)"):
        stencil.fetch()
    with pytest.raises(SchemaError, match=rf"'regtest.Order' is not in the descriptors from {URL}; known messages: "
                                          r"regtest.Money"):
        stencil.fetch()
    assert "regtest.Order" in stencil.fetch().message_names()
