"""One isolation level for the batch planner and both range readers (fakes only, no broker).

The fake librdkafka below keeps one partition with transactional records and answers each consumer by its
own `isolation.level` (librdkafka's default, read_committed, when unset), as a broker does: the planner
(KafkaMetadataClient) and the reader tasks (RangeReader) each make their own consumer, so the fake tells
whether they agree. The real broker's answers are in tests/integration/test_source_reader.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from firehose_bq.config import Config
from firehose_bq.errors import ConfigError, SourceError
from firehose_bq.source import kafka_client
from firehose_bq.source.kafka_client import (
    CONFLUENT_KAFKA,
    KAFKA_PYTHON,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RangeReader,
    confluent_config,
)
from firehose_bq.source.kafka_source import KafkaStreamReader
from tests.unit.test_config import MINIMAL

COMMITTED, ABORTED, OPEN, MARKER = "committed", "aborted", "open", "marker"


@dataclass
class Partition:
    """Records of partition t/0 in offset order: plain ones (state None) and transactional ones."""

    states: list[str | None] = field(default_factory=list)

    def add(self, state: str | None, count: int = 1) -> None:
        self.states.extend([state] * count)

    def finish(self, outcome: str) -> None:
        """End the open transaction: its records take `outcome`, and its control record follows."""
        self.states = [outcome if s == OPEN else s for s in self.states]
        self.add(MARKER)

    @property
    def high_watermark(self) -> int:
        return len(self.states)

    @property
    def last_stable_offset(self) -> int:
        return self.states.index(OPEN) if OPEN in self.states else self.high_watermark

    def end(self, isolation_level: str) -> int:
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark

    def visible(self, offset: int, isolation_level: str) -> bool:
        hidden = (MARKER, ABORTED) if isolation_level == READ_COMMITTED else (MARKER,)
        return self.states[offset] not in hidden


def fake_librdkafka(monkeypatch: pytest.MonkeyPatch, partition: Partition) -> list[str]:
    """Patch confluent_kafka.Consumer with one over `partition`; returns each consumer's isolation level."""
    import confluent_kafka as ck

    made: list[str] = []

    class Consumer:
        def __init__(self, conf: dict) -> None:
            self.isolation = conf.get("isolation.level", READ_COMMITTED)  # librdkafka's default
            self.position_offset = 0
            made.append(self.isolation)

        def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
            return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions={0: None})})

        def get_watermark_offsets(self, tp: ck.TopicPartition, timeout: float = 0, cached: bool = False) -> tuple:
            # librdkafka ≥ 1.8 answers a read_committed consumer's query with the LSO; the cached one is the
            # high watermark of its last fetch.
            return 0, partition.high_watermark if cached else partition.end(self.isolation)

        def assign(self, partitions: list) -> None:
            self.position_offset = partitions[0].offset

        def consume(self, num_messages: int, timeout: float) -> list:
            end = partition.end(self.isolation)
            if self.position_offset >= end:
                return [ck.Message(topic="t", partition=0, offset=end,
                                   error=ck.KafkaError(ck.KafkaError._PARTITION_EOF))]
            got = []
            for offset in range(self.position_offset, end):
                self.position_offset = offset + 1  # markers and aborted records move the position too
                if partition.visible(offset, self.isolation):
                    got.append(ck.Message(topic="t", partition=0, offset=offset, key=b"k", value=b"v%d" % offset,
                                          timestamp=(ck.TIMESTAMP_CREATE_TIME, 1000)))
                if len(got) == num_messages:
                    break
            return got

        def position(self, partitions: list) -> list:
            return [ck.TopicPartition("t", 0, self.position_offset)]

        def poll(self, timeout: float) -> None:
            return None  # nothing assigned to the driver's client: only librdkafka's log lines are served

        def close(self) -> None:
            pass

    monkeypatch.setattr(ck, "Consumer", Consumer)
    return made


def plan_and_read(source: KafkaStreamReader, reader: RangeReader, start: dict) -> tuple[dict, list[int]]:
    """One micro-batch as the job runs it: the driver plans from `start`, the task reads its range."""
    end = source.latestOffset(start, ReadAllAvailable())
    offsets = [o for part in source.partitions(start, end) for topic, partition, first, last in source.read(part)
               for batch in reader.read(topic, partition, first, last) for o in batch.column("offset").to_pylist()]
    return end, offsets


def test_every_part_defaults_to_read_committed() -> None:
    assert Config.from_env(MINIMAL).source.isolation_level == READ_COMMITTED
    assert KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"}).isolation_level == READ_COMMITTED
    assert RangeReader("b:1", CONFLUENT_KAFKA, 1000).isolation_level == READ_COMMITTED
    # Set explicitly: librdkafka's default happens to be read_committed, kafka-python's is not.
    assert confluent_config("b:1", 10)["isolation.level"] == READ_COMMITTED
    assert confluent_config("b:1", 10, READ_UNCOMMITTED)["isolation.level"] == READ_UNCOMMITTED


def test_the_setting_takes_only_kafkas_levels() -> None:
    assert Config.from_env({**MINIMAL, "SOURCE_KAFKA_ISOLATION_LEVEL": READ_UNCOMMITTED}).source.isolation_level \
        == READ_UNCOMMITTED
    with pytest.raises(ConfigError, match="SOURCE_KAFKA_ISOLATION_LEVEL"):
        Config.from_env({**MINIMAL, "SOURCE_KAFKA_ISOLATION_LEVEL": "committed"})
    with pytest.raises(SourceError, match="isolation_level must be one of"):
        KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g", "isolation_level": "READ_COMMITTED"})


def planner_and_reader(config: Config) -> tuple[KafkaStreamReader, RangeReader]:
    """The source's planner as Spark makes it from the options the job's Pipeline gives, and the tasks' reader."""
    from firehose_bq.pipeline import Pipeline

    options: dict[str, str] = {}

    class Stream:
        def format(self, name: str) -> Stream:
            return self

        def option(self, key: str, value: str) -> Stream:
            options[key] = value
            return self

        def options(self, **values: str) -> Stream:
            options.update(values)
            return self

        def load(self) -> None:
            return None

    # A local[2] session: SPARK_MAX_TASKS_PER_BATCH's default, 0, reads its parallelism (pipeline._max_tasks).
    context = SimpleNamespace(master="local[2]", defaultParallelism=2, getConf=lambda: SimpleNamespace(getAll=list))
    spark = SimpleNamespace(dataSource=SimpleNamespace(register=lambda source: None), readStream=Stream(),
                            sparkContext=context)
    pipeline = Pipeline(config, spark)  # type: ignore[arg-type]
    pipeline.source()
    # Spark hands a Python data source its options as strings, names lower-cased.
    assert all(isinstance(v, str) for v in options.values())
    return KafkaStreamReader({k.lower(): v for k, v in options.items()}), pipeline._reader


@pytest.mark.parametrize("level", [READ_COMMITTED, READ_UNCOMMITTED])
def test_the_job_hands_its_level_to_the_planner_and_the_readers(level: str) -> None:
    planner, reader = planner_and_reader(Config.from_env({**MINIMAL, "SOURCE_KAFKA_ISOLATION_LEVEL": level}))
    assert planner.isolation_level == reader.isolation_level == level
    assert planner.max_tasks == 2, "SPARK_MAX_TASKS_PER_BATCH=0: as many tasks as the session's cores"


@pytest.mark.parametrize("level", [READ_COMMITTED, READ_UNCOMMITTED])
def test_the_kafka_python_reader_and_the_dlq_replay_read_at_the_level_given(
        monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    import kafka

    from firehose_bq.dlq.replay import KafkaDlqSource

    class Made(Exception):
        pass

    def consumer(**kwargs: object) -> None:
        raise Made(kwargs.get("isolation_level"))

    monkeypatch.setattr(kafka, "KafkaConsumer", consumer)
    with pytest.raises(Made, match=f"^{level}$"):
        list(RangeReader("b:1", KAFKA_PYTHON, 1000, isolation_level=level).read("t", 0, 0, 5))
    with pytest.raises(Made, match=f"^{level}$"):
        KafkaDlqSource("b:1", "dlq", "g", None, level)
    with pytest.raises(Made, match=f"^{READ_COMMITTED}$"):
        KafkaDlqSource("b:1", "dlq", "g", None)


def test_read_committed_plans_up_to_the_open_transaction_and_reads_it_once_committed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Records 3..5 are a transaction still open, 6 a plain record after it: the batch ends at the LSO (3)
    without waiting for it, and the next batch reads 3..6 once it has committed."""
    partition = Partition()
    partition.add(None, 3)
    partition.add(OPEN, 3)
    partition.add(None)
    made = fake_librdkafka(monkeypatch, partition)
    source = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"})
    reader = RangeReader("b:1", CONFLUENT_KAFKA, stall_timeout_ms=300)  # a stall would fail the read

    end, read = plan_and_read(source, reader, {"t": {"0": 0}})
    assert (end, read) == ({"t": {"0": 3}}, [0, 1, 2])
    assert plan_and_read(source, reader, end) == (end, [])  # nothing new while it stays open: no batch

    partition.finish(COMMITTED)
    end, read = plan_and_read(source, reader, end)
    assert (end, read) == ({"t": {"0": 8}}, [3, 4, 5, 6])  # 7, the commit marker, is passed over
    assert set(made) == {READ_COMMITTED}


def test_read_committed_never_reads_an_aborted_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    partition = Partition()
    partition.add(None, 2)
    partition.add(OPEN, 3)
    fake_librdkafka(monkeypatch, partition)
    partition.finish(ABORTED)
    partition.add(None)
    source = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"})
    reader = RangeReader("b:1", CONFLUENT_KAFKA, stall_timeout_ms=300)

    assert plan_and_read(source, reader, {"t": {"0": 0}}) == ({"t": {"0": 7}}, [0, 1, 6])


def test_read_uncommitted_reads_everything_up_to_the_high_watermark(monkeypatch: pytest.MonkeyPatch) -> None:
    partition = Partition()
    partition.add(None, 2)
    partition.add(OPEN, 2)
    partition.finish(ABORTED)
    partition.add(OPEN, 2)
    made = fake_librdkafka(monkeypatch, partition)
    options = {"brokers": "b:1", "topics": "t", "group_id": "g", "isolation_level": READ_UNCOMMITTED}
    reader = RangeReader("b:1", CONFLUENT_KAFKA, stall_timeout_ms=300, isolation_level=READ_UNCOMMITTED)

    assert plan_and_read(KafkaStreamReader(options), reader, {"t": {"0": 0}}) == ({"t": {"0": 7}}, [0, 1, 2, 3, 5, 6])
    assert set(made) == {READ_UNCOMMITTED}


def test_a_range_planned_past_the_open_transaction_stalls_into_an_error_that_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch planned to the high watermark (by a run under read_uncommitted, replayed from the offset log
    after the setting changed) cannot end before the transaction does: it must neither stop short (records
    3..5 would never be read) nor hang; it fails with the stall timeout, and names the transaction."""
    partition = Partition()
    partition.add(None, 3)
    partition.add(OPEN, 3)
    fake_librdkafka(monkeypatch, partition)
    reader = RangeReader("b:1", CONFLUENT_KAFKA, stall_timeout_ms=300)
    with pytest.raises(SourceError, match=r"t/0: no progress for 300 ms at offset 3, planned to read up to 6 "
                                          r"\(the broker holds records up to 6: a transaction still open at 3"):
        list(reader.read("t", 0, 0, 6))


def test_the_planners_end_is_the_last_stable_offset_under_read_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every place that asks for the end (the batch's end, the available-now target, the lag Spark reports,
    a fresh checkpoint at `latest`) asks the one client, so they all see the same end."""
    partition = Partition()
    partition.add(None, 4)
    partition.add(OPEN, 2)
    fake_librdkafka(monkeypatch, partition)
    source = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g", "starting_offsets": "latest"})
    source._client = kafka_client.KafkaMetadataClient("b:1", "g")  # no committed offsets: see below
    monkeypatch.setattr(source._client, "committed_offsets", lambda topics: {})
    assert source.initialOffset() == {"t": {"0": 4}}
    source.prepareForTriggerAvailableNow()
    assert source.latestOffset({"t": {"0": 0}}, ReadAllAvailable()) == {"t": {"0": 4}}
    assert source.reportLatestOffset() == {"t": {"0": 4}}
    partition.finish(COMMITTED)
    # available-now keeps the end it froze at start; the transaction's records are the next run's.
    assert source.latestOffset({"t": {"0": 0}}, ReadAllAvailable()) == {"t": {"0": 4}}
    assert source.reportLatestOffset() == {"t": {"0": 7}}


def test_the_stall_error_goes_out_when_its_hint_cannot_be_had(monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka as ck

    partition = Partition()
    partition.add(None, 3)
    partition.add(OPEN, 3)
    fake_librdkafka(monkeypatch, partition)

    def broken(self: object, tp: object, timeout: float = 0, cached: bool = False) -> tuple:
        raise ck.KafkaException(ck.KafkaError(ck.KafkaError._STATE))

    monkeypatch.setattr(ck.Consumer, "get_watermark_offsets", broken)
    with pytest.raises(SourceError, match=r"^t/0: no progress for 300 ms at offset 3, planned to read up to 6$"):
        list(RangeReader("b:1", CONFLUENT_KAFKA, stall_timeout_ms=300).read("t", 0, 0, 6))
