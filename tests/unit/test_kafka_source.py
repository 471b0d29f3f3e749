"""Offset planning of the Kafka source (pure logic: no broker)."""

from __future__ import annotations

import pickle

from pyspark.sql.streaming.datasource import ReadAllAvailable

from firehose_bq.source.kafka_source import KafkaStreamReader, _cap, _from_json, _to_json


def test_offsets_round_trip_through_checkpoint_json() -> None:
    offsets = {"b": {10: 5, 2: 7}, "a": {0: 0}}
    as_json = _to_json(offsets)
    assert as_json == {"a": {"0": 0}, "b": {"2": 7, "10": 5}}
    assert _from_json(as_json) == offsets


def test_cap_leaves_small_backlogs_alone() -> None:
    assert _cap({"t": {0: 0, 1: 0}}, {"t": {0: 3, 1: 4}}, 10) == {"t": {0: 3, 1: 4}}


def test_cap_shares_the_limit_in_proportion_to_backlog() -> None:
    capped = _cap({"t": {0: 100, 1: 0, 2: 50}}, {"t": {0: 900, 1: 200, 2: 50}}, 500)
    assert capped == {"t": {0: 100 + 400, 1: 0 + 100, 2: 50}}


def test_cap_uses_its_whole_allowance_and_never_exceeds_it() -> None:
    capped = _cap({"t": {0: 0, 1: 0}}, {"t": {0: 10_000, 1: 1}}, 10)
    assert sum(capped["t"].values()) == 10 and capped["t"][0] >= 9
    # More partitions with backlog than the limit: still at most the limit, and still moving.
    many = _cap({"t": dict.fromkeys(range(50), 0)}, {"t": dict.fromkeys(range(50), 5)}, 10)
    assert sum(many["t"].values()) == 10


def test_offsets_going_backwards_are_an_error_not_a_skip() -> None:
    import pytest

    from firehose_bq.errors import SourceError

    class Kafka:
        def end_offsets(self, topics):  # noqa: ANN001, ANN201
            return {"t": {0: 5}}

    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"})
    reader._client = Kafka()  # type: ignore[assignment]
    with pytest.raises(SourceError, match="t/0: the broker's end offset 5 is below the checkpoint's 9"):
        reader.latestOffset({"t": {"0": 9}}, ReadAllAvailable())


def test_reader_pickles_without_its_driver_client() -> None:
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t1, t2", "group_id": "g"})
    reader._client = object()  # type: ignore[assignment]
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._client is None and clone.topics == ("t1", "t2")


def test_client_choice() -> None:
    from firehose_bq.source.kafka_client import resolve_client

    assert resolve_client("kafka-python") == "kafka-python"
    assert resolve_client("auto") == "confluent-kafka"  # installed as a dependency


def test_the_source_rows_are_the_ranges_tasks_read() -> None:
    from firehose_bq.source.kafka_client import RANGE_COLUMNS
    from firehose_bq.source.kafka_source import RANGE_DDL

    assert tuple(column.split()[0] for column in RANGE_DDL.split(", ")) == RANGE_COLUMNS


def test_the_source_reads_no_record_it_hands_each_task_its_range() -> None:
    """The records are read in the task that processes them (pipeline.run_task), not by the source."""
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"})
    (partition,) = reader.partitions({"t": {"0": 3, "1": 7}}, {"t": {"0": 9, "1": 7}})
    assert list(reader.read(partition)) == [("t", 0, 3, 9)]


def _message(offset: int, error: object = None, topic: str | None = "t"):  # noqa: ANN202
    import confluent_kafka as ck

    if error is not None:
        return ck.Message(topic=topic, partition=0, offset=offset, error=error)
    return ck.Message(topic=topic, partition=0, offset=offset, key=b"k", value=b"v",
                      timestamp=(ck.TIMESTAMP_CREATE_TIME, 1000), leader_epoch=0)


def _fake_consumer(batches: list[list], asked: list[int] | None = None):  # noqa: ANN202
    import confluent_kafka as ck

    class Consumer:
        def __init__(self, conf: dict) -> None:
            self.position_offset = 0

        def assign(self, partitions: list) -> None:
            pass

        def consume(self, num_messages: int, timeout: float) -> list:
            if asked is not None:
                asked.append(num_messages)
            got = batches.pop(0) if batches else []
            offsets = [m.offset() for m in got if m.error() is None]
            if offsets:
                self.position_offset = max(offsets) + 1
            return got

        def position(self, partitions: list) -> list:
            return [ck.TopicPartition("t", 0, self.position_offset)]

        def close(self) -> None:
            pass

    return Consumer


def test_confluent_reader_skips_background_client_errors_but_not_its_partitions(monkeypatch) -> None:
    import confluent_kafka as ck
    import pytest

    from firehose_bq.errors import SourceError
    from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, RangeReader

    coordinator = ck.KafkaError(ck.KafkaError._BAD_MSG, "FindCoordinator response error: Local: Bad message format")
    monkeypatch.setattr(ck, "Consumer", _fake_consumer([[_message(0, coordinator, topic=None), _message(0)],
                                                        [_message(1)]]))
    read = list(RangeReader("b", CONFLUENT_KAFKA, 1000, 10).read("t", 0, 0, 2))
    assert [o for batch in read for o in batch.column("offset").to_pylist()] == [0, 1]

    broken = ck.KafkaError(ck.KafkaError._TRANSPORT, "broker down")
    monkeypatch.setattr(ck, "Consumer", _fake_consumer([[_message(0, broken)]]))
    with pytest.raises(SourceError, match="t/0: broker down"):
        list(RangeReader("b", CONFLUENT_KAFKA, 1000, 10).read("t", 0, 0, 2))


def test_confluent_reader_never_asks_for_more_than_the_range_holds(monkeypatch) -> None:
    """consume() waits its whole timeout unless it gets as many messages as asked for."""
    import confluent_kafka as ck

    from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, RangeReader

    asked: list[int] = []
    monkeypatch.setattr(ck, "Consumer", _fake_consumer([[_message(o) for o in range(0, 4)],
                                                        [_message(o) for o in range(4, 7)]], asked))
    read = list(RangeReader("b", CONFLUENT_KAFKA, 1000, 4).read("t", 0, 0, 7))
    assert [b.num_rows for b in read] == [4, 3]
    assert asked == [4, 3]


class RetainedKafka:
    """The driver's metadata client over one partition whose records `low` to `high` are on the broker."""

    def __init__(self, low: int, high: int, committed: int | None) -> None:
        self.low, self.high, self.committed = low, high, committed

    def partitions(self, topics):  # noqa: ANN001, ANN201
        return [("t", 0)]

    def committed_offsets(self, topics):  # noqa: ANN001, ANN201
        return {} if self.committed is None else {"t": {0: self.committed}}

    def beginning_offsets(self, parts):  # noqa: ANN001, ANN201
        return {"t": {p: self.low for _, p in parts}}

    def end_offsets(self, topics):  # noqa: ANN001, ANN201
        return {"t": {0: self.high}}


def fresh_start(kafka: RetainedKafka, starting: str = "earliest") -> int:
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g", "starting_offsets": starting})
    reader._client = kafka  # type: ignore[assignment]
    return reader.initialOffset()["t"]["0"]


def test_a_fresh_checkpoint_starts_at_the_groups_committed_offset_or_where_it_is_told() -> None:
    assert fresh_start(RetainedKafka(100, 2000, committed=400)) == 400
    assert fresh_start(RetainedKafka(100, 2000, committed=2000)) == 2000, "caught up: nothing to read"
    assert fresh_start(RetainedKafka(100, 2000, committed=None)) == 100
    assert fresh_start(RetainedKafka(100, 2000, committed=None), "latest") == 2000


def test_a_committed_offset_the_broker_no_longer_has_starts_where_auto_offset_reset_points(caplog) -> None:  # noqa: ANN001
    """The way out of a job stopped by retention (its planned offsets are gone): a new checkpoint. It must
    not start at the same deleted offset again, and the gap is said, never skipped quietly."""
    assert fresh_start(RetainedKafka(1000, 2000, committed=400)) == 1000
    assert "t/0: group g committed offset 400, which is no longer on the broker (it holds 1000 to 2000" in caplog.text
    assert "the records between were never read" in caplog.text
    assert fresh_start(RetainedKafka(1000, 2000, committed=400), "latest") == 2000
    assert fresh_start(RetainedKafka(0, 50, committed=400)) == 0, "topic recreated: past its end"


def test_librdkafka_lines_reach_the_log_each_distinct_one_once(caplog) -> None:  # noqa: ANN001
    """A refused connection makes librdkafka repeat one line every few tens of ms: the first says it all."""
    import logging

    from firehose_bq.source.kafka_client import _DistinctLines, librdkafka_logger

    logger = librdkafka_logger()
    with caplog.at_level(logging.INFO, logger="firehose_bq.source.kafka_client"):
        for _ in range(600):
            logger.error("FAIL [rdkafka#consumer-1] 127.0.0.1:1/bootstrap: Connect failed: Connection refused")
        logger.warning("REQTMOUT [rdkafka#consumer-1] timed out")
        for n in range(2 * _DistinctLines.MAX_LINES):
            logger.info("line %d", n)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == ["librdkafka: FAIL [rdkafka#consumer-1] 127.0.0.1:1/bootstrap: Connect failed: Connection refused",
                         "librdkafka: REQTMOUT [rdkafka#consumer-1] timed out"]
    assert [r.levelname for r in caplog.records[:2]] == ["ERROR", "WARNING"]
    assert len(lines) == _DistinctLines.MAX_LINES, "bounded, whatever a client says"
    assert librdkafka_logger() is not logger, "one per client: what one has said does not silence another"
