"""The Kafka DLQ writer against the real broker: a letter too large to store stops at once, naming it."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from firehose_bq import sample
from firehose_bq.dlq.config import DlqConfig
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.writers import MAX_REQUEST_BYTES, dead_letter
from firehose_bq.errors import DeadLetterTooLargeError, ErrorType, MessageError

pytestmark = pytest.mark.integration


def letter(offset: int, value: bytes) -> DeadLetter:
    return DeadLetter(MessageError(ErrorType.INVALID_MESSAGE_ERROR, "orders", 1, offset, "bad"), b"k", value, (),
                      1_700_000_000_000, 1, 1_700_000_000_500)


def test_a_letter_too_large_for_the_dlq_is_named_and_not_retried(stack_env: dict[str, str]) -> None:
    brokers = stack_env["SOURCE_KAFKA_BROKERS"]
    topic = f"dlq-size-{uuid.uuid4().hex[:8]}"
    sample.ensure_topic(brokers, topic, 1)
    cfg = dataclasses.replace(DlqConfig(enabled=True), kafka_brokers=brokers, kafka_topic=topic,
                              retry_max_attempts=5)
    opened: list[int] = []

    def opener(c: DlqConfig):  # noqa: ANN202 - counts attempts, else the real writer
        from firehose_bq.dlq.writers import open_dlq_writer

        opened.append(1)
        return open_dlq_writer(c)

    letters = [letter(7, b"small"), letter(8, b"x" * (MAX_REQUEST_BYTES + 1))]
    with pytest.raises(DeadLetterTooLargeError, match=r"orders/1@8 \(16,777,\d{3} bytes .*max.message.bytes"):
        dead_letter(cfg, letters, opener=opener)
    assert len(opened) == 1  # no retry can make it fit


def test_a_letter_is_kept_by_the_dlq_topic_from_when_it_was_written(stack_env: dict[str, str]) -> None:
    """A backlog older than the DLQ topic's retention must not be deleted as soon as it is dead-lettered:
    the letter's Kafka timestamp is its write time, the original travels in a header (for the replay)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    brokers = stack_env["SOURCE_KAFKA_BROKERS"]
    topic = f"dlq-time-{uuid.uuid4().hex[:8]}"
    sample.ensure_topic(brokers, topic, 1)
    cfg = dataclasses.replace(DlqConfig(enabled=True), kafka_brokers=brokers, kafka_topic=topic)
    month_ago_ms = int(time.time() * 1000) - 30 * 86_400_000
    before_ms = int(time.time() * 1000)
    dead_letter(cfg, [dataclasses.replace(letter(7, b"old"), timestamp_ms=month_ago_ms)])

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        record = consumer.poll(30)
        assert record is not None and record.error() is None
        _, stamp = record.timestamp()
        assert stamp >= before_ms, f"letter timestamped {stamp}, before it was written ({before_ms})"
        read = DeadLetter.from_kafka(record.key(), record.value(), list(record.headers() or []))
        assert read.timestamp_ms == month_ago_ms and read.value == b"old"
    finally:
        consumer.close()


def test_a_record_with_no_key_no_value_and_a_null_header_is_dead_lettered_as_it_was(
        stack_env: dict[str, str]) -> None:
    """kafka-python's producer refuses such a record (`Need at least one: key or value`, a null header
    value): the write must not fail (it would be retried, stop the job, and do the same after every
    restart), and the replay must read back the nulls, not b"" (an empty header routes differently)."""
    from confluent_kafka import Consumer, TopicPartition

    brokers = stack_env["SOURCE_KAFKA_BROKERS"]
    topic = f"dlq-nulls-{uuid.uuid4().hex[:8]}"
    sample.ensure_topic(brokers, topic, 1)
    cfg = dataclasses.replace(DlqConfig(enabled=True), kafka_brokers=brokers, kafka_topic=topic,
                              retry_max_attempts=1)
    sent = dataclasses.replace(letter(9, b""), key=None, value=None, headers=(("region", None), ("kind", b"")))
    dead_letter(cfg, [sent])

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        record = consumer.poll(30)
        assert record is not None and record.error() is None
        read = DeadLetter.from_kafka(record.key(), record.value(), list(record.headers() or []))
        assert (read.key, read.value, read.headers) == (None, None, (("region", None), ("kind", b"")))
        assert read.error == sent.error
    finally:
        consumer.close()
