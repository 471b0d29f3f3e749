"""Upsert/delete on the real local stack: a random changelog ends as its KTable materialization."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.cloud import bigquery
from google.protobuf import message_factory
from kafka import KafkaProducer

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.dlq.replay import KafkaDlqSource, replay
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry
from tests.integration.test_dead_letters import read_topic
from tests.integration.test_schema_refresh import PROTOS

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

KEY_FIELD = "booking_key"
RECORDS = 20_000
KEYS = 1_200
TOMBSTONE_SHARE = 0.13


def upsert_env(job_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**job_env, "SINK_BIGQUERY_UPSERT_ENABLED": "true", "SINK_BIGQUERY_DELETE_ENABLED": "true",
            "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": KEY_FIELD,
            "INPUT_SCHEMA_PROTO_KEY_CLASS": "firehose.example.v1.BookingKey",
            "SINK_BIGQUERY_MERGE_INTERVAL_MS": "200", "SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD": "5000", **extra}


@dataclass
class Changelog:
    """A random keyed stream and what a KTable holds after it: key → number of its last booking."""

    keys: list[str]  # key of record j
    tombstones: set[int] = field(default_factory=set)
    table: dict[str, int] = field(default_factory=dict)
    reused_after_delete: int = 0


def random_changelog(seed: int, records: int = RECORDS, keys: int = KEYS) -> Changelog:
    rng = random.Random(seed)
    log = Changelog([f"K-{rng.randrange(keys):05d}" for _ in range(records)])
    deleted: set[str] = set()
    for j, key in enumerate(log.keys):
        if rng.random() < TOMBSTONE_SHARE:  # also for absent keys: a KTable ignores those
            log.tombstones.add(j)
            if log.table.pop(key, None) is not None:
                deleted.add(key)
        else:
            log.reused_after_delete += key in deleted
            deleted.discard(key)
            log.table[key] = j
    return log


def changelog_messages(cfg: Config, log: Changelog) -> Callable[[int], sample.Record]:
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    key_class = message_factory.GetMessageClass(cls.DESCRIPTOR.file.message_types_by_name["BookingKey"])

    def make(j: int) -> sample.Record:
        key = key_class(order_number=log.keys[j]).SerializeToString()  # type: ignore[call-arg]
        return key, None if j in log.tombstones else sample.booking(j, cls).SerializeToString(), ()

    return make


def produce_changelog(cfg: Config, log: Changelog) -> None:
    topic = cfg.source.topics[0]
    # kafka-python hashes the key to pick the partition: all records of a key share one, as a changelog needs.
    sample.ensure_topic(cfg.source.brokers, topic, 3)
    sample.produce(cfg.source.brokers, topic, changelog_messages(cfg, log), len(log.keys), progress=False)


def assert_materialized(client: bigquery.Client, cfg: Config, log: Changelog) -> None:
    rows = list(client.query(f"SELECT {KEY_FIELD}.order_number AS k, order_number, amount, status "
                             f"FROM `{cfg.bigquery.table_ref}`").result())
    assert len(rows) == len({r.k for r in rows}), "one row per key"
    assert {r.k: r.order_number for r in rows} == {k: f"ORD-{j:08d}" for k, j in log.table.items()}
    for r in rows:  # the whole value, not only the field that names the record
        values = sample.booking_values(log.table[r.k])
        assert (r.amount, r.status) == (values["amount"], values["status"]), r.k


def tables_in(client: bigquery.Client, cfg: Config) -> list[str]:
    return sorted(t.table_id for t in client.list_tables(f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}"))


@pytest.fixture
def upsert_config(job_env: dict[str, str], bq_client: bigquery.Client):  # noqa: ANN201
    cfg = Config.from_env(upsert_env(job_env))
    yield cfg
    bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_random_changelog_ends_as_its_ktable(spark, upsert_config: Config, bq_client: bigquery.Client) -> None:
    log = random_changelog(seed=20261123)
    assert len(log.tombstones) >= RECORDS // 10 and len(set(log.keys)) >= 1000 and log.reused_after_delete > 100
    produce_changelog(upsert_config, log)

    summary = Pipeline(upsert_config, spark).run(available_now=True)

    assert summary.totals.messages == RECORDS and summary.totals.failed == 0
    assert summary.batches >= 4  # the records threshold split the stream into several merges
    assert_materialized(bq_client, upsert_config, log)
    assert tables_in(bq_client, upsert_config) == [upsert_config.bigquery.table]  # intermediate dropped


def test_keys_differing_only_in_a_field_the_key_class_lacks_are_never_merged_into_one_row(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The key class is evo.Detail: v1 has `note`, v2 adds `priority`. Keys written with v2 that differ only
    in `priority` are one key to v1: merged by it, one record would overwrite the other's row. With only v1
    in the registry they are dead-lettered (unknown fields are allowed for values: keys are never merged
    without theirs); once v2 is published, new such records hold the batch, refresh the registry and land
    as two rows, and the dead-lettered pair is replayed into two rows as well."""
    fake, _server = registry
    paths = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / v) for v in ("v1", "v2")}
    blobs = {v: path.read_bytes() for v, path in paths.items()}
    classes = {v: descriptors.load([str(path)]) for v, path in paths.items()}
    key_v1, key_v2 = classes["v1"].message_class("evo.Detail"), classes["v2"].message_class("evo.Detail")
    event = classes["v1"].message_class("evo.Event")
    fake.routes["/evo.desc"] = blobs["v1"]
    dlq_topic = f"dlq-{uuid.uuid4().hex[:8]}"
    cfg = Config.from_env(upsert_env(
        job_env, INPUT_SCHEMA_PROTO_CLASS="evo.Event", INPUT_SCHEMA_PROTO_KEY_CLASS="evo.Detail",
        SINK_BIGQUERY_TABLE_NAME="events", SCHEMA_REGISTRY_STENCIL_URLS=f"{fake.url}/evo.desc",
        SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS="600000",  # no background refresh: only the one unknown fields ask for
        SCHEMA_REGISTRY_UNKNOWN_FIELDS_REFRESH_MIN_INTERVAL_MS="0",
        DLQ_SINK_ENABLE="true", DLQ_WRITER_TYPE="KAFKA", DLQ_KAFKA_TOPIC=dlq_topic))
    assert cfg.errors.allow_unknown_fields  # the default: it does not cover a changelog's keys
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 1)
    sample.ensure_topic(cfg.source.brokers, dlq_topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)

    def send(key: bytes, id_: str, amount: int) -> None:
        producer.send(topic, event(id=id_, amount=amount).SerializeToString(), key=key).get(timeout=10)

    def table() -> dict[tuple[str, int | None], tuple[str, int]]:
        rows = bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`").result()
        return {(r[KEY_FIELD]["note"], r[KEY_FIELD].get("priority")): (r["id"], r["amount"]) for r in rows}

    caplog.set_level(logging.INFO, logger="firehose_bq.pipeline")
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        send(key_v2(note="n", priority=1).SerializeToString(), "a", 1)
        send(key_v2(note="n", priority=2).SerializeToString(), "b", 2)
        send(key_v1(note="m").SerializeToString(), "c", 3)
        first = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)

        t = first.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (3, 1, 2, 0)
        assert dict(t.errors_by_type) == {"UNKNOWN_FIELDS_ERROR": 2} and t.unknown_fields == 0
        assert table() == {("m", None): ("c", 3)}  # not one row of key "n" holding a or b
        letters = read_topic(cfg.source.brokers, dlq_topic)
        assert sorted(x.error.offset for x in letters) == [0, 1]
        assert all(x.error.error_type is ErrorType.UNKNOWN_FIELDS_ERROR and x.error.message.startswith("key: ")
                   for x in letters)
        assert cache.stats().changes == 0  # the refresh they asked for found nothing newer
        assert "brought nothing new: written without them (publish the new proto to the registry, then replay to " \
               "fill them); in a key: UNKNOWN_FIELDS_ERROR (upsert/delete)" in caplog.text

        fake.routes["/evo.desc"] = blobs["v2"]  # the key class's new version is published
        send(key_v2(note="p", priority=1).SerializeToString(), "d", 4)
        send(key_v2(note="p", priority=2).SerializeToString(), "e", 5)
        second = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)

        t = second.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed, t.unknown_fields) == (2, 2, 0, 0, 0)
        assert cache.stats().changes == 1  # the sink started on v1: the pair held its batch for the refresh
        assert table() == {("m", None): ("c", 3), ("p", 1): ("d", 4), ("p", 2): ("e", 5)}

        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-it", None)
        try:
            replayed = replay(cfg, source)
        finally:
            source.close()
        assert (replayed.stats.messages, replayed.stats.rows_written, replayed.stats.dead_lettered) == (2, 2, 0)
        assert table() == {("m", None): ("c", 3), ("p", 1): ("d", 4), ("p", 2): ("e", 5),
                           ("n", 1): ("a", 1), ("n", 2): ("b", 2)}
    finally:
        cache.stop()
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
