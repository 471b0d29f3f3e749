"""The source's Arrow batches, built column-wise from each client's messages, against the record-by-record
rules they must follow (no broker: both clients' message types can be made by hand)."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest
from kafka.consumer.fetcher import ConsumerRecord

from firehose_bq.source.batches import ARROW_SCHEMA, from_confluent, from_kafka_python
from firehose_bq.source.kafka_client import _below, _rebatch

CREATE, LOG_APPEND, NONE = ck.TIMESTAMP_CREATE_TIME, ck.TIMESTAMP_LOG_APPEND_TIME, ck.TIMESTAMP_NOT_AVAILABLE
# librdkafka's timestamp kinds → Kafka's numbering (the `timestamp_type` column), None when there is none.
KAFKA_KIND = {CREATE: 0, LOG_APPEND: 1, NONE: None}
# 9999-12-31 23:59:59.999 UTC in ms: the last Kafka timestamp a TIMESTAMP column holds.
LAST_BIGQUERY_MS = int((datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC))
                       / timedelta(milliseconds=1))


def expected_row(key: bytes | None, value: bytes | None, offset: int, kind: int, ms: int,
                 headers: list[tuple[str, bytes | None]] | None, epoch: int | None) -> dict[str, Any]:
    """One record as the source must show it, spelled out rule by rule."""
    has_time = kind != NONE and 0 <= ms <= LAST_BIGQUERY_MS
    return {
        "key": key, "value": value, "topic": "t", "partition": 3, "offset": offset,
        "timestamp": ms * 1000 if has_time else None,  # microseconds, as far as BigQuery's TIMESTAMP goes
        "timestamp_type": KAFKA_KIND[kind],
        "headers": [{"key": k, "value": v} for k, v in headers or []],
        "leader_epoch": epoch if epoch is not None and epoch >= 0 else None,
    }


def expected_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    micros = ARROW_SCHEMA.field("timestamp").type
    columns = {f.name: pa.array([r[f.name] for r in rows], pa.int64() if f.type == micros else f.type)
               for f in ARROW_SCHEMA}
    columns["timestamp"] = columns["timestamp"].cast(micros)
    return pa.RecordBatch.from_arrays(list(columns.values()), schema=ARROW_SCHEMA)


def confluent(key: bytes | None, value: bytes | None, offset: int, kind: int, ms: int,
              headers: list[tuple[str, bytes | None]] | None, epoch: int | None) -> ck.Message:
    return ck.Message(topic="t", partition=3, offset=offset, key=key, value=value, timestamp=(kind, ms),
                      headers=headers, leader_epoch=-1 if epoch is None else epoch)


def kafka_python(key: bytes | None, value: bytes | None, offset: int, kind: int, ms: int,
                 headers: list[tuple[str, bytes | None]] | None, epoch: int | None) -> ConsumerRecord:
    # kafka-python says "no timestamp" with -1 and no type, and "no headers" with an empty list.
    stamp, kafka_kind = (ms, KAFKA_KIND[kind]) if kind != NONE else (-1, None)
    return ConsumerRecord("t", 3, -1 if epoch is None else epoch, offset, stamp, kafka_kind, key, value,
                          headers or [], None, -1, -1, -1)


EDGE_CASES = [
    (b"k", b"v", 7, CREATE, 1_000, [("h", b"x"), ("nul", None), ("empty", b"")], 3),
    (b"k", None, 8, LOG_APPEND, 2_000, None, None),  # a tombstone: NULL value, key kept
    (None, None, 9, NONE, 0, [], -1),  # NULL key and value; no timestamp in this record format
    (None, b"", 11, CREATE, -1, [("ключ", b"\xff\x00")], 0),  # offset gap; CreateTime without a time
]


@pytest.mark.parametrize("build,make", [(from_confluent, confluent), (from_kafka_python, kafka_python)])
def test_each_client_gives_the_rows_record_by_record_rules_give(build, make) -> None:  # noqa: ANN001
    batch = build([make(*case) for case in EDGE_CASES], "t", 3)
    assert batch.schema == ARROW_SCHEMA
    assert batch.equals(expected_batch([expected_row(*case) for case in EDGE_CASES]))


def hostile(rng: random.Random, offset: int) -> tuple[Any, ...]:
    def blob() -> bytes | None:
        return None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 300))

    headers = None if rng.random() < 0.7 else [
        (rng.choice(["a", "trace-id", "ü", ""]), blob()) for _ in range(rng.randrange(0, 4))]
    return (blob(), blob(), offset, rng.choice([CREATE, LOG_APPEND, NONE]), rng.choice([-1, 0, 2**41, LAST_BIGQUERY_MS, LAST_BIGQUERY_MS + 1, 2**62]),
            headers, rng.choice([None, -1, 0, 5]))


def test_random_batches_match_the_rules_and_both_clients_agree() -> None:
    rng = random.Random(42)
    for size in (0, 1, 2, 17, 3_000):
        cases = [hostile(rng, 100 + 2 * i) for i in range(size)]
        want = expected_batch([expected_row(*c) for c in cases])
        assert from_confluent([confluent(*c) for c in cases], "t", 3).equals(want)
        assert from_kafka_python([kafka_python(*c) for c in cases], "t", 3).equals(want)


@pytest.mark.parametrize("build,make", [(from_confluent, confluent), (from_kafka_python, kafka_python)])
def test_a_timestamp_after_year_9999_is_null_with_a_warning_and_the_record_is_kept(build, make, caplog) -> None:  # noqa: ANN001
    # Years 10,000 to 294,247 fit in microseconds but not in BigQuery; later ones fit in neither: all alike.
    cases = [(b"k", b"v", 5, CREATE, LAST_BIGQUERY_MS, None, 0), (b"k", b"v", 6, CREATE, LAST_BIGQUERY_MS + 1, None, 0),
             (b"k", b"v", 7, CREATE, 2**62, None, 0), (b"k", b"v", 8, CREATE, -1, None, 0)]
    with caplog.at_level(logging.WARNING, logger="firehose_bq.source.batches"):
        batch = build([make(*case) for case in cases], "t", 3)
    assert batch.column("value").to_pylist() == [b"v"] * 4
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [LAST_BIGQUERY_MS * 1000, None, None, None]
    assert [r.getMessage() for r in caplog.records] == [
        f"t/3: 2 record(s) carry a Kafka timestamp after 9999-12-31, which BigQuery cannot hold; their "
        f"message_timestamp is NULL (first at offset 6: {LAST_BIGQUERY_MS + 1} ms)"]


def test_polls_are_rebatched_to_at_most_the_batch_size_in_order() -> None:
    polls = [list(range(0, 7)), [], list(range(7, 9)), list(range(9, 30))]
    sizes = [len(b) for b in _rebatch(iter(polls), 10)]
    assert sizes == [10, 10, 10]
    assert [x for b in _rebatch(iter(polls), 4) for x in b] == list(range(30))
    assert [len(b) for b in _rebatch(iter([[1, 2, 3]]), 10)] == [3]


def test_the_last_batches_go_on_after_the_backend_closed_its_consumer() -> None:
    closed = []

    def polls():  # noqa: ANN202
        try:
            yield from ([1] * 10, [2] * 10, [3] * 5)
        finally:
            closed.append(True)

    handed = [(batch[0], len(batch), bool(closed)) for batch in _rebatch(polls(), 10)]
    assert handed == [(1, 10, False), (2, 10, False), (3, 5, True)]


def test_messages_at_or_past_the_end_are_cut() -> None:
    offsets = [3, 4, 6, 9]
    assert _below(offsets, 10, int) == offsets
    assert _below(offsets, 6, int) == [3, 4]
    assert _below(offsets, 5, int) == [3, 4]
    assert _below(offsets, 3, int) == []
    assert _below([], 3, int) == []
