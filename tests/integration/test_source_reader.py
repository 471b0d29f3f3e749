"""The source's range reader against the real broker, over both clients: the same Arrow batch from
each, exact [start, end) ranges, records the Arrow rules must keep (tombstones, NULL keys, headers
with NULL values, timestamps), transaction markers, aborted and open transactions as the source plans and
reads them, and a stall that ends in a clear error. And a range that comes in several fetches, from a
broker that caps them as Kafka does (Tansu: the stack's broker answers with the whole partition)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from firehose_bq.devstack.tansu import tansu_broker
from firehose_bq.errors import SourceError
from firehose_bq.source.batches import ARROW_SCHEMA
from firehose_bq.source.kafka_client import (
    CONFLUENT_KAFKA,
    KAFKA_PYTHON,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RangeReader,
)

pytestmark = pytest.mark.integration

CLIENTS = (KAFKA_PYTHON, CONFLUENT_KAFKA)
# Recent: the broker applies time-based retention (7 days) to CreateTime, and would delete records
# timestamped years ago between their write and their read (seen as offsets out of range under load).
BASE_MS = (int(time.time()) - 3600) * 1000
# (key, value, headers) per offset: tombstones, NULL keys, empty values, headers with NULL values.
RECORDS = [
    (b"k0", b"v0", []),
    (None, b"v1", [("trace", b"t1"), ("nothing", None)]),
    (b"k2", None, []),
    (None, None, [("ü", b"\x00\xff")]),
    (b"k4", b"", []),
] * 4


@pytest.fixture
def brokers(stack_env: dict[str, str]) -> str:
    return stack_env["SOURCE_KAFKA_BROKERS"]


def new_topic(brokers: str, partitions: int = 1) -> str:
    topic = f"reader-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=brokers)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


def produce_records(brokers: str, topic: str) -> None:
    # confluent-kafka's producer: kafka-python's refuses NULL header values and records with neither key nor value.
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": brokers, "acks": "all"})
    for i, (key, value, headers) in enumerate(RECORDS):
        producer.produce(topic, key=key, value=value, headers=headers, partition=0, timestamp=BASE_MS + i)
    assert producer.flush(30) == 0


def read(brokers: str, topic: str, start: int, end: int, client: str, batch_rows: int = 7,
         stall_timeout_ms: int = 20_000) -> pa.Table:
    batches = list(RangeReader(brokers, client, stall_timeout_ms, batch_rows).read(topic, 0, start, end))
    assert all(b.schema == ARROW_SCHEMA and 0 < b.num_rows <= batch_rows for b in batches)
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_range_reads_exactly_its_records_as_they_were_sent(brokers: str, client: str) -> None:
    topic = new_topic(brokers)
    produce_records(brokers, topic)
    table = read(brokers, topic, 3, 17, client)
    assert table.column("offset").to_pylist() == list(range(3, 17))
    rows = table.to_pylist()
    for row in rows:
        key, value, headers = RECORDS[row["offset"]]
        assert (row["key"], row["value"]) == (key, value)
        assert row["headers"] == [{"key": k, "value": v} for k, v in headers]
        assert row["timestamp"].timestamp() * 1000 == BASE_MS + row["offset"]
        assert row["timestamp_type"] == 0  # CreateTime
        assert (row["topic"], row["partition"]) == (topic, 0)
        assert row["leader_epoch"] is None or row["leader_epoch"] >= 0


def test_both_clients_give_the_same_batches(brokers: str) -> None:
    topic = new_topic(brokers)
    produce_records(brokers, topic)
    tables = [read(brokers, topic, 0, len(RECORDS), client) for client in CLIENTS]
    assert tables[0].equals(tables[1])


@pytest.mark.parametrize("client", CLIENTS)
def test_transaction_markers_leave_gaps_that_end_the_range(brokers: str, client: str) -> None:
    from confluent_kafka import Producer

    topic = new_topic(brokers)
    producer = Producer({"bootstrap.servers": brokers, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for _ in range(2):  # each commit writes a control record, which takes an offset but is no message
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=b"v%d" % i, partition=0)
        producer.commit_transaction(30)
    from firehose_bq.source.kafka_client import KafkaMetadataClient

    metadata = KafkaMetadataClient(brokers, f"g-{topic}")
    try:
        end = metadata.end_offsets((topic,))[topic][0]
    finally:
        metadata.close()
    table = read(brokers, topic, 0, end, client)
    assert table.column("value").to_pylist() == [b"v0", b"v1", b"v2"] * 2
    assert end > table.num_rows  # the markers' offsets were there, and passed over


def transactional_producer(brokers: str, topic: str):  # noqa: ANN201 - confluent_kafka.Producer
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": brokers, "transactional.id": f"tx-{topic}-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    return producer


def produce_plain(brokers: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": brokers, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0


def plan_and_read(brokers: str, topic: str, client: str, start: dict[str, dict[str, int]], isolation_level: str,
                  stall_timeout_ms: int = 20_000) -> tuple[dict[str, dict[str, int]], pa.Table, float]:
    """One `--available-now` query as the job runs it, without Spark: the source freezes its end at start
    and plans the range from `start`, the task reads it at the same isolation level. Returns the end, what
    was read, and how long reading took."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from firehose_bq.source.kafka_source import KafkaStreamReader

    source = KafkaStreamReader({"brokers": brokers, "topics": topic, "group_id": f"g-{topic}",
                                "isolation_level": isolation_level})
    try:
        source.prepareForTriggerAvailableNow()
        end = source.latestOffset(start, ReadAllAvailable())
        ranges = source.partitions(start, end)
    finally:
        source.stop()
    reader = RangeReader(brokers, client, stall_timeout_ms, 7, isolation_level)
    started = time.monotonic()
    batches = [b for part in ranges for topic, partition, first, end_ in source.read(part)
               for b in reader.read(topic, partition, first, end_)]
    return end, pa.Table.from_batches(batches, schema=ARROW_SCHEMA), time.monotonic() - started


@pytest.mark.parametrize("client", CLIENTS)
def test_an_aborted_transaction_never_reaches_a_read_committed_reader(brokers: str, client: str) -> None:
    topic = new_topic(brokers)
    produce_plain(brokers, topic, [b"before0", b"before1"])
    producer = transactional_producer(brokers, topic)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"aborted%d" % i, partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    produce_plain(brokers, topic, [b"after0"])
    start = {topic: {"0": 0}}

    end, table, _ = plan_and_read(brokers, topic, client, start, READ_COMMITTED)
    assert table.column("value").to_pylist() == [b"before0", b"before1", b"after0"]
    assert end == {topic: {"0": 7}}  # 2 + 3 aborted + the abort marker + 1: all passed over, none stalls

    # The other choice reads them, up to the same end (no transaction is open): both clients alike.
    _, everything, _ = plan_and_read(brokers, topic, client, start, READ_UNCOMMITTED)
    assert everything.column("value").to_pylist() == [b"before0", b"before1", b"aborted0", b"aborted1",
                                                      b"aborted2", b"after0"]


@pytest.mark.parametrize("client", CLIENTS)
def test_an_open_transaction_ends_the_batch_before_it_and_is_read_once_committed(brokers: str, client: str) -> None:
    """A producer mid-transaction must neither stall the batch (planned past the LSO, a read_committed
    reader waits there for the stall timeout, then fails) nor let its records in before it commits."""
    topic = new_topic(brokers)
    produce_plain(brokers, topic, [b"before0", b"before1", b"before2"])
    producer = transactional_producer(brokers, topic)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"open%d" % i, partition=0)
    producer.flush(30)  # on the broker, transaction still open
    produce_plain(brokers, topic, [b"after0", b"after1"])  # not transactional, but behind the open ones

    end, table, seconds = plan_and_read(brokers, topic, client, {topic: {"0": 0}}, READ_COMMITTED)
    assert end == {topic: {"0": 3}}  # the LSO, not the high watermark (8)
    assert table.column("value").to_pylist() == [b"before0", b"before1", b"before2"]
    assert seconds < 5, f"read of what precedes the open transaction took {seconds:.1f} s"
    assert plan_and_read(brokers, topic, client, end, READ_COMMITTED)[0] == end  # still open: nothing new
    # What the old planner did (to the high watermark): the read_committed reader cannot get there.
    with pytest.raises(SourceError, match=rf"{topic}/0: no progress for 1500 ms at offset 3, planned to read up "
                                          rf"to 8 \(the broker holds records up to 8: a transaction still open at 3"):
        read(brokers, topic, 0, 8, client, stall_timeout_ms=1500)

    producer.commit_transaction(30)
    later, table, seconds = plan_and_read(brokers, topic, client, end, READ_COMMITTED)
    assert later == {topic: {"0": 9}}  # the commit marker took offset 8
    assert table.column("value").to_pylist() == [b"open0", b"open1", b"open2", b"after0", b"after1"]
    assert table.column("offset").to_pylist() == [3, 4, 5, 6, 7]
    assert seconds < 5


@pytest.mark.parametrize("client", CLIENTS)
def test_a_range_past_the_end_stalls_into_a_clear_error(brokers: str, client: str) -> None:
    topic = new_topic(brokers)
    produce_records(brokers, topic)
    started = time.monotonic()
    with pytest.raises(SourceError, match=rf"{topic}/0: no progress for 1500 ms at offset {len(RECORDS)}, "
                                          rf"planned to read up to {len(RECORDS) + 5}"):
        read(brokers, topic, 0, len(RECORDS) + 5, client, stall_timeout_ms=1500)
    assert time.monotonic() - started < 15


def test_the_driver_metadata_client_against_the_broker(brokers: str) -> None:
    """What the source's driver side asks Kafka (kafka_client.KafkaMetadataClient): partitions, both
    ends, and the consumer group's offsets, committed so that any Kafka client (here kafka-python, as
    lag monitors are) sees them."""
    from kafka import KafkaConsumer, TopicPartition

    from firehose_bq.source.kafka_client import KafkaMetadataClient

    topic = new_topic(brokers, partitions=3)
    produce_records(brokers, topic)  # all to partition 0
    group = f"g-{topic}"
    client = KafkaMetadataClient(brokers, group)
    try:
        assert client.partitions((topic,)) == [(topic, 0), (topic, 1), (topic, 2)]
        assert client.end_offsets((topic,)) == {topic: {0: len(RECORDS), 1: 0, 2: 0}}
        assert client.beginning_offsets([(topic, 0), (topic, 2)]) == {topic: {0: 0, 2: 0}}
        assert client.committed_offsets((topic,)) == {}
        client.commit({topic: {0: 7, 1: 0}})
        assert client.committed_offsets((topic,)) == {topic: {0: 7, 1: 0}}
        with pytest.raises(SourceError, match="does not exist"):
            client.partitions((f"{topic}-missing",))
    finally:
        client.close()
    again = KafkaMetadataClient(brokers, group)  # a new query's source process
    try:
        assert again.committed_offsets((topic,)) == {topic: {0: 7, 1: 0}}
    finally:
        again.close()
    monitor = KafkaConsumer(bootstrap_servers=brokers, group_id=group, enable_auto_commit=False)
    try:
        assert monitor.committed(TopicPartition(topic, 0)) == 7
    finally:
        monitor.close()


@pytest.fixture(scope="module")
def capped_brokers() -> Iterator[str]:
    with tansu_broker() as address:
        yield address


# About 18 MB in one partition: Tansu hands it out in fetches of a few MB, Kafka in fetches of at most
# max.partition.fetch.bytes (8 MiB), the stack's broker in one.
CAPPED_RECORDS = 9_000
CAPPED_VALUE_BYTES = 2_000


@pytest.mark.parametrize("client", CLIENTS)
def test_a_range_that_comes_in_several_fetches_reads_each_record_once_in_order(capped_brokers: str,
                                                                             client: str) -> None:
    """The range starts and ends inside fetches; each fetch fills the reader's queue (CONFLUENT_KAFKA: past one
    read batch, `queued.min.messages`), which is when librdkafka waits `fetch.queue.backoff.ms` to fetch again."""
    from confluent_kafka import Producer

    topic = new_topic(capped_brokers)
    producer = Producer({"bootstrap.servers": capped_brokers, "acks": "all", "linger.ms": 20})
    for i in range(CAPPED_RECORDS):
        producer.produce(topic, value=b"%08d" % i + b"x" * (CAPPED_VALUE_BYTES - 8), partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    start, end = 1_234, CAPPED_RECORDS - 1_111
    table = read(capped_brokers, topic, start, end, client, batch_rows=1_000)
    assert table.column("offset").to_pylist() == list(range(start, end))
    assert [v[:8] for v in table.column("value").to_pylist()] == [b"%08d" % i for i in range(start, end)]
