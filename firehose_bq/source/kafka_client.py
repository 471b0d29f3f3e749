"""The few Kafka operations the source needs: offsets over kafka-python, reading over either client.

Offsets are plain dicts `{topic: {partition: offset}}` (partition as int here; the Spark-facing
offset JSON uses string keys, see `kafka_source.py`). "End" offsets are exclusive: the first offset a
reader at the job's isolation level cannot read yet. Under read_committed (the default) that is the last
stable offset (LSO: the first record of the oldest transaction still open, else the high watermark), under
read_uncommitted the high watermark. Planner and readers must use the same level: a read_committed reader
asked to read past the LSO waits there until the transaction ends, and a read_uncommitted one writes the
records of aborted transactions.

kafka-python is imported where it is used: Spark's source and task workers import this module, and with
the default confluent-kafka reader most of them (tasks reading ranges, planning workers) never touch
kafka-python, which would cost each of those processes ~9 MB.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar

import pyarrow as pa

from firehose_bq.errors import SourceError, SourceUnavailableError
from firehose_bq.source import batches
from firehose_bq.source.kafka_security import KafkaSecurityConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

Offsets = dict[str, dict[int, int]]

# Metadata and offset look-ups on the driver: long enough for a busy broker, short enough that a dead
# one is reported while the user is still watching (SOURCE_KAFKA_REQUEST_TIMEOUT_MS's default).
REQUEST_TIMEOUT_MS = 30_000
# How long a task waits for records of its range, and the planner for a broker that does not answer
# (SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS's default).
STALL_TIMEOUT_MS = 120_000
# Largest fetch per partition (kafka-python's default is 1 MiB; bigger fetches cut round trips).
MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
# Kafka's isolation levels (`isolation.level`), by their names in every client.
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)
# Rows per Arrow batch a range is read in: large enough to amortize per-batch costs, small enough that a
# task holds a few MB, not a whole partition's backlog.
READ_BATCH_ROWS = 10_000
# How soon a reader looks again at a queue it found full (confluent_config says why).
FETCH_QUEUE_BACKOFF_MS = 10


class KafkaMetadataClient:
    """Driver-side view of topics, end offsets and the consumer group's committed offsets.

    On librdkafka (confluent-kafka), whichever client the readers use: Spark starts a new source process
    for every streaming query, and this client is on its critical path. Made and used once there, it
    costs ≈ 40 ms against kafka-python's ≈ 175 ms (its import alone is 140 ms), for the same answers.
    End offsets are those a reader at `isolation_level` can reach: librdkafka's watermark query honours
    `isolation.level` since 1.8 (librdkafka#3423), so under read_committed its "high" is the LSO. Commits
    go to the group without joining it."""

    def __init__(self, brokers: str, group_id: str, isolation_level: str = READ_COMMITTED,
                 security: KafkaSecurityConfig = KafkaSecurityConfig(), *, auto_create: bool = False,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        """`auto_create`: its metadata requests let the brokers create a missing topic, as a producer's do
        (`require_writable`); off, a missing source topic is reported, never created. `request_timeout_ms`:
        how long each request waits for the brokers."""
        import confluent_kafka as ck

        self._ck = ck
        self._brokers = brokers
        self._timeout_s = request_timeout_ms / 1000
        # librdkafka's codes for a broker that did not answer (down, unreachable, restarting, slow), as
        # opposed to one that answered no (a missing topic, no authorization). _DESTROY_BROKER: a request
        # outstanding on a broker handle that librdkafka dropped, as it does when the broker goes away.
        errors = ck.KafkaError
        self._unavailable = frozenset((errors._TRANSPORT, errors._ALL_BROKERS_DOWN, errors._TIMED_OUT,
                                       errors._RESOLVE, errors._DESTROY_BROKER, errors.REQUEST_TIMED_OUT,
                                       errors.LEADER_NOT_AVAILABLE, errors.NOT_LEADER_FOR_PARTITION,
                                       errors.BROKER_NOT_AVAILABLE))
        self._consumer = ck.Consumer({
            "bootstrap.servers": brokers,
            "group.id": group_id,
            "client.id": f"firehose-bq-{group_id}",
            "enable.auto.commit": False,
            "isolation.level": isolation_level,
            "socket.timeout.ms": request_timeout_ms,
            "allow.auto.create.topics": auto_create,
            "logger": librdkafka_logger(),
            **security.librdkafka(),
        })

    def _call(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return call(*args, **kwargs)
        except self._ck.KafkaException as exc:
            error = exc.args[0]
            unavailable = error.code() in self._unavailable or error.retriable()
            raise (SourceUnavailableError if unavailable else SourceError)(
                f"Kafka at {self._brokers}: {what} failed: {error.str()}") from exc
        finally:
            # This client never consumes: hand librdkafka's queued log lines on now (the cause of a
            # failure among them, before the error that reports it).
            self._consumer.poll(0)

    def partitions(self, topics: tuple[str, ...]) -> list[tuple[str, int]]:
        """(topic, partition) of every partition of `topics`; SourceError for a topic the broker lacks."""
        result = []
        for topic in topics:
            found = self._call(f"metadata of {topic!r}", self._consumer.list_topics, topic,
                               timeout=self._timeout_s).topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                detail = f": {found.error.str()}" if found is not None and found.error is not None else ""
                raise SourceError(f"topic {topic!r} does not exist on {self._brokers}{detail}")
            result.extend((topic, p) for p in sorted(found.partitions))
        return result

    def require_writable(self, env: str, topic: str) -> None:
        """What the job's first write to `topic` (a dead letter, an unrouted record) would meet, found at start:
        the topic exists, or the brokers create it on this request as they would on that write (this client
        made with `auto_create`). Otherwise SourceError naming `env` and the topic: left to that write, it
        would wait for the topic through every DLQ retry and stop the job, batch after batch."""
        try:
            found = self._call(f"metadata of {topic!r}", self._consumer.list_topics, topic,
                               timeout=self._timeout_s).topics.get(topic)
        except SourceError as exc:  # brokers not reached: DLQ_KAFKA_BROKERS may not be the source's, so name it
            raise SourceError(f"{env}: topic {topic!r} on {self._brokers}: {exc}") from exc
        problem = output_topic_problem(found, self._ck.KafkaError)
        if problem is not None:
            raise SourceError(f"{env}: topic {topic!r} on {self._brokers} {problem}")

    def end_offsets(self, topics: tuple[str, ...]) -> Offsets:
        return self._watermarks(self.partitions(topics), high=True)

    def beginning_offsets(self, partitions: list[tuple[str, int]]) -> Offsets:
        return self._watermarks(partitions, high=False)

    def _watermarks(self, partitions: list[tuple[str, int]], high: bool) -> Offsets:
        result: Offsets = {}
        for topic, partition in partitions:
            low, top = self._call(f"offsets of {topic}/{partition}", self._consumer.get_watermark_offsets,
                                  self._ck.TopicPartition(topic, partition), timeout=self._timeout_s)
            result.setdefault(topic, {})[partition] = top if high else low
        return result

    def committed_offsets(self, topics: tuple[str, ...]) -> Offsets:
        """The group's committed offsets; partitions it never committed are absent."""
        wanted = [self._ck.TopicPartition(t, p) for t, p in self.partitions(topics)]
        result: Offsets = {}
        for tp in self._call("the group's committed offsets", self._consumer.committed, wanted,
                             timeout=self._timeout_s):
            if tp.error is None and tp.offset >= 0:
                result.setdefault(tp.topic, {})[tp.partition] = tp.offset
        return result

    def commit(self, offsets: Offsets) -> None:
        tps = [self._ck.TopicPartition(topic, partition, offset)
               for topic, parts in offsets.items() for partition, offset in parts.items()]
        if not tps:
            return
        for tp in self._call("committing the group's offsets", self._consumer.commit, offsets=tps,
                             asynchronous=False) or []:
            if tp.error is not None:
                raise SourceError(f"Kafka at {self._brokers}: committing {tp.topic}/{tp.partition}@{tp.offset} "
                                  f"failed: {tp.error.str()}")

    def close(self) -> None:
        self._consumer.close()


def output_topic_problem(found: Any, errors: Any) -> str | None:
    """Why a topic the job writes to cannot be written, from its metadata (`found`: librdkafka's TopicMetadata,
    None if absent; `errors`: confluent_kafka.KafkaError, for its codes); None if it can be."""
    code = found.error.code() if found is not None and found.error is not None else None
    if found is None or code in (errors.UNKNOWN_TOPIC_OR_PART, errors._UNKNOWN_TOPIC):
        return ("does not exist, and the brokers do not create topics on first use (auto.create.topics.enable="
                "false): create it, then start the job (it creates no topics itself)")
    if code == errors.LEADER_NOT_AVAILABLE:
        return None  # being created by this very request (auto-creation): a producer waits for its leader
    if code is not None:
        return f"cannot be written: {found.error.str()}"
    return None if found.partitions else "has no partitions"


KAFKA_PYTHON = "kafka-python"
CONFLUENT_KAFKA = "confluent-kafka"
AUTO = "auto"


def resolve_client(name: str) -> str:
    """The reader backend for SOURCE_KAFKA_CLIENT: `auto` takes confluent-kafka when it is installed."""
    if name != AUTO:
        return name
    try:
        import confluent_kafka  # noqa: F401 - only whether it imports
    except ImportError:
        return KAFKA_PYTHON
    return CONFLUENT_KAFKA


# The columns of a range, as the source hands it to a task (kafka_source.RANGE_DDL).
RANGE_COLUMNS = ("topic", "partition", "start_offset", "end_offset")


@dataclass(frozen=True)
class RangeReader:
    """How a task reads the Kafka ranges it is given: settings only, pickled to the workers; each range
    gets a consumer of its own, closed when the range is read."""

    brokers: str
    client: str  # KAFKA_PYTHON or CONFLUENT_KAFKA (`resolve_client` has settled `auto`)
    stall_timeout_ms: int
    batch_rows: int = READ_BATCH_ROWS
    isolation_level: str = READ_COMMITTED  # the one the ranges were planned with (KafkaMetadataClient)
    security: KafkaSecurityConfig = KafkaSecurityConfig()  # the source's: pickled with the reader to the tasks
    request_timeout_ms: int = REQUEST_TIMEOUT_MS  # SOURCE_KAFKA_REQUEST_TIMEOUT_MS

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records of one partition in [start, end), as Arrow batches (batches.ARROW_SCHEMA) of at most
        `batch_rows` rows.

        Offsets may have gaps (compaction, transaction markers, under read_committed the records of
        aborted transactions), so the loop ends when the consumer's position reaches `end`, not after a
        fixed count. A start offset that retention already deleted
        is an error, not a silent skip: those messages never reached the table.
        """
        confluent = self.client == CONFLUENT_KAFKA
        polls = (_polls_confluent if confluent else _polls_kafka_python)(
            self.brokers, topic, partition, start, end, self.stall_timeout_ms, self.batch_rows, self.isolation_level,
            self.security, self.request_timeout_ms)
        build = batches.from_confluent if confluent else batches.from_kafka_python
        for messages in _rebatch(polls, self.batch_rows):
            yield _uncollected(build, messages, topic, partition)
        # Arrow's allocator (mimalloc) keeps freed pages for reuse; a worker then idles until its next range
        # with them resident (~30 MB each in P4). The caller asked past the last batch, so it is done with
        # the batches: give the pages back.
        pa.default_memory_pool().release_unused()


def _uncollected(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` with Python's cycle collector off. Reading makes thousands of client objects at a
    time and holds them until their batch is built; each batch so held made the collector walk every
    object of the worker, a third of the reader's CPU time, and found nothing: messages hold no cycles.
    Never across a `yield`: the code that takes the batch runs with the collector as it was."""
    if not gc.isenabled():
        return call(*args)
    gc.disable()
    try:
        return call(*args)
    finally:
        gc.enable()


def _rebatch(polls: Iterator[list[Any]], size: int) -> Iterator[list[Any]]:
    """Each backend yields what one poll brought; hand them on in lists of at most `size`.

    A poll's messages go on only once the next poll is in: the last ones therefore go on after the
    backend has finished and closed its consumer. An open consumer costs CPU while the task works
    through what it was given (librdkafka keeps fetching at the end of the partition: 0.35 CPU-s a second
    against the local broker), and the last batch is what the task is busy with when nothing is left to read.
    """
    pending: list[Any] = []
    for messages in polls:
        while len(pending) >= size:
            yield pending[:size]
            del pending[:size]
        pending.extend(messages)
    while pending:
        yield pending[:size]
        del pending[:size]


class _Progress:
    """Tracks a partition read: where it is, and whether it has stalled."""

    def __init__(self, topic: str, partition: int, start: int, end: int, stall_timeout_ms: int,
                 isolation_level: str, high_watermark: Callable[[], int | None]) -> None:
        self.where = f"{topic}/{partition}"
        self.position, self.end, self.stall_timeout_ms = start, end, stall_timeout_ms
        self._isolation_level, self._high_watermark = isolation_level, high_watermark
        self._last = time.monotonic()

    def advance(self, position: int | None) -> None:
        if position is not None and position > self.position:
            self.position = position
            self._last = time.monotonic()
        elif (time.monotonic() - self._last) * 1000 > self.stall_timeout_ms:
            raise SourceError(f"{self.where}: no progress for {self.stall_timeout_ms} ms at offset "
                              f"{self.position}, planned to read up to {self.end}{self._why()}")

    def _why(self) -> str:
        """What the consumer last heard of the partition's end, when it explains the stall: a range planned
        past the LSO (under read_uncommitted, e.g. by an earlier run) waits there for the transaction."""
        if self._isolation_level != READ_COMMITTED:
            return ""
        try:
            high = self._high_watermark()
        except Exception:  # noqa: BLE001 - a hint only: the stall error itself must go out whatever it meets
            return ""
        if high is None or high <= self.position:
            return ""
        return (f" (the broker holds records up to {high}: a transaction still open at {self.position} keeps "
                f"read_committed reads there until it commits or aborts)")

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def deleted(self, start: int, detail: object) -> SourceError:
        # The batch is planned in the checkpoint, so every restart asks for the same offsets again.
        return SourceError(f"{self.where}: offsets from {start} are no longer on the broker (deleted by retention "
                           f"before they were read?): {detail}. Restarting reads the same planned offsets; to "
                           "go on without these records, start a new checkpoint (SPARK_CHECKPOINT_LOCATION): it "
                           "starts where SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET points")


def _polls_kafka_python(brokers: str, topic: str, partition: int, start: int, end: int, stall_timeout_ms: int,
                        batch_rows: int, isolation_level: str, security: KafkaSecurityConfig,
                        request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> Iterator[list[Any]]:
    """kafka-python's ConsumerRecords below `end`, one list per poll."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    consumer = KafkaConsumer(
        bootstrap_servers=brokers.split(","),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        isolation_level=isolation_level,
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_bytes=4 * MAX_PARTITION_FETCH_BYTES,
        request_timeout_ms=request_timeout_ms,
        bootstrap_timeout_ms=request_timeout_ms,  # its first connection, in __init__ (kafka-python's default: 30 s)
        **security.kafka_python(),
    )
    tp = TopicPartition(topic, partition)
    progress = _Progress(topic, partition, start, end, stall_timeout_ms, isolation_level,
                         lambda: consumer.highwater(tp))
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        while not progress.done:
            try:
                polled = consumer.poll(timeout_ms=500, max_records=batch_rows).get(tp, [])
            except OffsetOutOfRangeError as exc:
                raise progress.deleted(start, exc) from exc
            progress.advance(consumer.position(tp))
            yield _below(polled, end, attrgetter("offset"))
    finally:
        consumer.close(autocommit=False)


class _DistinctLines(logging.Handler):
    """One librdkafka client's log lines, each distinct text once, on to this module's logger. A broker
    that refuses connections has librdkafka repeat the same line every few tens of milliseconds (about
    600 lines while a metadata request waits out its 30 s); the first says why."""

    MAX_LINES = 50

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text in self._seen or len(self._seen) >= self.MAX_LINES:
            return
        self._seen.add(text)
        log.log(record.levelno, "librdkafka: %s", text)


def librdkafka_logger() -> logging.Logger:
    """The `logger` of a confluent-kafka client: its log lines then go through Python's logging (the job's
    format, JSON included) instead of straight to stderr, each distinct one once. A logger of its own,
    outside logging's registry, so that it goes with its client. librdkafka hands lines on when the
    client is polled."""
    logger = logging.Logger("firehose_bq.librdkafka")
    logger.addHandler(_DistinctLines())
    return logger


def confluent_config(brokers: str, batch_rows: int, isolation_level: str = READ_COMMITTED,
                     security: KafkaSecurityConfig = KafkaSecurityConfig(),
                     request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> dict[str, Any]:
    """librdkafka settings of a range reader."""
    return {
        **security.librdkafka(),
        "bootstrap.servers": brokers,
        "logger": librdkafka_logger(),
        # Always explicit: librdkafka's default (read_committed) is not kafka-python's (read_uncommitted).
        "isolation.level": isolation_level,
        "group.id": "firehose-bq-reader",  # required by librdkafka; nothing is ever committed with it
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # a deleted start offset must surface, not be skipped
        "enable.partition.eof": True,
        "max.partition.fetch.bytes": MAX_PARTITION_FETCH_BYTES,
        "fetch.max.bytes": MAX_PARTITION_FETCH_BYTES,  # one partition per reader: its cap is the fetch's
        "socket.timeout.ms": request_timeout_ms,
        # A task reads a bounded range already on the broker: waiting for a fuller fetch only adds latency.
        "fetch.wait.max.ms": 50,
        # Fetch about one batch ahead, not librdkafka's default of 100,000 messages: more is never used
        # sooner, may lie past the range's end, and keeps the fetcher busy while the task works.
        "queued.min.messages": batch_rows,
        # Likewise by size: about two fetches ahead, not librdkafka's default of 64 MiB: with large
        # messages, a batch's worth of them would otherwise be held in every reader at once.
        "queued.max.messages.kbytes": 2 * MAX_PARTITION_FETCH_BYTES // 1024,
        # Once a fetch leaves more than those two limits queued, librdkafka waits this long before it even
        # looks at the queue again, however soon the task drains it. Its default, 1 s, made a task fetch
        # once a second from a broker that hands out a partition in fetches of a few MB, as Kafka does
        # (each fetch of small records is past `queued.min.messages`): 28k records a second per partition,
        # against 200k records in 0.26 s with 10 ms (bench/capped_fetch.py, on Tansu). The local broker
        # (noida-db) answers with the whole partition in one fetch, which hid it. Not 0: with it, librdkafka
        # 2.16 never fetched the rest of the partition (the read stalled).
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }


def _polls_confluent(brokers: str, topic: str, partition: int, start: int, end: int, stall_timeout_ms: int,
                     batch_rows: int, isolation_level: str, security: KafkaSecurityConfig,
                     request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> Iterator[list[Any]]:
    """The same over librdkafka, which fetches and decodes in C, tens of times faster here: its
    Messages below `end`, error events taken out, one list per poll."""
    import confluent_kafka as ck

    consumer = ck.Consumer(confluent_config(brokers, batch_rows, isolation_level, security, request_timeout_ms))
    offset = ck.Message.offset
    tp = ck.TopicPartition(topic, partition)
    progress = _Progress(topic, partition, start, end, stall_timeout_ms, isolation_level,
                         lambda: _cached_high_watermark(consumer, tp))
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        while not progress.done:
            # consume() returns early only once it has as many messages as asked for, else after its
            # timeout: never ask for more than the range still holds, or each range's end costs the wait.
            polled = _uncollected(consumer.consume, max(1, min(batch_rows, end - progress.position)), 0.1)
            # A KafkaError is truthy and cannot be compared with None (its == raises): test it with any().
            if any(map(ck.Message.error, polled)):
                polled = [m for m in polled
                          if m.error() is None or not _skippable(ck, m.error(), m, topic, partition, start, progress)]
            # Gaps (compaction, transaction markers) leave no message to see: ask for the position too.
            position = consumer.position([tp])[0].offset
            progress.advance(max(position, offset(polled[-1]) + 1) if polled else position)
            yield _below(polled, end, offset)
    finally:
        consumer.close()


def _cached_high_watermark(consumer: Any, tp: Any) -> int | None:
    """The high watermark of the consumer's last fetch (no request); None before the first."""
    watermarks = consumer.get_watermark_offsets(tp, cached=True)
    return watermarks[1] if watermarks is not None and watermarks[1] >= 0 else None


def _skippable(ck: Any, error: Any, message: Any, topic: str, partition: int, start: int,
               progress: _Progress) -> bool:
    """True for an error event that says nothing about this partition's records; raises for the others."""
    if error.code() == ck.KafkaError._PARTITION_EOF:
        return True
    if error.code() in (ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE):
        raise progress.deleted(start, error.str())
    if not error.fatal() and message.topic() != topic:
        # librdkafka reports background trouble (e.g. the group-coordinator lookup that `group.id`
        # triggers) through consume(); it retries that itself and it does not concern this partition's
        # fetches. A real stall still ends in the stall timeout.
        log.warning("%s/%d: Kafka client reported %s; continuing", topic, partition, error.str())
        return True
    raise SourceError(f"{topic}/{partition}: {error.str()}")


def _below(messages: list[Any], end: int, offset: Callable[[Any], int]) -> list[Any]:
    """The messages with offsets below `end`; a partition's offsets only grow, so cut at the first one."""
    if messages and offset(messages[-1]) >= end:
        return messages[:bisect_left(messages, end, key=offset)]
    return messages


