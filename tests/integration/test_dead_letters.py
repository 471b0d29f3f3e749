"""Bad messages go to the dead-letter queue with the right ErrorType, the job keeps going, and a replay
after the cause is fixed lands them (once), on the real local stack."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from firehose_bq import cli, descriptors
from firehose_bq.config import Config
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.blobstore import LocalBlobStore
from firehose_bq.dlq.blob_source import BlobDlqSource
from firehose_bq.dlq.replay import KafkaDlqSource, replay
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

PROTOS = Path(__file__).parent / "protos"
VALID = 12
# 300k packed enum values: a 300 kB record (under the broker's 1 MB) but ~12 MB of JSON, over the 9 MB an
# insertAll request carries.
OVERSIZED_LEVELS = 300_000


def bad_timestamp(cls: type) -> bytes:
    msg = cls(id="bq1")
    msg.happened_at.seconds, msg.happened_at.nanos = 1_700_000_000, -5
    return msg.SerializeToString()


def read_topic(brokers: str, topic: str) -> list[DeadLetter]:
    consumer = KafkaConsumer(bootstrap_servers=brokers, max_partition_fetch_bytes=32 << 20, fetch_max_bytes=32 << 20)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        letters: list[DeadLetter] = []
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                letters.extend(DeadLetter.from_kafka(r.key, r.value, list(r.headers)) for r in records)
        return letters
    finally:
        consumer.close()


def read_blobs(root: Path, pattern: str = "*.jsonl") -> list[DeadLetter]:
    return [DeadLetter.from_json(line) for f in sorted(root.rglob(pattern)) for line in f.read_text().splitlines()]


def table_ids(client: bigquery.Client, cfg: Config) -> Counter[str]:
    return Counter(r["id"] for r in client.query(f"SELECT id FROM `{cfg.bigquery.table_ref}`").result())

@dataclass
class DlqJob:
    """A job on the dead-letter tests' schema (dlq_v1, served by the fake registry; dlq_v2 is the fix)
    with unknown fields not allowed and a DLQ topic of its own; its topic and the DLQ topic exist."""

    paths: dict[str, Path]
    env: dict[str, str]
    cfg: Config
    topic: str
    dlq_topic: str
    v1: type
    v2: type

    @classmethod
    def start(cls, fake: FakeRegistry, job_env: dict[str, str], tmp_path: Path, **settings: str) -> DlqJob:
        paths = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / f"dlq_{v}") for v in ("v1", "v2")}
        fake.routes["/dlq.desc"] = paths["v1"].read_bytes()
        dlq_topic = f"dlq-{uuid.uuid4().hex[:8]}"
        env = {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "dlq.Event", "SINK_BIGQUERY_TABLE_NAME": "events",
               "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/dlq.desc",
               "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "600000",
               "SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS": "0",
               "INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE": "false",
               "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "KAFKA", "DLQ_KAFKA_TOPIC": dlq_topic, **settings}
        cfg = Config.from_env(env)
        ensure_topic(cfg.source.brokers, cfg.source.topics[0], 2)
        ensure_topic(cfg.source.brokers, dlq_topic, 1)
        v1 = descriptors.load([str(paths["v1"])]).message_class("dlq.Event")
        v2 = descriptors.load([str(paths["v2"])]).message_class("dlq.Event")
        return cls(paths, env, cfg, cfg.source.topics[0], dlq_topic, v1, v2)



@pytest.mark.parametrize("writer_type", ["KAFKA", "BLOB"])
def test_mixed_stream_ends_in_table_or_dlq_and_replay_lands_the_fixed_ones(
        writer_type: str, spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, _server = registry
    # insertAll: the oversized row below is over an insertAll request's size (not an Arrow append's).
    job = DlqJob.start(fake, job_env, tmp_path, DLQ_WRITER_TYPE=writer_type,
                       DLQ_BLOB_LOCAL_DIRECTORY=str(tmp_path / "dlq"), SINK_BIGQUERY_WRITE_METHOD="insertall")
    paths, env, cfg, topic, dlq_topic, v1, v2 = (job.paths, job.env, job.cfg, job.topic, job.dlq_topic, job.v1,
                                                 job.v2)
    whole = v1(id="truncated-in-its-id", amount=5).SerializeToString()
    # (value, ErrorType or None = lands) — one partition each, so offsets are known.
    bad: list[tuple[bytes, ErrorType]] = [
        (b"\xff\xff\xff\xff\xff", ErrorType.DESERIALIZATION_ERROR),  # corrupt bytes
        (whole[:6], ErrorType.DESERIALIZATION_ERROR),  # truncated inside the id
        (v2(amount=3).SerializeToString(), ErrorType.INVALID_MESSAGE_ERROR),  # v1's required `id` missing
        (v2(id="u1", amount=4, tags=["x"]).SerializeToString(), ErrorType.UNKNOWN_FIELDS_ERROR),
        # A Timestamp with negative nanos is no instant: the decoder refuses it (never normalized).
        (bad_timestamp(v1), ErrorType.INVALID_MESSAGE_ERROR),
        (v1(id="big", levels=[0] * OVERSIZED_LEVELS).SerializeToString(), ErrorType.PAYLOAD_TOO_LARGE),
    ]
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, max_request_size=4 << 20)
    expected: dict[tuple[int, int], ErrorType] = {}
    for i in range(VALID):
        producer.send(topic, v1(id=f"ok{i}", amount=i).SerializeToString(), headers=[("n", b"%d" % i)],
                      partition=0).get(timeout=10)
    for value, kind in bad:
        meta = producer.send(topic, value, key=b"k-" + kind.value.encode(), headers=[("trace", b"\x01")],
                             partition=1).get(timeout=30)
        expected[(meta.partition, meta.offset)] = kind
    producer.close()
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)

        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (VALID + len(bad), VALID, len(bad), 0)
        assert t.rows_written + t.dead_lettered == t.messages  # every message in exactly one place
        assert dict(t.errors_by_type) == dict(Counter(k.value for _, k in bad))
        assert table_ids(bq_client, cfg) == Counter(f"ok{i}" for i in range(VALID))
        letters = (read_topic(cfg.source.brokers, dlq_topic) if writer_type == "KAFKA"
                   else read_blobs(tmp_path / "dlq"))
        assert {(x.error.partition, x.error.offset): x.error.error_type for x in letters} == expected
        assert all(x.error.topic == topic and x.attempt == 1 for x in letters)
        by_type = {x.error.error_type: x for x in letters}
        unknown = by_type[ErrorType.UNKNOWN_FIELDS_ERROR]
        assert unknown.value == bad[3][0] and unknown.key == b"k-UNKNOWN_FIELDS_ERROR"
        assert unknown.headers == (("trace", b"\x01"),)
        (timestamp,) = [x for x in letters if x.value == bad[4][0]]
        assert "nanos -5" in timestamp.error.message or "nanos=-5" in timestamp.error.message

        # The cause is fixed: v2 knows `tags` and no longer requires `id`.
        fake.routes["/dlq.desc"] = paths["v2"].read_bytes()
        if writer_type == "KAFKA":
            source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-it", None)
        else:
            source = BlobDlqSource(LocalBlobStore(tmp_path / "dlq"), None)
        try:
            first = replay(cfg, source)
        finally:
            source.close()

        assert (first.stats.messages, first.stats.rows_written, first.stats.dead_lettered) == (len(bad), 2, 4)
        landed = table_ids(bq_client, cfg)
        assert landed["u1"] == 1 and landed[None] == 1 and sum(landed.values()) == VALID + 2
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`")}
        # The original coordinates: the row is what the stream would have written.
        assert (rows["u1"]["tags"], rows["u1"]["message_partition"], rows["u1"]["message_topic"]) == (["x"], 1, topic)
        again = (read_topic(cfg.source.brokers, dlq_topic)[len(bad):] if writer_type == "KAFKA"
                 else read_blobs(tmp_path / "dlq"))
        assert sorted(x.error.error_type.value for x in again) == sorted(
            ["DESERIALIZATION_ERROR", "DESERIALIZATION_ERROR", "INVALID_MESSAGE_ERROR", "PAYLOAD_TOO_LARGE"])
        assert {x.attempt for x in again} == {2}

        # Run twice: nothing new lands (Kafka: the group's position; blob: the handled files are renamed).
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        blob = ["--from-blob", str(tmp_path / "dlq")] if writer_type == "BLOB" else ["--group", "replay-it"]
        assert cli.main(["replay-dlq", "--available-now", *blob]) == 0
        assert table_ids(bq_client, cfg) == landed
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
