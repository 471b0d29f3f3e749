"""Offset planning of the Kafka source (pure logic: no broker)."""

from __future__ import annotations

import json
import pickle

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

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


class GrowingKafka:
    """The driver's metadata client over a topic whose partitions and retention change between calls:
    `low`/`high` per partition, edited by the test as the broker would move them."""

    def __init__(self, low: dict[int, int], high: dict[int, int]) -> None:
        self.low, self.high = low, high
        self.looked_up: list[tuple[str, int]] = []

    def partitions(self, topics):  # noqa: ANN001, ANN201
        return [("t", p) for p in sorted(self.high)]

    def beginning_offsets(self, parts):  # noqa: ANN001, ANN201
        self.looked_up.extend(parts)
        return {"t": {p: self.low[p] for _, p in parts}}

    def end_offsets(self, topics):  # noqa: ANN001, ANN201
        return {"t": dict(self.high)}


def planner(kafka: GrowingKafka, **options: str) -> KafkaStreamReader:
    """A reader as Spark makes one in each of its Python processes (the source runner, each planning one)."""
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g", **options})
    reader._client = kafka  # type: ignore[assignment]
    return reader


def ranges(reader: KafkaStreamReader, start: dict, end: dict) -> list[tuple[str, int, int, int]]:  # type: ignore[type-arg]
    return [r for part in reader.partitions(start, end) for r in part.ranges]


def test_a_new_partition_is_read_from_the_start_planned_with_the_batch_whatever_retention_did_since() -> None:
    """Spark's offset log keeps each batch's end only: a partition new in a batch must carry its start in that
    end, or planning the read (another process, later) and every replay of the batch look it up again, and
    records retention deleted meanwhile would be skipped without a word instead of stopping the job."""
    kafka = GrowingKafka(low={0: 0, 1: 0}, high={0: 10, 1: 8})
    start = {"t": {"0": 5}}  # the previous batch's end: partition 1 did not exist then
    end = planner(kafka).latestOffset(start, ReadAllAvailable())

    kafka.low[1] = 3  # retention, between planning the batch and reading it (or before a replay of it)

    planned = [("t", 0, 5, 10), ("t", 1, 0, 8)]
    assert ranges(planner(kafka), start, end) == planned
    assert ranges(planner(kafka), json.loads(json.dumps(start)), json.loads(json.dumps(end))) == planned, \
        "a replay reads the checkpoint's JSON"
    assert kafka.looked_up == [("t", 1)], "looked up once, when the batch was planned"


def test_the_planned_starts_leave_the_offsets_themselves_as_they_were() -> None:
    kafka = GrowingKafka(low={0: 0, 1: 0}, high={0: 10, 1: 8})
    end = planner(kafka).latestOffset({"t": {"0": 5}}, ReadAllAvailable())
    assert _from_json(end) == {"t": {0: 10, 1: 8}}

    committed: list = []  # type: ignore[type-arg]
    kafka.commit = committed.append  # type: ignore[attr-defined]
    planner(kafka).commit(end)
    assert committed == [{"t": {0: 10, 1: 8}}], "the group gets offsets only"

    # The next batch starts at that end: partition 1 is known there, at its end offset.
    kafka.high = {0: 12, 1: 9}
    following = planner(kafka).latestOffset(end, ReadAllAvailable())
    assert ranges(planner(kafka), end, following) == [("t", 0, 10, 12), ("t", 1, 8, 9)]
    assert _from_json(following) == {"t": {0: 12, 1: 9}}


def test_nothing_new_after_a_batch_that_added_a_partition_plans_no_batch() -> None:
    """Spark plans a batch whenever the latest offset differs from the last end, JSON for JSON."""
    kafka = GrowingKafka(low={0: 0, 1: 0}, high={0: 10, 1: 8})
    end = json.loads(json.dumps(planner(kafka).latestOffset({"t": {"0": 5}}, ReadAllAvailable())))
    assert planner(kafka).latestOffset(end, ReadAllAvailable()) == end


def test_a_new_partition_capped_by_max_offsets_per_trigger_still_reads_from_its_planned_start() -> None:
    kafka = GrowingKafka(low={0: 0, 1: 0}, high={0: 100, 1: 100})
    end = planner(kafka, max_offsets_per_trigger="50").latestOffset({"t": {"0": 50}}, ReadMaxRows(50))
    kafka.low[1] = 10
    assert ranges(planner(kafka), {"t": {"0": 50}}, end) == [("t", 0, 50, 66), ("t", 1, 0, 34)]


def test_a_new_partition_whose_first_records_are_gone_when_first_seen_starts_at_its_earliest_with_a_warning(
        caplog) -> None:  # noqa: ANN001
    """Records deleted before the job ever saw the partition cannot be read by any restart; stopping would
    stop every restart, and a new checkpoint (the only way on) would not bring them back either. As for a
    committed offset the broker no longer has (initialOffset): start where the broker's records start, and
    say which offsets were never read."""
    kafka = GrowingKafka(low={0: 0, 1: 40}, high={0: 10, 1: 48})
    end = planner(kafka).latestOffset({"t": {"0": 5}}, ReadAllAvailable())
    assert ranges(planner(kafka), {"t": {"0": 5}}, end) == [("t", 0, 5, 10), ("t", 1, 40, 48)]
    assert ("t/1: a partition new to this job starts at offset 40: its offsets 0 to 39 were deleted before the "
            "job could read them (retention) and are not in the table") in caplog.text


def test_a_new_partition_with_nothing_in_it_yet_needs_no_planned_start() -> None:
    kafka = GrowingKafka(low={0: 0, 1: 0}, high={0: 10, 1: 0})
    end = planner(kafka).latestOffset({"t": {"0": 5}}, ReadAllAvailable())
    assert end == {"t": {"0": 10, "1": 0}}


def test_an_end_written_before_starts_were_recorded_still_plans(caplog) -> None:  # noqa: ANN001
    """Checkpoints of earlier versions: their ends have offsets only. A partition new in such a batch starts
    where the broker's records start now (what those versions did), said when that is not 0."""
    kafka = GrowingKafka(low={0: 0, 1: 2}, high={0: 10, 1: 8})
    assert ranges(planner(kafka), {"t": {"0": 5}}, {"t": {"0": 10, "1": 8}}) == [("t", 0, 5, 10), ("t", 1, 2, 8)]
    assert "t/1: a partition new to this job starts at offset 2" in caplog.text


def test_once_the_driver_is_stopping_no_further_batch_is_planned(tmp_path) -> None:  # noqa: ANN001
    """With a backlog Spark's trigger runs batch after batch and the driver, stopping after "the current
    batch", would never see it idle: once the stop file exists the latest offset is where the last batch
    ended, so the query idles after the batch it runs."""
    kafka = GrowingKafka(low={0: 0}, high={0: 1000})
    stop_file = tmp_path / "stop"
    reader = planner(kafka, stop_file=str(stop_file), max_offsets_per_trigger="100")
    start = {"t": {"0": 200}}
    assert _from_json(reader.latestOffset(start, ReadMaxRows(100))) == {"t": {0: 300}}
    stop_file.touch()
    assert reader.latestOffset(start, ReadMaxRows(100)) == start
    assert planner(kafka).latestOffset(start, ReadMaxRows(100)) != start, "no stop file: reads on"


class RestartingKafka(GrowingKafka):
    """A broker that does not answer the first `down` requests for end offsets (`error`), then does."""

    def __init__(self, down: int, error: Exception) -> None:
        super().__init__(low={0: 0}, high={0: 50})
        self.down, self.error, self.asked = down, error, 0

    def end_offsets(self, topics):  # noqa: ANN001, ANN201
        self.asked += 1
        if self.asked <= self.down:
            raise self.error
        return super().end_offsets(topics)


def test_the_planner_waits_out_a_broker_that_does_not_answer_then_gives_up_saying_so() -> None:
    """A broker restarting while the job is idle (or between batches) failed the planner's first request and
    stopped the job within 30 s, where a task waits for records for SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS."""
    import pytest

    from firehose_bq.errors import SourceError, SourceUnavailableError

    down = SourceUnavailableError("Kafka at b:1: offsets of t/0 failed: Local: Broker transport failure")
    kafka = RestartingKafka(down=2, error=down)
    assert _from_json(planner(kafka).latestOffset({"t": {"0": 0}}, ReadAllAvailable())) == {"t": {0: 50}}
    assert kafka.asked == 3

    gone = RestartingKafka(down=10**6, error=down)
    with pytest.raises(SourceUnavailableError, match="Broker transport failure"):
        planner(gone, stall_timeout_ms="1200").latestOffset({"t": {"0": 0}}, ReadAllAvailable())
    assert 2 <= gone.asked <= 4, "tried again within the stall timeout, then stopped"

    refused = RestartingKafka(down=1, error=SourceError("topic 't' does not exist on b:1"))
    with pytest.raises(SourceError, match="does not exist"):
        planner(refused).latestOffset({"t": {"0": 0}}, ReadAllAvailable())
    assert refused.asked == 1, "an answer (no such topic) is not waited out"
    assert planner(RestartingKafka(down=1, error=down)).reportLatestOffset() is None, "progress reports only"


def test_kafka_errors_of_a_broker_that_does_not_answer_are_told_apart_from_refusals() -> None:
    import confluent_kafka as ck
    import pytest

    from firehose_bq.errors import SourceError, SourceUnavailableError
    from firehose_bq.source.kafka_client import KafkaMetadataClient

    client = KafkaMetadataClient("127.0.0.1:1", "g")
    try:
        def failing(code: int):  # noqa: ANN202
            def call() -> None:
                raise ck.KafkaException(ck.KafkaError(code))
            return call

        # _DESTROY_BROKER: what a watermark query outstanding while the broker stopped got in a drill
        # (test_drills.py, the broker restart while idle), which stopped the job instead of waiting.
        for code in (ck.KafkaError._TRANSPORT, ck.KafkaError._TIMED_OUT, ck.KafkaError._ALL_BROKERS_DOWN,
                     ck.KafkaError._DESTROY_BROKER):
            with pytest.raises(SourceUnavailableError):
                client._call("metadata", failing(code))
        with pytest.raises(SourceError) as refused:
            client._call("metadata", failing(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED))
        assert not isinstance(refused.value, SourceUnavailableError)
    finally:
        client.close()


def test_many_partitions_are_read_by_at_most_max_tasks_tasks_of_about_as_many_records() -> None:
    from firehose_bq.source.kafka_source import group_ranges

    # Every task costs Spark a fixed ≈ 30 ms: 64 partitions as 64 tasks on two cores took 4x as long.
    sizes = [100, 5, 60, 40, 30, 30, 20, 10, 1]
    planned = [("t", p, 1000, 1000 + n) for p, n in enumerate(sizes)]
    groups = group_ranges(planned, 3)
    assert len(groups) == 3
    assert sorted(r for g in groups for r in g) == planned  # every range once, none cut
    totals = sorted(sum(e - s for _, _, s, e in g) for g in groups)
    assert totals[-1] == 100 and totals[-1] - totals[0] <= max(sizes[1:])  # the largest range alone bounds it
    assert all(g == sorted(g) for g in groups)  # a task reads its partitions in order
    assert group_ranges(list(reversed(planned)), 3) == groups  # the same ranges, the same tasks


def test_fewer_ranges_than_tasks_or_no_limit_is_one_task_per_partition() -> None:
    from firehose_bq.source.kafka_source import group_ranges

    planned = [("a", 0, 0, 5), ("b", 3, 2, 4)]
    assert group_ranges(planned, 2) == group_ranges(planned, 8) == group_ranges(planned, 0) == [[r] for r in planned]
    assert group_ranges(planned, 1) == [planned]


def test_the_source_hands_each_task_its_group_of_ranges() -> None:
    reader = KafkaStreamReader({"brokers": "b:1", "topics": "t,u", "group_id": "g", "max_tasks": "2"})
    parts = reader.partitions({"t": {"0": 0, "1": 0, "2": 0}, "u": {"0": 0}},
                              {"t": {"0": 10, "1": 20, "2": 30}, "u": {"0": 5}})
    assert len(parts) == 2
    read = [list(reader.read(part)) for part in parts]
    assert sorted(r for rows in read for r in rows) == [("t", 0, 0, 10), ("t", 1, 0, 20), ("t", 2, 0, 30),
                                                          ("u", 0, 0, 5)]
    assert sorted(sum(e - s for _, _, s, e in rows) for rows in read) == [30, 35]


def test_a_broker_that_never_answers_is_reported_after_the_request_timeout_setting(monkeypatch) -> None:  # noqa: ANN001
    """SOURCE_KAFKA_REQUEST_TIMEOUT_MS reaches the start's check and the planner (its option) and the
    readers: a listener that accepts and never answers (a broker of another protocol) costs that, not 30 s."""
    import socket
    import time

    import pytest

    from firehose_bq.config import Config
    from firehose_bq.errors import SourceError
    from firehose_bq.source.kafka_client import (CONFLUENT_KAFKA, KAFKA_PYTHON, REQUEST_TIMEOUT_MS, RangeReader,
                                                 confluent_config)
    from tests.unit.test_config import MINIMAL

    assert Config.from_env(MINIMAL).source.request_timeout_ms == REQUEST_TIMEOUT_MS == 30_000
    assert Config.from_env({**MINIMAL, "SOURCE_KAFKA_REQUEST_TIMEOUT_MS": "1500"}).source.request_timeout_ms == 1500
    assert confluent_config("b:1", 10, request_timeout_ms=1500)["socket.timeout.ms"] == 1500
    assert RangeReader("b:1", CONFLUENT_KAFKA, 1000, request_timeout_ms=1500).request_timeout_ms == 1500
    import kafka

    class Made(Exception):
        pass

    def consumer(**kwargs: object) -> None:
        raise Made(kwargs["request_timeout_ms"], kwargs["bootstrap_timeout_ms"])

    monkeypatch.setattr(kafka, "KafkaConsumer", consumer)
    with pytest.raises(Made) as made:  # kafka-python's first connection waits bootstrap_timeout_ms (30 s)
        list(RangeReader("b:1", KAFKA_PYTHON, 1000, request_timeout_ms=1500).read("t", 0, 0, 1))
    assert made.value.args == (1500, 1500)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        brokers = f"127.0.0.1:{silent.getsockname()[1]}"
        reader = KafkaStreamReader({"brokers": brokers, "topics": "t", "group_id": "g", "request_timeout_ms": "1500"})
        client = reader._kafka()
        started = time.monotonic()
        try:
            with pytest.raises(SourceError, match=f"Kafka at {brokers}"):
                client.partitions(("t",))
        finally:
            client.close()
        assert time.monotonic() - started < 5


def test_a_reader_fetches_again_soon_after_a_fetch_filled_its_queue() -> None:
    """librdkafka puts off the next fetch of a partition whose queue a fetch filled past the reader's limits
    by `fetch.queue.backoff.ms`, however soon the task drains it. At librdkafka's default (1 s), a broker that
    hands out a partition in fetches of a few MB, as Kafka does, gave each task one fetch a second
    (bench/capped_fetch.py: 24k against 333k records a second). 0 stalls the read."""
    import confluent_kafka as ck

    from firehose_bq.source.kafka_client import FETCH_QUEUE_BACKOFF_MS, confluent_config

    conf = confluent_config("127.0.0.1:1", 10_000)
    assert conf["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS
    assert 0 < FETCH_QUEUE_BACKOFF_MS <= 50
    ck.Consumer(conf).close()  # a setting this librdkafka takes
