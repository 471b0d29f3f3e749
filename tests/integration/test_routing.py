"""Routing by attributes (seed 004) on the real local stack: one topic, three event types, three tables,
the unrouted ones on the fallback topic, and the mixed output mode."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from google.cloud import bigquery

from firehose_bq import sample
from firehose_bq.config import Config
from firehose_bq.dlq.replay import KafkaDlqSource, replay
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from firehose_bq.sink_schema import load_descriptors
from tests.integration.test_dead_letters import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

COUNT = 300  # 294 routed (98 of each type) and 6 of a type no route names
TABLES = {"ride.requested": "ride_requested", "ride.completed": "ride_completed",
          "payment.captured": "payment_captured"}


def routed_env(job_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "", "INPUT_SCHEMA_PROTO_CLASS_HEADER": "ce_type",
            "INPUT_SCHEMA_PROTO_CLASS_ROUTES": ",".join(f"{t}=firehose.example.v1.{m}"
                                                        for t, m in sample.EVENT_TYPES.items()),
            "SINK_BIGQUERY_TABLE_NAME": "${header.ce_type}",
            "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": f"unrouted-{uuid.uuid4().hex[:8]}", **extra}


def produce_events(cfg: Config, count: int = COUNT) -> None:
    pool = load_descriptors(cfg)
    classes = {short: pool.message_class(f"firehose.example.v1.{short}") for short in sample.EVENT_TYPES.values()}
    sample.ensure_topic(cfg.source.brokers, cfg.source.topics[0], 2)
    sample.ensure_topic(cfg.source.brokers, cfg.bigquery.route_fallback_topic, 1)
    sample.produce(cfg.source.brokers, cfg.source.topics[0], sample.event_messages(classes), count, progress=False)


def per_table(count: int = COUNT) -> dict[str, int]:
    """How many of the first `count` sample events each table gets."""
    return {table: sum(1 for i in range(count) if TABLES.get(sample.event_type(i)) == table)
            for table in TABLES.values()}


def landed(client: bigquery.Client, cfg: Config, table: str, column: str) -> Counter[str]:
    return Counter(r[0] for r in client.query(f"SELECT {column} FROM `{cfg.bigquery.project_id}."
                                              f"{cfg.bigquery.dataset}.{table}`").result())


def landed_events(client: bigquery.Client, cfg: Config) -> dict[str, int]:
    return {table: sum(landed(client, cfg, table, "message_offset").values()) for table in TABLES.values()}


def test_three_event_types_land_in_their_own_tables_and_unrouted_ones_on_the_fallback(
        spark, job_env: dict[str, str], bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(routed_env(job_env))
    produce_events(cfg)
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        t = summary.totals
        unrouted = [i for i in range(COUNT) if sample.event_type(i) == sample.UNROUTED_TYPE]
        assert (t.messages, t.rows_written, t.fallback, t.dead_lettered, t.failed) == (
            COUNT, COUNT - len(unrouted), len(unrouted), 0, 0)
        # Each table was created from its own class: its columns are that message's.
        columns = {table: {f.name for f in bq_client.get_table(f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}."
                                                               f"{table}").schema} for table in TABLES.values()}
        assert {"fare", "duration", "tags"} <= columns["ride_completed"] and "fare" not in columns["ride_requested"]
        assert {"payment_id", "metadata", "message_offset"} <= columns["payment_captured"]
        assert landed_events(bq_client, cfg) == per_table()
        assert {name: c["written"] for name, c in t.tables.items()} == {
            f"{cfg.bigquery.dataset}.{table}": n for table, n in per_table().items()}
        # Nothing else lost: the unrouted records are on the fallback topic, untouched, saying why.
        letters = read_topic(cfg.source.brokers, cfg.bigquery.route_fallback_topic)
        assert sorted(dict(x.headers)["ce_id"] for x in letters) == sorted(f"evt-{i}".encode() for i in unrouted)
        assert {x.error.error_type for x in letters} == {ErrorType.ROUTING_ERROR}
        assert all(dict(x.headers)["ce_type"] == sample.UNROUTED_TYPE.encode() for x in letters)
        assert "'ride.rated' names no message class" in letters[0].error.message
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_unrouted_records_replay_once_a_route_exists(spark, job_env: dict[str, str],
                                                     bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(routed_env(job_env))
    produce_events(cfg, 100)
    try:
        Pipeline(cfg, spark).run(available_now=True)
        # The route for the new type is added (into the RideRequested class it shares the shape of).
        fixed = Config.from_env(routed_env(job_env, SOURCE_KAFKA_TOPIC=cfg.source.topics[0],
                                           SINK_BIGQUERY_DATASET_NAME=cfg.bigquery.dataset,
                                           SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC=cfg.bigquery.route_fallback_topic,
                                           INPUT_SCHEMA_PROTO_CLASS_ROUTES=cfg.input_schema.class_routes +
                                           f",{sample.UNROUTED_TYPE}=firehose.example.v1.RideRequested"))
        source = KafkaDlqSource(fixed.source.brokers, fixed.bigquery.route_fallback_topic, "replay-unrouted", None)
        try:
            again = replay(fixed, source)
        finally:
            source.close()
        assert (again.stats.messages, again.stats.rows_written) == (2, 2)
        rated = landed(bq_client, fixed, "ride_rated", "message_offset")
        assert sum(rated.values()) == 2  # at their original coordinates, once
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_mixed_mode_streams_the_opted_in_table_and_loads_the_others(spark, job_env: dict[str, str],
                                                                    bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(routed_env(job_env, SINK_BIGQUERY_WRITE_METHOD="mixed",
                                     SINK_BIGQUERY_MIXED_STREAMING_TABLES="payment_captured",
                                     SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0"))
    produce_events(cfg)
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.totals.failed == 0 and summary.totals.fallback == 6
        assert landed_events(bq_client, cfg) == per_table()
        jobs = [j for j in bq_client.list_jobs(all_users=True) if getattr(j, "job_type", "") == "load"
                and j.destination is not None and j.destination.dataset_id == cfg.bigquery.dataset]
        # One load job per loaded table per batch (one batch here); the streamed table has none.
        assert sorted(j.destination.table_id for j in jobs) == ["ride_completed", "ride_requested"]
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_table_names_with_dashes_are_streamed_and_loaded_as_named(spark, job_env: dict[str, str],
                                                                   bq_client: bigquery.Client) -> None:
    """BigQuery's table names may hold dashes: the job's own text keeps them (a value's never do), on the
    Storage Write and the load-job paths alike."""
    cfg = Config.from_env(routed_env(job_env, SINK_BIGQUERY_TABLE_NAME="ev-${header.ce_type}",
                                     SINK_BIGQUERY_WRITE_METHOD="mixed",
                                     SINK_BIGQUERY_MIXED_STREAMING_TABLES="ev-payment_captured",
                                     SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0"))
    produce_events(cfg, 60)
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.totals.failed == 0 and summary.totals.dead_lettered == 0
        got = {table: sum(landed(bq_client, cfg, f"ev-{table}", "message_offset").values())
               for table in TABLES.values()}
        assert got == per_table(60)
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_routed_table_deleted_between_batches_is_created_again(spark, job_env: dict[str, str],
                                                                 bq_client: bigquery.Client) -> None:
    """The Python workers keep their tables' checks for SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS (sink_schema
    CheckedTables) instead of checking in every task: a table deleted under the job meets a write that trusted
    such a check, which checks again (creating the table) and writes its rows, as a check of its own would
    have, instead of stopping the job."""
    cfg = Config.from_env(routed_env(job_env))
    produce_events(cfg)
    try:
        Pipeline(cfg, spark).run(available_now=True)
        assert landed_events(bq_client, cfg) == per_table()
        bq_client.delete_table(f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.ride_completed")
        produce_events(cfg)
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.failure is None and summary.totals.failed == 0
        expected = {table: 2 * n for table, n in per_table().items()}
        expected["ride_completed"] = per_table()["ride_completed"]  # the second run's, in the table made again
        assert landed_events(bq_client, cfg) == expected
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
