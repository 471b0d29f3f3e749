"""Offset planning of the Kafka source (pure logic: no broker)."""

from __future__ import annotations

import pickle

import pyarrow as pa

from firehose_bq.source.kafka_client import ConsumerRecord
from pyspark.sql.streaming.datasource import ReadAllAvailable

from firehose_bq.source.kafka_source import ARROW_SCHEMA, KafkaStreamReader, _cap, _from_json, _to_json, to_arrow


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


def test_records_become_an_arrow_batch_of_the_source_schema() -> None:
    batch = to_arrow([
        ConsumerRecord(b"k", b"v", "t", 2, 7, 1_000, 0, [("h", b"x")], 3),
        ConsumerRecord(None, None, "t", 2, 8, None, None, [], None),
    ])
    assert batch.schema == ARROW_SCHEMA
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_000_000, None]
    assert batch.column("headers").to_pylist() == [[{"key": "h", "value": b"x"}], []]
    assert batch.column("value").to_pylist() == [b"v", None]


def test_client_choice() -> None:
    from firehose_bq.source.kafka_client import resolve_client

    assert resolve_client("kafka-python") == "kafka-python"
    assert resolve_client("auto") == "confluent-kafka"  # installed as a dependency
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g", "client": "confluent-kafka"})
    assert reader.client == "confluent-kafka"


class _Error:
    def __init__(self, code: int, text: str, fatal: bool = False) -> None:
        self._code, self._text, self._fatal = code, text, fatal

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return self._text

    def fatal(self) -> bool:
        return self._fatal


class _Message:
    def __init__(self, offset: int, error: _Error | None = None, topic: str | None = "t") -> None:
        self._offset, self._error, self._topic = offset, error, topic

    def error(self) -> _Error | None:
        return self._error

    def topic(self) -> str | None:
        return self._topic

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def timestamp(self) -> tuple[int, int]:
        import confluent_kafka as ck

        return ck.TIMESTAMP_CREATE_TIME, 1000

    def leader_epoch(self) -> int:
        return 0

    def headers(self) -> None:
        return None


def _fake_consumer(batches: list[list[_Message]]):  # noqa: ANN202
    import confluent_kafka as ck

    class Consumer:
        def __init__(self, conf: dict) -> None:
            self.position_offset = 0

        def assign(self, partitions: list) -> None:
            pass

        def consume(self, num_messages: int, timeout: float) -> list[_Message]:
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
    from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, read_range

    coordinator = _Error(ck.KafkaError._BAD_MSG, "FindCoordinator response error: Local: Bad message format")
    monkeypatch.setattr(ck, "Consumer", _fake_consumer([[_Message(0, coordinator, topic=None), _Message(0)],
                                                        [_Message(1)]]))
    read = list(read_range("b", "t", 0, 0, 2, stall_timeout_ms=1000, batch_size=10, client=CONFLUENT_KAFKA))
    assert [r.offset for batch in read for r in batch] == [0, 1]

    broken = _Error(ck.KafkaError._TRANSPORT, "broker down")
    monkeypatch.setattr(ck, "Consumer", _fake_consumer([[_Message(0, broken)]]))
    with pytest.raises(SourceError, match="t/0: broker down"):
        list(read_range("b", "t", 0, 0, 2, stall_timeout_ms=1000, batch_size=10, client=CONFLUENT_KAFKA))
