"""Registry settings: defaults, parsing through settings.load_section, and secrets that never show."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from firehose_bq import settings
from firehose_bq.errors import ConfigError
from firehose_bq.registry.config import RegistryConfig, Secret, parse_headers

HEADERS = "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS"
AUTH = "SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO"


def load(env: dict[str, str]) -> RegistryConfig:
    problems: list[str] = []
    loaded = settings.load_section(RegistryConfig, env, problems)
    if problems:  # collected like every other setting's, so all are reported together
        raise ConfigError(problems)
    return loaded  # type: ignore[no-any-return]


def test_defaults() -> None:
    cfg = load({})
    assert cfg == RegistryConfig()
    assert (cfg.fetch_timeout_ms, cfg.fetch_retries, cfg.fetch_backoff_min_ms) == (10_000, 4, 60_000)
    assert (cfg.cache_ttl_ms, cfg.cache_auto_refresh, cfg.refresh_strategy) == (900_000, True, "LONG_POLLING")
    assert cfg.fetch_headers is None and cfg.stencil_headers() == {}
    assert cfg.confluent_url is None and cfg.confluent_basic_auth is None
    assert cfg.unknown_fields_refresh_min_interval_ms == 30_000


def test_values_are_parsed_by_type() -> None:
    cfg = load({
        "SCHEMA_REGISTRY_STENCIL_FETCH_TIMEOUT_MS": "500", "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES": "0",
        "SCHEMA_REGISTRY_STENCIL_CACHE_AUTO_REFRESH": "false",
        "SCHEMA_REGISTRY_STENCIL_REFRESH_STRATEGY": "VERSION_BASED_REFRESH",
        HEADERS: "Authorization: Bearer a:b, X-Team:  data ,", "SCHEMA_REGISTRY_CONFLUENT_URL": "http://sr:8081",
        AUTH: "user:pa:ss",
    })
    assert (cfg.fetch_timeout_ms, cfg.fetch_retries, cfg.cache_auto_refresh) == (500, 0, False)
    assert cfg.refresh_strategy == "VERSION_BASED_REFRESH"
    assert cfg.stencil_headers() == {"Authorization": "Bearer a:b", "X-Team": "data"}
    assert cfg.confluent_url == "http://sr:8081"
    assert cfg.confluent_basic_auth == Secret("user:pa:ss")


def test_bad_values_are_reported_one_line_per_variable() -> None:
    problems: list[str] = []
    env = {"SCHEMA_REGISTRY_STENCIL_REFRESH_STRATEGY": "SOMETIMES", "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES": "-1"}
    assert settings.load_section(RegistryConfig, env, problems) is None
    assert problems == [
        "SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES: must be at least 0, got -1",
        "SCHEMA_REGISTRY_STENCIL_REFRESH_STRATEGY: expected one of LONG_POLLING, VERSION_BASED_REFRESH, "
        "got 'SOMETIMES'",
    ]


def test_secrets_never_show_in_repr_str_copies_or_dicts() -> None:
    cfg = load({HEADERS: "Authorization: Bearer s3cr3t", AUTH: "user:pa55"})
    shown = [repr(cfg), str(cfg), f"{cfg.fetch_headers} {cfg.confluent_basic_auth!r}",
             str(dataclasses.asdict(cfg)), repr(copy.deepcopy(cfg))]
    assert not [text for text in shown if "s3cr3t" in text or "pa55" in text]
    assert "Secret('***')" in repr(cfg)
    restored = pickle.loads(pickle.dumps(cfg))  # settings travel to Spark workers
    assert restored == cfg and restored.confluent_basic_auth.reveal() == "user:pa55"


@pytest.mark.parametrize("raw", [
    "Bearer s3cr3t",  # the value without a name
    "Authorization Bearer s3cr3t",
    "Bad Name: s3cr3t",
    "X-Token: s3cr3t\r\nX-Injected: 1",
    "X-Token: s3cr3t, X-Empty:",
])
def test_malformed_headers_are_config_errors_that_do_not_echo_them(raw: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load({HEADERS: raw})
    assert str(raised.value).startswith(f"{HEADERS}: item ")
    assert "s3cr3t" not in str(raised.value)


def test_basic_auth_needs_user_and_password() -> None:
    with pytest.raises(ConfigError, match=f"{AUTH}: expected `user:password`"):
        load({AUTH: "justatoken"})


def test_header_items_are_numbered_from_one_ignoring_empty_ones() -> None:
    assert parse_headers(" , A: 1,,B: 2 ") == {"A": "1", "B": "2"}
    with pytest.raises(ValueError, match="item 2 "):
        parse_headers("A: 1, , broken")


def test_reference_documents_every_setting_without_redeclaring_the_urls() -> None:
    docs = settings.reference((RegistryConfig,))
    assert [(d.env, d.default) for d in docs] == [
        ("SCHEMA_REGISTRY_STENCIL_FETCH_TIMEOUT_MS", "10000"),
        ("SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES", "4"),
        ("SCHEMA_REGISTRY_STENCIL_FETCH_BACKOFF_MIN_MS", "60000"),
        ("SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS", ""),
        ("SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS", "900000"),
        ("SCHEMA_REGISTRY_STENCIL_CACHE_AUTO_REFRESH", "true"),
        ("SCHEMA_REGISTRY_STENCIL_REFRESH_STRATEGY", "LONG_POLLING"),
        ("SCHEMA_REGISTRY_CONFLUENT_URL", ""),
        ("SCHEMA_REGISTRY_CONFLUENT_SUBJECT", ""),
        ("SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO", ""),
        ("SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS", "30000"),
    ]
    assert not any(d.required for d in docs)
