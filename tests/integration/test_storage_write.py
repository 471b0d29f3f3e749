"""Kafka → Spark → BigQuery through the Storage Write API (SINK_BIGQUERY_WRITE_METHOD=storage_write),
on the real local stack: rows read back through google-cloud-bigquery, compared field by field."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.errors import BatchFailedError, FirehoseError
from firehose_bq.pipeline import Pipeline
from tests.integration.test_end_to_end import assert_sample_landed, produce_bookings, read_table

pytestmark = pytest.mark.integration

COUNT = 300


@pytest.fixture
def storage_env(job_env: dict[str, str], bq_client: bigquery.Client) -> Iterator[dict[str, str]]:
    env = {**job_env, "SINK_BIGQUERY_WRITE_METHOD": "storage_write"}
    yield env
    bq_client.delete_dataset(env["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)


def booking_class(cfg: Config):  # noqa: ANN201
    return descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)


def test_sample_stream_lands_exactly_through_storage_write(spark, storage_env: dict[str, str],
                                                           bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(storage_env)
    assert cfg.bigquery.effective_write_method == "storage_write"
    produce_bookings(cfg, COUNT)
    started = datetime.now(UTC)

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (COUNT, COUNT, 0)
    assert_sample_landed(bq_client, cfg, COUNT, started, datetime.now(UTC))


def test_a_row_the_table_cannot_take_fails_alone_and_the_rest_of_its_request_lands(
    spark, storage_env: dict[str, str], bq_client: bigquery.Client
) -> None:
    cfg = Config.from_env(storage_env)
    cls = booking_class(cfg)
    sample.ensure_topic(cfg.source.brokers, cfg.source.topics[0], 1)  # one partition: one task, one request
    produce_bookings(cfg, 10)
    bad = sample.booking(10, cls)
    bad.created_at.seconds = 300_000_000_000  # year 11476: a Timestamp proto holds it, a TIMESTAMP does not
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    producer.send(cfg.source.topics[0], value=bad.SerializeToString(), partition=0).get(timeout=10)
    producer.close()
    produce_bookings(cfg, 5, start=11)

    with pytest.raises(BatchFailedError) as failed:
        Pipeline(cfg, spark).run(available_now=True)

    assert failed.value.total == 1
    (error,) = failed.value.errors
    assert (error.error_type.value, error.topic, error.partition, error.offset) == (
        "INVALID_MESSAGE_ERROR", cfg.source.topics[0], 0, 10)
    # Refused by the decoder, never clamped (the emulator would store it and break every query of the
    # table; real BigQuery would reject the whole request): the row fails alone, the others land. What the
    # writer itself refuses before an append is tests/integration/test_writers.py's subject.
    assert "outside 0001-01-01..9999-12-31" in error.message
    landed = sorted(r["order_number"] for r in read_table(bq_client, cfg))
    assert landed == [f"ORD-{i:08d}" for i in range(16) if i != 10]


def test_a_missing_table_stops_the_job_with_a_classified_reason(spark, storage_env: dict[str, str],
                                                                bq_client: bigquery.Client) -> None:
    cfg = Config.from_env(storage_env)
    produce_bookings(cfg, 10)
    pipeline = Pipeline(cfg, spark)
    pipeline.prepare()
    bq_client.delete_table(cfg.bigquery.table_ref)  # gone between start-up and the first write

    with pytest.raises(FirehoseError) as failed:
        pipeline.run(available_now=True)

    text = str(failed.value)
    assert text.startswith("batch 0 stopped, offsets not committed: SINK_4XX_ERROR: "), text
    assert cfg.bigquery.table_ref in text
