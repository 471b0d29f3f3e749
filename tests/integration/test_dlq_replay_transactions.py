"""`replay-dlq --topic` reads a topic written in transactions to its end (a review finding: it stalled).

KafkaDlqSource plans each partition's end as the consumer's end offset (the last stable offset under
read_committed, the default). It used to track progress as `last record's offset + 1`; a transaction's
commit marker (and an aborted transaction's records) take offsets no record is returned for, so progress
stayed short of the end, the loop polled on and failed with "no records ... although the topic ends
further on", and every later replay the same way. Progress now follows the consumer's position.

Only the broker is needed (no Spark, no BigQuery): the source is read the way `replay` reads it.
Run: flock /tmp/firehose-heavy.lock .venv/bin/python -m pytest tests/integration/test_dlq_replay_transactions.py -q
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


# Each case: transactions in order, as (letters, commit?). Aborted ones are never read (read_committed).
CASES = {
    "ends in a commit marker": [([0, 1, 2], True)],
    "an aborted transaction, then a committed one": [([0, 1], False), ([2], True)],
    "a committed one, then an aborted one at the end": [([0], True), ([1, 2], False)],
}


@pytest.mark.parametrize("transactions", list(CASES.values()), ids=list(CASES))
def test_a_dlq_topic_written_in_transactions_is_replayed_to_its_end(
        stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, transactions: list[tuple[list[int], bool]]) -> None:
    brokers = stack_env["SOURCE_KAFKA_BROKERS"]
    monkeypatch.setattr(replay_module, "EMPTY_POLLS_BEFORE_STALL", 3)  # 3 s, not 30: the outcome is the same
    topic = new_topic(brokers)
    producer = transactional_producer(brokers, topic)
    for ids, commit in transactions:
        producer.begin_transaction()
        for i in ids:
            one = letter(i)
            producer.produce(topic, key=one.key, value=one.value, headers=one.kafka_headers(), partition=0)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    del producer  # librdkafka's threads end with it, not with the stack

    source = KafkaDlqSource(brokers, topic, f"replay-{topic}", None)
    try:
        read = []
        for letters, position in source.batches():  # as replay() drives it
            read.extend(x.error.offset for x in letters)
            source.commit(position)
    finally:
        source.close()
    assert read == [i for ids, commit in transactions if commit for i in ids]

    again = KafkaDlqSource(brokers, topic, f"replay-{topic}", None)
    try:
        assert again.total() == 0, "a finished replay leaves nothing to read"
    finally:
        again.close()
