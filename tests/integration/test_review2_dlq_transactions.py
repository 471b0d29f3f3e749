"""REVIEW2 finding: `replay-dlq --topic` never finishes a topic whose last records came in a transaction.

KafkaDlqSource plans each partition's end as the consumer's end offset (the last stable offset under
read_committed, the default) and tracks progress as `last record's offset + 1`. A committed transaction
ends with a control record that takes an offset but is never returned, so the position stays one short
of the end: the loop polls on, gets nothing, and after EMPTY_POLLS_BEFORE_STALL polls raises "no records
... although the topic ends further on". Every later replay starts at the committed offset just before
the marker and fails the same way. The class docstring says a `--topic` DLQ "may be written by anyone",
and the source reader (kafka_client.RangeReader) already passes over such gaps; the replay does not.

Only the broker is needed (no Spark, no BigQuery): the source is read the way `replay` reads it.
Run: flock /tmp/firehose-heavy.lock .venv/bin/python -m pytest tests/integration/test_review2_dlq_transactions.py -q
"""

from __future__ import annotations

import pytest

from firehose_bq.dlq import replay as replay_module
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.replay import KafkaDlqSource
from firehose_bq.errors import ErrorType, MessageError
from tests.integration.test_source_reader import new_topic, transactional_producer

pytestmark = pytest.mark.integration


def letter(i: int) -> DeadLetter:
    return DeadLetter(MessageError(ErrorType.DESERIALIZATION_ERROR, "bookings", 0, i, "bad bytes"), b"k%d" % i,
                      b"v%d" % i, (), 1_700_000_000_000, 1, 1_700_000_000_000)


@pytest.mark.xfail(strict=True, reason="REVIEW2: the DLQ replay never reaches an end offset that lies past a "
                                       "transaction's commit marker; it stalls into an error every run")
def test_a_dlq_topic_written_in_a_transaction_is_replayed_to_its_end(
        stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    brokers = stack_env["SOURCE_KAFKA_BROKERS"]
    monkeypatch.setattr(replay_module, "EMPTY_POLLS_BEFORE_STALL", 3)  # 3 s, not 30: the outcome is the same
    topic = new_topic(brokers)
    producer = transactional_producer(brokers, topic)
    producer.begin_transaction()
    for i in range(3):
        one = letter(i)
        producer.produce(topic, key=one.key, value=one.value, headers=one.kafka_headers(), partition=0)
    producer.commit_transaction(30)
    del producer  # librdkafka's threads end with it, not with the stack

    source = KafkaDlqSource(brokers, topic, f"replay-{topic}", None)
    try:
        read = []
        for letters, position in source.batches():  # as replay() drives it
            read.extend(x.error.offset for x in letters)
            source.commit(position)
    finally:
        source.close()
    assert read == [0, 1, 2]

    again = KafkaDlqSource(brokers, topic, f"replay-{topic}", None)
    try:
        assert again.total() == 0, "a finished replay leaves nothing to read"
    finally:
        again.close()
