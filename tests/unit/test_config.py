"""Settings: parsing, one clear problem per variable, and the README reference kept in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from firehose_bq import config
from firehose_bq.config import Config
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ConfigError
from firehose_bq.source.kafka_security import DLQ_SECURITY_ENVS

README = Path(__file__).resolve().parents[2] / "README.md"

MINIMAL = {
    "SOURCE_KAFKA_BROKERS": "k:9092",
    "SOURCE_KAFKA_TOPIC": "t",
    "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
    "INPUT_SCHEMA_PROTO_CLASS": "p.M",
    "SCHEMA_REGISTRY_STENCIL_URLS": "file:///d.desc",
    "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "proj",
    "SINK_BIGQUERY_DATASET_NAME": "ds",
    "SINK_BIGQUERY_TABLE_NAME": "tbl",
    "SPARK_CHECKPOINT_LOCATION": "/ck",
}


def test_defaults() -> None:
    cfg = Config.from_env(MINIMAL)
    assert cfg.source.topics == ("t",)
    assert cfg.source.auto_offset_reset == "earliest"
    assert cfg.bigquery.row_insert_id_enable is True
    assert cfg.bigquery.api_endpoint is None
    assert cfg.bigquery.metadata_namespace == ""
    assert cfg.bigquery.table_ref == "proj.ds.tbl"
    assert cfg.spark.master == "local[*]"
    assert cfg.spark.max_offsets_per_trigger == 100_000


def test_values_are_parsed_by_type() -> None:
    cfg = Config.from_env({**MINIMAL, "SOURCE_KAFKA_TOPIC": "a, b,", "SINK_BIGQUERY_ROW_INSERT_ID_ENABLE": "FALSE",
                           "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1", "SINK_BIGQUERY_METADATA_NAMESPACE": "kafka",
                           "SINK_BIGQUERY_API_ENDPOINT": "http://127.0.0.1:1",
                           "SINK_BIGQUERY_STORAGE_API_ENDPOINT": "127.0.0.1:2"})
    assert cfg.source.topics == ("a", "b")
    assert cfg.bigquery.row_insert_id_enable is False
    assert cfg.spark.max_offsets_per_trigger == -1
    assert cfg.bigquery.metadata_namespace == "kafka"
    assert cfg.bigquery.api_endpoint == "http://127.0.0.1:1"


def test_uint64_column_type_reaches_the_table_schema(test_descriptors: Descriptors) -> None:
    from firehose_bq.sink_schema import plan_table

    env = {**MINIMAL, "INPUT_SCHEMA_PROTO_CLASS": "testdata.AllTypes"}
    assert Config.from_env(env).bigquery.uint64_column_type == "INTEGER"
    cfg = Config.from_env({**env, "SINK_BIGQUERY_UINT64_COLUMN_TYPE": "NUMERIC"})
    plan = plan_table(cfg, test_descriptors)
    assert plan.options.uint64_type == "NUMERIC"
    assert {f.name: f.field_type for f in plan.table.schema}["f_fixed64"] == "NUMERIC"
    with pytest.raises(ConfigError, match="SINK_BIGQUERY_UINT64_COLUMN_TYPE"):
        Config.from_env({**MINIMAL, "SINK_BIGQUERY_UINT64_COLUMN_TYPE": "FLOAT"})


def test_native_decoder_required_but_not_built_is_a_start_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Config.from_env(MINIMAL).input_schema.decoder == "auto"
    monkeypatch.setattr(config, "native_unavailable",
                        lambda extension="_native": "the native decoder is not built (no module); build it")
    Config.from_env({**MINIMAL, "INPUT_SCHEMA_PROTO_DECODER": "python"})  # the others do not need it
    Config.from_env(MINIMAL)
    with pytest.raises(ConfigError) as raised:
        Config.from_env({**MINIMAL, "INPUT_SCHEMA_PROTO_DECODER": "native"})
    assert raised.value.problems == ["INPUT_SCHEMA_PROTO_DECODER=native: the native decoder is not built (no module); "
                                     "build it"]


def test_an_empty_dlq_topic_is_a_start_error_not_a_failed_dead_letter_write() -> None:
    # `DLQ_KAFKA_TOPIC=` (a blank line in an env file) used to pass: the first dead letter then failed to
    # send for DLQ_RETRY_DEADLINE_MS and stopped the job.
    env = {**MINIMAL, "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": " "}
    with pytest.raises(ConfigError) as raised:
        Config.from_env(env)
    assert raised.value.problems == ["DLQ_KAFKA_TOPIC: empty; unset it for the default (firehose-retry-topic) or "
                                     "give a value"]


def test_every_problem_is_reported_at_once_one_line_per_variable() -> None:
    env = {**MINIMAL, "SPARK_MAX_OFFSETS_PER_TRIGGER": "lots", "SINK_BIGQUERY_ROW_INSERT_ID_ENABLE": "yes",
           "SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET": "newest", "SINK_BIGQUERY_INSERT_ALL_BATCH_SIZE": "60000"}
    del env["SOURCE_KAFKA_BROKERS"]
    with pytest.raises(ConfigError) as raised:
        Config.from_env(env)
    assert raised.value.problems == [
        "SOURCE_KAFKA_BROKERS: required but not set (Kafka bootstrap servers, `host:port[,host:port]`.)",
        "SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET: expected one of earliest, latest, got 'newest'",
        "SINK_BIGQUERY_ROW_INSERT_ID_ENABLE: expected true or false, got 'yes'",
        "SINK_BIGQUERY_INSERT_ALL_BATCH_SIZE: must be at most 50000, got 60000",
        "SPARK_MAX_OFFSETS_PER_TRIGGER: expected an integer, got 'lots'",
    ]


def test_empty_required_value_is_missing() -> None:
    with pytest.raises(ConfigError, match="SINK_BIGQUERY_TABLE_NAME: required but not set"):
        Config.from_env({**MINIMAL, "SINK_BIGQUERY_TABLE_NAME": "  "})


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("SINK_BIGQUERY_TABLE_NAME", "my table", "SINK_BIGQUERY_TABLE_NAME: 'my table' is not a valid BigQuery table name"),
        ("SINK_BIGQUERY_TABLE_NAME", "-x_${header.t}", "SINK_BIGQUERY_TABLE_NAME: '-x_${header.t}' is not a valid"),
        ("SINK_BIGQUERY_DATASET_NAME", "my-data", "SINK_BIGQUERY_DATASET_NAME: 'my-data' is not a valid BigQuery "
                                                  "dataset name (ASCII letters, digits and _)"),
        ("SINK_BIGQUERY_TABLE_NAME", "t" * 1025, "SINK_BIGQUERY_TABLE_NAME: a name longer than 1024 characters"),
        ("SINK_BIGQUERY_METADATA_NAMESPACE", "a.b", "SINK_BIGQUERY_METADATA_NAMESPACE: 'a.b' is not a valid"),
        ("SPARK_MAX_OFFSETS_PER_TRIGGER", "0", "SPARK_MAX_OFFSETS_PER_TRIGGER: must be positive or -1"),
    ],
)
def test_cross_checks(name: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Config.from_env({**MINIMAL, name: value})


def test_a_table_name_may_hold_dashes_as_bigquery_allows() -> None:
    assert Config.from_env({**MINIMAL, "SINK_BIGQUERY_TABLE_NAME": "orders-v2"}).bigquery.table == "orders-v2"
    Config.from_env({**MINIMAL, "SINK_BIGQUERY_TABLE_NAME": "events-${header.type}"})


def test_dataset_and_table_names_may_start_with_a_digit_as_bigquery_allows() -> None:
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_DATASET_NAME": "2024_raw", "SINK_BIGQUERY_TABLE_NAME": "2024_events"})
    assert (cfg.bigquery.dataset, cfg.bigquery.table) == ("2024_raw", "2024_events")
    Config.from_env({**MINIMAL, "SINK_BIGQUERY_TABLE_NAME": "2024_${header.type}"})


def test_unknown_variables_under_our_prefixes_are_reported() -> None:
    env = {**MINIMAL, "SINK_BIGQUERY_TABEL_NAME": "x", "SPARK_HOME": "/opt/spark", "PATH": "/bin"}
    assert config.unknown_variables(env) == ["SINK_BIGQUERY_TABEL_NAME"]


def test_env_file(tmp_path: Path) -> None:
    path = tmp_path / "a.env"
    path.write_text("# comment\n\nexport A=1\nB='two words'\nC=\"x=y\"\n")
    assert config.read_env_file(path) == {"A": "1", "B": "two words", "C": "x=y"}
    path.write_text("not a setting\n")
    with pytest.raises(ConfigError, match="a.env:1: expected NAME=value"):
        config.read_env_file(path)


def test_stack_config_defaults() -> None:
    cfg = StackConfig.from_env({})
    assert (cfg.kafka_port, cfg.bigquery_port, cfg.bigquery_grpc_port) == (19092, 19050, 19060)


def _readme_block(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert match, f"README.md has no {name} block"
    return match.group(1).strip()


def test_readme_lists_every_job_setting_with_its_default() -> None:
    assert _readme_block("config-reference") == config.reference_markdown(), (
        "README's configuration table is out of date: paste `firehose-bq config reference` into it")


def test_readme_lists_every_stack_setting_with_its_default() -> None:
    assert _readme_block("stack-reference") == config.reference_markdown((StackConfig,)), (
        "README's stack table is out of date: paste `firehose-bq config stack-reference` into it")


# Variables the README names that are Spark's own, read from the process environment, not settings.
SPARK_VARIABLES = {"SPARK_CONF_DIR", "SPARK_SIMPLIFIED_TRACEBACK"}


def test_readme_prose_names_only_settings_that_exist() -> None:
    # The generated tables cannot go stale; the prose around them can (a renamed or removed setting).
    declared = {name for d in config.reference() + config.reference((StackConfig,)) for name in (d.env, *d.formerly)}
    declared |= set(DLQ_SECURITY_ENVS)  # read, not settings: each must say what its SOURCE_KAFKA_* says
    named = set(re.findall(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`", README.read_text()))
    prefixes = (*config.OWNED_PREFIXES, "SPARK_", "LOG_", "FIREHOSE_STACK_")
    assert sorted(n for n in named if n.startswith(prefixes) and n not in declared | SPARK_VARIABLES) == []


def test_readme_names_only_example_files_that_exist() -> None:
    named = set(re.findall(r"`config/([\w.-]+)`|`([\w-]+\.env)`", README.read_text()))
    files = {name for pair in named for name in pair if name}
    assert files and sorted(f for f in files if not (README.parent / "config" / f).is_file()) == []


def test_example_env_file_is_a_valid_config() -> None:
    local = config.read_env_file(README.parent / "config" / "local.env")
    assert Config.from_env(local).source.topics == ("bookings",)
    assert config.unknown_variables(local) == []


@pytest.mark.parametrize("layer", sorted(p.name for p in (README.parent / "config").glob("*.env") if p.name != "local.env"))
def test_example_layers_over_local_env_are_valid_configs(layer: str) -> None:
    env = {**config.read_env_file(README.parent / "config" / "local.env"),
           **config.read_env_file(README.parent / "config" / layer)}
    assert config.unknown_variables(env) == []
    Config.from_env(env)


def test_a_firehose_env_files_client_read_timeout_of_minus_1_is_the_default() -> None:
    """Firehose documents SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS=-1 (its default, set in its env files) as the
    client's default timeout; 0 there is no timeout, which would let a BigQuery that never answers hold a task."""
    minus_one = Config.from_env({**MINIMAL, "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS": "-1"})
    assert minus_one.bigquery.request_timeout_s == Config.from_env(MINIMAL).bigquery.request_timeout_s == 60.0
    assert Config.from_env({**MINIMAL, "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS": "2500"}).bigquery.request_timeout_s == 2.5
    for bad, problem in (("0", "must be positive or -1 (the default, 60000 ms), got 0"), ("-2", "must be at least -1")):
        with pytest.raises(ConfigError, match=re.escape(f"SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS: {problem}")):
            Config.from_env({**MINIMAL, "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS": bad})
