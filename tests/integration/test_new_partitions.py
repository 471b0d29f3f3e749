"""Partitions added to the topic while the job runs, on the real broker: where the job starts reading them,
and what it does when retention deleted records it planned to read."""

from __future__ import annotations

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.errors import BatchFailedError, FirehoseError
from firehose_bq.pipeline import Pipeline
from tests.integration.test_end_to_end import delete_records, read_table

pytestmark = pytest.mark.integration


def add_partitions(brokers: str, topic: str, total: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": brokers})  # kept while its futures are awaited
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(30)


def send(cfg: Config, partition: int, bookings: range, bad: bool = False) -> None:
    """Sample bookings into one partition, in order; `bad`: then one value that is no Booking."""
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)  # a new one sees the partitions added
    try:
        for i in bookings:
            producer.send(cfg.source.topics[0], value=sample.booking(i, cls).SerializeToString(), partition=partition)
        if bad:
            producer.send(cfg.source.topics[0], value=b"\x0a\x05ab", partition=partition)
        producer.flush(30)
    finally:
        producer.close()


def order_numbers(client: bigquery.Client, cfg: Config) -> set[str]:
    return {row["order_number"] for row in read_table(client, cfg)}


@pytest.fixture
def one_partition(job_env: dict[str, str], bq_client: bigquery.Client):  # noqa: ANN201
    """A topic of one partition with bookings 0-9 in it, read to its end by a first run."""
    cfg = Config.from_env({**job_env, "SINK_BIGQUERY_WRITE_METHOD": "file_loads"})
    sample.ensure_topic(cfg.source.brokers, cfg.source.topics[0], 1)
    send(cfg, 0, range(10))
    yield cfg
    bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_replayed_batch_reads_a_new_partition_from_its_planned_start_or_stops(
        spark, one_partition: Config, job_env: dict[str, str], bq_client: bigquery.Client) -> None:  # noqa: ANN001
    """A batch that first includes a partition fails; retention then deletes the partition's first records.
    Its replay must ask for the offsets it planned and stop on their deletion, not quietly start later."""
    cfg = one_partition
    brokers, topic = cfg.source.brokers, cfg.source.topics[0]
    assert Pipeline(cfg, spark).run(available_now=True).totals.rows_written == 10
    add_partitions(brokers, topic, 2)
    send(cfg, 1, range(10, 20), bad=True)  # offsets 0-9, then the bad one at 10
    with pytest.raises(BatchFailedError, match="DESERIALIZATION_ERROR"):
        Pipeline(cfg, spark).run(available_now=True)  # planned [0, 11) of partition 1; nothing committed
    delete_records(brokers, topic, 1, 3)

    # The bad message would now go to the DLQ: the replay would complete, had it started after the gap.
    dead_lettering = Config.from_env({**job_env, "SINK_BIGQUERY_WRITE_METHOD": "file_loads",
                                      "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "LOG"})
    with pytest.raises(FirehoseError) as stopped:
        Pipeline(dead_lettering, spark).run(available_now=True)

    assert f"{topic}/1: offsets from 0 are no longer on the broker (deleted by retention" in str(stopped.value)
    assert order_numbers(bq_client, cfg) == {f"ORD-{i:08d}" for i in range(10)}, "nothing of the batch loaded"


def test_a_new_partition_whose_first_records_were_gone_when_first_seen_is_read_from_its_earliest(
        spark, one_partition: Config, bq_client: bigquery.Client) -> None:  # noqa: ANN001
    """Those records were deleted before the job could plan them: no restart could read them. The job goes
    on from the partition's first record still on the broker (and warns, in the source's process)."""
    cfg = one_partition
    brokers, topic = cfg.source.brokers, cfg.source.topics[0]
    assert Pipeline(cfg, spark).run(available_now=True).totals.rows_written == 10
    add_partitions(brokers, topic, 2)
    send(cfg, 1, range(10, 20))
    delete_records(brokers, topic, 1, 4)

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (6, 6, 0)
    assert order_numbers(bq_client, cfg) == {f"ORD-{i:08d}" for i in [*range(10), *range(14, 20)]}
