"""A data engineer's own changelog through upsert/delete on the real local stack: a composite key (string,
int64, enum, Timestamp), values with nested messages, repeated fields and a oneof, and the records a real
topic carries: duplicates, delete then re-insert, deletes of keys never written, an all-defaults key
(empty key bytes), null and undecodable keys, and one key on two partitions."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from tests.conftest import compile_protos
from tests.integration.test_dead_letters import read_topic

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos" / "ledger"


@pytest.fixture
def ledger(job_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path):  # noqa: ANN201
    desc = compile_protos(tmp_path / "ledger.desc", PROTOS)
    loaded = descriptors.load([str(desc)])
    dlq_topic = f"dlq-{uuid.uuid4().hex[:8]}"

    def config(upsert: bool, delete: bool, stencil: Path = desc) -> Config:
        return Config.from_env({
            **job_env, "SCHEMA_REGISTRY_STENCIL_URLS": str(stencil), "INPUT_SCHEMA_PROTO_CLASS": "ledger.v1.Account",
            "INPUT_SCHEMA_PROTO_KEY_CLASS": "ledger.v1.AccountKey", "SINK_BIGQUERY_TABLE_NAME": "accounts",
            "SINK_BIGQUERY_UPSERT_ENABLED": str(upsert).lower(), "SINK_BIGQUERY_DELETE_ENABLED": str(delete).lower(),
            "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "account_key", "SINK_BIGQUERY_MERGE_INTERVAL_MS": "200",
            "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "KAFKA", "DLQ_KAFKA_TOPIC": dlq_topic})

    yield config, loaded.message_class("ledger.v1.AccountKey"), loaded.message_class("ledger.v1.Account"), dlq_topic
    bq_client.delete_dataset(job_env["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)


def key_of(cls, tenant: str, account: int, region: int, opened: int | None = None) -> bytes:  # noqa: ANN001
    key = cls(tenant=tenant, account_id=account, region=region)
    if opened is not None:
        key.opened.seconds, key.opened.nanos = opened, 123000
    return key.SerializeToString()


def rows(client: bigquery.Client, cfg: Config) -> list[tuple[object, ...]]:
    found = client.query(
        "SELECT account_key.tenant AS t, account_key.account_id AS a, account_key.region AS r, "
        "UNIX_MICROS(account_key.opened) AS o, owner, balance, address.city AS city, tags, email, phone "
        f"FROM `{cfg.bigquery.table_ref}`").result()
    return sorted(((r.t, r.a, r.r, r.o, r.owner, r.balance, r.city, list(r.tags), r.email, r.phone) for r in found),
                  key=repr)


def produce(cfg: Config, dlq_topic: str, partitions: int, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
    """(partition, key, value) records into the job's topic, each on the partition it names."""
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, partitions)
    sample.ensure_topic(cfg.source.brokers, dlq_topic, 1)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for partition, key, value in records:
        producer.send(topic, value, key=key, partition=partition).get(timeout=10)
    producer.close()


def test_a_users_changelog_ends_as_its_latest_values(spark, ledger, bq_client: bigquery.Client) -> None:
    config, key_cls, value_cls, dlq_topic = ledger
    cfg = config(upsert=True, delete=True)

    def value(owner: str, balance: int, **extra: object) -> bytes:
        return value_cls(owner=owner, balance=balance, address={"city": f"{owner}-city", "lines": ["l1"]},
                         previous=[{"city": "old"}], tags=[owner, "t"], **extra).SerializeToString()

    k1 = key_of(key_cls, "acme", 1, 1, 1_700_000_000)
    k1_later = key_of(key_cls, "acme", 1, 1, 1_700_000_001)  # differs only in the Timestamp: another key
    k2 = key_of(key_cls, "acme", 2, 2)
    k3 = key_of(key_cls, "zeta", 3, 1)
    blank = key_of(key_cls, "", 0, 0)
    assert blank == b""  # an all-defaults proto3 key is empty bytes, not a null key
    records = [  # (partition, key, value): a key always on the same partition
        (0, k1, value("ann", 1, email="a@x")), (0, k1, value("ann", 2, phone="+1")), (1, k1_later, value("bob", 5)),
        (1, k2, value("cy", 7)), (1, k2, None), (1, k2, value("cy", 8, email="c@x")),
        (0, k3, None),  # a key never written: nothing to delete, nothing fails
        (1, blank, value("dee", 9)),
        (0, None, value("nokey", 1)), (0, b"\xff\xff\xff", value("badkey", 1)),
    ]
    produce(cfg, dlq_topic, 2, records)

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert summary.totals.messages == len(records) and summary.totals.failed == 0
    assert rows(bq_client, cfg) == sorted([
        ("", 0, "REGION_UNSPECIFIED", None, "dee", 9, "dee-city", ["dee", "t"], None, None),
        ("acme", 1, "EU", 1_700_000_000_000_123, "ann", 2, "ann-city", ["ann", "t"], None, "+1"),
        ("acme", 1, "EU", 1_700_000_001_000_123, "bob", 5, "bob-city", ["bob", "t"], None, None),
        ("acme", 2, "US", None, "cy", 8, "cy-city", ["cy", "t"], "c@x", None),
    ], key=repr)
    letters = sorted((d.error.error_type.name, d.error.message.split(";")[0]) for d in read_topic(cfg.source.brokers,
                                                                                                 dlq_topic))
    assert [t for t, _ in letters] == ["DESERIALIZATION_ERROR", "INVALID_MESSAGE_ERROR"]
    assert letters[0][1].startswith("key: ") and letters[1][1] == "null key"


def test_delete_only_keeps_every_record_of_a_key_on_two_partitions(spark, ledger, bq_client: bigquery.Client) -> None:
    """One key on two partitions (producers with different partitioners, a topic whose partitions were
    added): its records in one batch may share an offset. They are still two records: delete-only appends
    both, never one in place of the other."""
    config, key_cls, value_cls, dlq_topic = ledger
    cfg = config(upsert=False, delete=True)
    key = key_of(key_cls, "acme", 1, 1)
    produce(cfg, dlq_topic, 2, [(partition, key, value_cls(owner=owner, balance=1).SerializeToString())
                                for partition, owner in ((0, "ann"), (1, "bob"))])  # both at offset 0

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert summary.totals.messages == 2 and summary.totals.failed == 0
    assert sorted(r[4] for r in rows(bq_client, cfg)) == ["ann", "bob"]


def test_keys_differing_only_past_the_microsecond_are_never_merged_into_one_row(
        spark, ledger, bq_client: bigquery.Client) -> None:
    """BigQuery keeps microseconds: a key Timestamp's nanoseconds past them are lost in the key column, so
    two keys differing only there would be one row, the later record overwriting the other key's. Such a
    key is refused (dead-lettered here) rather than merged; a key at whole microseconds lands."""
    config, key_cls, value_cls, dlq_topic = ledger
    cfg = config(upsert=True, delete=True)
    fine, finer = key_cls(tenant="acme", account_id=1), key_cls(tenant="acme", account_id=1)
    fine.opened.seconds = finer.opened.seconds = 1_700_000_000
    fine.opened.nanos, finer.opened.nanos = 123_456_000, 123_456_789
    produce(cfg, dlq_topic, 1, [(0, key.SerializeToString(), value_cls(owner=owner).SerializeToString())
                                for key, owner in ((finer, "finer"), (fine, "fine"))])

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert summary.totals.messages == 2 and summary.totals.failed == 0
    assert [(r[3], r[4]) for r in rows(bq_client, cfg)] == [(1_700_000_000_123_456, "fine")]
    letters = read_topic(cfg.source.brokers, dlq_topic)
    assert [(d.error.error_type.name, d.error.offset) for d in letters] == [("INVALID_MESSAGE_ERROR", 0)]
    assert "opened" in letters[0].error.message and "microsecond" in letters[0].error.message


def test_a_key_field_added_later_still_matches_the_rows_written_before_it(
        spark, ledger, bq_client: bigquery.Client, tmp_path: Path) -> None:
    """The key class gains a plain proto3 field (`shard`, no presence): a compatible change, the key column
    gets a NULLABLE column. Rows written before hold NULL there; a record of the same key, its bytes
    unchanged, decodes with the field's default (0). It is still the same key: it updates (or deletes)
    the row written before, never adds a second row beside it."""
    config, key_cls, value_cls, dlq_topic = ledger
    v1 = config(upsert=True, delete=True)
    key = key_of(key_cls, "acme", 1, 1)
    produce(v1, dlq_topic, 1, [(0, key, value_cls(owner="ann").SerializeToString()),
                               (0, key_of(key_cls, "acme", 2, 1), value_cls(owner="cy").SerializeToString())])
    assert Pipeline(v1, spark).run(available_now=True).totals.failed == 0

    source = (PROTOS / "ledger.proto").read_text()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "ledger.proto").write_text(source.replace(
        "  google.protobuf.Timestamp opened = 4;\n", "  google.protobuf.Timestamp opened = 4;\n  int64 shard = 5;\n"))
    v2_desc = compile_protos(tmp_path / "v2.desc", tmp_path / "v2")
    v2 = config(upsert=True, delete=True, stencil=v2_desc)
    produce(v2, dlq_topic, 1, [(0, key, value_cls(owner="bob").SerializeToString()),
                               (0, key_of(key_cls, "acme", 2, 1), None)])
    assert Pipeline(v2, spark).run(available_now=True).totals.failed == 0

    found = list(bq_client.query(f"SELECT account_key.account_id AS a, account_key.shard AS s, owner "
                                 f"FROM `{v2.bigquery.table_ref}`").result())
    assert [(r.a, r.owner) for r in found] == [(1, "bob")]
