"""The few Kafka operations the source needs, over kafka-python.

Offsets are plain dicts `{topic: {partition: offset}}` (partition as int here; the Spark-facing
offset JSON uses string keys, see `kafka_source.py`). "End" offsets are exclusive: the offset of the
next record to be written, i.e. the high watermark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, OffsetOutOfRangeError
from kafka.structs import OffsetAndMetadata

from firehose_bq.errors import SourceError

log = logging.getLogger(__name__)

Offsets = dict[str, dict[int, int]]

# Metadata and offset look-ups on the driver: long enough for a busy broker, short enough that a dead
# one is reported while the user is still watching.
REQUEST_TIMEOUT_MS = 30_000
# Largest fetch per partition (kafka-python's default is 1 MiB; bigger fetches cut round trips).
MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ConsumerRecord:
    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    timestamp_type: int | None
    headers: list[tuple[str, bytes | None]]
    leader_epoch: int | None


class KafkaMetadataClient:
    """Driver-side view of topics, watermarks and the consumer group's committed offsets."""

    def __init__(self, brokers: str, group_id: str) -> None:
        self._brokers = brokers
        try:
            self._consumer = KafkaConsumer(
                bootstrap_servers=brokers.split(","),
                group_id=group_id,
                enable_auto_commit=False,
                request_timeout_ms=REQUEST_TIMEOUT_MS,
                client_id=f"firehose-bq-{group_id}",
            )
        except KafkaError as exc:
            raise SourceError(f"cannot connect to Kafka at {brokers}: {exc}") from exc

    def partitions(self, topics: tuple[str, ...]) -> list[TopicPartition]:
        result = []
        for topic in topics:
            found = self._consumer.partitions_for_topic(topic)
            if not found:
                raise SourceError(f"topic {topic!r} does not exist on {self._brokers}")
            result.extend(TopicPartition(topic, p) for p in sorted(found))
        return result

    def end_offsets(self, topics: tuple[str, ...]) -> Offsets:
        return _nest(self._consumer.end_offsets(self.partitions(topics)))

    def beginning_offsets(self, partitions: list[TopicPartition]) -> Offsets:
        return _nest(self._consumer.beginning_offsets(partitions))

    def committed_offsets(self, topics: tuple[str, ...]) -> Offsets:
        """The group's committed offsets; partitions it never committed are absent."""
        result: Offsets = {}
        for tp in self.partitions(topics):
            offset = self._consumer.committed(tp)
            if offset is not None and offset >= 0:
                result.setdefault(tp.topic, {})[tp.partition] = offset
        return result

    def commit(self, offsets: Offsets) -> None:
        self._consumer.commit(
            {
                TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                for topic, parts in offsets.items()
                for partition, offset in parts.items()
            }
        )

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def read_range(
    brokers: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    stall_timeout_ms: int,
    batch_size: int,
) -> Iterator[list[ConsumerRecord]]:
    """Records of one partition in [start, end), in lists of at most `batch_size`.

    Offsets may have gaps (compaction, transaction markers), so the loop ends when the consumer's
    position reaches `end`, not after a fixed count. A start offset that retention already deleted
    is an error, not a silent skip: those messages never reached the table.
    """
    consumer = KafkaConsumer(
        bootstrap_servers=brokers.split(","),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_bytes=4 * MAX_PARTITION_FETCH_BYTES,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        pending: list[ConsumerRecord] = []
        last_progress = time.monotonic()
        while position < end:
            try:
                polled = consumer.poll(timeout_ms=500, max_records=batch_size).get(tp, [])
            except OffsetOutOfRangeError as exc:
                raise SourceError(
                    f"{topic}/{partition}: offsets from {start} are no longer on the broker "
                    f"(deleted by retention?): {exc}"
                ) from exc
            for r in polled:
                if r.offset >= end:
                    break
                pending.append(
                    ConsumerRecord(r.key, r.value, r.topic, r.partition, r.offset,
                                   r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None,
                                   r.timestamp_type, list(r.headers or []), r.leader_epoch)
                )
            new_position = consumer.position(tp)
            if new_position is not None and new_position > position:
                position = new_position
                last_progress = time.monotonic()
            elif (time.monotonic() - last_progress) * 1000 > stall_timeout_ms:
                raise SourceError(
                    f"{topic}/{partition}: no progress for {stall_timeout_ms} ms at offset {position}, "
                    f"planned to read up to {end}"
                )
            if len(pending) >= batch_size:
                yield pending
                pending = []
        if pending:
            yield pending
    finally:
        consumer.close(autocommit=False)


def _nest(flat: dict[TopicPartition, int]) -> Offsets:
    result: Offsets = {}
    for tp, offset in flat.items():
        result.setdefault(tp.topic, {})[tp.partition] = offset
    return result
