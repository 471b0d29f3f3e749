"""A local stack of the benchmark's own (broker + BigQuery emulator on free ports, state in a temporary
directory), the job settings that point at it, and a fast producer for large topics."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from firehose_bq import descriptors, sample
from firehose_bq.config import Config, read_env_file
from firehose_bq.devstack.stack import isolated_env, owned_stack
from firehose_bq.devstack.stack_config import StackConfig

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def local_stack() -> Iterator[tuple[dict[str, str], Path]]:
    """(job settings for the stack, a scratch directory for checkpoints); the stack stops on exit."""
    with tempfile.TemporaryDirectory() as state, owned_stack(StackConfig.from_env(isolated_env(state))) as stack:
        yield {**read_env_file(REPO / "config" / "local.env"), **stack.env()}, Path(state)


def produce_fast(cfg: Config, topic: str, count: int, partitions: int, distinct: int = 10_000,
                 headers: Callable[[int], list[tuple[str, bytes]]] | None = None) -> None:
    """`count` example bookings through confluent-kafka's producer (kafka-python sends ~10k msg/s, too slow
    for a million), cycling `distinct` prebuilt messages: building each booking costs more than sending it.
    `headers(i)`: the Kafka headers of record i (none by default)."""
    from confluent_kafka import Producer

    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE)
    make = sample.booking_messages(cls)
    pool = [make(i) for i in range(min(distinct, count))]
    sample.ensure_topic(cfg.source.brokers, topic, partitions)
    producer = Producer({"bootstrap.servers": cfg.source.brokers, "linger.ms": 50, "acks": "all",
                         "batch.size": 1_000_000, "queue.buffering.max.messages": 500_000})
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for i in range(count):
        key, value, _headers = pool[i % len(pool)]
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers(i) if headers else None,
                                 on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka send some first
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if failures or left:
        raise RuntimeError(f"{len(failures)} failed, {left} unsent of {count}: {failures[:1]}")
