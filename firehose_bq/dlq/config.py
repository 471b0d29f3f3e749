"""DLQ settings (Firehose's names where Firehose has them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from firehose_bq.blobstore import GcsOptions
from firehose_bq.errors import ConfigError
from firehose_bq.retrying import Backoff
from firehose_bq.settings import setting
from firehose_bq.source.kafka_security import KafkaSecurityConfig, java_store_variables

KAFKA, BLOB, LOG = "KAFKA", "BLOB", "LOG"
LOCAL, GCS = "LOCAL", "GCS"
# The longest wait between two attempts of a DLQ write.
MAX_BACKOFF_S = 30.0
# Firehose's DLQ producer settings this job has no use for, and why: a Firehose env file carries them (often
# at Firehose's defaults), and "no setting reads it (typo?)" would send its operator hunting for a misspelling,
# or (DLQ_KAFKA_SSL_KEYSTORE_PASSWORD) to the key's password, which is another secret.
_PRODUCER_TUNING = ("Firehose's DLQ producer tuning, not read: the DLQ producer sends each batch's letters and "
                    "waits for them (retried per DLQ_RETRY_*)")
_JAVA_STORE = ("Firehose's DLQ key or trust store setting, not read: the DLQ producer uses the source's PEM "
               "files (Secured Kafka in README.md)")
FIREHOSE_UNREAD = {
    "DLQ_KAFKA_RETRIES": _PRODUCER_TUNING, "DLQ_KAFKA_BATCH_SIZE": _PRODUCER_TUNING,
    "DLQ_KAFKA_LINGER_MS": _PRODUCER_TUNING, "DLQ_KAFKA_BUFFER_MEMORY": _PRODUCER_TUNING,
    "DLQ_KAFKA_KEY_SERIALIZER": "not read: a dead letter keeps the original key's bytes",
    "DLQ_KAFKA_VALUE_SERIALIZER": "not read: a dead letter keeps the original value's bytes",
    **java_store_variables("DLQ_KAFKA_", _JAVA_STORE),
}


@dataclass(frozen=True)
class DlqConfig:
    enabled: bool = setting(
        "DLQ_SINK_ENABLE",
        "Send messages whose error type is in ERROR_TYPES_FOR_DLQ to the dead-letter queue; false = such "
        "messages stop the job (never dropped).",
        False,
    )
    writer_type: str = setting(
        "DLQ_WRITER_TYPE",
        "KAFKA: the original record plus error headers to DLQ_KAFKA_TOPIC; BLOB: JSON lines (base64 payload, "
        "full error) under `topic/yyyy-mm-dd/uuid.jsonl`; LOG: one structured log line per message (the "
        "payload is not kept: only for streams whose bad messages may be lost). The default keeps the "
        "messages (Firehose's is LOG).",
        KAFKA,
        choices=(KAFKA, BLOB, LOG),
    )
    retry_max_attempts: int = setting(
        "DLQ_RETRY_MAX_ATTEMPTS",
        "Attempts of one DLQ write, within DLQ_RETRY_DEADLINE_MS of the first; when either runs out the job "
        "stops and offsets are not committed.",
        10,
        minimum=1,
    )
    retry_backoff_ms: int = setting(
        "DLQ_RETRY_BACKOFF_MS", "Wait before the first retry of a DLQ write; doubles per retry, at most 30 s.",
        500, minimum=0,
    )
    retry_deadline_ms: int = setting(
        "DLQ_RETRY_DEADLINE_MS",
        "How long a failed DLQ write is retried, from its first attempt. Each attempt waits at most 40 s for "
        "the DLQ (Kafka: 10 s to connect, 30 s to deliver; GCS: 30 s per object), so a dead DLQ holds a task "
        "at most this plus 40 s (under 3 minutes with the defaults, whose attempts would wait 121.5 s).",
        120_000, minimum=0,
    )
    kafka_brokers: str = setting(
        "DLQ_KAFKA_BROKERS", "Bootstrap servers of the DLQ topic; empty = SOURCE_KAFKA_BROKERS.", ""
    )
    kafka_topic: str = setting(
        "DLQ_KAFKA_TOPIC",
        "DLQ topic (KAFKA writer). Not created by the job: it must exist, or the brokers create topics on first "
        "use (checked at start).",
        "firehose-retry-topic",
    )
    kafka_acks: str = setting(
        "DLQ_KAFKA_ACKS",
        "Producer acks of the DLQ writer. all: a letter counts as written once every in-sync replica has it; "
        "1: once the leader has it (a leader lost right after can lose letters whose source offsets are "
        "committed); 0: as soon as it is sent (letters can be lost without an error). Anything but all gives up "
        "the guarantee that every message ends in the table or the DLQ. -1 is Kafka's other name for all.",
        "all", choices=("all", "-1", "1", "0")
    )
    blob_storage_type: str = setting(
        "DLQ_BLOB_STORAGE_TYPE", "Where BLOB files go: a LOCAL directory or a GCS bucket.", LOCAL,
        choices=(LOCAL, GCS),
    )
    blob_local_directory: str = setting(
        "DLQ_BLOB_LOCAL_DIRECTORY", "Directory of the BLOB writer with DLQ_BLOB_STORAGE_TYPE=LOCAL.", ""
    )
    gcs_bucket: str = setting("DLQ_GCS_BUCKET_NAME", "Bucket of the BLOB writer with DLQ_BLOB_STORAGE_TYPE=GCS.", "")
    gcs_prefix: str = setting("DLQ_GCS_PREFIX", "Object name prefix inside DLQ_GCS_BUCKET_NAME.", "")
    gcs_project: str | None = setting(
        "DLQ_GCS_GOOGLE_CLOUD_PROJECT_ID",
        "Project the Cloud Storage client bills requests to; unset = the credentials' project.", None,
    )
    gcs_credential_path: str | None = setting(
        "DLQ_GCS_CREDENTIAL_PATH",
        "Service-account JSON key for DLQ_GCS_BUCKET_NAME; unset = Application Default Credentials.", None,
    )
    gcs_api_endpoint: str | None = setting(
        "DLQ_GCS_API_ENDPOINT",
        "Cloud Storage JSON API endpoint, e.g. the local emulator `http://127.0.0.1:19023` (anonymous "
        "credentials; `firehose-bq stack status --env` prints it); unset = real Cloud Storage.",
        None,
    )

    # Not a setting: the source's (with_brokers). The DLQ topic is on the source's brokers unless
    # DLQ_KAFKA_BROKERS says otherwise, and those are reached with the same security settings.
    kafka_security: KafkaSecurityConfig = dataclasses.field(default_factory=KafkaSecurityConfig)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if self.writer_type == BLOB and self.blob_storage_type == LOCAL and not self.blob_local_directory:
            raise ConfigError(["DLQ_BLOB_LOCAL_DIRECTORY: required with DLQ_WRITER_TYPE=BLOB and "
                               "DLQ_BLOB_STORAGE_TYPE=LOCAL"])
        if self.writer_type == BLOB and self.blob_storage_type == GCS and not self.gcs_bucket:
            raise ConfigError(["DLQ_GCS_BUCKET_NAME: required with DLQ_WRITER_TYPE=BLOB and DLQ_BLOB_STORAGE_TYPE=GCS"])

    def backoff(self) -> Backoff:
        """How a failed DLQ write is retried."""
        return Backoff(self.retry_max_attempts, self.retry_backoff_ms / 1000, 2, MAX_BACKOFF_S,
                       self.retry_deadline_ms / 1000)

    def blob_location(self) -> str:
        """Root of the BLOB writer's files: the local directory or `gs://bucket/prefix`."""
        if self.blob_storage_type == GCS:
            return f"gs://{self.gcs_bucket}/{self.gcs_prefix.strip('/')}"
        return self.blob_local_directory

    def gcs_options(self) -> GcsOptions:
        return GcsOptions(self.gcs_api_endpoint, self.gcs_credential_path, self.gcs_project, "DLQ_GCS_CREDENTIAL_PATH")

    def with_brokers(self, source_brokers: str, security: KafkaSecurityConfig) -> DlqConfig:
        """This config with DLQ_KAFKA_BROKERS filled in from the source when unset, and the source's Kafka
        security settings."""
        return dataclasses.replace(self, kafka_brokers=self.kafka_brokers or source_brokers, kafka_security=security)
