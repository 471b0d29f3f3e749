"""`firehose-bq replay-dlq`: send dead letters through the job's write mode and batch core again.

A plain Python loop, not a Spark job: a DLQ holds few messages (the failures of a stream), it needs
no checkpoint beyond its own consumer group (or, for blob files, a rename), and a replay should start
in a second, not after a JVM. It is the streaming job without Spark: the same write mode (chosen from
the same settings), `process_batch` on each batch of letters, and `settle` (the mode's load job or
MERGE) before the batch is committed. Each record is rebuilt with its ORIGINAL topic/partition/offset
from the dead letter, so its insertId and metadata are the ones the stream would have used: replaying
twice does not duplicate rows.

What still fails is dead-lettered again (attempt count + 1) before the DLQ position is committed;
a message that fails the policy stops the replay without committing, like the streaming job.

With file loads and upsert/delete, a batch's driver step (load job, MERGE) and the commit of its DLQ
position are two steps, and a crash between them must not write the batch's rows twice. So before that
step the replay writes the batch down (`PendingBatch`: its number, its task results, its position) in the
staging area, under a prefix that is the same for every replay of this DLQ, and deletes it once the
position is committed. A replay that finds one finishes that batch first, with the same job id (derived
from the number, the position and the replay run that wrote it): a file-loads batch exactly as it was (its load found done, or run
from its staged files), then the commit; an upsert batch, whose staged rows went with that replay's
intermediate table, is committed if its MERGE is found done, and otherwise read again (a MERGE that never
ran merged nothing). The streaming job needs none of this: Spark's checkpoint replays a batch with its
number.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from firehose_bq import logs
from firehose_bq.batch.core import ATTEMPT_COLUMN, TaskResult, process_batch
from firehose_bq.bigquery.client import Clients
from firehose_bq.bigquery.file_loads import discard, staging_area
from firehose_bq.blobstore import BlobStore
from firehose_bq.config import Config
from firehose_bq.dlq.letters import DeadLetter, Position
from firehose_bq.errors import FirehoseError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.modes import (FileLoadsMode, UpsertMode, WriteMode, batch_stats, handling_of, reaches_driver_step, settle,
                               write_mode)
from firehose_bq.source.batches import ARROW_SCHEMA
from firehose_bq.source.kafka_client import READ_COMMITTED
from firehose_bq.source.kafka_security import KafkaSecurityConfig
from firehose_bq.telemetry import Telemetry

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 1000
# A DLQ record is the original record plus headers; read what the DLQ writer may have written.
MAX_FETCH_BYTES = 16 * 1024 * 1024
# Letters per replayed batch from a DLQ topic, at most.
DLQ_BATCH = 500
# Polls without a record before a partition that is short of its planned end counts as stalled.
EMPTY_POLLS_BEFORE_STALL = 30


class DlqSource(Protocol):
    def identity(self) -> str:
        """What this DLQ is (topic and group, or directory): the same for every replay of it."""

    def total(self) -> int:
        """Letters this replay will read at most (for the progress bar)."""

    def batches(self) -> Iterator[tuple[list[DeadLetter], Position]]:
        """Letters in order, each batch with its position, which `commit` marks handled."""

    def commit(self, position: Position) -> None:
        """Mark the batch at `position` handled, also one a previous run read (its pending batch): later
        `batches()` skip it."""

    def close(self) -> None: ...


class KafkaDlqSource:
    """The DLQ topic from the group's committed offsets (or the beginning) up to its end at start.

    At the source's isolation level: the job's own letters are never transactional (both levels read
    them alike), but a topic replayed with `--topic` may be written by anyone. One consumer answers both
    the end and the reads, so they agree: under read_committed the end is the last stable offset."""

    def __init__(self, brokers: str, topic: str, group_id: str, max_messages: int | None,
                 isolation_level: str = READ_COMMITTED, security: KafkaSecurityConfig = KafkaSecurityConfig()) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._consumer = KafkaConsumer(bootstrap_servers=brokers, group_id=group_id, enable_auto_commit=False,
                                       auto_offset_reset="earliest", max_partition_fetch_bytes=MAX_FETCH_BYTES,
                                       fetch_max_bytes=MAX_FETCH_BYTES, isolation_level=isolation_level,
                                       **security.kafka_python())
        found = self._consumer.partitions_for_topic(topic)
        if not found:
            self._consumer.close()
            raise FirehoseError(f"DLQ topic {topic!r} does not exist on {brokers}")
        parts = [TopicPartition(topic, p) for p in sorted(found)]
        # assign(), not subscribe(): no group join (slow on small brokers), yet commits go to the group.
        self._consumer.assign(parts)
        begin = self._consumer.beginning_offsets(parts)
        self._end = self._consumer.end_offsets(parts)  # --available-now: what is there now, no more
        self._start = {}
        for tp in parts:
            committed = self._consumer.committed(tp)
            self._start[tp] = committed if committed is not None and committed >= 0 else begin[tp]
            self._consumer.seek(tp, self._start[tp])
        self._limit = max_messages
        self._identity = f"{topic}@{group_id}"
        self._topic = topic
        self._reading = False

    def identity(self) -> str:
        return self._identity

    def total(self) -> int:
        available = sum(max(0, self._end[tp] - self._start[tp]) for tp in self._end)
        return available if self._limit is None else min(available, self._limit)

    def batches(self) -> Iterator[tuple[list[DeadLetter], Position]]:
        self._reading = True
        left = self.total()
        position = dict(self._start)
        empty = 0
        while left > 0 and any(position[tp] < self._end[tp] for tp in self._end):
            polled = self._consumer.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=min(left, DLQ_BATCH))
            letters, done = [], {}
            for tp, records in polled.items():
                for r in records:
                    if r.offset >= self._end[tp] or left == 0:
                        break
                    try:
                        letters.append(DeadLetter.from_kafka(r.key, r.value, list(r.headers or [])))
                    except ValueError as exc:
                        raise FirehoseError(f"{tp.topic}/{tp.partition}@{r.offset}: {exc}") from None
                    done[tp] = r.offset + 1
                    left -= 1
            if left > 0:
                done.update(self._passed(done, position))
            if not letters:
                if not done:
                    empty += 1
                    if empty >= EMPTY_POLLS_BEFORE_STALL:
                        raise FirehoseError(f"DLQ replay: no records for {empty} s although the topic ends further "
                                            f"on ({ {tp.partition: (position[tp], self._end[tp]) for tp in self._end} })")
                    continue
                # Offsets that hold no letter: every batch before was committed (this generator resumes only
                # after its consumer committed), so committing them settles nothing and the next replay does
                # not wait for records that are not there.
                self.commit(_position(done))
            empty = 0
            position.update(done)
            if letters:
                yield letters, _position(done)

    def _passed(self, done: dict, position: dict) -> dict:
        """Partitions whose reading passed offsets that hold no record for this replay, up to the planned end:
        a transaction's commit marker, an aborted transaction's records (read_committed), records past the
        end. The consumer's position moves over them, records or not; `done` and `position` would not."""
        passed = {}
        for tp, end in self._end.items():
            at = min(self._consumer.position(tp), end)
            if at > done.get(tp, position[tp]):
                passed[tp] = at
        return passed

    def commit(self, position: Position) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        done = {TopicPartition(self._topic, int(p)): offset for p, offset in position["offsets"].items()}
        self._consumer.commit({tp: OffsetAndMetadata(offset, "", -1) for tp, offset in done.items()})
        if not self._reading:  # a previous run's batch, committed before this run reads: read past it
            for tp, offset in done.items():
                if offset > self._start[tp]:
                    self._start[tp] = offset
                    self._consumer.seek(tp, offset)

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def _position(done: dict) -> Position:
    return {"offsets": {str(tp.partition): offset for tp, offset in done.items()}}


@dataclass
class ReplaySummary:
    stats: BatchStats = field(default_factory=BatchStats)
    seconds: float = 0.0

    def render(self) -> str:
        s = self.stats
        lines = [f"dead letters read  {s.messages}", f"rows written       {s.rows_written}",
                 f"dead-lettered again {s.dead_lettered}",
                 *([f"sent to fallback   {s.fallback}"] if s.fallback else []),  # routes still missing
                 f"retried            {s.retried}", f"failed             {s.failed}"]
        lines += [f"  {name:<22} {count}" for name, count in sorted(s.errors_by_type.items())]
        lines.append(f"elapsed            {self.seconds:.1f} s")
        return "\n".join(lines)


def letters_batch(letters: list[DeadLetter]) -> pa.RecordBatch:
    """The original records as a source batch, at their original coordinates (so insertIds and metadata
    are the stream's), with how often each was dead-lettered (`dlq_attempt`)."""
    columns = {
        "key": [x.key for x in letters], "value": [x.value for x in letters],
        "topic": [x.error.topic for x in letters], "partition": [x.error.partition for x in letters],
        "offset": [x.error.offset for x in letters],
        "timestamp": [x.timestamp_ms * 1000 if x.timestamp_ms is not None else None for x in letters],
        "timestamp_type": [x.timestamp_type for x in letters],
        "headers": [[{"key": k, "value": v} for k, v in x.headers] for x in letters],
        "leader_epoch": [x.leader_epoch for x in letters],
    }
    arrays = [pa.array(columns[f.name], type=f.type) for f in ARROW_SCHEMA]
    arrays.append(pa.array([x.attempt for x in letters], pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA.append(pa.field(ATTEMPT_COLUMN, pa.int32())))


class PendingBatch:
    """The replayed batch whose driver step (a file-loads batch's load, an upsert batch's MERGE) may have run
    but whose DLQ position is not committed yet, as one JSON object in the staging area
    (`<prefix>pending.json`, beside the files a file-loads batch staged)."""

    NAME = "pending.json"

    def __init__(self, store: BlobStore, prefix: str) -> None:
        self.store, self._name = store, prefix + self.NAME  # the staging area's store
        self.held = False  # written or found, and not cleared: a replay must finish it before reading on

    def write(self, batch: int, results: Sequence[TaskResult], position: Position, run: str) -> None:
        record = {"batch": batch, "results": [r.to_json() for r in results], "position": position, "run": run}
        self.store.put(self._name, json.dumps(record).encode())
        self.held = True

    def read(self) -> tuple[int, list[TaskResult], Position, str | None] | None:
        """The pending batch: its number, task results, DLQ position and the replay run that wrote it (None:
        written before runs were recorded)."""
        if self._name not in self.store.names(self._name):
            return None
        record = json.loads(self.store.get(self._name))
        self.held = True
        results = [TaskResult.from_json(r) for r in record["results"]]
        return record["batch"], results, record["position"], record.get("run")

    def clear(self) -> None:
        self.store.delete_prefix(self._name)
        self.held = False

    def where(self) -> str:
        return self.store.uri(self._name)


def replay(cfg: Config, source: DlqSource, progress: bool = False, telemetry: Telemetry | None = None) -> ReplaySummary:
    """Replay every letter `source` yields through the job's write mode and batch core; raise
    BatchFailedError when the policy fails one (that batch is not committed)."""
    from tqdm import tqdm

    started = time.monotonic()
    run = uuid.uuid4().hex  # this replay's jobs are its own (replay_plan)
    # File loads stage under a prefix of this DLQ's own (the same in every replay of it, so that a replay
    # finds what a crashed one left pending) and load once per replayed batch.
    identity = source.identity()
    staging = staging_area(cfg, prefix=f"dlq-replay-{hashlib.sha256(identity.encode()).hexdigest()[:16]}/")
    mode = write_mode(cfg, staging=staging, identity=lambda: f"dlq-replay:{identity}")
    # The modes with a driver step keep a pending batch (file loads: its files and load; upsert: its MERGE);
    # the others need none (and no Cloud Storage client).
    pending = (PendingBatch(staging.store(), staging.prefix) if isinstance(mode, (FileLoadsMode, UpsertMode))
               else None)
    handling = handling_of(cfg)
    summary = ReplaySummary()
    clients = Clients()  # every batch's writers borrow them, as a Spark worker's tasks do
    try:
        spec = mode.schema.current()  # fresh descriptors; the table evolved to them
        first = 0
        if pending is not None:
            first = _finish_pending(pending, mode, source)
            discard(pending.store, staging.prefix)  # what a crashed replay staged and never loaded
        bar = tqdm(total=source.total(), unit="msg", desc="replay-dlq", disable=not progress)
        try:
            # A stream batch run again after a crash dead-letters its messages again, a batch or more after
            # the first copies: what this run handled is skipped in its later batches too. The attempt is
            # part of the identity, since a letter this run dead-lettered again must be read again.
            handled = RecentLetters.for_mode(mode)
            for number, (read, position) in enumerate(source.batches(), start=first):
                # The same message dead-lettered twice (a batch replayed after a crash) is one message.
                letters = [x for x in {_coords(x): x for x in read}.values() if _identity(x) not in handled]
                if len(letters) < len(read):
                    log.info("%d duplicate dead letter(s) in this batch (copies of one in it or replayed earlier in "
                             "this run) replayed once", len(read) - len(letters))
                with logs.log_context(batch_id=number):
                    results = [process_batch([letters_batch(letters)], spec, mode.task(number), handling, clients)]
                    stats = batch_stats(results)
                    summary.stats.merge(stats)
                    if telemetry is not None:
                        telemetry.observe_replay(stats)
                    if pending is not None and reaches_driver_step(results, stats):
                        pending.write(number, results, position, run)
                    settle(mode, number, results, stats, replay_plan(position, run))
                source.commit(position)  # only now: every letter of the batch is in the table or the DLQ again
                handled.add(_identity(x) for x in letters)
                if pending is not None:
                    pending.clear()
                bar.update(len(read))
        finally:
            bar.close()
    finally:
        clients.close()
        mode.close()
        if pending is not None:
            if pending.held:  # its load may have run: the next replay finishes it from its staged files
                log.warning("replay stopped with a batch staged and not committed; the next replay finishes it "
                            "first (%s)", pending.where())
            else:
                discard(pending.store, staging.prefix)
        summary.seconds = time.monotonic() - started
    return summary


class RecentLetters:
    """The identities of the letters a replay handled last, `size` of them at most: a replay that follows a
    DLQ for days must not hold every letter it ever read. The copies a stream batch's rerun writes lie
    within two of its batches' letters of the first ones (the rest of the first run's, then the rerun's),
    and a stream batch reads at most its write mode's `max_offsets_per_trigger` records (the replay runs with
    the job's settings), so twice that, plus one replay batch, is enough; unlimited batches get UNLIMITED."""

    UNLIMITED = 1_000_000  # about 200 MB of identities (measured: 190 MiB)

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[tuple[str, int, int, int]] = deque()
        self._set: set[tuple[str, int, int, int]] = set()

    @classmethod
    def for_stream(cls, max_offsets_per_trigger: int) -> RecentLetters:
        return cls(2 * max_offsets_per_trigger + DLQ_BATCH if max_offsets_per_trigger > 0 else cls.UNLIMITED)

    @classmethod
    def for_mode(cls, mode: WriteMode) -> RecentLetters:
        """Sized from the stream's own bound on a batch, which upsert/delete takes from
        SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD rather than SPARK_MAX_OFFSETS_PER_TRIGGER."""
        return cls.for_stream(mode.max_offsets_per_trigger())

    def __contains__(self, identity: tuple[str, int, int, int]) -> bool:
        return identity in self._set

    def add(self, identities: Iterable[tuple[str, int, int, int]]) -> None:
        for identity in identities:
            if identity not in self._set:
                self._set.add(identity)
                self._order.append(identity)
        while len(self._order) > self.size:
            self._set.discard(self._order.popleft())


def _finish_pending(pending: PendingBatch, mode: WriteMode, source: DlqSource) -> int:
    """Finish the batch a crashed replay left pending, as it was (the same load job, then the commit of its
    position); return the number this replay's batches start at."""
    found = pending.read()
    if found is None:
        return 0
    batch, results, position, run = found
    if isinstance(mode, UpsertMode):
        # Its rows were staged in that replay's intermediate table, which is gone: a MERGE that ran is found
        # by its id and the position committed; one that never ran (or failed) merged nothing, and the
        # letters are read and merged again, numbered from this batch on.
        try:
            merged = mode.merged(batch, replay_plan(position, run))
        except SinkError as exc:
            raise FirehoseError(f"{exc} (looking for the MERGE of the batch an earlier replay left pending, "
                                f"{pending.where()})") from exc
        if not merged:
            log.warning("an earlier replay stopped before merging batch %d: its letters are read again", batch)
            pending.clear()
            return batch
        log.warning("an earlier replay stopped after merging batch %d and before committing it: committing it "
                    "(its MERGE is not run again)", batch)
        source.commit(position)
        pending.clear()
        return batch + 1
    log.warning("an earlier replay stopped after staging batch %d and before committing it: finishing it first "
                "(a load job that already ran is found by its id and not run again)", batch)
    try:
        settle(mode, batch, results, batch_stats(results), replay_plan(position, run))
    except FirehoseError as exc:
        raise FirehoseError(f"{exc} (the batch an earlier replay left pending, {pending.where()}; delete that "
                            "object to read its letters again instead, if they must be staged anew)") from exc
    source.commit(position)
    pending.clear()
    return batch + 1


def replay_plan(position: Position, run: str | None) -> list[Position]:
    """A replayed batch's plan (its jobs' identity, bigquery/jobs.py): the DLQ position its letters were read
    up to, never read again once committed, and the replay run that read them. Batch numbers start from 0
    in every replay, and one record can be in two replays' batches (dead-lettered again): its original
    coordinates would not tell them apart. The run: a replay of letters replayed before (the group's
    offsets reset, `.replayed` files renamed back) reads the same positions on purpose, and must load and
    merge again rather than find the earlier replay's jobs done and commit without writing; a crashed
    replay's batch keeps its run through its pending record."""
    return [position] if run is None else [position, {"replay_run": run}]


def _coords(letter: DeadLetter) -> tuple[str, int, int]:
    return letter.error.topic, letter.error.partition, letter.error.offset


def _identity(letter: DeadLetter) -> tuple[str, int, int, int]:
    """One dead-lettering of one message: its copies (a stream batch run twice) share it."""
    return (*_coords(letter), letter.attempt)
