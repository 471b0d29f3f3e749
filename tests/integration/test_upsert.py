"""Upsert/delete on the real local stack: a random changelog ends as its KTable materialization."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from google.cloud import bigquery
from google.protobuf import message_factory

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline

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
