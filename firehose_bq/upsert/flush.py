"""The driver side of upsert/delete: tables, the merge flush after each micro-batch, and shutdown.

How seed 000's design maps onto Spark Structured Streaming:
- A micro-batch is a merge batch: its id is the `batchNumber` the tasks write, and `foreachBatch`
  returns (so Spark commits the batch's offsets) only after the batch's MERGE succeeded. The offsets
  of a batch are therefore never committed before its rows are in the destination (seed steps 6–7,
  the role of kcbq's preCommit).
- Steps 1–3 (new batch number, earlier flushes done, the batch's rows all written) hold by
  construction: Spark runs micro-batches one at a time, and the tasks' `collect()` returns only when
  every task finished its inserts. Step 4 (waiting for the streaming buffer) is not needed: rows
  streamed by insertAll are visible to queries at once; only DML on them is restricted, which the
  cleanup's `_PARTITIONTIME` guard handles.
- Triggers: the micro-batch trigger interval is SINK_BIGQUERY_MERGE_INTERVAL_MS and the records per
  micro-batch are capped by SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD; an `--available-now` run ends
  with its last batch merged, so nothing is left unmerged.
- Recovery: a crash before a batch's MERGE leaves its offsets uncommitted; the restarted job writes
  the replayed records into its own new intermediate table and merges them then. The old table's
  rows are never needed (their offsets were never committed): it is an orphan for `upsert cleanup`.
- A batch is merged once (`bigquery/jobs.py`): its MERGE job id is derived from the destination, the
  checkpoint's query id, the batch id and the batch's plan, the Kafka ranges it was planned to read
  (never from the intermediate table, whose name is new in every run, nor from what a run staged). A crash after the MERGE but before Spark's
  commit replays the same offsets as the same batch: the replay stages them again, finds the MERGE
  job done by its id and only clears the rows. A MERGE still running then, or slower than a request
  timeout, is waited for, never submitted a second time. This matters for delete-only, whose values
  are appended: merging them twice would append them twice (upsert-only and upsert+delete would set
  the same state again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import pyarrow as pa
from google.api_core.exceptions import GoogleAPIError
from google.cloud import bigquery

from firehose_bq.bigquery.client import REQUEST_ERRORS, attempt_options, call_options, make_client
from firehose_bq.bigquery.jobs import BatchJobs, BatchPlan, batch_job_id
from firehose_bq.bigquery.tables import ensure_dataset, ensure_table
from firehose_bq.config import Config
from firehose_bq.decode import make_value_decoder
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import FirehoseError, SchemaEvolutionError, SinkError
from firehose_bq.policy import ErrorHandling, gave_up
from firehose_bq.retrying import retry_call
from firehose_bq.sink_schema import DescriptorSource, SinkSchema, SinkSpec, plan_table, spec_of
from firehose_bq.upsert import tables
from firehose_bq.upsert.sql import MergePlan, TableRef, key_leaves
from firehose_bq.upsert.writer import ChangelogTask, staged_rows

log = logging.getLogger(__name__)


class MergeFlushError(FirehoseError):
    """A merge flush failed: the micro-batch is not committed and will be replayed."""


class UpsertSinkSchema(SinkSchema):
    """The sink schema for upsert/delete: the destination with its key column under
    SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME, plus this run's intermediate table, evolved together."""

    def __init__(self, config: Config, descriptor_source: DescriptorSource | None = None) -> None:
        super().__init__(config, descriptor_source)
        bq, up = config.bigquery, config.upsert
        assert up.kafka_key_field_name  # Config.validate requires it
        self.key_column = up.kafka_key_field_name
        self.destination = TableRef(bq.project_id, bq.dataset, bq.table)
        self.intermediate = TableRef(bq.project_id, bq.dataset,
                                     tables.intermediate_name(bq.table, up.intermediate_table_suffix))
        self.merge_plan: MergePlan | None = None
        self.created = False

    def _evolve(self, loaded: Descriptors) -> SinkSpec:
        cfg = self.config
        plan = plan_table(cfg, loaded)
        wanted = plan.table
        wanted.schema = tables.destination_schema(wanted.schema, self.key_column)
        new_key, _ = tables.split_key(wanted.schema, self.key_column)
        call = call_options(cfg.bigquery)
        with make_client(cfg.bigquery) as client:
            self._check_key(client, new_key)
            key_leaves(new_key.fields)  # a key MERGE cannot group or match on stops here, before any table
            ensure_dataset(client, cfg.bigquery.project_id, cfg.bigquery.dataset, cfg.bigquery.dataset_location,
                           cfg.table.dataset_labels, **call)
            live = ensure_table(client, wanted, self._table_changed, **call)
            # The intermediate's value columns are what this version writes; the destination may hold more.
            ensure_table(client, tables.intermediate_table(self.intermediate, wanted.schema, self.key_column), **call)
        self.created = True
        key, values = tables.split_key(wanted.schema, self.key_column)
        partitioning = live.time_partitioning
        ingestion = partitioning.type_ if partitioning is not None and not partitioning.field else None
        spec = spec_of(cfg, loaded, plan.message_name)
        self.merge_plan = MergePlan(self.destination, self.intermediate, self.key_column, tuple(key.fields),
                                    tuple(v.name for v in values), cfg.upsert.upsert_enabled,
                                    cfg.upsert.delete_enabled, ingestion, absent_key_values(spec))
        log.info("descriptors %s (%s) → %s via %s, key %s", loaded.fingerprint, plan.message_name,
                 self.destination.api, self.intermediate.table, self.key_column)
        return spec

    def _check_key(self, client: bigquery.Client, new_key: bigquery.SchemaField) -> None:
        from google.api_core.exceptions import NotFound

        try:
            live = client.get_table(self.destination.api, **call_options(self.config.bigquery))
        except NotFound:
            return
        old = [f for f in live.schema if f.name.lower() == self.key_column.lower()]
        if not old:
            raise SchemaEvolutionError(f"table {self.destination.api} has no key column {self.key_column!r}; "
                                       "upsert/delete needs one: write to a new table or add the column")
        changes = tables.key_changes(old[0].fields, new_key.fields)
        if changes:
            raise SchemaEvolutionError(f"incompatible key schema change for {self.destination.api}: "
                                       f"{'; '.join(changes)} (only new NULLABLE fields and REQUIRED -> NULLABLE "
                                       "can be applied)")


def absent_key_values(spec: SinkSpec) -> tuple[tuple[str, object], ...]:
    """(field, value) of the key's top-level fields that a key lacking them decodes to a value, not NULL
    (proto3 scalars and enums): decoded as the tasks decode keys, from the empty key."""
    assert spec.descriptors is not None and spec.key_class
    decoder = make_value_decoder(spec.descriptors.message_class(spec.key_class), 2, spec.options,
                                 confluent_framed=False, detect_unknown_fields=False, prefer=spec.decoder)
    empty = decoder.decode(pa.array([b""], pa.binary())).values[0].as_py() or {}
    return tuple((name, value) for name, value in empty.items()
                 if value is not None and not isinstance(value, (dict, list)))


class UpsertSession:
    """One run's upsert/delete state on the driver. `handling`: whose retry types and schedule a failed
    MERGE follows (default: the job's policy within SINK_BIGQUERY_RETRY_DEADLINE_MS). `identity`: what
    the batch ids count in (the checkpoint's query id; a DLQ replay's own), part of the MERGE job ids."""

    def __init__(self, config: Config, descriptor_source: DescriptorSource | None = None,
                 handling: ErrorHandling | None = None, *, identity: Callable[[], str],
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._sleep, self._clock = sleep, clock
        self._identity = identity
        self._handling = handling or ErrorHandling(config.errors, retry_deadline_ms=config.bigquery.retry_deadline_ms)
        self.schema = UpsertSinkSchema(config, descriptor_source)
        self.merges = 0
        self.merge_seconds = 0.0

    @property
    def trigger_interval_ms(self) -> int:
        interval = self.config.upsert.merge_interval_ms
        return interval if interval > 0 else self.config.spark.trigger_interval_ms

    @property
    def max_offsets_per_trigger(self) -> int:
        threshold = self.config.upsert.merge_records_threshold
        return threshold if threshold > 0 else self.config.spark.max_offsets_per_trigger

    def task(self, batch_id: int) -> ChangelogTask:
        """What the pipeline's tasks need to stage batch `batch_id` in this run's intermediate table."""
        return ChangelogTask(self.config.bigquery, self.schema.intermediate.table, batch_id,
                             self.config.upsert.delete_enabled)

    def flush(self, batch_id: int, reports: Sequence[str], batch_plan: BatchPlan) -> None:
        """Merge the batch's rows into the destination, then clear them from the intermediate table.
        `reports`: the tasks' ChangelogTask reports (how many rows they staged); `batch_plan`: what the batch
        was planned to read, from which the MERGE job id is derived (bigquery/jobs.py `batch_job_id`).

        The MERGE runs as one job per batch (found again by its id rather than run twice); a failed one,
        or one whose outcome is unknown, is retried like a write; the client's own retries, and its job
        retries of up to 40 minutes, are off inside it."""
        plan = self.schema.merge_plan
        assert plan is not None, "the schema is planned before the first batch"
        if not staged_rows(reports):
            log.info("batch %d: no rows staged, nothing to merge", batch_id)
            return
        bq = self.config.bigquery
        base = batch_job_id("firehose_bq_merge_", plan.destination.api, self._identity(), batch_id, batch_plan)
        started = self._clock()
        call = attempt_options(bq)
        sql = plan.merge(batch_id)
        with make_client(bq) as client:
            jobs = BatchJobs(client, "MERGE job", plan.destination.api, call, bq.job_timeout_ms / 1000, self._sleep,
                             self._clock)
            try:
                run = retry_call(lambda: jobs.run(base, lambda job_id: client.query(sql, job_id=job_id, job_retry=None,
                                                                                    **call)),
                                 self._handling.write_backoff(), retry_on=self._handling.retries, give_up=gave_up,
                                 what=f"batch {batch_id}: merge into {plan.destination.api}", sleep=self._sleep,
                                 clock=self._clock)
            except SinkError as exc:
                raise MergeFlushError(f"merge flush of batch {batch_id} into {plan.destination.api} failed: "
                                      f"{exc}") from exc
            merged = self._clock() - started
            self._cleanup(client, plan, batch_id)
        self.merges += 1
        self.merge_seconds += merged
        if run.already:
            log.info("batch %d: already merged into %s by MERGE job %s (a replay of the batch): not merged again",
                     batch_id, plan.destination.api, run.job_id)
        else:
            log.info("batch %d: merged into %s in %.2f s (%s rows affected, job %s)", batch_id, plan.destination.api,
                     merged, getattr(run.job, "num_dml_affected_rows", None), run.job_id)

    def merged(self, batch_id: int, batch_plan: BatchPlan) -> bool:
        """Whether an earlier run merged batch `batch_id` of this identity and plan (its MERGE job is done,
        waited for if it still runs): a replay that stopped between a MERGE and the commit of its position.
        Raises SinkError when the job cannot be looked up."""
        plan = self.schema.merge_plan
        assert plan is not None, "the schema is planned before the first batch"
        bq = self.config.bigquery
        base = batch_job_id("firehose_bq_merge_", plan.destination.api, self._identity(), batch_id, batch_plan)
        with make_client(bq) as client:
            jobs = BatchJobs(client, "MERGE job", plan.destination.api, attempt_options(bq), bq.job_timeout_ms / 1000,
                             self._sleep, self._clock)
            return jobs.done(base) is not None

    def _cleanup(self, client: bigquery.Client, plan: MergePlan, batch_id: int) -> None:
        # Best effort (seed step 8): the rows are merged already, and the table is dropped at shutdown; so
        # one attempt, not the client's retries (a BigQuery gone after the MERGE must not hold the batch).
        call = attempt_options(self.config.bigquery)
        try:
            buffered = client.get_table(plan.intermediate.api, **call).streaming_buffer is not None
            client.query(plan.cleanup(batch_id, buffered), job_retry=None, **call).result(job_retry=None, **call)
        except REQUEST_ERRORS as exc:
            log.warning("could not clear merged rows from %s (left for the drop at shutdown): %s",
                        plan.intermediate.table, exc)

    def close(self) -> None:
        """Drop this run's intermediate table: whatever it still holds was never committed."""
        if not self.schema.created:
            return
        try:
            with make_client(self.config.bigquery) as client:
                client.delete_table(self.schema.intermediate.api, not_found_ok=True,
                                    **call_options(self.config.bigquery))
            log.info("dropped intermediate table %s", self.schema.intermediate.table)
        except GoogleAPIError as exc:
            log.warning("could not drop intermediate table %s (drop it with `firehose-bq upsert cleanup`): %s",
                        self.schema.intermediate.table, exc)
