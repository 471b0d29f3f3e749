"""The upsert/delete settings (kafka-connect-bigquery's names, in Firehose's env style) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from firehose_bq.settings import setting


@dataclass(frozen=True)
class UpsertConfig:
    upsert_enabled: bool = setting(
        "SINK_BIGQUERY_UPSERT_ENABLED",
        "Treat the topic as a changelog keyed by the Kafka key: the table holds the latest value per key. "
        "Rows go to an intermediate table and reach the table by MERGE; needs INPUT_SCHEMA_PROTO_KEY_CLASS.",
        False,
    )
    delete_enabled: bool = setting(
        "SINK_BIGQUERY_DELETE_ENABLED",
        "A record with a null value (a tombstone) deletes its key's rows from the table (by MERGE, as upsert).",
        False,
    )
    merge_interval_ms: int = setting(
        "SINK_BIGQUERY_MERGE_INTERVAL_MS",
        "With upsert/delete: how often a merge flush runs (it is the micro-batch trigger interval; every "
        "micro-batch ends with its merge); -1 = no time-based flushes (SPARK_TRIGGER_INTERVAL_MS applies).",
        60_000,
        minimum=-1,
    )
    merge_records_threshold: int = setting(
        "SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD",
        "With upsert/delete: most records per merge flush (bounds each micro-batch, in place of "
        "SPARK_MAX_OFFSETS_PER_TRIGGER); -1 = no record-count bound.",
        -1,
        minimum=-1,
    )
    intermediate_table_suffix: str = setting(
        "SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX",
        "Intermediate tables are named `{table}_{suffix}_{task}_{uuid}_{epoch ms}`; one per run, dropped at a "
        "clean shutdown (`firehose-bq upsert cleanup` lists and drops those a crash left behind).",
        "tmp",
    )
    kafka_key_field_name: str | None = setting(
        "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME",
        "RECORD column holding the Kafka key, which MERGE matches rows on; required with upsert/delete.",
        None,
    )

    @property
    def enabled(self) -> bool:
        return self.upsert_enabled or self.delete_enabled

    def problems(self, key_class: str | None) -> list[str]:
        """What is wrong with these settings, given the configured key message (empty = fine)."""
        # Imported here: the SQL module validates names the same way the queries do.
        from firehose_bq.upsert.sql import IdentifierError, check_identifier

        if not self.enabled:
            return []
        problems = []
        switch = "SINK_BIGQUERY_UPSERT_ENABLED / SINK_BIGQUERY_DELETE_ENABLED"
        if not self.kafka_key_field_name:
            problems.append(f"SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME: required when {switch} is on (the key column)")
        if not key_class:
            problems.append(f"INPUT_SCHEMA_PROTO_KEY_CLASS: required when {switch} is on (the key's message)")
        if self.merge_interval_ms == 0:
            problems.append("SINK_BIGQUERY_MERGE_INTERVAL_MS: must be positive or -1 (no time-based flushes), got 0")
        if self.merge_records_threshold == 0:
            problems.append("SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD: must be positive or -1 (no bound), got 0")
        for env, name in (("SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME", self.kafka_key_field_name),
                          ("SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX", self.intermediate_table_suffix)):
            if name:
                try:
                    check_identifier(name)
                except IdentifierError as exc:
                    problems.append(f"{env}: {exc}")
        return problems
