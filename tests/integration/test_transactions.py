"""Transactional producers through the whole job (Spark, the real broker, the BigQuery emulator), over both
reader clients: an aborted transaction's records never land, and a transaction left open neither stalls
an `--available-now` run nor lands before it commits. The reader-level cases: test_source_reader.py."""

from __future__ import annotations

import time
import uuid

import pytest
from google.cloud import bigquery

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from tests.integration.test_end_to_end import produce_bookings, read_table

pytestmark = pytest.mark.integration

# Far below the default (120 s): a run that waits on the open transaction fails fast, not after minutes.
STALL_TIMEOUT_MS = 10_000


def send_in_transaction(cfg: Config, producer, numbers: range, partition: int) -> None:  # noqa: ANN001
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    make = sample.booking_messages(cls)
    producer.begin_transaction()
    for i in numbers:
        key, value, _ = make(i)
        producer.produce(cfg.source.topics[0], key=key, value=value, partition=partition)
    producer.flush(30)


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_only_committed_transactions_land_and_an_open_one_waits_for_the_next_run(
        spark, job_env: dict[str, str], bq_client: bigquery.Client, client: str) -> None:
    from confluent_kafka import Producer

    cfg = Config.from_env({**job_env, "SOURCE_KAFKA_CLIENT": client,
                           "SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS": str(STALL_TIMEOUT_MS)})
    try:
        produce_bookings(cfg, 20)  # 3 partitions
        producer = Producer({"bootstrap.servers": cfg.source.brokers, "transactional.id": f"tx-{uuid.uuid4().hex}"})
        producer.init_transactions(30)
        send_in_transaction(cfg, producer, range(20, 30), partition=0)
        producer.abort_transaction(30)
        send_in_transaction(cfg, producer, range(30, 40), partition=1)  # left open
        produce_bookings(cfg, 5, start=40)  # plain records, some behind the open transaction on partition 1

        started = time.monotonic()
        first = Pipeline(cfg, spark).run(available_now=True)
        seconds = time.monotonic() - started

        landed = {r["order_number"] for r in read_table(bq_client, cfg)}
        assert not landed & {f"ORD-{i:08d}" for i in range(20, 40)}  # neither aborted nor open ones
        assert {f"ORD-{i:08d}" for i in range(20)} <= landed
        assert first.totals.failed == 0 and first.totals.messages == len(landed)
        assert seconds < STALL_TIMEOUT_MS / 1000, f"the run took {seconds:.1f} s: it waited on the transaction"

        producer.commit_transaction(30)
        second = Pipeline(cfg, spark).run(available_now=True)

        rows = read_table(bq_client, cfg)
        expected = {f"ORD-{i:08d}" for i in (*range(20), *range(30, 45))}
        assert sorted(r["order_number"] for r in rows) == sorted(expected)  # each once, no aborted one
        assert second.totals.messages == len(expected) - first.totals.messages
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
