"""Settings of the local development stack (`firehose-bq stack ...`): never read by a production job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from firehose_bq.errors import ConfigError
from firehose_bq.settings import load_section, setting


@dataclass(frozen=True)
class StackConfig:
    state_dir: str = setting(
        "FIREHOSE_STACK_DIR", "Where the local stack keeps PIDs, logs and the broker's data.", ".stack"
    )
    tools_dir: str = setting(
        "FIREHOSE_STACK_TOOLS_DIR",
        "Where the broker's and emulators' venvs are installed once and reused; empty = "
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
    gcs_port: int = setting("FIREHOSE_STACK_GCS_PORT", "Port of the Cloud Storage emulator (JSON API).", 19023,
                            minimum=1, maximum=65535)
    gcs_bucket: str = setting(
        "FIREHOSE_STACK_GCS_BUCKET", "Bucket the Cloud Storage emulator creates at start.", "firehose-local"
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
