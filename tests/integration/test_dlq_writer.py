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
