"""Kafka as a PySpark Python DataSource streaming source (format `firehose-kafka`).

Spark's built-in Kafka source needs jars this deployment cannot fetch, so this is a Python one:
- offsets live in Spark's checkpoint as `{topic: {"partition": next_offset}}`; Spark's offset log keeps
  each batch's END only (its start is the previous batch's end), so a batch that first includes a
  partition also records where that partition's range starts (NEW_STARTS, below): planning the read,
  in another process, and every replay of the batch then read the same range, and records that
  retention deletes meanwhile stop the job ("deleted by retention") instead of being skipped;
- a partition added while the job runs starts at its first offset still on the broker, with a warning
  naming the offsets that were gone before the job first saw it (as `initialOffset` does for a
  committed offset no longer on the broker): no restart could read those, so stopping would only stop;
- each micro-batch is one Spark partition per Kafka partition with new records, or at most `max_tasks`
  of them, each reading several partitions' ranges (`group_ranges`);
- `maxOffsetsPerTrigger` caps a batch, shared across partitions in proportion to their backlog;
- `Trigger.AvailableNow` reads up to the end offsets seen when the query starts, then stops;
- end offsets are those of the `isolation_level` the tasks read with (kafka_client.KafkaMetadataClient):
  under read_committed the last stable offset, so a batch never ends inside a transaction still open,
  whose records a later batch reads once it has committed;
- a fresh checkpoint starts at the consumer group's committed offsets, else at `startingOffsets`;
- once the file named by the `stop_file` option exists (the driver is stopping: SIGTERM, Ctrl-C), no
  further batch is planned: the query goes idle after the batch it runs, and the driver stops it there;
- after Spark commits a batch, its end offsets are committed to the consumer group, only so that lag
  monitoring works: the checkpoint, not the group, is what a restart resumes from.

Its rows are the batch's offset ranges (RANGE_DDL), one per Spark partition, not the records: the task
that gets a range reads its records itself (`kafka_client.RangeReader`) and hands them to the batch core
in the same Python process. Spark has no use for the records' bytes, and carrying them from a reader
process to the JVM and back to the task's process cost more CPU than decoding them. The job does not even
run the scan: its tasks take the planned partitions from the micro-batch's plan (pipeline.py
`_run_tasks`), which saves a Python worker per task. So Spark's progress reports count no input rows; the
job reports messages itself.

`read()` runs in Spark's Python workers, only where a Spark version's plan does not show the planned
partitions; it keeps no state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from firehose_bq.errors import SourceError, SourceUnavailableError
from firehose_bq.retrying import Backoff, retry_call
from firehose_bq.source.kafka_client import (ISOLATION_LEVELS, READ_COMMITTED, REQUEST_TIMEOUT_MS, STALL_TIMEOUT_MS,
                                            KafkaMetadataClient, Offsets)
from firehose_bq.source.kafka_security import KafkaSecurityConfig

log = logging.getLogger(__name__)

# How the planner waits for a broker that does not answer: soon at first, then every 10 s, for as long as a
# task waits for records (the `stall_timeout_ms` option, SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS).
UNAVAILABLE_FIRST_WAIT_S = 0.5
UNAVAILABLE_MAX_WAIT_S = 10.0
UNAVAILABLE_ATTEMPTS = 1_000  # never the limit: the time budget ends the retries first

FORMAT_NAME = "firehose-kafka"

# The key, in a batch's end offsets, of the planned start of each partition that the batch's start lacked
# and that it reads from (`{NEW_STARTS: {topic: {"partition": first_offset}}}`). Not a topic name: those
# are letters, digits, `.`, `_` and `-` only. Ends written before it existed have no such key (see
# `_planned_begin`).
NEW_STARTS = "$new_partition_starts"

# One row per Spark partition of a micro-batch: the records [start_offset, end_offset) of one partition
# (kafka_client.RANGE_COLUMNS, in this order).
RANGE_DDL = "topic STRING, partition INT, start_offset BIGINT, end_offset BIGINT"


class KafkaRanges(InputPartition):
    """One Spark task's share of a micro-batch: the slices [start, end) of one or more Kafka partitions,
    read in this order (`group_ranges`)."""

    def __init__(self, ranges: Sequence[tuple[str, int, int, int]]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def group_ranges(ranges: Sequence[tuple[str, int, int, int]], most: int) -> list[list[tuple[str, int, int, int]]]:
    """`ranges` (topic, partition, start, end) as at most `most` groups (0: one per range), one per task,
    of about as many records each: the largest range first into the group holding the fewest so far. Every
    task costs a fixed ≈ 30 ms or more (its scheduling, its Python worker's round trip, its own Kafka
    consumer), so a 64-partition topic read as 64 tasks on two cores took four times as long as the same
    records in two.
    The same ranges always make the same groups, each in topic and partition order."""
    if most <= 0 or len(ranges) <= most:
        return [[r] for r in ranges]
    groups: list[list[tuple[str, int, int, int]]] = [[] for _ in range(most)]
    sizes = [0] * most
    for r in sorted(ranges, key=lambda r: (r[2] - r[3], r[0], r[1])):
        smallest = min(range(most), key=lambda i: (sizes[i], i))
        groups[smallest].append(r)
        sizes[smallest] += r[3] - r[2]
    return sorted(sorted(group) for group in groups if group)


class KafkaDataSource(DataSource):
    """Options: brokers, topics (comma-separated), group_id, starting_offsets [earliest|latest],
    max_offsets_per_trigger (-1 = no limit), max_tasks (Spark tasks per micro-batch at most; 0 = one per
    Kafka partition), isolation_level [read_committed|read_uncommitted] (the tasks' RangeReader must use
    the same). Spark lower-cases option names."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return RANGE_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        missing = [k for k in ("brokers", "topics", "group_id") if not options.get(k)]
        if missing:
            raise SourceError(f"{FORMAT_NAME} source needs option(s): {', '.join(missing)}")
        self.brokers = options["brokers"]
        self.topics = tuple(t.strip() for t in options["topics"].split(",") if t.strip())
        self.group_id = options["group_id"]
        self.starting = options.get("starting_offsets", "earliest")
        if self.starting not in ("earliest", "latest"):
            raise SourceError(f"starting_offsets must be earliest or latest, got {self.starting!r}")
        self.max_offsets = int(options.get("max_offsets_per_trigger", "-1"))
        self.max_tasks = int(options.get("max_tasks", "0"))
        self.isolation_level = options.get("isolation_level", READ_COMMITTED)
        if self.isolation_level not in ISOLATION_LEVELS:
            raise SourceError(f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}, "
                              f"got {self.isolation_level!r}")
        self.security = KafkaSecurityConfig.from_options(options)  # the job's, as its tasks' RangeReader has it
        self.stop_file = options.get("stop_file") or None
        self.unavailable_s = int(options.get("stall_timeout_ms", STALL_TIMEOUT_MS)) / 1000
        self.request_timeout_ms = int(options.get("request_timeout_ms", REQUEST_TIMEOUT_MS))
        self._target: Offsets | None = None  # end offsets frozen by Trigger.AvailableNow
        self._client: KafkaMetadataClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader is pickled to the workers for read(); the driver's client stays behind.
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def _kafka(self) -> KafkaMetadataClient:
        if self._client is None:
            self._client = KafkaMetadataClient(self.brokers, self.group_id, self.isolation_level, self.security,
                                               request_timeout_ms=self.request_timeout_ms)
        return self._client

    # --- driver side -----------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """Where a fresh checkpoint starts: the group's committed offset, else `starting_offsets`. A
        committed offset the broker no longer has (retention deleted its records, or the topic was
        recreated) is treated as Kafka consumers treat it: `starting_offsets` applies, with a warning
        naming the gap. Starting there again would stop the job on its first batch, as the checkpoint
        it replaces did, with nothing the user could do but reset the group by hand."""
        kafka = self._kafka()
        committed = kafka.committed_offsets(self.topics)
        low = kafka.beginning_offsets(kafka.partitions(self.topics))
        high = kafka.end_offsets(self.topics)
        reset = low if self.starting == "earliest" else high
        start: Offsets = {}
        for t, parts in reset.items():
            for p, fallback in parts.items():
                at = committed.get(t, {}).get(p)
                if at is not None and not low[t][p] <= at <= high[t][p]:
                    log.warning("%s/%d: group %s committed offset %d, which is no longer on the broker (it holds "
                                "%d to %d: deleted by retention, or the topic was recreated); the fresh checkpoint "
                                "starts at %d (SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET=%s): the records "
                                "between were never read", t, p, self.group_id, at, low[t][p], high[t][p], fallback,
                                self.starting)
                    at = None
                start.setdefault(t, {})[p] = fallback if at is None else at
        log.info("starting a fresh checkpoint at %s (group %s committed %s)", start, self.group_id, committed)
        return _to_json(start)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._end_offsets()
        log.info("available-now: reading up to %s", self._target)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if self.stop_file is not None and os.path.exists(self.stop_file):
            # The driver is stopping: nothing new, so the query idles once its running batch is committed. A
            # backlog keeps Spark's trigger busy batch after batch, and the driver would never see it idle.
            return start
        latest = self._target if self._target is not None else self._end_offsets()
        known = _from_json(start)
        begin = {t: dict(parts) for t, parts in known.items()}
        new = self._begin_new_partitions(begin, latest)
        for t, parts in latest.items():
            for p, o in parts.items():
                if o < begin[t][p]:
                    # Never skip silently: records between here and the checkpoint would be lost.
                    raise SourceError(
                        f"{t}/{p}: the broker's end offset {o} is below the checkpoint's {begin[t][p]} (topic "
                        "deleted and recreated, or truncated?); start a new checkpoint once you know why"
                    )
        if isinstance(limit, ReadMaxRows):
            latest = _cap(begin, latest, limit.max_rows)
        if latest == known:
            # Nothing moved: the start as it is (with the starts it may record), or Spark, which compares
            # the two as JSON, would plan an empty batch.
            return start
        # A new partition read from in this batch: its start goes into the end, the only offsets of the batch
        # that Spark keeps. One with nothing to read ends where it starts, which its end offset says already.
        starts: Offsets = {}
        for t, p in new:
            if latest[t][p] > begin[t][p]:
                starts.setdefault(t, {})[p] = begin[t][p]
        return _to_json(latest, starts)

    def _end_offsets(self) -> Offsets:
        """The topics' end offsets, waiting out a broker that does not answer: a broker restarting between two
        batches (or while the job is idle) must not stop a job that a restart during a batch would not
        (its tasks wait for records as long, `stall_timeout_ms`). Past that the job stops, saying so."""
        backoff = Backoff(attempts=UNAVAILABLE_ATTEMPTS, first_s=UNAVAILABLE_FIRST_WAIT_S, max_s=UNAVAILABLE_MAX_WAIT_S,
                          budget_s=self.unavailable_s)
        return retry_call(lambda: self._kafka().end_offsets(self.topics), backoff,
                          retry_on=lambda exc: isinstance(exc, SourceUnavailableError),
                          what="the Kafka source's end offsets")

    def _begin_new_partitions(self, begin: Offsets, end: Offsets) -> list[tuple[str, int]]:
        """Add the partitions of `end` that `begin` lacks to `begin`, at their first offset still on the
        broker (as Spark's Kafka source does), and return them. One not at 0 lost records to retention
        before the job could read them: no restart can read them either (stopping would stop every
        restart, and a new checkpoint would not bring them back), so the job goes on from there, saying
        which offsets were never read."""
        new = [(t, p) for t, parts in end.items() for p in parts if p not in begin.get(t, {})]
        if not new:
            return new
        for t, parts in self._kafka().beginning_offsets(new).items():
            begin.setdefault(t, {}).update(parts)
            for p, o in parts.items():
                if o > 0:
                    log.warning("%s/%d: a partition new to this job starts at offset %d: its offsets 0 to %d were "
                                "deleted before the job could read them (retention) and are not in the table", t, p,
                                o, o - 1)
        return new

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            return _to_json(self._kafka().end_offsets(self.topics))
        except SourceUnavailableError as exc:  # progress reports only (the lag): planning waits for the broker
            log.warning("the broker's end offsets for the progress report: %s", exc)
            return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        finish = _from_json(end)
        begin = self._planned_begin(_from_json(start), finish, end)
        ranges = [(t, p, begin[t][p], o) for t, parts in sorted(finish.items()) for p, o in sorted(parts.items())
                  if o > begin[t][p]]
        return [KafkaRanges(group) for group in group_ranges(ranges, self.max_tasks)]

    def _planned_begin(self, start: Offsets, finish: Offsets, end: dict[str, Any]) -> Offsets:
        """Where each partition of a batch begins: the start's offset, else the start the batch recorded
        when it was planned (NEW_STARTS), never a fresh look-up that retention may have moved since. An
        end written before NEW_STARTS existed has none: its new partitions are looked up, as then."""
        begin = _from_json(end.get(NEW_STARTS, {}))
        for t, parts in start.items():
            begin.setdefault(t, {}).update(parts)
        self._begin_new_partitions(begin, finish)
        return begin

    def commit(self, end: dict[str, Any]) -> None:
        try:
            self._kafka().commit(_from_json(end))
        except Exception as exc:  # noqa: BLE001 - monitoring only; the checkpoint already holds `end`
            log.warning("could not commit offsets to consumer group %s (lag metrics only): %s", self.group_id, exc)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- worker side -----------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, int, int]]:
        assert isinstance(partition, KafkaRanges)
        yield from partition.ranges


def _cap(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Shrink `end` so that at most `max_rows` records are read, shared in proportion to backlog.

    What rounding down leaves over goes to the largest backlogs first, so the batch uses its whole
    allowance and always moves, even with more partitions than `max_rows`.
    """
    backlog = {(t, p): o - begin[t][p] for t, parts in end.items() for p, o in parts.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    shares = {tp: max_rows * lag // total for tp, lag in backlog.items()}
    left = max_rows - sum(shares.values())
    for tp in sorted(backlog, key=lambda tp: backlog[tp] - shares[tp], reverse=True)[:left]:
        shares[tp] += 1
    capped: Offsets = {t: dict(parts) for t, parts in end.items()}
    for (t, p), share in shares.items():
        capped[t][p] = begin[t][p] + share
    return capped


def _to_json(offsets: Offsets, new_starts: Offsets | None = None) -> dict[str, Any]:
    as_json = {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}
    if new_starts:
        as_json[NEW_STARTS] = _to_json(new_starts)
    return as_json


def _from_json(offsets: dict[str, Any]) -> Offsets:
    """The offsets of a checkpoint's JSON (without the planned starts it may hold: `_planned_begin`)."""
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offsets.items() if t != NEW_STARTS}
