"""Configuration: Firehose's environment variable names, parsed once into frozen, typed objects.

Every setting is declared once, as a dataclass field carrying its env name, default and meaning. The
same declarations drive parsing, validation, `firehose-bq config reference` and the README table (a
unit test keeps the README in step), so the documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from firehose_bq import redact
from firehose_bq.blobstore import GCS_SCHEME, gcs_location
from firehose_bq.decode import DECODERS, native_unavailable
from firehose_bq.dlq.config import FIREHOSE_UNREAD as DLQ_UNREAD, KAFKA, DlqConfig
from firehose_bq.errors import ConfigError
from firehose_bq.gcp_auth import key_content_problem
from firehose_bq.logs import LogConfig
from firehose_bq.policy import DEFAULT_RETRY_DEADLINE_MS, ErrorPolicyConfig
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.routing import (PLACEHOLDER, NameTemplate, Router, TemplateError, name_problem,
                                 parse_class_routes)
from firehose_bq.schema import UINT64_COLUMN_TYPES, parse_metadata_columns
from firehose_bq.settings import SettingDoc, load_section, read_env_file, setting
from firehose_bq.settings import reference as _reference
from firehose_bq.settings import reference_markdown as _reference_markdown
from firehose_bq.source.kafka_client import ISOLATION_LEVELS, READ_COMMITTED, REQUEST_TIMEOUT_MS, STALL_TIMEOUT_MS
from firehose_bq.source.kafka_security import DLQ_SECURITY_ENVS, KafkaSecurityConfig, dlq_security_ignored, \
    dlq_security_problems
from firehose_bq.source.kafka_security import FIREHOSE_UNREAD as SOURCE_UNREAD
from firehose_bq.telemetry import MetricsConfig
from firehose_bq.upsert.config import UpsertConfig

__all__ = ["Config", "ConfigError", "SettingDoc", "read_env_file", "reference", "reference_markdown", "setting"]

# Prefixes that belong to this sink: a set variable under one of them that no setting reads is almost
# always a typo, so it is reported (as a warning, because Firehose deployments carry extra keys).
OWNED_PREFIXES = ("SOURCE_KAFKA_", "SINK_BIGQUERY_", "INPUT_SCHEMA_", "SCHEMA_REGISTRY_", "ERROR_TYPES_", "RETRY_",
                  "DLQ_", "METRIC_")

# BigQuery accepts at most 50,000 rows and 10 MB per insertAll request; Google recommends ~500 rows
# per request as the latency/throughput sweet spot, which is the default batch size.
INSERT_ALL_MAX_ROWS_LIMIT = 50_000
INSERT_ALL_RECOMMENDED_ROWS = 500
WRITE_METHODS = ("insertall", "storage_write", "file_loads", "mixed")
# One BigQuery request: a load or MERGE job's insert, an insertAll of 9 MB, an Arrow append, all answer in
# seconds; a minute covers a slow region without leaving a dead endpoint unnoticed for long.
CLIENT_TIMEOUT_MS = 60_000
# BigQuery allows 1,500 load jobs per table per day: 86,400 s / 1,500 = 57.6 s is the shortest interval that
# runs around the clock under it; a minute leaves 60 jobs a day for retries and replays.
LOAD_JOBS_PER_TABLE_PER_DAY = 1_500
DAY_MS = 86_400_000
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
        "Where a partition with no checkpoint and no committed group offset starts, and where a fresh "
        "checkpoint starts a partition whose committed offset the broker no longer has (deleted by "
        "retention: a warning names the gap).",
        "earliest",
        choices=("earliest", "latest"),
    )
    client: str = setting(
        "SOURCE_KAFKA_CLIENT",
        "Kafka client the reader tasks use: `auto` = confluent-kafka (librdkafka, much faster) when it is "
        "installed, else kafka-python. The driver's offsets and consumer-group commits always use confluent-kafka.",
        "auto",
        choices=("auto", "kafka-python", "confluent-kafka"),
    )
    stall_timeout_ms: int = setting(
        "SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS",
        "A task that gets no record for this long while its planned range is unread fails with an "
        "error naming the partition (a broker that lost data must not hang the job); the source's planner "
        "waits as long for a broker that does not answer before the job stops.",
        STALL_TIMEOUT_MS,
        minimum=1000,
    )
    request_timeout_ms: int = setting(
        "SOURCE_KAFKA_REQUEST_TIMEOUT_MS",
        "How long one request to the brokers waits for an answer: the start's check of the topics, the "
        "source planner's offset look-ups (each, while it waits out SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS for a "
        "broker that does not answer) and the reader tasks' requests (with kafka-python, their first "
        "connection too). A broker that does not answer, or that this job cannot talk to (another "
        "protocol), stops the start after it.",
        REQUEST_TIMEOUT_MS,
        minimum=1000,
    )
    isolation_level: str = setting(
        "SOURCE_KAFKA_ISOLATION_LEVEL",
        "Which records of transactional producers are read. `read_committed`: only those of committed "
        "transactions (aborted ones never reach the table), and each batch ends at the last stable offset, "
        "so records of a transaction still open are read in a later batch, once it commits. "
        "`read_uncommitted`: every record, aborted ones included, up to the high watermark. The batch "
        "planner, the reader tasks (either SOURCE_KAFKA_CLIENT) and `replay-dlq` all use it.",
        READ_COMMITTED,
        choices=ISOLATION_LEVELS,
    )


@dataclass(frozen=True)
class InputSchemaConfig:
    proto_class: str = setting(
        "INPUT_SCHEMA_PROTO_CLASS",
        "Full name of the protobuf message in the topic, e.g. `pkg.Message`; with "
        "INPUT_SCHEMA_PROTO_CLASS_ROUTES, the class of records whose header the map does not name (unset: "
        "such records are unrouted). Required otherwise.",
        "",
    )
    class_header: str = setting(
        "INPUT_SCHEMA_PROTO_CLASS_HEADER",
        "Kafka header whose value picks each record's message class from INPUT_SCHEMA_PROTO_CLASS_ROUTES (a "
        "topic carrying several event types, e.g. CloudEvents' `ce_type`); each class lands in its own table, "
        "named by SINK_BIGQUERY_TABLE_NAME's template.",
        "",
    )
    class_routes: str = setting(
        "INPUT_SCHEMA_PROTO_CLASS_ROUTES",
        "`header-value=pkg.Message,...`: the message class per value of INPUT_SCHEMA_PROTO_CLASS_HEADER.",
        "",
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
    data_type: str = setting(
        "INPUT_SCHEMA_DATA_TYPE",
        "What the Kafka values are: PROTOBUF (decoded with the descriptors) or JSON (objects coerced to the "
        "destination table's own schema; see JSON input).",
        "PROTOBUF",
        choices=("PROTOBUF", "JSON"),
    )
    decoder: str = setting(
        "INPUT_SCHEMA_PROTO_DECODER",
        "How values and keys are decoded: `native` = the C decoders built with the package (protobuf wire bytes "
        "or JSON text straight to Arrow, about as fast as protobuf's own parsing), `python` = the Python "
        "reference decoders (much slower, same results), `auto` = native when it is built, else python with a "
        "log line saying why. `native` stops the start when the C decoder is not built. A message shape the C "
        "decoder does not support (proto2 groups, extensions) is decoded by the reference either way.",
        "auto",
        choices=DECODERS,
    )


@dataclass(frozen=True)
class BigQueryConfig:
    project_id: str = setting("SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID", "Google Cloud project of the table.")
    dataset: str = setting(
        "SINK_BIGQUERY_DATASET_NAME",
        "Dataset; created when missing. May be a template over each record's attributes: `${header.NAME}`, "
        "`${topic}`, `${partition}`, `${key}` (e.g. `${header.document_namespace}_live`).",
    )
    table: str = setting(
        "SINK_BIGQUERY_TABLE_NAME",
        "Table; created when missing, evolved as the proto grows. May be a template like the dataset's (e.g. "
        "`${header.document_type}_v${header.document_version}`): each resolved name is sanitized like a "
        "column name and validated.",
    )
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
        "How rows reach the table: `insertall` (streaming inserts), `storage_write` (Storage Write API), "
        "`file_loads` (staged files, one load job per table per trigger) or `mixed` (the tables in "
        "SINK_BIGQUERY_MIXED_STREAMING_TABLES by Storage Write, the others by file loads). The default is the "
        "fastest that keeps every guarantee (see Output modes).",
        "storage_write",
        choices=WRITE_METHODS,
    )
    mixed_streaming_tables: tuple[str, ...] = setting(
        "SINK_BIGQUERY_MIXED_STREAMING_TABLES",
        "With `mixed`: the table names (templates allowed, e.g. `${header.document_type}_v1`) streamed with "
        "Storage Write; every other table is loaded from files once per SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS.",
        (),
    )
    table_schema_file: str = setting(
        "SINK_BIGQUERY_TABLE_SCHEMA_FILE",
        "With INPUT_SCHEMA_DATA_TYPE=JSON: a BigQuery JSON schema file (what `bq show --schema` prints) that "
        "creates a destination table that does not exist yet (and whose new columns are added to one that "
        "does); unset: the table must exist, its schema is the schema.",
        "",
    )
    table_schema_cache_ttl_ms: int = setting(
        "SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS",
        "How long a table's schema, once read, is used before it is read again. With INPUT_SCHEMA_DATA_TYPE=JSON: "
        "the destination table's, on the driver (columns added to the table are then filled). With routing (tables "
        "named by the records): each table a Spark worker checked (created or evolved) and streams to (not one "
        "staged for a load job), for its later tasks with the same descriptors; new descriptors, and a write "
        "request that failed as a whole, check again at once, and a write that finds the table gone checks it "
        "again (creating it). 0: every task checks each of its tables.",
        60_000,
        minimum=0,
    )
    additional_properties: bool = setting(
        "SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE",
        "Collect values the table has no column for, at any depth, as one JSON object string in the STRING "
        "column `additional_properties` (created when missing), so a new column can be backfilled with JSON "
        "functions. JSON input: keys with no column. Protobuf input: fields the descriptor lacks, still unknown "
        "after the registry refresh they trigger, as their raw wire values (README: Decoding); such messages are "
        "then written, never UNKNOWN_FIELDS_ERROR. Only the value's: unknown fields in the Kafka key "
        "(INPUT_SCHEMA_PROTO_KEY_CLASS) follow INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE, and in upsert/delete "
        "are always UNKNOWN_FIELDS_ERROR.",
        False,
    )
    route_fallback_topic: str = setting(
        "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC",
        "Kafka topic (on SOURCE_KAFKA_BROKERS) for records with no route: a routing attribute is missing, or "
        "the class header names no class. The original record plus `firehose-dlq-*` headers saying why; "
        "`replay-dlq --topic` feeds them back once routes exist. Unset: unrouted records are ROUTING_ERRORs "
        "for the error policy.",
        "",
    )
    max_destinations: int = setting(
        "SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK",
        "Most destination tables one task writes to in a micro-batch (each holds a writer, and with file "
        "loads a staged file), counted per Kafka partition the task reads (SPARK_MAX_TASKS_PER_BATCH): the "
        "tables each partition brings first; the records of a table past it fail as ROUTING_ERROR (for the "
        "error policy: the DLQ, or a stop), and the table is not created, rather than exhaust connections or "
        "the load-job quota.",
        100,
        minimum=1,
    )
    concurrent_table_writes: int = setting(
        "SINK_BIGQUERY_CONCURRENT_TABLE_WRITES",
        "With routing (tables named by the records): how many of its destination tables a task writes at once "
        "when it writes what waits (at its end, or when its waiting rows pass 50,000 or 64 MiB). A request "
        "takes tens of milliseconds on BigQuery; one table after another, a task routed to 200 tables waits "
        "seconds on them. Each table's rows still go in order. 1: one table after another; at most 10, the "
        "BigQuery REST client's connections per host (insertAll, table reads).",
        8,
        minimum=1,
        maximum=10,
    )
    insert_all_concurrent_requests: int = setting(
        "SINK_BIGQUERY_INSERT_ALL_CONCURRENT_REQUESTS",
        "insertAll requests one writer has in flight at once. A task writing 50,000 rows into a table sends 100 "
        "requests of 500 (SINK_BIGQUERY_INSERT_ALL_BATCH_SIZE); a request takes tens of milliseconds on "
        "BigQuery, so one after another a task waits seconds. The requests are independent: BigQuery keeps no "
        "order among rows. The first request that fails as a whole stops those not yet sent, and the error "
        "policy retries the rows of those that did not go in. 1: one after another. The requests of all "
        "writers of a Python worker share the REST client's 10 connections per host.",
        4,
        minimum=1,
        maximum=10,
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
        "ones included): one a minute is 1,440; under 57600 a streaming `run` (and `config check`) warns at start "
        "that a busy table runs out of that quota within the day (not with upsert, which MERGEs per "
        "SINK_BIGQUERY_MERGE_INTERVAL_MS).",
        FILE_LOADS_TRIGGER_MS,
        minimum=0,
    )
    file_loads_concurrent_jobs: int = setting(
        "SINK_BIGQUERY_FILE_LOADS_CONCURRENT_JOBS",
        "With `file_loads` or `mixed` and routed tables: how many of a micro-batch's load jobs (one per table) "
        "the driver runs at once. A load job takes seconds on BigQuery: one after another, a batch routed to "
        "200 tables would take minutes.",
        8,
        minimum=1,
    )
    file_loads_staging_uri: str = setting(
        "SINK_BIGQUERY_FILE_LOADS_STAGING_URI",
        "With `file_loads` or `mixed`: where tasks stage their rows (Parquet; newline-delimited JSON for a table "
        "with a JSON column) until the batch's load job ran. "
        "`gs://bucket/prefix` (on a cluster): the load job reads the objects from there; or a directory (a path "
        "or `file://`) that the driver and every executor share: the driver uploads each batch's files. Empty = "
        "`<SPARK_CHECKPOINT_LOCATION>/staging`, for a local checkpoint only.",
        "",
    )
    file_loads_staging_credential_path: str | None = setting(
        "SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH",
        "With `gs://` staging: service-account JSON key with which the tasks write, and the driver lists and "
        "deletes, the staged objects; unset = SINK_BIGQUERY_CREDENTIAL_PATH, else Application Default "
        "Credentials. The load jobs read the objects as the BigQuery identity (`storage.objects.get`).",
        None,
    )
    file_loads_staging_gcs_endpoint: str | None = setting(
        "SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT",
        "With `gs://` staging: Cloud Storage JSON API endpoint, e.g. the local emulator `http://127.0.0.1:19023` "
        "(anonymous credentials; `firehose-bq stack status --env` prints it); unset = real Cloud Storage.",
        None,
    )
    job_timeout_ms: int = setting(
        "SINK_BIGQUERY_JOB_TIMEOUT_MS",
        "How long the driver waits for a batch's BigQuery job (the load job of `file_loads`, the MERGE of "
        "upsert/delete), polling it; past it the batch fails (offsets not committed) and its retry or replay "
        "finds the same job by its id instead of writing twice. Not SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS, "
        "which bounds each request.",
        600_000,
        minimum=1000,
        formerly=("SINK_BIGQUERY_FILE_LOADS_JOB_TIMEOUT_MS",),
    )
    insert_all_batch_size: int = setting(
        "SINK_BIGQUERY_INSERT_ALL_BATCH_SIZE",
        "Rows per insertAll request (BigQuery allows 50,000; requests are also kept under 9 MB).",
        INSERT_ALL_RECOMMENDED_ROWS,
        minimum=1,
        maximum=INSERT_ALL_MAX_ROWS_LIMIT,
    )
    client_timeout_ms: int = setting(
        "SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS",
        f"Timeout of one BigQuery request; -1 = the default ({CLIENT_TIMEOUT_MS} ms), as in Firehose, whose env "
        "files set -1. Firehose's 0 (no timeout) is refused: a BigQuery that never answers would hold a task forever.",
        CLIENT_TIMEOUT_MS,
        minimum=-1,
    )
    retry_deadline_ms: int = setting(
        "SINK_BIGQUERY_RETRY_DEADLINE_MS",
        "How long a failed BigQuery write (a request failing as a whole, or rows with a type in "
        "ERROR_TYPES_FOR_RETRY) is retried, from its first attempt, before the job stops (or the rows go to "
        "the DLQ); the waits follow RETRY_*. Other BigQuery calls are retried by the client as long. A dead "
        "BigQuery thus holds a task at most this plus one SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS (3 minutes with "
        "the defaults). (Formerly the client's own deadline per call, under the policy's attempts: their waits multiplied.)",
        DEFAULT_RETRY_DEADLINE_MS,
        minimum=0,
    )

    @property
    def table_ref(self) -> str:
        return f"{self.project_id}.{self.dataset}.{self.table}"

    @property
    def request_timeout_s(self) -> float:
        """SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS in seconds, -1 being the default."""
        return (CLIENT_TIMEOUT_MS if self.client_timeout_ms == -1 else self.client_timeout_ms) / 1000

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
    max_tasks_per_batch: int = setting(
        "SPARK_MAX_TASKS_PER_BATCH",
        "Most Spark tasks a micro-batch runs; a task then reads several Kafka partitions, in turn, of about as "
        "many records each. Each task has a fixed cost (≈ 30 ms here), so a topic of many partitions read one "
        "task per partition spends its time starting tasks (README: Performance). 0 = as many as the job has "
        "cores: local mode's threads; on a cluster spark.default.parallelism if set, else the cores its "
        "configuration asks for (spark.executor.instances or spark.dynamicAllocation.maxExecutors times "
        "spark.executor.cores, spark.cores.max) or that have registered as the query starts, and one task per "
        "partition when none of these is known; -1 = one task per partition.",
        0,
        minimum=-1,
    )
    driver_java_options: str = setting(
        "SPARK_DRIVER_JAVA_OPTIONS",
        "JVM options of the Spark driver the job starts (in local mode it runs the tasks too), as "
        "spark.driver.defaultJavaOptions: unless Spark's configuration sets that already, and before "
        "spark.driver.extraJavaOptions, which wins. The default stops the JIT compiler at its first tier: "
        "Python moves the rows here and the JVM only plans, and on a small machine the optimizing tier's "
        "compiler threads cost a fresh job seconds of start-up (README: Performance). Empty = the JVM's defaults.",
        "-XX:TieredStopAtLevel=1",
        empty_ok=True,
    )
    class_archive_dir: str = setting(
        "SPARK_CLASS_ARCHIVE_DIR",
        "Where `firehose-bq jvm-archive` puts the driver JVM's class-data archive and where the job looks for "
        "it: with one, the JVM maps Spark's classes already parsed and verified instead of reading them from "
        "its jars, ≈ 3 s less per start (README: Performance). One archive per JDK and Spark installation, "
        "≈ 170 MB; a job never builds one and starts as before without. `auto` = inside this Python "
        "environment (sys.prefix/var/cache/firehose-bq), beside the Spark jars it is made from; empty = none.",
        "auto",
        empty_ok=True,
    )
    python_fork_server: bool = setting(
        "SPARK_PYTHON_FORK_SERVER",
        "Fork the Python processes Spark starts on the driver (each streaming query's source runner, the "
        "planning and the workers' daemons) from a process the job starts before the JVM, with their imports "
        "done, instead of each importing them afresh while the query waits (README: Performance). Where it "
        "cannot, a process starts as Spark starts it; executors of a cluster always do.",
        True,
    )


def spark_settings(environ: Mapping[str, str]) -> SparkConfig:
    """The Spark settings alone, for what starts no job (`doctor`, `jvm-archive` and its training run): no
    checkpoint is needed. ConfigError lists every problem."""
    problems: list[str] = []
    cfg = load_section(SparkConfig, {"SPARK_CHECKPOINT_LOCATION": "unused", **environ}, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _broker_set(brokers: str) -> frozenset[str]:
    """Bootstrap servers as a set, as written (`localhost` and `127.0.0.1` are not recognised as one)."""
    return frozenset(b.strip().lower() for b in brokers.split(",") if b.strip())


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    kafka_security: KafkaSecurityConfig
    input_schema: InputSchemaConfig
    registry: RegistryConfig
    bigquery: BigQueryConfig
    table: TableConfig
    spark: SparkConfig
    upsert: UpsertConfig
    errors: ErrorPolicyConfig = dataclasses.field(default_factory=ErrorPolicyConfig)
    dlq: DlqConfig = dataclasses.field(default_factory=DlqConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    logs: LogConfig = dataclasses.field(default_factory=LogConfig)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Config:
        """Build the config or raise ConfigError listing every problem at once."""
        problems: list[str] = []
        sections = {name: load_section(section, environ, problems) for name, section in _sections().items()}
        if problems:
            raise ConfigError(problems)
        config = cls(**sections)
        config.validate(environ)
        return config

    def validate(self, environ: Mapping[str, str] | None = None) -> None:
        """Raise ConfigError naming every contradiction; `environ` also has variables read by no section."""
        problems = dlq_security_problems(environ or {}, self.kafka_security, self.dlq_on_kafka)
        if not SPARK_MASTER.fullmatch(self.spark.master):
            # Spark says so only once its JVM runs, in a Py4JJavaError traceback.
            problems.append(f"SPARK_MASTER: {self.spark.master!r} is not a master URL Spark accepts: local, local[N], "
                            "local[*], local[N,F], local-cluster[N,C,M], spark://host:port[,host:port], yarn or "
                            "k8s://https://host:port")
        if self.bigquery.client_timeout_ms == 0:
            problems.append(f"SINK_BIGQUERY_CLIENT_READ_TIMEOUT_MS: must be positive or -1 (the default, "
                            f"{CLIENT_TIMEOUT_MS} ms), got 0: without a timeout a BigQuery that never answers would "
                            "hold a task forever")
        if self.spark.max_offsets_per_trigger == 0:
            problems.append("SPARK_MAX_OFFSETS_PER_TRIGGER: must be positive or -1 (no limit), got 0")
        ns = self.bigquery.metadata_namespace
        if ns and not BQ_NAME.fullmatch(ns):
            problems.append(f"SINK_BIGQUERY_METADATA_NAMESPACE: {ns!r} is not a valid BigQuery column name")
        problems.extend(self._routing_problems())
        if self.input_schema.data_type == "JSON":
            problems.extend(self._json_problems())
        elif bool(self.input_schema.stencil_urls) == bool(self.registry.confluent_url):
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
        if self.bigquery.storage_api_enable and self.bigquery.write_method != "storage_write":
            problems.append("SINK_BIGQUERY_STORAGE_API_ENABLE=true contradicts SINK_BIGQUERY_WRITE_METHOD="
                            f"{self.bigquery.write_method}: choose one write method")
        problems.extend(self.upsert.problems(self.input_schema.key_class))
        problems.extend(self._ignored_problems())
        problems.extend(self.kafka_security.problems())
        problems.extend(self._topic_name_problems())
        problems.extend(p for env, path in (("SINK_BIGQUERY_CREDENTIAL_PATH", self.bigquery.credential_path),
                                            ("SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH",
                                             self.bigquery.file_loads_staging_credential_path),
                                            ("DLQ_GCS_CREDENTIAL_PATH", self.dlq.gcs_credential_path))
                        if (p := key_content_problem(env, path)))
        problems.extend(self._loop_problems())
        extension = "_json" if self.input_schema.data_type == "JSON" else "_native"
        if self.input_schema.decoder == "native" and (why := native_unavailable(extension)):
            problems.append(f"INPUT_SCHEMA_PROTO_DECODER=native: {why}")
        if (self.bigquery.effective_write_method in ("storage_write", "mixed") and self.bigquery.api_endpoint
                and not self.bigquery.storage_api_endpoint):
            problems.append("SINK_BIGQUERY_STORAGE_API_ENDPOINT: required for storage_write when "
                            "SINK_BIGQUERY_API_ENDPOINT points at an emulator (its gRPC host:port)")
        if self.bigquery.effective_write_method in ("file_loads", "mixed"):
            problems.extend(staging_problems(self.bigquery.file_loads_staging_uri, self.spark.checkpoint_location))
        if problems:
            raise ConfigError(problems)

    def _ignored_problems(self) -> list[str]:
        """Settings the rest of the configuration makes the job ignore: whoever set one expects it to act (a
        registry setting without its URL was never asked; a key left unused leaves the caller anonymous, and
        the refusal points at the key's roles). Table layout settings with their switch off are warnings
        instead (`switched_off`)."""
        reg, bq = self.registry, self.bigquery
        needs = [("SCHEMA_REGISTRY_CONFLUENT_SUBJECT", bool(reg.confluent_subject) and not reg.confluent_url,
                  "SCHEMA_REGISTRY_CONFLUENT_URL"),
                 ("SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO", bool(reg.confluent_basic_auth) and not reg.confluent_url,
                  "SCHEMA_REGISTRY_CONFLUENT_URL"),
                 ("SINK_BIGQUERY_TABLE_SCHEMA_FILE", bool(bq.table_schema_file) and self.input_schema.data_type != "JSON",
                  "INPUT_SCHEMA_DATA_TYPE=JSON (a protobuf table's schema comes from the descriptors)")]
        # With an API endpoint the clients send no Google credentials: the emulators take none.
        anonymous = [("SINK_BIGQUERY_CREDENTIAL_PATH", bq.credential_path, "SINK_BIGQUERY_API_ENDPOINT", bq.api_endpoint),
                     ("DLQ_GCS_CREDENTIAL_PATH", self.dlq.gcs_credential_path, "DLQ_GCS_API_ENDPOINT",
                      self.dlq.gcs_api_endpoint),
                     ("SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH", bq.file_loads_staging_credential_path,
                      "SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT", bq.file_loads_staging_gcs_endpoint)]
        return ([f"{env}: only used with {need}; set that too or unset this" for env, alone, need in needs if alone]
                + [f"{env}: not used with {endpoint} set (an emulator's endpoint: its clients send no Google "
                   "credentials); unset one of them" for env, key, endpoint, url in anonymous if key and url])

    def switched_off(self) -> list[str]:
        """Table layout settings whose switch is off: warned about, not refused. Firehose env files often
        carry a partition key or clustering keys and toggle the feature, and its sink ignores them too; but
        a table created without them stays so (BigQuery cannot partition a table later), so say it."""
        t = self.table
        off = [("SINK_BIGQUERY_TABLE_PARTITION_KEY", bool(t.partition_key) and not t.partitioning_enable,
                "SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE"),
               ("SINK_BIGQUERY_TABLE_PARTITION_EXPIRY_MS", t.partition_expiry_ms != -1 and not t.partitioning_enable,
                "SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE"),
               ("SINK_BIGQUERY_TABLE_CLUSTERING_KEYS", bool(t.clustering_keys) and not t.clustering_enable,
                "SINK_BIGQUERY_TABLE_CLUSTERING_ENABLE")]
        return [f"{env} is set but {switch} is not true: a table this job creates has no such layout (and an "
                "existing table keeps its own)" for env, unused, switch in off if unused]

    @property
    def dlq_on_kafka(self) -> bool:
        return self.dlq.enabled and self.dlq.writer_type == KAFKA

    def dlq_security_ignored(self, environ: Mapping[str, str]) -> list[str]:
        """Firehose's DLQ_KAFKA_* security variables in `environ` that the DLQ's protocol does not use: warned
        about, not refused (kafka_security.dlq_security_ignored)."""
        return dlq_security_ignored(environ, self.kafka_security, self.dlq_on_kafka)

    def load_quota_warnings(self) -> list[str]:
        """A file-loads trigger faster than BigQuery's load-job quota allows, for a streaming run (only that
        paces its batches by the trigger: `run --available-now` and `replay-dlq` run theirs back to back
        whatever it says). A short trigger is a fair choice for a backfill or a test that ends within hours,
        so it is not refused; but a job left streaming at it has its loads refused (quotaExceeded) until the
        next day, and stops once its retries run out. Upsert paces its MERGEs by its own interval."""
        bq = self.bigquery
        interval = bq.file_loads_trigger_ms
        if (self.upsert.enabled or bq.effective_write_method not in ("file_loads", "mixed")
                or interval * LOAD_JOBS_PER_TABLE_PER_DAY >= DAY_MS):
            return []
        pace = (f"a load job per table every {interval / 1000:g} s" if interval
                else "a load job per table as soon as the previous batch ends")
        spent = (f"{_hours_minutes(LOAD_JOBS_PER_TABLE_PER_DAY * interval)} of streaming" if interval
                 else f"{LOAD_JOBS_PER_TABLE_PER_DAY:,} batches")
        return [f"SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS={interval} means {pace}, and BigQuery allows "
                f"{LOAD_JOBS_PER_TABLE_PER_DAY:,} a day per table (failed ones included): a table written in every "
                f"batch runs out after {spent}, its loads are then refused until the next day and the job stops. "
                f"{DAY_MS // LOAD_JOBS_PER_TABLE_PER_DAY} ms or more runs all day."]

    def _topic_name_problems(self) -> list[str]:
        """Topic names Kafka refuses: the DLQ and fallback topics are first written when a message fails, so
        the broker would refuse them only then, after the DLQ's retries."""
        topics = [("SOURCE_KAFKA_TOPIC", t) for t in self.source.topics]
        topics += [(env, topic) for env, topic, _ in self.kafka_outputs()]
        return [f"{env}: {topic[:60]!r} is not a Kafka topic name: 1 to 249 of [a-zA-Z0-9._-], not '.' or '..'"
                for env, topic in topics if topic and (not KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."))]

    def _loop_problems(self) -> list[str]:
        """An output topic that is also an input: each letter or unrouted record is the original record, so
        the job would read it back, fail or leave it unrouted the same way, and write it again in every
        batch, forever, while every batch commits."""
        source = _broker_set(self.source.brokers)
        return [f"{env}: {topic!r} is also in SOURCE_KAFKA_TOPIC on the same brokers: the job would read its own "
                "output back and write it again every batch; use a topic of its own"
                for env, topic, brokers in self.kafka_outputs()
                if topic in self.source.topics and _broker_set(brokers) == source]

    def kafka_outputs(self) -> list[tuple[str, str, str]]:
        """(setting, topic, bootstrap servers) of each Kafka topic the job writes records to: the route
        fallback topic and the KAFKA DLQ's, those in use."""
        outputs = []
        if self.bigquery.route_fallback_topic:
            outputs.append(("SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC", self.bigquery.route_fallback_topic,
                            self.source.brokers))
        if self.dlq.enabled and self.dlq.writer_type == KAFKA:
            outputs.append(("DLQ_KAFKA_TOPIC", self.dlq.kafka_topic, self.dlq.kafka_brokers or self.source.brokers))
        return outputs

    def _routing_problems(self) -> list[str]:
        problems = []
        for env, value, table in (("SINK_BIGQUERY_DATASET_NAME", self.bigquery.dataset, False),
                                  ("SINK_BIGQUERY_TABLE_NAME", self.bigquery.table, True)):
            try:
                template = NameTemplate(value, table)
            except TemplateError as exc:
                problems.append(f"{env}: {exc}")
                continue
            # The text around the placeholders must be valid on its own (the values are sanitized).
            static = PLACEHOLDER.sub("x", value)
            if problem := name_problem(static, table):
                problems.append(f"{env}: {problem.replace(repr(static), repr(value))}")
            elif template.is_template and self.upsert.enabled:
                problems.append(f"{env}: a template routes records to several tables, which upsert/delete "
                                "(one destination and its intermediate table) does not support")
        try:
            routes = parse_class_routes(self.input_schema.class_routes)
        except ValueError as exc:
            problems.append(f"INPUT_SCHEMA_PROTO_CLASS_ROUTES: {exc}")
            routes = ()
        ins = self.input_schema
        if bool(routes) != bool(ins.class_header):
            problems.append("INPUT_SCHEMA_PROTO_CLASS_HEADER / INPUT_SCHEMA_PROTO_CLASS_ROUTES: set both or neither")
        elif routes and not PLACEHOLDER.search(self.bigquery.table) and len({m for _, m in routes}) > 1:
            problems.append("SINK_BIGQUERY_TABLE_NAME: several message classes need a table each: make it a template "
                            f"(e.g. `${{header.{ins.class_header}}}`)")
        if not ins.proto_class and not routes and ins.data_type == "PROTOBUF":
            problems.append("INPUT_SCHEMA_PROTO_CLASS: required (the message class of the topic's values)")
        if routes and self.upsert.enabled:
            problems.append("INPUT_SCHEMA_PROTO_CLASS_ROUTES: class routing is not supported with upsert/delete")
        if self.bigquery.mixed_streaming_tables and self.bigquery.write_method != "mixed":
            problems.append("SINK_BIGQUERY_MIXED_STREAMING_TABLES: only used with SINK_BIGQUERY_WRITE_METHOD=mixed")
        for entry in self.bigquery.mixed_streaming_tables:
            try:
                NameTemplate(entry, table=True)
            except TemplateError as exc:
                problems.append(f"SINK_BIGQUERY_MIXED_STREAMING_TABLES: {exc}")
        return problems

    def _json_problems(self) -> list[str]:
        ins, problems = self.input_schema, []
        for env, value in (("INPUT_SCHEMA_PROTO_CLASS", ins.proto_class),
                           ("INPUT_SCHEMA_PROTO_CLASS_ROUTES", ins.class_routes),
                           ("INPUT_SCHEMA_PROTO_KEY_CLASS", ins.key_class),
                           ("SCHEMA_REGISTRY_STENCIL_URLS", ins.stencil_urls),
                           ("SCHEMA_REGISTRY_CONFLUENT_URL", self.registry.confluent_url)):
            if value:
                problems.append(f"{env}: protobuf only; with INPUT_SCHEMA_DATA_TYPE=JSON the table's schema is the "
                                "schema")
        if self.upsert.enabled:
            problems.append("SINK_BIGQUERY_UPSERT_ENABLED: upsert/delete needs protobuf keys, not JSON input")
        return problems

    @property
    def router(self) -> Router:
        """Where each record goes: the dataset/table templates and the class route map."""
        bq, ins = self.bigquery, self.input_schema
        default_class = ins.proto_class or None if ins.data_type == "PROTOBUF" else None
        streaming = (tuple(NameTemplate(t, table=True) for t in bq.mixed_streaming_tables)
                     if bq.write_method == "mixed" else None)
        return Router(NameTemplate(bq.dataset), NameTemplate(bq.table, table=True), default_class,
                      ins.class_header or None, parse_class_routes(ins.class_routes), streaming, bq.max_destinations,
                      bq.concurrent_table_writes)

    @property
    def confluent_subject(self) -> str:
        return self.registry.confluent_subject or f"{self.source.topics[0]}-value"

    def secret_values(self) -> list[str]:
        """The values of the settings typed `Secret`, for a `Redactor` to mask wherever they would show."""
        sections = (getattr(self, f.name) for f in dataclasses.fields(self))
        return [value.reveal() for section in sections for f in dataclasses.fields(section)
                if isinstance(value := getattr(section, f.name), Secret)]

    def public_dict(self) -> dict[str, Any]:
        """Settings for logs: credential paths are shown; secret values are `Secret`s, shown redacted, and
        URLs lose their credentials (a registry URL may carry a password or a token)."""
        return _without_url_credentials(dataclasses.asdict(self))


BQ_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,299}")
KAFKA_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's own rule (org.apache.kafka.common.internals.Topic)
# The master URLs SparkContext.createTaskScheduler parses (its regexes), and the cluster managers it ships.
SPARK_MASTER = re.compile(r"local(\[([0-9]+|\*)(\s*,\s*[0-9]+)?\])?|local-cluster\[\s*[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\s*\]"
                          r"|spark://.+|yarn|k8s://.+")
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
    """File loads stage in Cloud Storage or in a directory that every process of the job shares."""
    if staging_uri.startswith(GCS_SCHEME):
        try:
            gcs_location(staging_uri)
        except ValueError as exc:
            return [f"SINK_BIGQUERY_FILE_LOADS_STAGING_URI: {exc}"]
    elif staging_uri:
        if _remote(staging_uri):
            return [f"SINK_BIGQUERY_FILE_LOADS_STAGING_URI: {staging_uri!r}: use gs://bucket/prefix or a directory "
                    "that the driver and every executor share"]
    elif _remote(checkpoint_location):
        # The staging default lives under the checkpoint, which Spark may keep where this job cannot stage
        # (hdfs://, s3a://); an explicit location says where the objects go and who may read them.
        return [f"SINK_BIGQUERY_FILE_LOADS_STAGING_URI: required with file loads when SPARK_CHECKPOINT_LOCATION "
                f"({checkpoint_location}) is not a local directory: set gs://bucket/prefix"]
    return []


def _remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _without_url_credentials(value: Any) -> Any:
    if isinstance(value, str):
        return redact.urls_in(value)
    if isinstance(value, dict):
        return {k: _without_url_credentials(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_without_url_credentials(v) for v in value)
    return value


def secret_settings() -> tuple[str, ...]:
    """Env names of the job's settings typed `Secret`: their values are masked in every log line and error."""
    names = []
    for section in _sections().values():
        hints = typing.get_type_hints(section)
        names.extend(f.metadata["env"] for f in dataclasses.fields(section)
                     if Secret in (hints[f.name], *typing.get_args(hints[f.name])))
    names.extend(dlq for dlq, source in DLQ_SECURITY_ENVS.items() if source in names)
    # Firehose's store passwords are not read, yet a Firehose env file sets them: masked all the same.
    names.extend(name for name in FIREHOSE_UNREAD if name.endswith("_PASSWORD"))
    return tuple(names)


def _sections() -> dict[str, type]:
    return dict(typing.get_type_hints(Config))


def reference(sections: tuple[type, ...] | None = None) -> list[SettingDoc]:
    """Every setting (the job's by default) in declaration order."""
    return _reference(sections or tuple(_sections().values()))


def reference_markdown(sections: tuple[type, ...] | None = None) -> str:
    return _reference_markdown(sections or tuple(_sections().values()))


# Firehose's variables this job knows and does not read, each with why (the DLQ producer's and the source's).
FIREHOSE_UNREAD = {**SOURCE_UNREAD, **DLQ_UNREAD}


def _hours_minutes(ms: int) -> str:
    """`ms` as "23 h 59 min", "25 min" or "1 s", rounded down: a time that runs out is never overstated (23.99 h
    rounded to "24.0 h" said a trigger that is warned about runs all day)."""
    minutes, seconds = divmod(ms // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min" if minutes else f"{seconds} s"


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Set variables under this sink's prefixes that no setting reads (probably typos); not Firehose's own
    that this job knows it does not read (`firehose_unread`)."""
    known = _known_names() | set(FIREHOSE_UNREAD)
    return sorted(k for k in environ if k.startswith(OWNED_PREFIXES) and k not in known)


def firehose_unread(environ: Mapping[str, str]) -> list[str]:
    """Firehose's variables set in `environ` that this job does not read, each with why."""
    return [f"{name} is set but is {why}" for name, why in FIREHOSE_UNREAD.items() if name in environ]


def resembling_setting(name: str) -> str | None:
    """The setting `name` is most likely a misspelling of (a letter off, a word swapped), if one is close."""
    close = difflib.get_close_matches(name, sorted(_known_names()), n=1, cutoff=0.9)
    return close[0] if close else None


def _known_names() -> set[str]:
    # Firehose's DLQ security variables are read too: each must match the source's (dlq_security_problems).
    return {name for d in reference() for name in (d.env, *d.formerly)} | set(DLQ_SECURITY_ENVS)
