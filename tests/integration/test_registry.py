"""Registries over real HTTP: a local server plays Stencil and Confluent. Needs no stack: fast."""

from __future__ import annotations

import json

from http.server import ThreadingHTTPServer

import pytest

from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.registry.confluent import ConfluentRegistry, encode_frame
from tests.integration.conftest import FakeRegistry
from tests.unit.registry.fixtures import MONEY_PROTO, ORDER_PROTO, eventually, regtest_set, with_new_field


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return regtest_set(tmp_path_factory.mktemp("registry"))


def fast(**settings: object) -> RegistryConfig:
    """Production semantics at test speed: intervals of milliseconds instead of minutes."""
    return RegistryConfig(**{"cache_ttl_ms": 50, "fetch_retries": 1, "fetch_backoff_min_ms": 1, **settings})  # type: ignore[arg-type]


def test_version_based_cache_follows_new_versions_ignores_republish_and_survives_downtime(
        registry: tuple[FakeRegistry, ThreadingHTTPServer], v1: bytes) -> None:
    fake, server = registry
    v2 = with_new_field(v1)
    fake.publish_versions("/orders", {1: v1})
    config = fast(refresh_strategy="VERSION_BASED_REFRESH", fetch_headers=Secret("Authorization: Bearer t0ken"))
    with DescriptorCache.for_stencil([f"{fake.url}/orders"], config) as cache:
        heard: list[Descriptors] = []
        cache.add_listener(heard.append)
        assert "added" not in cache.get().find_message("regtest.Header").fields_by_name

        fake.publish_versions("/orders", {1: v1, 2: v2})
        eventually(lambda: len(heard) == 1)
        assert "added" in cache.get().find_message("regtest.Header").fields_by_name

        fake.publish_versions("/orders", {1: v1, 2: v2, 3: v2})  # the same content again, as a new version
        eventually(lambda: "/orders/versions/3" in fake.paths())
        fetches = cache.stats().fetches
        eventually(lambda: cache.stats().fetches >= fetches + 3)
        assert len(heard) == 1 and cache.stats().changes == 1
        assert fake.paths().count("/orders/versions/2") == 1  # each version is downloaded once
        assert {headers["Authorization"] for _, headers in fake.requests} == {"Bearer t0ken"}

        server.shutdown()
        server.server_close()
        eventually(lambda: cache.stats().failures >= 2)
        assert cache.get() == heard[0]
        assert cache.stats().changes == 1


def test_long_polling_downloads_each_interval_and_tells_no_one_about_equal_content(
        registry: tuple[FakeRegistry, ThreadingHTTPServer], v1: bytes) -> None:
    fake, _ = registry
    fake.routes["/orders.desc"] = v1
    with DescriptorCache.for_stencil([f"{fake.url}/orders.desc"], fast()) as cache:
        heard: list[Descriptors] = []
        cache.add_listener(heard.append)
        eventually(lambda: fake.paths().count("/orders.desc") >= 3)
        assert heard == [] and cache.stats().changes == 0


def test_a_first_load_from_a_missing_url_fails_clearly(registry: tuple[FakeRegistry, ThreadingHTTPServer]) -> None:
    fake, _ = registry
    with pytest.raises(SchemaError, match=f"cannot load descriptors from {fake.url}/nothing.*HTTP Error 404"):
        DescriptorCache.for_stencil([f"{fake.url}/nothing"], fast()).start()


def test_a_confluent_framed_message_decodes_with_the_resolved_class(
        registry: tuple[FakeRegistry, ThreadingHTTPServer], v1: bytes) -> None:
    fake, _ = registry
    fake.routes["/schemas/ids/42"] = json.dumps({
        "schemaType": "PROTOBUF", "schema": ORDER_PROTO,
        "references": [{"name": "regtest/money.proto", "subject": "money-value", "version": 1}],
    }).encode()
    fake.routes["/subjects/money-value/versions/1"] = json.dumps(
        {"subject": "money-value", "version": 1, "id": 41, "schemaType": "PROTOBUF", "schema": MONEY_PROTO}
    ).encode()
    confluent = ConfluentRegistry.from_config(fast(confluent_url=fake.url, confluent_basic_auth=Secret("sink:pa55")))
    assert confluent is not None

    line = Descriptors((v1,)).message_class("regtest.Order.Line")(sku="A-1", notes=[{"text": "fragile"}])
    line.price.currency, line.price.units = "EUR", 12
    decoded = confluent.decode(encode_frame(42, [1, 0], line.SerializeToString()))
    assert decoded.DESCRIPTOR.full_name == "regtest.Order.Line"
    assert decoded.SerializeToString(deterministic=True) == line.SerializeToString(deterministic=True)
    assert (decoded.sku, decoded.price.units, decoded.notes[0].text) == ("A-1", 12, "fragile")
    assert fake.paths() == ["/schemas/ids/42", "/subjects/money-value/versions/1"]
    assert {headers["Authorization"] for _, headers in fake.requests} == {"Basic c2luazpwYTU1"}
