"""The batch core: one task's Kafka records → table, DLQ, or a reason to stop. Free of Spark.

`process_batch` is the whole task: decode (rows.py) → the write mode's shaping → write with retries
and the error policy (policy.py) → dead letters. The Spark job runs it in each task (pipeline.py) and
`replay-dlq` runs it on dead letters (dlq/replay.py): there is no second copy of this loop. What the
write mode does per task (which writer, what shape of rows, what to tell the driver) comes in as a
`TaskPlan`; what it does per batch on the driver (a load job, a MERGE) is `modes.WriteMode.finish`.
A destination's rows wait for a request's worth (WRITE_ROWS) across the task's source batches, so a job
routed over many tables sends each one request per task, not one per table and source batch.

A task never raises for a message: every record ends in the table, the DLQ or the result's `failed`
count. States it cannot go on from (BigQuery down after retries, a DLQ that cannot be written) come
back as `TaskResult.fatal`, so the driver can stop with one clean reason; offsets are then not committed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.cloud.bigquery import SchemaField

from firehose_bq.batch.enums import EnumNumbers
from firehose_bq.batch.keys import SubMicrosecondKeys
from firehose_bq.batch.rows import RowBuilder, Rows, SchemaIds, Writable, framed_schema_id, insert_ids
from firehose_bq.bigquery.classify import table_missing
from firehose_bq.bigquery.client import Clients
from firehose_bq.bigquery.writers import RowWriter
from firehose_bq.decode import make_value_decoder
from firehose_bq.decode.unknown import UnknownFieldsJson
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.writers import dead_letter
from firehose_bq.errors import (DeadLetterError, ErrorType, MessageError, RowError, SchemaError,
                                 SinkError, TableChangedError, cause_of)
from firehose_bq.logs import log_context
from firehose_bq.metrics import BatchStats
from firehose_bq.policy import DLQ, FAILED, FALLBACK, RETRIED, ErrorHandling, Handled, write_with_policy
from firehose_bq.redact import Redactor
from firehose_bq.registry.confluent import message_indexes
from firehose_bq.routing import Destination
from firehose_bq.sink_schema import CheckedTables, SinkSpec
from firehose_bq.threads import Stopped, until_failure

log = logging.getLogger(__name__)

# A source batch may carry this column: how often each record was dead-lettered before (replay-dlq).
ATTEMPT_COLUMN = "dlq_attempt"
# The write path a writer class is, as metrics label it.
WRITE_PATHS = {"InsertAllWriter": "insertall", "ChangelogWriter": "insertall", "StorageWriteWriter": "storage_write",
               "StagingWriter": "file_loads"}
UNKNOWN_FIELDS = "fields that no known descriptor version has (INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE=false)"
# A destination's decoded rows wait until it has WRITE_ROWS of them, or until the task's waiting records
# reach WAITING_ROWS or WAITING_BYTES (then every destination's are written), or the task ends or holds. A
# routed job's read batch (10k records) brings each of many tables a few dozen rows: written as they came,
# every table cost a request per read batch, ≈ 60–70 ms per table and micro-batch whatever its rows.
WRITE_ROWS = 10_000
WAITING_ROWS = 50_000
WAITING_BYTES = 64 * 1024 * 1024
KEY_UNKNOWN_FIELDS = ("key: fields that no known descriptor version has (INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE"
                      "=false; additional_properties keeps only the value's)")


class TaskPlan(Protocol):
    """The write mode's part inside a task; small and picklable (Spark ships it to every task)."""

    @property
    def changelog(self) -> bool:
        """Records are a changelog: a NULL value is a delete of its key, and every record needs a key."""

    def open_writer(self, destination: Destination | None, clients: Clients,
                    schema: list[SchemaField] | None = None) -> RowWriter:
        """A writer into `destination`'s table (None: the job's one configured table), on `clients`'. `schema`:
        the table's live columns as the task's check of a routed table just read them, else None (a writer
        that needs them reads them)."""

    def shape(self, rows: Rows, source: pa.RecordBatch, ids: pa.Array) -> tuple[Writable, list[RowError]]:
        """The rows as this mode writes them, and the records it refuses (by source index)."""

    def report(self, destination: Destination | None, writer: RowWriter) -> str | None:
        """What the driver needs from `destination`'s writer once it is closed (e.g. the file it staged)."""

    def writes_to_table(self, destination: Destination | None) -> bool:
        """Whether the task's writer puts `destination`'s rows in its table itself (a write then finds the table
        gone, if it is), rather than staging them for the driver's load job."""


@dataclass
class TaskResult:
    """What a task tells the driver: counts, and why it could not finish, if it could not."""

    stats: BatchStats = field(default_factory=BatchStats)
    fatal: str | None = None  # the task stopped: nothing of its batch may be committed
    # Why the task held, with `topic/partition@offset` of the first record carrying fields or a schema id
    # the descriptors lack ("unknown schema id 9 at t/0@12"), when it was told to hold there (the driver
    # refreshes the descriptors and runs the rest of the batch again).
    held: str | None = None
    reports: list[str] = field(default_factory=list)  # the mode's TaskPlan.report, one per writer that has one
    # With `held`: where the task stopped, per Kafka partition (topic, partition, first offset not done).
    # Everything before it is settled (written, dead-lettered), so the second run starts there: a row
    # appended twice would stay twice in Storage Write's default stream, which has no insertIds.
    resume: list[tuple[str, int, int]] = field(default_factory=list)
    # The Kafka ranges (topic, partition, start, end) the task was given, whole, however much of them it
    # read: part of the batch's plan, from which the driver derives its job ids (bigquery/jobs.py).
    planned: list[tuple[str, int, int, int]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"stats": json.loads(self.stats.to_json()), "fatal": self.fatal, "held": self.held,
                           "reports": self.reports, "resume": self.resume, "planned": self.planned})

    @classmethod
    def from_json(cls, text: str) -> TaskResult:
        data = json.loads(text)
        return cls(BatchStats.from_json(json.dumps(data["stats"])), data["fatal"], data["held"], data["reports"],
                   [(t, int(p), int(o)) for t, p, o in data.get("resume", [])],
                   [(t, int(p), int(s), int(e)) for t, p, s, e in data.get("planned", [])])


def row_builder(spec: SinkSpec, changelog: bool, proto_class: str = "",
                json_columns: tuple[str, ...] | None = None) -> RowBuilder:
    """The decoders of one message class (and the key type), or of one JSON table's payload columns:
    built once per task and class (or table)."""
    if spec.json:
        from firehose_bq.decode import make_json_decoder
        from firehose_bq.json_tables import schema_fields

        assert json_columns is not None, "a JSON destination's columns are read before its records are decoded"
        values = make_json_decoder(schema_fields(json_columns), additional_properties=spec.additional_properties,
                                   prefer=spec.decoder)
        return RowBuilder(values, spec.metadata, None, changelog=changelog)
    assert spec.descriptors is not None
    message_class = spec.descriptors.message_class(proto_class)
    values = make_value_decoder(message_class, 1, spec.options, confluent_framed=spec.confluent_framed,
                                detect_unknown_fields=True, prefer=spec.decoder)
    # The key's unknown fields are detected too: a key decoded without them is another key (rows.py).
    key_class = spec.descriptors.message_class(spec.key_class) if spec.key_class else None
    key = (make_value_decoder(key_class, 2, spec.options, confluent_framed=False, detect_unknown_fields=True,
                              prefer=spec.decoder)
           if key_class is not None else None)
    precision = SubMicrosecondKeys.of(key_class) if changelog and key_class is not None else None
    unknown = UnknownFieldsJson(message_class, spec.confluent_framed) if spec.additional_properties else None
    ids = spec.descriptors.schema_ids
    # By the descriptor's full name: the setting may spell the class `.pkg.Message`, which find_message takes.
    name = message_class.DESCRIPTOR.full_name
    moved = {schema_id: names[name] for schema_id, names in (spec.descriptors.moved_indexes or {}).items()
             if name in names}
    schema_ids = (SchemaIds(spec.schema_subject, ids, name, message_indexes(message_class.DESCRIPTOR), moved)
                  if spec.confluent_framed and spec.schema_subject and ids is not None else None)
    return RowBuilder(values, spec.metadata, key, changelog=changelog, unknown=unknown, schema_ids=schema_ids,
                      key_precision=precision, enum_numbers=EnumNumbers(message_class.DESCRIPTOR, spec.options),
                      key_enum_numbers=EnumNumbers(key_class.DESCRIPTOR, spec.options, 2) if key_class is not None else None)


class _Task:
    """One task's state across its source batches: a row builder per message class, a writer per
    destination (each table ensured once), the dead letters and fallback records to store at the end."""

    def __init__(self, spec: SinkSpec, plan: TaskPlan, handling: ErrorHandling, clients: Clients,
                 kept: CheckedTables) -> None:
        self.spec, self.plan, self.handling, self.clients, self.kept = spec, plan, handling, clients, kept
        self.result = TaskResult()
        self.request_failed = False  # a write request failed as a whole: the clients are not trusted after
        # Per message class (protobuf) or per destination (JSON: each table is its own schema).
        self.builders: dict[object, RowBuilder] = {}
        # Routed destinations whose table this task has ensured, with their live columns as ensured.
        self.checked: dict[Destination | None, list[SchemaField]] = {}
        # Those of them whose check this task took from the worker's kept ones (`kept`), not made itself.
        self.trusted: set[Destination] = set()
        self.writers: dict[Destination | None, RowWriter] = {}
        self.letters: list[DeadLetter] = []
        self.unrouted: list[DeadLetter] = []
        # Routed destinations whose table cannot be created or evolved (a name that exists with another
        # schema, a JSON table with no schema file): why, so their records fail alone, once per task.
        self.unusable: dict[Destination, str] = {}
        self.over: dict[Destination, str] = {}  # past the cap (`_over_cap`) where last met: why
        # The destinations each Kafka partition of the task brought first (ensured, or found unusable), for
        # the cap (`_over_cap`); `scope`: the partition being read (None: a source batch that mixes them).
        self.met: dict[tuple[object, ...] | None, list[Destination]] = {}
        self.scope: tuple[object, ...] | None = None
        # Each destination's rows not written yet (`_wait`), and their records and source bytes in all.
        self.waiting: dict[Destination | None, list[_Decoded]] = {}
        self.waiting_rows = 0
        self.waiting_bytes = 0

    def process(self, source: pa.RecordBatch) -> bool:
        """Decode, write and settle one source batch; False when the task must hold (unknown fields)."""
        fields = _kafka_fields(source)
        # A replay (dead letters, ATTEMPT_COLUMN) counts over the whole call, as its batches are no partition's.
        replay = ATTEMPT_COLUMN in source.schema.names
        self.scope = (fields["topic"], fields["partition"]) if len(fields) == 2 and not replay else None
        with log_context(**fields):
            return self._process(source)

    def _process(self, source: pa.RecordBatch) -> bool:
        load_time_us = time.time_ns() // 1000
        if self.spec.router is None:
            groups: list[tuple[Destination | None, np.ndarray | None]] = [(None, None)]
            unrouted: list[RowError] = []
        else:
            assignment = self.spec.router.assign(source)
            groups, unrouted = list(assignment.groups), assignment.unrouted
        parts = [(d, source if ix is None or len(ix) == source.num_rows else source.take(pa.array(ix)))
                 for d, ix in groups]
        decoded, refused = [], []
        for destination, part in parts:
            builder = self._builder(destination)
            if builder is None:
                refused.append((destination, part))
                continue
            rows = builder.build(part, load_time_us)
            if (rows.unknown_fields or rows.unknown_schema_ids or rows.enum_numbers) and self.spec.hold_on_unknown_fields:
                # Nothing of this source batch is written or counted: the second run starts with it. What the
                # batches before it left waiting is written now: everything before `resume` is settled.
                self.result.held = _held(part, rows)
                self.result.resume = _starts(source)
                self.flush()
                return False
            decoded.append((destination, part, rows))
        self.result.stats.messages += source.num_rows
        self._unrouted(source, unrouted)
        for destination, part in refused:
            self._refuse(destination, part)
        for destination, part, rows in decoded:
            self._write(destination, part, rows)
        return True

    def _builder(self, destination: Destination | None) -> RowBuilder | None:
        """The destination's row builder, its table created or evolved first (once per task) when the
        records name it (routed jobs); None when that table cannot be (`unusable`)."""
        spec, changelog = self.spec, self.plan.changelog
        if destination is not None and destination in self.unusable:
            return None
        if destination is not None and spec.tables is not None and destination not in self.checked:
            # The cap first: a template over a high-cardinality attribute must not create the tables.
            if (over := self._over_cap()) is not None:
                self.over[destination] = over
                return None
            self.met.setdefault(self.scope, []).append(destination)
            try:
                # A dataset this task ensured for another of its tables is not checked again (a worker's kept
                # check of another table does not count: that dataset may have gone since).
                dataset_ready = any(d is not None and d.dataset == destination.dataset and d not in self.trusted
                                    for d in self.checked)
                # A worker's kept check stands in for the task's own only where a write would find the table
                # gone and check again (`_heals`): not for rows staged for the driver's load job.
                kept = self.kept if self.plan.writes_to_table(destination) else None
                ensured = spec.tables.ensure(spec.descriptors, destination, self.clients, dataset_ready, kept)
            except SinkError:
                self.request_failed = True  # as a write's: the next task starts on new clients
                raise
            except SchemaError as exc:
                # The record's attributes chose a table it cannot go to: its records fail (ROUTING_ERROR,
                # for the policy), the other destinations go on; stopping the batch would stop it again
                # on every restart, for one record's header.
                self.unusable[destination] = str(exc)
                return None
            self.checked[destination] = list(ensured.schema)  # the writer's own: a kept check is shared
            if ensured.kept:
                self.trusted.add(destination)
            if spec.json:
                self.builders[destination] = row_builder(spec, changelog, json_columns=ensured.json_columns)
        if spec.json:
            if destination not in self.builders:  # the job's one table, whose columns the driver read
                self.builders[destination] = row_builder(spec, changelog, json_columns=spec.json_columns)
            return self.builders[destination]
        proto_class = destination.proto_class if destination is not None and destination.proto_class \
            else spec.proto_class
        if proto_class not in self.builders:
            self.builders[proto_class] = row_builder(spec, changelog, proto_class)
        return self.builders[proto_class]

    def _over_cap(self) -> str | None:
        """Why a destination new to the task is past the cap on destinations, or None. Every routed
        destination is ensured (`ready`) before its writer opens: capping those caps both. Past it, the
        records fail (ROUTING_ERROR, for the policy) rather than stop the batch, which a restart would meet
        again: the tables come from the records' attributes, which a bad producer can spread without bound.

        The cap counts per Kafka partition the task reads (`scope`), the tables that partition brought first:
        a task may read several partitions in turn (SPARK_MAX_TASKS_PER_BATCH), and how many share a task
        follows the backlog and the cores, so a count over the task would fail records that a task of their
        partition alone writes. A table an earlier partition brought costs nothing more and is not counted."""
        assert self.spec.router is not None, "only routed jobs ensure tables"
        cap = self.spec.router.max_destinations
        # Destinations that turned out unusable count too: each cost a create call, and a producer spreading
        # names BigQuery refuses would otherwise have the task make one per name.
        met = self.met.get(self.scope, [])
        if len(met) < cap:
            return None
        names = sorted(d.name for d in met)
        where = f" reading {self.scope[0]}/{self.scope[1]}" if self.scope is not None else ""
        return (f"the task already met {cap} destination tables{where} in this micro-batch ({', '.join(names[:5])}"
                f"{', ...' if len(names) > 5 else ''}): raise SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK or check the "
                "routing templates")

    def _writer(self, destination: Destination | None) -> RowWriter:
        if destination not in self.writers:
            # A routed table's check just read its columns: the writer starts from them (one read less).
            self.writers[destination] = self.plan.open_writer(destination, self.clients, self.checked.get(destination))
        return self.writers[destination]

    def _refuse(self, destination: Destination, part: pa.RecordBatch) -> None:
        """`part`'s records, routed to a table that cannot be used, as ROUTING_ERRORs for the policy."""
        reason = self.unusable.get(destination) or self.over[destination]
        why = f"destination table {destination.name} cannot be used: {reason}"
        with log_context(table=destination.name):
            # Counted with the unrouted records, not under the name: such names come from the records'
            # attributes, and each would be a metric label forever. The letters keep it, for a replay.
            self._fail(part, [RowError(i, ErrorType.ROUTING_ERROR, why) for i in range(part.num_rows)],
                       "", part.num_rows, route=destination.name)

    def _fail(self, source: pa.RecordBatch, failures: list[RowError], table: str, messages: int,
              route: str | None = None) -> None:
        """Records that fail before any write (no route, no usable table): the policy dead-letters or fails
        them. `table`: where they are counted; `route`: the table their letters name (default `table`)."""
        done = write_with_policy(self.handling, Writable.empty(), failures, None,
                                 where=lambda i: _coordinates(source, i))
        _count(self.result.stats, table, messages, 0, 0, source, done.dead, done.failed)
        self.letters.extend(_letter(source, f, table if route is None else route, self.handling.redactor)
                            for f in done.dead)

    def _write(self, destination: Destination | None, part: pa.RecordBatch, rows: Rows) -> None:
        """`part`'s rows as the mode shapes them, written once their destination has enough waiting (`_wait`)."""
        pending, refused = self.plan.shape(_without_unknown(rows, self.handling), part, insert_ids(part))
        failures = sorted(rows.failures + refused + _unknown_errors(rows, self.handling), key=lambda f: f.index)
        self._wait(destination, _Decoded(part, pending, failures, rows.unknown_fields))

    def _wait(self, destination: Destination | None, decoded: _Decoded) -> None:
        if not len(decoded.pending):
            self._settle(destination, [decoded])  # nothing to send: what failed is settled at once
            return
        waiting = self.waiting.setdefault(destination, [])
        if waiting and not waiting[0].joins(decoded):
            self._flush(destination)  # columns that differ (the table grew meanwhile): one request each
            waiting = self.waiting.setdefault(destination, [])
        waiting.append(decoded)
        self.waiting_rows += decoded.part.num_rows
        self.waiting_bytes += decoded.part.nbytes
        if sum(d.part.num_rows for d in waiting) >= WRITE_ROWS:
            self._flush(destination)
        elif self.waiting_rows >= WAITING_ROWS or self.waiting_bytes >= WAITING_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write every destination's waiting rows: up to the router's `concurrent_writes` destinations at once.

        A request takes tens of milliseconds on BigQuery, and a routed task writes each of its tables at
        its end: one after another, 200 tables kept it waiting seconds. Each destination's rows still go in
        order, by one thread; what became of them is counted here, in order, once the writes are over.
        The first write that fails for good (BigQuery down after its retries) stops the others: those not
        started do not start, and those waiting to retry stop waiting, so a task stops within one write's
        retry budget, as one table after another did. The writes that went through are counted; the task
        then raises that failure."""
        destinations = [d for d in self.waiting if self.waiting[d]]
        limit = self.spec.router.concurrent_writes if self.spec.router is not None else 1
        if len(destinations) < 2 or limit < 2 or not self.spec.write:
            for destination in list(self.waiting):
                self._flush(destination)
            return
        batches = [(d, self._take(d)) for d in destinations]
        for destination, _ in batches:
            self._writer(destination)  # opened here: writers and the clients they borrow are made in one thread

        def send(destination: Destination | None, waiting: list[_Decoded],
                 stop: threading.Event) -> tuple[_Decoded, Handled]:
            def sleep(seconds: float) -> None:  # the policy's wait between retries, cut short by a failure
                if stop.wait(seconds):
                    raise Stopped()

            return self._send(destination, waiting, sleep)

        futures = until_failure([functools.partial(send, d, w) for d, w in batches], limit, "firehose-write",
                                stops=lambda i, error: not self._heals(batches[i][0], error))
        failures: list[BaseException] = []
        again: list[tuple[Destination | None, list[_Decoded], BaseException]] = []
        for (destination, waiting), future in zip(batches, futures, strict=True):
            if (error := future.exception()) is None:
                self._account(destination, *future.result())
            elif self._heals(destination, error):
                again.append((destination, waiting, error))
            elif not isinstance(error, Stopped):
                failures.append(error)
        for destination, waiting, error in again if not failures else ():
            self._account(destination, *self._send_again(destination, waiting, error))
        if failures:
            first = next((f for f in failures if not isinstance(f, SinkError)), failures[0])  # a bug comes first
            for other in failures:
                if other is not first:
                    log.warning("another destination's write failed too: %s", other)
            raise first

    def _flush(self, destination: Destination | None) -> None:
        if waiting := self._take(destination):
            self._settle(destination, waiting)

    def _take(self, destination: Destination | None) -> list[_Decoded]:
        waiting = self.waiting.pop(destination, [])
        self.waiting_rows -= sum(d.part.num_rows for d in waiting)
        self.waiting_bytes -= sum(d.part.nbytes for d in waiting)
        return waiting

    def _settle(self, destination: Destination | None, waiting: list[_Decoded]) -> None:
        """Write `waiting` (one destination's) in one go, then count and dead-letter what became of each record."""
        try:
            sent = self._send(destination, waiting)
        except SinkError as exc:
            if not self._heals(destination, exc):
                raise
            sent = self._send_again(destination, waiting, exc)
        self._account(destination, *sent)

    def _heals(self, destination: Destination | None, error: BaseException) -> bool:
        """Whether `error` may be a kept check gone stale: the write found no table (or dataset), a table without
        columns the check had (TableChangedError: dropped and created again with fewer), or a table that refuses
        its rows as invalid, none of them alone (the policy's stop: another type for a column, say), where this
        task trusted a worker's earlier check (`CheckedTables`) instead of checking. A check now creates or
        evolves it again, or finds it unusable (`_send_again`)."""
        return destination in self.trusted and isinstance(error, SinkError) and (
            table_missing(error) or isinstance(error, TableChangedError) or error.invalid_request)

    def _send_again(self, destination: Destination | None, waiting: list[_Decoded],
                     error: BaseException) -> tuple[_Decoded, Handled]:
        """`_send` once more after `error` (`_heals`), `destination`'s table checked again first, which creates
        or evolves it, by a new writer; the rows as ROUTING_ERRORs when the table cannot be used any more."""
        assert destination is not None and self.spec.tables is not None
        self.trusted.discard(destination)
        log.warning("table %s was %s although this worker checked it within the last "
                    "SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS: checking it again, then writing its rows again (%s)",
                    destination.name, "not found" if table_missing(error) else "refusing its rows", error)
        self.spec.tables.forget(self.spec.descriptors, destination, self.kept)
        try:
            ensured = self.spec.tables.ensure(self.spec.descriptors, destination, self.clients, False, self.kept)
        except SchemaError as exc:
            # As a check of its own would have found it (`_builder`): its records fail (ROUTING_ERROR, for the
            # policy), here and in the task's later source batches; stopping would stop again on every restart.
            log.warning("table %s cannot be created or evolved again: %s", destination.name, exc)
            self.unusable[destination] = str(exc)
            return self._unusable(destination, waiting)
        except SinkError:
            self.request_failed = True
            raise
        self.checked[destination] = list(ensured.schema)
        # A new writer, from the columns just checked: the old one's are the stale check's (a table created
        # again with fewer columns and evolved back may also hold them in another order).
        self._retire(destination)
        return self._send(destination, waiting)

    def _unusable(self, destination: Destination, waiting: list[_Decoded]) -> tuple[_Decoded, Handled]:
        """`waiting`'s rows, for a table found unusable after they were decoded, as ROUTING_ERRORs for the policy
        (`_refuse`'s, but for rows); the records that became no row keep their own failures."""
        decoded = _Decoded.joined(waiting)
        why = f"destination table {destination.name} cannot be used: {self.unusable[destination]}"
        failures = sorted(decoded.failures + [RowError(int(i), ErrorType.ROUTING_ERROR, why)
                                              for i in decoded.pending.sources], key=lambda f: f.index)
        return decoded, write_with_policy(self.handling, Writable.empty(), failures, None,
                                          where=lambda i: _coordinates(decoded.part, i))

    def _retire(self, destination: Destination | None) -> None:
        """Close `destination`'s writer (its report kept), so that the next write opens one anew."""
        if (writer := self.writers.pop(destination, None)) is not None:
            self._close_writer(destination, writer)

    def _close_writer(self, destination: Destination | None, writer: RowWriter) -> None:
        """Close `writer`, keeping what the driver needs of it (`TaskPlan.report`) whatever the close raises."""
        try:
            writer.close()
        finally:
            if (report := self.plan.report(destination, writer)) is not None:
                self.result.reports.append(report)

    def _send(self, destination: Destination | None, waiting: list[_Decoded],
              sleep: Callable[[float], None] = time.sleep) -> tuple[_Decoded, Handled]:
        """Write `waiting` (one destination's) in one go, with the error policy's retries (waiting with `sleep`):
        what became of each record. It touches nothing of the task's but its statistics' write timings (one list
        append each), so that `flush` can run it for several destinations at once."""
        decoded = _Decoded.joined(waiting)
        part, pending = decoded.part, decoded.pending
        # A routed destination names its table (dataset.table); a job with one table has it on every line
        # already, as project.dataset.table (the driver's process fields, shipped with the task).
        routed = self.spec.router is not None and not self.spec.router.is_static
        table = {"table": destination.name} if routed and destination is not None else {}
        with log_context(**_kafka_fields(part), **table):
            writer = (lambda: _Timed(self._writer(destination), self.result.stats, self)) if self.spec.write else None
            return decoded, write_with_policy(self.handling, pending, decoded.failures, writer, sleep=sleep,
                                              where=lambda i: _coordinates(part, i))

    def _account(self, destination: Destination | None, decoded: _Decoded, done: Handled) -> None:
        """Count and dead-letter what became of each record of one destination's write."""
        part, stats = decoded.part, self.result.stats
        table = destination.name if destination is not None else ""
        stats.unknown_fields += _written_unknown(decoded.unknown, decoded.pending, done)
        _count(stats, table, part.num_rows, done.written, done.retried, part, done.dead, done.failed)
        self.letters.extend(_letter(part, f, table, self.handling.redactor) for f in done.dead)

    def _unrouted(self, source: pa.RecordBatch, unrouted: list[RowError]) -> None:
        if not unrouted:
            return
        if self.handling.fallback is not None:
            self.unrouted.extend(_letter(source, f, "", self.handling.redactor) for f in unrouted)
            self.result.stats.add_outcome(FALLBACK, len(unrouted))
            return
        # No fallback output: an error like any other, for the policy to dead-letter or fail.
        self._fail(source, unrouted, "", 0)

    def finish(self) -> None:
        """Write what waits, then store the dead letters and fallback records: only once every row of the task
        is written. Each list is emptied once stored, so that `unstored` on a stop counts only what is not."""
        self.flush()
        if self.handling.fallback is not None:
            dead_letter(self.handling.fallback, self.unrouted)
            self.unrouted = []
        dead_letter(self.handling.dlq, self.letters)
        self.letters = []

    def unstored(self) -> None:
        """The task stops (fatal) with letters it counted as sent to the DLQ or the route fallback not stored
        there: a failed write there (unknowable which of its letters landed), a write to the DLQ never
        reached after the fallback's failed, or a sink failure before `finish`. They count as failed (a
        restart dead-letters them again), so no batch line, run summary or DLQ counter claims them."""
        for outcome, letters in ((FALLBACK, self.unrouted), (DLQ, self.letters)):
            self.result.stats.not_stored(outcome, [x.error for x in letters], [x.route for x in letters])

    def close(self) -> None:
        for destination, writer in self.writers.items():
            try:
                self._close_writer(destination, writer)  # Spark reuses Python workers: unclosed clients would pile up
            except SinkError as exc:
                # Closing can be the write itself (file loads put their staged file into the staging area
                # then): the batch cannot be loaded, and the driver hears why like any other stop.
                self.result.fatal = self.result.fatal or str(exc)
        if self.request_failed:
            self.clients.reset()
            self.kept.clear()  # a table may be gone, or its dataset: the next task checks them again


@dataclass
class _Decoded:
    """Records of one destination decoded and shaped, not written yet: `part` their source records,
    `pending` their rows as the mode shaped them, `failures` those that became no row, `unknown` those
    whose fields no descriptor knows. Every index is into `part`."""

    part: pa.RecordBatch
    pending: Writable
    failures: list[RowError]
    unknown: list[int]

    def joins(self, other: _Decoded) -> bool:
        """Whether `other` can go into one request with this: the same source columns, the same row columns."""
        mine, theirs = self.pending, other.pending
        return (other.part.schema == self.part.schema and theirs.rows.schema == mine.rows.schema
                and (None if theirs.insert_ids is None else theirs.insert_ids.type)
                == (None if mine.insert_ids is None else mine.insert_ids.type))

    @staticmethod
    def joined(pieces: list[_Decoded]) -> _Decoded:
        """`pieces` (each `joins` the first) as one, in order: their indices shifted past the records before."""
        if len(pieces) == 1:
            return pieces[0]
        shifts = np.cumsum([0] + [d.part.num_rows for d in pieces[:-1]]).tolist()
        ids = [d.pending.insert_ids for d in pieces]
        pending = Writable(pa.concat_batches([d.pending.rows for d in pieces]),
                           None if ids[0] is None else pa.concat_arrays(ids),  # type: ignore[arg-type]
                           np.concatenate([d.pending.sources + shift for d, shift in zip(pieces, shifts, strict=True)]))
        return _Decoded(pa.concat_batches([d.part for d in pieces]), pending,
                        [dataclasses.replace(f, index=f.index + shift)
                         for d, shift in zip(pieces, shifts, strict=True) for f in d.failures],
                        [i + shift for d, shift in zip(pieces, shifts, strict=True) for i in d.unknown])


class _Timed:
    """A writer whose write calls are timed into the task's stats (the BigQuery latency histogram), and
    whose calls that fail as a whole are noted on the task (`request_failed`)."""

    def __init__(self, writer: RowWriter, stats: BatchStats, task: _Task) -> None:
        self._writer, self._stats, self._task = writer, stats, task
        self._path = WRITE_PATHS.get(type(writer).__name__, type(writer).__name__)

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        started = time.perf_counter()
        try:
            return self._writer.write(rows, insert_ids)
        except Exception:
            self._task.request_failed = True
            raise
        finally:
            self._stats.add_write_seconds(self._path, time.perf_counter() - started)

    def close(self) -> None:
        self._writer.close()


def process_batch(sources: Iterable[pa.RecordBatch], spec: SinkSpec, plan: TaskPlan,
                  handling: ErrorHandling, clients: Clients | None = None,
                  kept: CheckedTables | None = None) -> TaskResult:
    """Decode, route, write and settle every record of `sources` (one task's share of a batch). The
    writers borrow `clients` (the caller's to keep and close), or clients made for this call alone; routed
    tables are checked once per call, or once per TTL with the caller's `kept` checks."""
    own = clients is None
    task = _Task(spec, plan, handling, clients if clients is not None else Clients(),
                 kept if kept is not None else CheckedTables())
    try:
        for source in sources:
            if not task.process(source):
                # The source batches before this one are settled: their letters are stored like any
                # other's, and the driver's second run starts at `resume` (no row or letter twice).
                break
        task.finish()
    except (SinkError, DeadLetterError) as exc:
        task.result.fatal = str(exc)
        task.unstored()
    finally:
        try:
            task.close()
        finally:
            if own:
                task.clients.close()
    return task.result


def _kafka_fields(source: pa.RecordBatch) -> dict[str, object]:
    """The topic and partition of a source batch's records, for its log lines and the destination cap, when
    they share them (each source batch of a task is one Kafka partition's; a replayed batch of dead letters
    may mix them)."""
    fields: dict[str, object] = {}
    for name in ("topic", "partition"):
        if name in source.schema.names and source.num_rows:
            values = pc.unique(source[name])
            if len(values) == 1 and values[0].is_valid:
                fields[name] = values[0].as_py()
    return fields


def _rejected_unknown(rows: Rows, handling: ErrorHandling) -> list[int]:
    """The source records whose unknown fields keep them out of the table: none when they are allowed
    (INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE); else all of them, but for those whose value alone had
    them and `additional_properties` keeps them (SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE, whatever the
    policy: unexpected fields in the value never fail a message). That column holds the value's unknown
    fields only, so a key's unknown fields follow the policy alone. (A changelog's keys never get here:
    RowBuilder fails them whatever the policy.)"""
    if handling.policy.allow_unknown_fields:
        return []
    return rows.key_unknown_fields if rows.additional is not None else rows.unknown_fields


def _without_unknown(rows: Rows, handling: ErrorHandling) -> Rows:
    """Rows with unknown fields that are kept are written (and counted once written: `_written_unknown`);
    the others leave the rows and become UNKNOWN_FIELDS_ERRORs (`_unknown_errors`)."""
    if not rows.unknown_fields:
        return rows
    rejected = _rejected_unknown(rows, handling)
    return rows.take(np.flatnonzero(~np.isin(rows.sources, rejected))) if rejected else rows


def _written_unknown(unknown: list[int], pending: Writable, done: Handled) -> int:
    """The records with unknown fields (`unknown`: value, key or both, once per record) that are in the table
    now. Counted after the write, not before: a kept row the sink then refuses is a dead letter or a
    failure, and the count says "written"."""
    if not unknown or not done.written:
        return 0
    written = np.setdiff1d(pending.sources, [f.index for f in done.errors])
    return int(np.isin(unknown, written).sum())


def _unknown_errors(rows: Rows, handling: ErrorHandling) -> list[RowError]:
    """One UNKNOWN_FIELDS_ERROR per rejected record that is a row (one that failed already has its error);
    the key's message when the key had unknown fields, whatever the value had."""
    rejected = _rejected_unknown(rows, handling)
    if not rejected:
        return []
    written, keyed = set(rows.sources.tolist()), set(rows.key_unknown_fields)
    return [RowError(i, ErrorType.UNKNOWN_FIELDS_ERROR, KEY_UNKNOWN_FIELDS if i in keyed else UNKNOWN_FIELDS)
            for i in rejected if i in written]


def _count(stats: BatchStats, table: str, messages: int, written: int, retried: int, source: pa.RecordBatch,
           dead: list[RowError], failed: list[RowError]) -> None:
    stats.rows_written += written
    dead_errors = [message_error(source, f) for f in dead]
    failed_errors = [message_error(source, f) for f in failed]
    stats.add_errors(dead_errors + failed_errors)
    stats.add_outcome(RETRIED, retried)
    stats.add_outcome(DLQ, dead_errors)
    stats.add_outcome(FAILED, failed_errors)
    if table:
        stats.add_table(table, messages=messages, written=written, retried=retried, dlq=len(dead), failed=len(failed))


def _coordinates(source: pa.RecordBatch, index: int) -> tuple[str, int, int]:
    return source["topic"][index].as_py(), source["partition"][index].as_py(), source["offset"][index].as_py()


def _starts(source: pa.RecordBatch) -> list[tuple[str, int, int]]:
    """(topic, partition, first offset) of each Kafka partition among `source`'s records."""
    firsts = pa.Table.from_batches([source]).group_by(["topic", "partition"]).aggregate([("offset", "min")])
    return sorted(zip(firsts["topic"].to_pylist(), firsts["partition"].to_pylist(), firsts["offset_min"].to_pylist(),
                      strict=True))


# How TaskResult.held begins, by why the task held (the driver's log line tells them apart).
UNKNOWN_FIELDS_AT = "unknown fields at"
UNKNOWN_SCHEMA_ID = "unknown schema id"
UNKNOWN_ENUM_NUMBER_AT = "enum number the descriptors do not name at"


def _held(source: pa.RecordBatch, rows: Rows) -> str:
    """Why a task holds: the first record in `source` with unknown fields, an unknown schema id or an enum
    number the descriptors do not name."""
    first = min(rows.unknown_fields[:1] + rows.unknown_schema_ids[:1] + rows.enum_numbers[:1])
    if first in rows.unknown_schema_ids[:1]:
        schema_id = framed_schema_id(source["value"][first].as_py())
        return f"{UNKNOWN_SCHEMA_ID} {schema_id} at {_where(source, first)}"
    if first in rows.unknown_fields[:1]:
        return f"{UNKNOWN_FIELDS_AT} {_where(source, first)}"
    return f"{UNKNOWN_ENUM_NUMBER_AT} {_where(source, first)}"


def _where(source: pa.RecordBatch, index: int) -> str:
    topic, partition, offset = _coordinates(source, index)
    return f"{topic}/{partition}@{offset}"


def message_error(source: pa.RecordBatch, failure: RowError) -> MessageError:
    """The failure with the Kafka coordinates of its record, for reports and dead letters."""
    return MessageError(failure.error_type, *_coordinates(source, failure.index), failure.message)


def _letter(source: pa.RecordBatch, failure: RowError, route: str, redactor: Redactor) -> DeadLetter:
    i = failure.index
    error = message_error(source, failure)
    micros = source["timestamp"][i].cast(pa.int64()).as_py() if source["timestamp"][i].is_valid else None
    headers = source["headers"][i].as_py() or []
    attempt = source[ATTEMPT_COLUMN][i].as_py() + 1 if ATTEMPT_COLUMN in source.schema.names else 1
    return DeadLetter(dataclasses.replace(error, message=redactor.text(error.message)), source["key"][i].as_py(),
                      source["value"][i].as_py(),
                      tuple((h["key"], h["value"]) for h in headers),
                      micros // 1000 if micros is not None and micros >= 0 else None, attempt,
                      int(time.time() * 1000), route=route, exception_class=cause_of(failure),
                      timestamp_type=source["timestamp_type"][i].as_py(), leader_epoch=source["leader_epoch"][i].as_py())
