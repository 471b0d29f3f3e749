"""A delete-only `replay-dlq` stopped between a batch's MERGE and the commit of its DLQ position appends
nothing twice on the next replay (a review finding: it did).

The stream keeps delete-only exact across such a crash because Spark replays the batch under the same
batch id, so its MERGE job id is found done. A replay numbers its batches from 0 every time, so the batch
the crash left uncommitted came back under another number, its MERGE id differed, and the delete-only
MERGE inserted every value again. Now the replay writes the batch down before its MERGE (PendingBatch, as
for file loads), and the next replay commits it when its MERGE is found done.

Letters are produced straight into the DLQ topic (no Spark): only the broker and the BigQuery emulator.
Run: flock /tmp/firehose-heavy.lock .venv/bin/python -m pytest tests/integration/test_replay_delete_only.py -q
"""

from __future__ import annotations

from collections import Counter

import pytest
from google.cloud import bigquery
from google.protobuf import message_factory
from kafka import KafkaProducer

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.dlq import replay as replay_module
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.replay import KafkaDlqSource, replay
from firehose_bq.errors import ErrorType, MessageError
from tests.integration.test_replay_paths import StopsBeforeCommittingItsSecondBatch

pytestmark = pytest.mark.integration

LETTERS = 4
PER_BATCH = 2  # two replay batches: the crash comes after the second one's MERGE


def letters_of(cfg: Config) -> list[DeadLetter]:
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    key_class = message_factory.GetMessageClass(cls.DESCRIPTOR.file.message_types_by_name["BookingKey"])
    out = []
    for j in range(LETTERS):
        key = key_class(order_number=f"K-{j}").SerializeToString()  # type: ignore[call-arg]
        error = MessageError(ErrorType.SINK_5XX_ERROR, cfg.source.topics[0], 0, j, "backendError")
        out.append(DeadLetter(error, key, sample.booking(j, cls).SerializeToString(), (), 1_700_000_000_000, 1,
                              1_700_000_000_000))
    return out


def test_a_delete_only_replay_stopped_after_a_merge_appends_nothing_twice(
        job_env: dict[str, str], bq_client: bigquery.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    dlq_topic = f"dlq-{job_env['SOURCE_KAFKA_TOPIC']}"
    cfg = Config.from_env({
        **job_env, "SINK_BIGQUERY_DELETE_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "booking_key",
        "INPUT_SCHEMA_PROTO_KEY_CLASS": "firehose.example.v1.BookingKey",
        "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": dlq_topic})
    monkeypatch.setattr(replay_module, "DLQ_BATCH", PER_BATCH)
    sample.ensure_topic(cfg.source.brokers, dlq_topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for one in letters_of(cfg):
        producer.send(dlq_topic, key=one.key, value=one.value, headers=one.kafka_headers(), partition=0)
    producer.flush()
    producer.close()

    def order_numbers() -> Counter[str]:
        return Counter(r.order_number for r in bq_client.query(
            f"SELECT order_number FROM `{cfg.bigquery.table_ref}`").result())

    try:
        StopsBeforeCommittingItsSecondBatch.run_killed(cfg, dlq_topic, "replay-crash")
        assert sum(order_numbers().values()) == LETTERS  # both batches merged, the first one committed

        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-crash", None)
        try:
            again = replay(cfg, source)
        finally:
            source.close()
        assert again.stats.messages == 0  # the batch left pending is committed: its MERGE ran

        assert order_numbers() == Counter(f"ORD-{j:08d}" for j in range(LETTERS)), "each letter's value once"
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
