"""Configuration: Firehose's environment variable names, parsed once into frozen, typed objects.

Every setting is declared once, as a dataclass field carrying its env name, default and meaning. The
same declarations drive parsing, validation, `firehose-bq config reference` and the README table (a
unit test keeps the README in step), so the documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from firehose_bq.decode import DECODERS, native_unavailable
from firehose_bq.dlq.config import DlqConfig
from firehose_bq.errors import ConfigError
from firehose_bq.policy import ErrorPolicyConfig
from firehose_bq.registry.config import RegistryConfig
from firehose_bq.schema import UINT64_COLUMN_TYPES, parse_metadata_columns
from firehose_bq.settings import SettingDoc, load_section, read_env_file, setting
from firehose_bq.settings import reference as _reference
from firehose_bq.settings import reference_markdown as _reference_markdown
from firehose_bq.upsert.config import UpsertConfig

__all__ = ["Config", "ConfigError", "SettingDoc", "read_env_file", "reference", "reference_markdown", "setting"]

# Prefixes that belong to this sink: a set variable under one of them that no setting reads is almost
# always a typo, so it is reported (as a warning, because Firehose deployments carry extra keys).
OWNED_PREFIXES = ("SOURCE_KAFKA_", "SINK_BIGQUERY_", "INPUT_SCHEMA_", "SCHEMA_REGISTRY_", "ERROR_TYPES_", "RETRY_",
                  "DLQ_")

# BigQuery accepts at most 50,000 rows and 10 MB per insertAll request; Google recommends ~500 rows
# per request as the latency/throughput sweet spot, which is the default batch size.
INSERT_ALL_MAX_ROWS_LIMIT = 50_000
INSERT_ALL_RECOMMENDED_ROWS = 500
WRITE_METHODS = ("insertall", "storage_write", "file_loads")
# BigQuery allows 1,500 load jobs per table per day: 86,400 s / 1,500 = 57.6 s is the shortest interval that
# runs around the clock under it; a minute leaves 60 jobs a day for retries and replays.
FILE_LOADS_TRIGGER_MS = 60_000


@dataclass(frozen=True)
class SourceConfig:
    brokers: str = setting("SOURCE_KAFKA_BROKERS", "Kafka bootstrap servers, `host:port[,host:port]`.")
    topics: tuple[str, ...] = setting(
        "SOURCE_KAFKA_TOPIC", "Topic to consume (comma-separated for several topics into one table)."
    )
    consumer_group_id: str = setting(
        "SOURCE_KAFKA_CONSUMER_GROUP_ID",
        "Consumer group: its committed offsets are the start of a fresh checkpoint, and progress is "
        "committed back to it for lag monitoring.",
    )
    auto_offset_reset: str = setting(
        "SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET",
        "Where a partition with no checkpoint and no committed group offset starts.",
        "earliest",
        choices=("earliest", "latest"),
    )
    client: str = setting(
        "SOURCE_KAFKA_CLIENT",
        "Kafka client the reader tasks use: `auto` = confluent-kafka (librdkafka, much faster) when it is "
        "installed, else kafka-python. Metadata and consumer-group commits always use kafka-python.",
        "auto",
        choices=("auto", "kafka-python", "confluent-kafka"),
    )
    stall_timeout_ms: int = setting(
        "SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS",
        "A task that gets no record for this long while its planned range is unread fails with an "
        "error naming the partition (a broker that lost data must not hang the job).",
        120_000,
        minimum=1000,
    )


@dataclass(frozen=True)
class InputSchemaConfig:
    proto_class: str = setting(
        "INPUT_SCHEMA_PROTO_CLASS", "Full name of the protobuf message in the topic, e.g. `pkg.Message`."
    )
    stencil_urls: tuple[str, ...] = setting(
        "SCHEMA_REGISTRY_STENCIL_URLS",
        "FileDescriptorSet locations, comma-separated: `file://` URLs, plain paths or `http(s)://` URLs. "
        "Required unless SCHEMA_REGISTRY_CONFLUENT_URL is set.",
        (),
    )
    key_class: str | None = setting(
        "INPUT_SCHEMA_PROTO_KEY_CLASS",
        "Full name of the protobuf message in the Kafka key; set = the key is written as the RECORD column "
        "`message_key`.",
        None,
    )
    proto_decoder: str = setting(
        "INPUT_SCHEMA_PROTO_DECODER",
        "How values and keys are decoded: `native` = the C decoder built with the package (wire bytes straight "
        "to Arrow, about as fast as protobuf's own parsing), `python` = the Python reference decoder (much "
        "slower, same results), `auto` = native when it is built, else python with a log line saying why. "
        "`native` stops the start when the C decoder is not built. A message shape the C decoder does not "
        "support (proto2 groups, extensions) is decoded by the reference either way.",
        "auto",
        choices=DECODERS,
    )


@dataclass(frozen=True)
class BigQueryConfig:
    project_id: str = setting("SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID", "Google Cloud project of the table.")
    dataset: str = setting("SINK_BIGQUERY_DATASET_NAME", "Dataset; created when missing.")
    table: str = setting("SINK_BIGQUERY_TABLE_NAME", "Table; created when missing, evolved as the proto grows.")
    dataset_location: str = setting(
        "SINK_BIGQUERY_DATASET_LOCATION", "Location used when the dataset is created.", "US"
    )
    credential_path: str | None = setting(
        "SINK_BIGQUERY_CREDENTIAL_PATH",
        "Service-account JSON key; unset = Application Default Credentials.",
        None,
    )
    api_endpoint: str | None = setting(
        "SINK_BIGQUERY_API_ENDPOINT",
        "BigQuery REST endpoint, e.g. the local emulator `http://127.0.0.1:19050` (anonymous "
        "credentials); unset = real BigQuery.",
        None,
    )
    row_insert_id_enable: bool = setting(
        "SINK_BIGQUERY_ROW_INSERT_ID_ENABLE",
        "Send insertId `topic_partition_offset` with each row so BigQuery drops replayed duplicates.",
        True,
    )
    add_metadata: bool = setting(
        "SINK_BIGQUERY_ADD_METADATA_ENABLED", "Add Kafka metadata columns (topic, partition, offset, ...).", True
    )
    metadata_namespace: str = setting(
        "SINK_BIGQUERY_METADATA_NAMESPACE",
        "RECORD column that holds the metadata columns; empty = metadata columns at the root.",
        "",
    )
    metadata_columns_types: str = setting(
        "SINK_BIGQUERY_METADATA_COLUMNS_TYPES",
        "Which metadata columns, in order, as `name=type,...` (types must match): message_topic=string, "
        "message_partition=integer, message_offset=integer, message_timestamp=timestamp, load_time=timestamp, "
        "message_headers=record, message_timestamp_type=string, message_leader_epoch=integer; empty = the "
        "first five.",
        "",
    )
    record_max_depth: int = setting(
        "SINK_BIGQUERY_RECORD_MAX_DEPTH",
        "Column level at which nested messages are stored as a JSON STRING instead of a RECORD (recursive "
        "messages); 15 is BigQuery's nesting limit.",
        15, minimum=1, maximum=15,
    )
    sanitize_field_names: bool = setting(
        "SINK_BIGQUERY_SANITIZE_FIELD_NAMES",
        "Map proto field names BigQuery rejects to valid column names (else such a name stops the job).",
        False,
    )
    uint64_column_type: str = setting(
        "SINK_BIGQUERY_UINT64_COLUMN_TYPE",
        "Column type of uint64 and fixed64 fields. INTEGER holds up to 2^63-1: a larger value fails its message "
        "(INVALID_MESSAGE_ERROR), it is never wrapped or clamped; NUMERIC and STRING keep every value. Changing it "
        "for an existing table is a column type change, which stops the job with the field named.",
        "INTEGER",
        choices=UINT64_COLUMN_TYPES,
    )
    write_method: str = setting(
        "SINK_BIGQUERY_WRITE_METHOD",
        "How rows reach the table: `insertall` (streaming inserts), `storage_write` (Storage Write API) or "
        "`file_loads` (staged files, one load job per table per trigger).",
        "insertall",
        choices=WRITE_METHODS,
    )
    storage_api_enable: bool = setting(
        "SINK_BIGQUERY_STORAGE_API_ENABLE",
        "Firehose's switch for the Storage Write API: true = `SINK_BIGQUERY_WRITE_METHOD=storage_write`.",
        False,
    )
    storage_api_endpoint: str | None = setting(
        "SINK_BIGQUERY_STORAGE_API_ENDPOINT",
        "Storage Write API gRPC endpoint `host:port`; with SINK_BIGQUERY_API_ENDPOINT (the local emulator, e.g. "
        "`127.0.0.1:19060`) a plaintext channel, else a private endpoint; unset = real BigQuery.",
        None,
    )
    file_loads_trigger_ms: int = setting(
        "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS",
        "With `file_loads`: the micro-batch interval of a streaming run (instead of SPARK_TRIGGER_INTERVAL_MS), "
        "so one load job per table per trigger. BigQuery allows 1,500 load jobs per table per day (failed "
        "ones included): one a minute is 1,440, the shortest interval that runs all day under that quota.",
        FILE_LOADS_TRIGGER_MS,
        minimum=0,
    )
    file_loads_staging_uri: str = setting(
        "SINK_BIGQUERY_FILE_LOADS_STAGING_URI",
        "With `file_loads`: directory where tasks stage their rows as newline-delimited JSON until the "
        "batch's load job ran; empty = `<SPARK_CHECKPOINT_LOCATION>/staging`. Must be a local path (or "
        "`file://`) that the driver and every executor share; `gs://` is not supported yet.",
        "",
    )
    file_loads_job_timeout_ms: int = setting(
        "SINK_BIGQUERY_FILE_LOADS_JOB_TIMEOUT_MS",
        "With `file_loads`: how long the driver waits for a batch's load job; past it the batch fails "
        "(offsets not committed) and the replay finds the same job again instead of loading twice.",
        600_000,
        minimum=1000,
    )
    insert_all_batch_size: int = setting(
        "SINK_BIGQUERY_INSERT_ALL_BATCH_SIZE",
        "Rows per insertAll request (BigQuery allows 50,000; requests are also kept under 9 MB).",
        INSERT_ALL_RECOMMENDED_ROWS,
        minimum=1,
        maximum=INSERT_ALL_MAX_ROWS_LIMIT,
    )
    client_timeout_ms: int = setting(
        "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS", "Timeout of one BigQuery HTTP request.", 60_000, minimum=1
    )
    retry_deadline_ms: int = setting(
        "SINK_BIGQUERY_RETRY_DEADLINE_MS",
        "How long transient BigQuery failures (5xx, connection errors) are retried before the batch fails.",
        120_000,
        minimum=0,
    )

    @property
    def table_ref(self) -> str:
        return f"{self.project_id}.{self.dataset}.{self.table}"

    @property
    def effective_write_method(self) -> str:
        """The write method, with Firehose's SINK_BIGQUERY_STORAGE_API_ENABLE switch applied."""
        return "storage_write" if self.storage_api_enable else self.write_method


@dataclass(frozen=True)
class TableConfig:
    """How the dataset and table are created: labels, partitioning, clustering (Firehose's names)."""

    dataset_labels: dict[str, str] = setting(
        "SINK_BIGQUERY_DATASET_LABELS", "Labels set on the dataset, `key=value,key=value`.", {}
    )
    table_labels: dict[str, str] = setting(
        "SINK_BIGQUERY_TABLE_LABELS", "Labels set on the table, `key=value,key=value`.", {}
    )
    partitioning_enable: bool = setting(
        "SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE", "Create the table time-partitioned.", False
    )
    partition_key: str = setting(
        "SINK_BIGQUERY_TABLE_PARTITION_KEY",
        "Top-level TIMESTAMP or DATE column to partition by (a proto field or a metadata column such as "
        "`message_timestamp`); empty = ingestion-time partitioning.",
        "",
    )
    partitioning_type: str = setting(
        "SINK_BIGQUERY_TABLE_PARTITIONING_TYPE", "Partition granularity.", "DAY",
        choices=("HOUR", "DAY", "MONTH", "YEAR"),
    )
    partition_expiry_ms: int = setting(
        "SINK_BIGQUERY_TABLE_PARTITION_EXPIRY_MS", "Partitions older than this are deleted; -1 = never.", -1,
        minimum=-1,
    )
    clustering_enable: bool = setting(
        "SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE", "Create the table clustered.", False
    )
    clustering_keys: tuple[str, ...] = setting(
        "SINK_BIGQUERY_TABLE_CLUSTERING_KEYS",
        "Up to 4 top-level columns to cluster by, comma-separated, most significant first.",
        (),
    )


@dataclass(frozen=True)
class SparkConfig:
    checkpoint_location: str = setting(
        "SPARK_CHECKPOINT_LOCATION",
        "Durable directory of the streaming checkpoint (source offsets live here). One per job.",
    )
    master: str = setting("SPARK_MASTER", "Spark master URL.", "local[*]")
    app_name: str = setting("SPARK_APP_NAME", "Spark application name.", "firehose-bq")
    trigger_interval_ms: int = setting(
        "SPARK_TRIGGER_INTERVAL_MS", "Micro-batch interval of a streaming run.", 5000, minimum=0
    )
    max_offsets_per_trigger: int = setting(
        "SPARK_MAX_OFFSETS_PER_TRIGGER",
        "Most Kafka records one micro-batch reads, over all partitions; -1 = no limit.",
        100_000,
        minimum=-1,
    )


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    input_schema: InputSchemaConfig
    registry: RegistryConfig
    bigquery: BigQueryConfig
    table: TableConfig
    spark: SparkConfig
    upsert: UpsertConfig
    errors: ErrorPolicyConfig = dataclasses.field(default_factory=ErrorPolicyConfig)
    dlq: DlqConfig = dataclasses.field(default_factory=DlqConfig)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Config:
        """Build the config or raise ConfigError listing every problem at once."""
        problems: list[str] = []
        sections = {name: load_section(section, environ, problems) for name, section in _sections().items()}
        if problems:
            raise ConfigError(problems)
        config = cls(**sections)
        config.validate()
        return config

    def validate(self) -> None:
        problems = []
        if self.spark.max_offsets_per_trigger == 0:
            problems.append("SPARK_MAX_OFFSETS_PER_TRIGGER: must be positive or -1 (no limit), got 0")
        ns = self.bigquery.metadata_namespace
        if ns and not BQ_NAME.fullmatch(ns):
            problems.append(f"SINK_BIGQUERY_METADATA_NAMESPACE: {ns!r} is not a valid BigQuery column name")
        for env, value in (("SINK_BIGQUERY_DATASET_NAME", self.bigquery.dataset),
                           ("SINK_BIGQUERY_TABLE_NAME", self.bigquery.table)):
            if not BQ_NAME.fullmatch(value):
                problems.append(f"{env}: {value!r} is not a valid BigQuery name (letters, digits, _)")
        if bool(self.input_schema.stencil_urls) == bool(self.registry.confluent_url):
            problems.append("SCHEMA_REGISTRY_STENCIL_URLS / SCHEMA_REGISTRY_CONFLUENT_URL: set exactly one: "
                            "Stencil URLs for plain protobuf values, or a Confluent registry for framed ones")
        try:
            parse_metadata_columns(self.bigquery.metadata_columns_types)
        except ValueError as exc:
            problems.append(f"SINK_BIGQUERY_METADATA_COLUMNS_TYPES: {exc}")
        for env, labels in (("SINK_BIGQUERY_DATASET_LABELS", self.table.dataset_labels),
                            ("SINK_BIGQUERY_TABLE_LABELS", self.table.table_labels)):
            problems.extend(f"{env}: {problem}" for problem in label_problems(labels))
        if self.table.partitioning_enable and self.table.partition_key and not BQ_NAME.fullmatch(
                self.table.partition_key):
            problems.append(f"SINK_BIGQUERY_TABLE_PARTITION_KEY: {self.table.partition_key!r} is not a column name")
        if self.table.clustering_enable and not self.table.clustering_keys:
            problems.append("SINK_BIGQUERY_TABLE_CLUSTERING_KEYS: required when SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE"
                            "=true")
        if len(self.table.clustering_keys) > MAX_CLUSTERING_KEYS:
            problems.append(f"SINK_BIGQUERY_TABLE_CLUSTERING_KEYS: BigQuery allows at most {MAX_CLUSTERING_KEYS} "
                            f"clustering columns, got {len(self.table.clustering_keys)}")
        if self.bigquery.storage_api_enable and self.bigquery.write_method == "file_loads":
            problems.append("SINK_BIGQUERY_STORAGE_API_ENABLE=true contradicts SINK_BIGQUERY_WRITE_METHOD=file_loads: "
                            "choose one write method")
        problems.extend(self.upsert.problems(self.input_schema.key_class))
        if self.input_schema.proto_decoder == "native" and (why := native_unavailable()):
            problems.append(f"INPUT_SCHEMA_PROTO_DECODER=native: {why}")
        if (self.bigquery.effective_write_method == "storage_write" and self.bigquery.api_endpoint
                and not self.bigquery.storage_api_endpoint):
            problems.append("SINK_BIGQUERY_STORAGE_API_ENDPOINT: required for storage_write when "
                            "SINK_BIGQUERY_API_ENDPOINT points at an emulator (its gRPC host:port)")
        if self.bigquery.effective_write_method == "file_loads":
            problems.extend(staging_problems(self.bigquery.file_loads_staging_uri, self.spark.checkpoint_location))
        if problems:
            raise ConfigError(problems)

    @property
    def confluent_subject(self) -> str:
        return self.registry.confluent_subject or f"{self.source.topics[0]}-value"

    def public_dict(self) -> dict[str, Any]:
        """Settings for logs: credential paths are shown; secret values are `Secret`s, shown redacted."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StackConfig:
    """The local development stack (`firehose-bq stack ...`): never used by a production job."""

    state_dir: str = setting(
        "FIREHOSE_STACK_DIR", "Where the local stack keeps PIDs, logs and the broker's data.", ".stack"
    )
    tools_dir: str = setting(
        "FIREHOSE_STACK_TOOLS_DIR",
        "Where the broker and emulator venvs are installed once and reused; empty = "
        "`$XDG_CACHE_HOME/firehose-bq/tools` (`~/.cache/...`).",
        "",
    )
    kafka_port: int = setting("FIREHOSE_STACK_KAFKA_PORT", "Port of the local Kafka broker.", 19092,
                              minimum=1, maximum=65535)
    bigquery_port: int = setting("FIREHOSE_STACK_BIGQUERY_PORT", "REST port of the BigQuery emulator.", 19050,
                                 minimum=1, maximum=65535)
    bigquery_grpc_port: int = setting(
        "FIREHOSE_STACK_BIGQUERY_GRPC_PORT", "gRPC (Storage API) port of the BigQuery emulator.", 19060,
        minimum=1, maximum=65535,
    )
    project_id: str = setting("FIREHOSE_STACK_PROJECT_ID", "Project id the emulator serves.", "local-project")
    start_timeout_s: int = setting(
        "FIREHOSE_STACK_START_TIMEOUT_S",
        "How long `stack up` waits for each service to answer (first start installs it: longer).",
        120, minimum=1,
    )
    bigquery_persistent: bool = setting(
        "FIREHOSE_STACK_BIGQUERY_PERSISTENT",
        "Keep the emulator's datasets in FIREHOSE_STACK_DIR/bigquery-data across restarts (default: in memory).",
        False,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StackConfig:
        problems: list[str] = []
        loaded = load_section(cls, environ, problems)
        if problems:
            raise ConfigError(problems)
        return loaded  # type: ignore[no-any-return]


BQ_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,299}")
# https://cloud.google.com/bigquery/docs/labels-intro#requirements
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
MAX_CLUSTERING_KEYS = 4  # BigQuery's limit


def label_problems(labels: Mapping[str, str]) -> list[str]:
    problems = []
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            problems.append(f"label key {key!r}: lowercase letters, digits, _ or -, starting with a letter, ≤ 63")
        if not LABEL_VALUE.fullmatch(value):
            problems.append(f"label {key}={value!r}: value must be lowercase letters, digits, _ or -, ≤ 63")
    return problems


def staging_problems(staging_uri: str, checkpoint_location: str) -> list[str]:
    """File loads stage through a directory the driver can read: a local (shared) path for now."""
    if staging_uri:
        if "://" in staging_uri and not staging_uri.startswith("file://"):
            return [f"SINK_BIGQUERY_FILE_LOADS_STAGING_URI: {staging_uri!r} is not supported yet: use a local "
                    "directory (on a cluster, one that the driver and every executor mount)"]
    elif "://" in checkpoint_location and not checkpoint_location.startswith("file://"):
        return [f"SINK_BIGQUERY_FILE_LOADS_STAGING_URI: required with SINK_BIGQUERY_WRITE_METHOD=file_loads when "
                f"SPARK_CHECKPOINT_LOCATION ({checkpoint_location}) is not a local directory"]
    return []


def _sections() -> dict[str, type]:
    return dict(typing.get_type_hints(Config))


def reference(sections: tuple[type, ...] | None = None) -> list[SettingDoc]:
    """Every setting (the job's by default) in declaration order."""
    return _reference(sections or tuple(_sections().values()))


def reference_markdown(sections: tuple[type, ...] | None = None) -> str:
    return _reference_markdown(sections or tuple(_sections().values()))


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Set variables under this sink's prefixes that no setting reads (probably typos)."""
    known = {d.env for d in reference()}
    return sorted(k for k in environ if k.startswith(OWNED_PREFIXES) and k not in known)
