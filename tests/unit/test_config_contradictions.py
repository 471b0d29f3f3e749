"""Settings an operator can get wrong without a parse error: an empty value where only a real one works,
a setting that the rest of the configuration makes the job ignore. Each must stop the start naming the
variable, not take effect minutes later in a task or never."""

from __future__ import annotations

import re

import pytest

from firehose_bq.config import Config
from firehose_bq.errors import ConfigError

from tests.unit.test_config import MINIMAL


def _problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        Config.from_env(env)
    return failed.value.problems


@pytest.mark.parametrize("name", ["DLQ_KAFKA_TOPIC", "SPARK_MASTER", "SPARK_APP_NAME", "SINK_BIGQUERY_DATASET_LOCATION",
                                  "SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX"])
def test_an_empty_value_where_the_default_is_not_empty_stops_the_start(name: str) -> None:
    # `NAME=` (an env file, a template whose variable was unset) would otherwise be taken as the value: a DLQ
    # topic named '' fails only when the first letter is written, after minutes of retries.
    problems = _problems({**MINIMAL, "DLQ_SINK_ENABLE": "true", name: ""})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: empty"), problems


@pytest.mark.parametrize("name", ["SPARK_DRIVER_JAVA_OPTIONS", "ERROR_TYPES_FOR_DLQ", "ERROR_TYPES_FOR_RETRY",
                                  "SINK_BIGQUERY_METADATA_NAMESPACE"])
def test_an_empty_value_that_means_something_is_kept(name: str) -> None:
    Config.from_env({**MINIMAL, name: ""})


@pytest.mark.parametrize(("extra", "named"), [
    ({"SINK_BIGQUERY_TABLE_PARTITION_KEY": "message_timestamp"}, "SINK_BIGQUERY_TABLE_PARTITION_KEY"),
    ({"SINK_BIGQUERY_TABLE_PARTITION_EXPIRY_MS": "86400000"}, "SINK_BIGQUERY_TABLE_PARTITION_EXPIRY_MS"),
    ({"SINK_BIGQUERY_TABLE_CLUSTERING_KEYS": "message_topic"}, "SINK_BIGQUERY_TABLE_CLUSTERING_KEYS"),
])
def test_table_layout_without_its_switch_is_warned_about_not_refused(extra: dict[str, str], named: str) -> None:
    # Firehose env files carry a partition key and toggle partitioning (its sink ignores the key then): a
    # start error would break them. But a table created without it cannot be partitioned later: say so.
    cfg = Config.from_env({**MINIMAL, **extra})
    (warning,) = cfg.switched_off()
    assert warning.startswith(f"{named} is set but SINK_BIGQUERY_TABLE_") and "_ENABLE is not true" in warning
    switch = "SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE" if "CLUSTERING" in named else "SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE"
    key = {} if "KEY" in named else {"SINK_BIGQUERY_TABLE_PARTITION_KEY": "message_timestamp"}
    assert Config.from_env({**MINIMAL, switch: "true", **key, **extra}).switched_off() == []


def test_storage_api_switch_contradicting_an_explicit_insertall_stops_the_start() -> None:
    problems = _problems({**MINIMAL, "SINK_BIGQUERY_STORAGE_API_ENABLE": "true", "SINK_BIGQUERY_WRITE_METHOD": "insertall"})
    assert problems == ["SINK_BIGQUERY_STORAGE_API_ENABLE=true contradicts SINK_BIGQUERY_WRITE_METHOD=insertall: "
                        "choose one write method"]


JSON_INPUT = {**{k: v for k, v in MINIMAL.items() if k not in ("SCHEMA_REGISTRY_STENCIL_URLS", "INPUT_SCHEMA_PROTO_CLASS")},
              "INPUT_SCHEMA_DATA_TYPE": "JSON"}


@pytest.mark.parametrize("extra", [{"SCHEMA_REGISTRY_STENCIL_URLS": "file:///d.desc"},
                                   {"SCHEMA_REGISTRY_CONFLUENT_URL": "http://registry:8081"},
                                   {"INPUT_SCHEMA_PROTO_CLASS": "p.M"}])
def test_json_input_with_a_protobuf_schema_source_stops_the_start(extra: dict[str, str]) -> None:
    # Both a table schema and descriptors: the job would silently use the table's and ignore the registry.
    (name,) = extra
    problems = _problems({**JSON_INPUT, **extra})
    assert len(problems) == 1 and re.match(rf"{name}: protobuf only", problems[0]), problems


def test_protobuf_input_with_a_table_schema_file_stops_the_start() -> None:
    problems = _problems({**MINIMAL, "SINK_BIGQUERY_TABLE_SCHEMA_FILE": "/schema.json"})
    assert len(problems) == 1 and problems[0].startswith("SINK_BIGQUERY_TABLE_SCHEMA_FILE: "), problems
    assert "INPUT_SCHEMA_DATA_TYPE=JSON" in problems[0]


@pytest.mark.parametrize("name", ["SCHEMA_REGISTRY_CONFLUENT_SUBJECT", "SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO"])
def test_confluent_settings_without_the_registry_stop_the_start(name: str) -> None:
    problems = _problems({**MINIMAL, name: "u:p" if "AUTH" in name else "orders-value"})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: ") and "SCHEMA_REGISTRY_CONFLUENT_URL" in problems[0]
    assert "u:p" not in problems[0]


KEY_JSON = ('{"type": "service_account", "project_id": "p", "private_key_id": "k1", "private_key": '
            '"-----BEGIN PRIVATE KEY-----\\nMIIEvSECRETKEYMATERIAL\\n-----END PRIVATE KEY-----\\n", '
            '"client_email": "sink@p.iam.gserviceaccount.com"}')


@pytest.mark.parametrize("name", ["SINK_BIGQUERY_CREDENTIAL_PATH", "SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH",
                                  "DLQ_GCS_CREDENTIAL_PATH"])
def test_a_key_pasted_where_its_path_belongs_stops_the_start_without_showing_it(name: str) -> None:
    # A common slip (CI secrets hold the key itself): the path setting would carry the private key into
    # `config check`'s output and into the "no such file <path>" error the first client raised.
    problems = _problems({**MINIMAL, name: KEY_JSON})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: "), problems
    assert "SECRETKEYMATERIAL" not in problems[0] and "PRIVATE KEY" not in problems[0]


def test_a_missing_key_file_error_does_not_quote_what_is_not_a_path() -> None:
    from firehose_bq.gcp_auth import service_account_credentials

    with pytest.raises(ConfigError) as failed:
        service_account_credentials(KEY_JSON, ["scope"], "SINK_BIGQUERY_CREDENTIAL_PATH")
    assert "SECRETKEYMATERIAL" not in str(failed.value)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,2]", "local[*,3]", "local-cluster[2,1,1024]",
                                    "spark://h:7077", "spark://h1:7077,h2:7077", "yarn", "k8s://https://api:443",
                                    "connect-me://x"])
def test_spark_master_urls_spark_accepts_pass(master: str) -> None:
    if master.startswith("connect-me"):
        with pytest.raises(ConfigError):
            Config.from_env({**MINIMAL, "SPARK_MASTER": master})
    else:
        Config.from_env({**MINIMAL, "SPARK_MASTER": master})


@pytest.mark.parametrize("master", ["sprak://host:7077", "local[x]", "localhost", "spark://", "yarn-cluster"])
def test_a_spark_master_spark_cannot_parse_stops_the_start_before_the_jvm(master: str) -> None:
    # Spark itself says so only after its JVM started, in a Py4JJavaError traceback of 70 lines.
    problems = _problems({**MINIMAL, "SPARK_MASTER": master})
    assert len(problems) == 1 and problems[0].startswith(f"SPARK_MASTER: {master!r} "), problems
    assert "local[N]" in problems[0] and "spark://" in problems[0]


@pytest.mark.parametrize(("name", "value"), [("DLQ_KAFKA_TOPIC", "bad dlq!"), ("SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC", "un/routed"),
                                             ("SOURCE_KAFKA_TOPIC", "orders,bad topic"), ("DLQ_KAFKA_TOPIC", "x" * 250),
                                             ("DLQ_KAFKA_TOPIC", "..")])
def test_a_kafka_topic_name_kafka_refuses_stops_the_start(name: str, value: str) -> None:
    # A DLQ or fallback topic is first written when a message fails: a name the broker refuses would stop
    # the job then, after the DLQ's retries (2 minutes by default), not at its start.
    problems = _problems({**MINIMAL, "DLQ_SINK_ENABLE": "true", name: value})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: ") and "[a-zA-Z0-9._-]" in problems[0], problems


def test_kafka_topic_names_kafka_accepts_pass() -> None:
    Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true", "SOURCE_KAFKA_TOPIC": "a.b_c-D9,orders",
                     "DLQ_KAFKA_TOPIC": "x" * 249, "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": "un_routed"})


@pytest.mark.parametrize(("key", "endpoint"), [
    ("SINK_BIGQUERY_CREDENTIAL_PATH", {"SINK_BIGQUERY_API_ENDPOINT": "https://bigquery-psc.p.googleapis.com",
                                       "SINK_BIGQUERY_STORAGE_API_ENDPOINT": "h:443"}),
    ("DLQ_GCS_CREDENTIAL_PATH", {"DLQ_GCS_API_ENDPOINT": "https://storage-psc.p.googleapis.com"}),
    ("SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH",
     {"SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT": "https://storage-psc.p.googleapis.com"}),
])
def test_a_key_that_an_api_endpoint_would_leave_unused_stops_the_start(key: str, endpoint: dict[str, str]) -> None:
    # With an endpoint set, the clients send no Google credentials (the emulators take none): the key was
    # silently ignored, and BigQuery or GCS refused the anonymous caller, pointing at the key's roles.
    (name,) = [n for n in endpoint if not n.startswith("SINK_BIGQUERY_STORAGE")]
    problems = _problems({**MINIMAL, key: "/keys/sa.json", **endpoint})
    assert len(problems) == 1 and problems[0].startswith(f"{key}: ") and name in problems[0], problems


@pytest.mark.parametrize(("method", "interval", "warned"), [
    ("file_loads", "60000", False), ("file_loads", "57600", False), ("file_loads", "57599", True),
    ("file_loads", "10000", True), ("file_loads", "0", True), ("mixed", "30000", True),
    ("storage_write", "1000", False), ("insertall", "0", False),
])
def test_a_file_loads_trigger_faster_than_the_load_job_quota_is_warned_about(method: str, interval: str,
                                                                              warned: bool) -> None:
    # 1,500 load jobs per table per day: a 10 s trigger spends them in about 4 hours of streaming, then every
    # load is refused until the next day. Fine for a backfill that ends sooner, so a warning, not a refusal.
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": method,
                           "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": interval})
    warnings = cfg.load_quota_warnings()
    assert bool(warnings) == warned
    if interval == "10000":
        (warning,) = warnings
        assert "every 10 s" in warning and "runs out after 4 h 10 min of streaming" in warning and "57600 ms" in warning
    if interval == "57599":
        # 23.9996 h: rounded to "24.0 h" it contradicted "57600 ms or more runs all day" in the same sentence
        (warning,) = warnings
        assert "runs out after 23 h 59 min of streaming" in warning and "24" not in warning.split("57600 ms")[0]
    if interval == "0" and warned:
        assert "as soon as the previous batch ends" in warnings[0] and "after 1,500 batches" in warnings[0]


def test_an_upsert_job_is_paced_by_its_merge_interval_not_the_file_loads_trigger() -> None:
    # Upsert ignores the write method (its MERGEs run every SINK_BIGQUERY_MERGE_INTERVAL_MS): a short file-loads
    # trigger left in its env file paces nothing, and warning about it sends the operator to the wrong setting.
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads",
                           "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "10000", "SINK_BIGQUERY_UPSERT_ENABLED": "true",
                           "INPUT_SCHEMA_PROTO_KEY_CLASS": "x.K", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "key"})
    assert cfg.load_quota_warnings() == []
