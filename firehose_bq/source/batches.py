"""The source's Arrow batch (ARROW_SCHEMA), built column by column from what a Kafka client returns.

pyarrow.compute is imported where batches are built: Spark's per-query source-runner process imports
this module for ARROW_SCHEMA only and would pay 40-60 ms for it, on every query.

No per-record Python object is made on the way: each column is pulled out of the client's message list
in one pass (`map` over the client's own accessor, which runs in C for confluent-kafka), and the rules
that turn Kafka's "not available" markers into NULLs run once per column, in Arrow compute.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa

from firehose_bq.bq_limits import MAX_MICROS

log = logging.getLogger(__name__)

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_type", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("leader_epoch", pa.int32()),
    ]
)
_HEADER = ARROW_SCHEMA.field("headers").type.value_type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type

Headers = Sequence[tuple[str, bytes | None]] | None

# The latest Kafka timestamp (ms) a TIMESTAMP column can hold: 9999-12-31 23:59:59.999, BigQuery's last.
_LATEST_MS = MAX_MICROS // 1000
# librdkafka's timestamp kinds (confluent_kafka.TIMESTAMP_*) are Kafka's own numbering plus one, with 0
# for "not available" (no timestamp in the record batch's format).
_LIBRDKAFKA_NOT_AVAILABLE = 0


def from_confluent(messages: Sequence[Any], topic: str, partition: int) -> pa.RecordBatch:
    """`confluent_kafka.Message`s of one partition, none of them an error event."""
    import pyarrow.compute as pc
    from confluent_kafka import Message

    n = len(messages)
    # The client hands out (kind, ms) pairs only: flatten them into one int64 run and split its columns.
    pairs = np.fromiter(chain.from_iterable(map(Message.timestamp, messages)), np.int64, 2 * n).reshape(n, 2)
    kinds = pa.array(pairs[:, 0], pa.int32())
    missing = pc.equal(kinds, _LIBRDKAFKA_NOT_AVAILABLE)
    return _batch(
        keys=list(map(Message.key, messages)),
        values=list(map(Message.value, messages)),
        topic=topic,
        partition=partition,
        offsets=list(map(Message.offset, messages)),
        stamps_ms=pc.if_else(missing, None, pa.array(pairs[:, 1])),
        kinds=pc.if_else(missing, None, pc.subtract(kinds, 1)),
        headers=list(map(Message.headers, messages)),
        epochs=pa.array(list(map(Message.leader_epoch, messages)), pa.int32()),
    )


_KAFKA_PYTHON_COLUMNS = attrgetter("key", "value", "offset", "timestamp", "timestamp_type", "headers", "leader_epoch")


def from_kafka_python(records: Sequence[Any], topic: str, partition: int) -> pa.RecordBatch:
    """kafka-python `ConsumerRecord`s of one partition."""
    if not records:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    keys, values, offsets, stamps, kinds, headers, epochs = zip(*map(_KAFKA_PYTHON_COLUMNS, records))
    return _batch(keys=keys, values=values, topic=topic, partition=partition, offsets=offsets,
                  stamps_ms=pa.array(stamps, pa.int64()), kinds=pa.array(kinds, pa.int32()), headers=headers,
                  epochs=pa.array(epochs, pa.int32()))


def _batch(*, keys: Sequence[bytes | None], values: Sequence[bytes | None], topic: str, partition: int,
           offsets: Sequence[int], stamps_ms: pa.Array, kinds: pa.Array, headers: Sequence[Headers],
           epochs: pa.Array) -> pa.RecordBatch:
    """What both clients share. A negative timestamp or leader epoch is Kafka's "none" (-1). A timestamp
    after BigQuery's last (9999-12-31), which only a broken or hostile producer sends, is NULL too, with a
    warning: it is the record's metadata, not its content, so the message still lands (dead-lettering it
    would dead-letter it again on every replay, the letter carrying the same time); and failing the batch
    would fail every retry of it."""
    import pyarrow.compute as pc

    n = len(offsets)
    too_late = pc.greater(stamps_ms, _LATEST_MS)
    if pc.any(too_late).as_py():
        first = pc.index(too_late, True).as_py()
        log.warning("%s/%d: %d record(s) carry a Kafka timestamp after 9999-12-31, which BigQuery cannot hold; "
                    "their message_timestamp is NULL (first at offset %d: %d ms)", topic, partition,
                    pc.sum(too_late).as_py(), offsets[first], stamps_ms[first].as_py())
    unusable = pc.or_(pc.less(stamps_ms, 0), too_late)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pc.if_else(unusable, None, pc.multiply(stamps_ms, 1000)).cast(_TIMESTAMP),
        kinds,
        _headers(headers),
        pc.if_else(pc.less(epochs, 0), None, epochs),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _headers(per_record: Sequence[Headers]) -> pa.Array:
    """One list of (key, value) structs per record; a record without headers gets an empty list."""
    n = len(per_record)
    if not any(per_record):  # the usual case: nobody sends headers (None or an empty list each)
        return pa.ListArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], _HEADER))
    ends = np.cumsum([0, *(len(hs) if hs else 0 for hs in per_record)], dtype=np.int32)
    flat = [h for hs in per_record if hs for h in hs]
    keys, values = zip(*flat) if flat else ((), ())
    items = pa.StructArray.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.binary())],
                                       fields=list(_HEADER))
    return pa.ListArray.from_arrays(pa.array(ends), items)
