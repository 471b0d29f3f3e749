"""The file-loads write path: tasks stage rows in files, the driver runs one load job per table per micro-batch.

BigQuery allows 1,500 load jobs per table per day, so a load job per Spark task is out of the question.
Instead each task fits its rows to the live table (`conform.py`: the rows BigQuery would refuse fail
here, each on its own, instead of failing the whole load job later) and appends them to a file of its
own on its local disk: Parquet, or newline-delimited JSON for a table with a JSON column (below). When
the task ends it puts the file into the staging area under the batch's prefix (`blobstore.py`:
`gs://bucket/prefix`, or a directory every process of the job mounts; whole objects, visible only once
complete) and reports the object (name, format, row count) in its result. The driver, once every task
of the micro-batch succeeded, loads each table's objects in one job (WRITE_APPEND, columns matched by
name, REPEATED columns read from Parquet LISTs), waits for it, and only when every table of the batch is
loaded drops the batch's prefix and lets Spark commit.

How a load job gets its rows: from Cloud Storage, BigQuery reads the objects itself; the job's source
URIs are exactly the reported objects (never a wildcard, which would also take a failed task attempt's
leftovers). From a shared directory the driver uploads them with the job, combined into one file. So
does it, from either, for a table whose Parquet objects differ in columns (the table grew while the batch
ran): one file under the union of their columns, rather than leaving BigQuery to reconcile per-file schemas.

Parquet where it can be: it is written straight from the Arrow batches (no text per value), typed
(TIMESTAMP, DATE, BYTES and NUMERIC need no text forms), and a fraction of the size. It cannot be for a
table with a JSON column at any depth: BigQuery's load jobs fill JSON columns only from CSV, Avro or JSON
files and refuse the Parquet, every batch. Such a table's tasks stage newline-delimited JSON (`ndjson.py`:
the insertAll serializer's text in the form load jobs read, each JSON column value checked first), decided
per task from the live table it fits its rows to. One load job has one source format, so when a table
gained a JSON column while a batch ran and some of its objects are Parquet, the driver loads all of them
as one uploaded JSON file, the Parquet rows turned into JSON lines (newline-delimited JSON needs no union
of columns: each line names its own).

Replays are idempotent: the job id is derived from the table, the checkpoint, the batch id and the batch's
plan, the Kafka ranges it was planned to read (bigquery/jobs.py `batch_job_id`: never from the file bytes,
names, formats or staged offsets, which differ between runs of one batch). A batch replayed after a crash between "load done" and "offsets committed" finds its job done
and loads nothing. The same makes a failed load safe to retry: the driver's retry (the error policy's
retry types, RETRY_* within SINK_BIGQUERY_RETRY_DEADLINE_MS) looks the job up again, waits for it if it
runs, and starts the next one only when it failed; the client's own retries are off inside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from google.auth import exceptions as auth_exceptions
from google.cloud import bigquery

from firehose_bq.bigquery.classify import classify_exception
from firehose_bq.bigquery.client import REQUEST_ERRORS, attempt_options, call_options
from firehose_bq.bigquery.conform import LiveTable
from firehose_bq.bigquery.jobs import BatchJobs, BatchPlan, batch_job_id
from firehose_bq.bigquery.ndjson import CONVERTED, NDJSON, PARQUET, SUFFIXES, NdjsonWriter, json_columns, \
    json_failures, lines, required_json_columns
from firehose_bq.blobstore import GCS_SCHEME, BlobStore, GcsOptions, open_blob_store
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.errors import ErrorType, RowError, SinkError
from firehose_bq.policy import ErrorHandling, gave_up
from firehose_bq.retrying import retry_call

if TYPE_CHECKING:
    import pyarrow.parquet as pq

log = logging.getLogger(__name__)

STAGED_SUFFIX = SUFFIXES[PARQUET]
DEFAULT_STAGING_DIR = "staging"
# A load job takes at most 10,000 source URIs; a batch stages one object per task and table (more only
# when the table changes during the task).
MAX_SOURCE_URIS = 10_000
# What failing to reach the staging area raises: Cloud Storage (API, HTTP, credentials) or a local disk.
STORE_ERRORS = (*REQUEST_ERRORS, auth_exceptions.GoogleAuthError, OSError)

@dataclass
class StagedFile:
    """What a task staged for one table; travels to the driver as JSON in the task's result.

    Usually one object; another one is begun when the rows' columns change within the task (the table
    gained a column meanwhile), as one Parquet file holds one schema, or when the table's format changes
    (it gained a JSON column). `objects` are names in the staging area; `schemas` a digest of each
    object's columns and `formats` its format (PARQUET or NEWLINE_DELIMITED_JSON), in the same order."""

    objects: list[str] = field(default_factory=list)
    rows: int = 0
    schemas: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.formats:  # staged by an older version (a replay's pending batch), which staged only Parquet
            self.formats = [PARQUET] * len(self.objects)

    def to_json(self) -> str:
        return json.dumps({"objects": self.objects, "rows": self.rows, "schemas": self.schemas,
                           "formats": self.formats})

    @classmethod
    def from_json(cls, text: str) -> StagedFile:
        data = json.loads(text)  # a replay's pending batch from an older version also has "ranges": unused now
        return cls(data["objects"], data["rows"], data["schemas"], data.get("formats", []))


@dataclass(frozen=True)
class StagingArea:
    """Where file loads stage: a directory or `gs://bucket/prefix`, how to reach Cloud Storage, and the
    name prefix of this run's batches (a replay's own `dlq-replay-<id>/`). Picklable: tasks get it."""

    location: str
    gcs: GcsOptions = GcsOptions()
    prefix: str = ""

    def store(self) -> BlobStore:
        return open_blob_store(self.location, self.gcs)

    def batch(self, batch_id: int) -> str:
        """The name prefix of everything batch `batch_id` stages."""
        return f"{self.prefix}batch-{batch_id}/"


def staging_area(config: Config, prefix: str = "") -> StagingArea:
    """The job's staging area; Config.validate has already refused locations it cannot stage in."""
    bq = config.bigquery
    location = bq.file_loads_staging_uri or f"{config.spark.checkpoint_location.rstrip('/')}/{DEFAULT_STAGING_DIR}"
    if not location.startswith(GCS_SCHEME):
        location = location.removeprefix("file://")
    # The load jobs read the objects as the BigQuery identity, so by default the tasks write them as it too.
    credential, setting_name = bq.credential_path, "SINK_BIGQUERY_CREDENTIAL_PATH"
    if bq.file_loads_staging_credential_path:
        credential, setting_name = (bq.file_loads_staging_credential_path,
                                    "SINK_BIGQUERY_FILE_LOADS_STAGING_CREDENTIAL_PATH")
    return StagingArea(location, GcsOptions(bq.file_loads_staging_gcs_endpoint, credential, bq.project_id,
                                            setting_name), prefix)


def _schema_digest(schema: pa.Schema) -> str:
    return hashlib.sha256(schema.remove_metadata().serialize().to_pybytes()).hexdigest()[:16]


def _scratch_parent() -> str | None:
    """Spark's local directories in a Spark task (its scratch space, sized for spills), else the system's
    temp directory."""
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None


class StagingWriter:
    """A task's RowWriter for file loads: appends the rows that fit the table to a file on local disk
    (Parquet, or newline-delimited JSON while the live table has a JSON column) and, on close, puts the
    file(s) into the staging area under `prefix`. The client (borrowed: its maker closes it) reads the live
    table. Rows the table cannot take fail here (RowErrors), never in the driver's load job; a file that
    cannot be stored raises SinkError on close.

    `insert_ids` are required: they are the rows' Kafka coordinates (`topic_partition_offset`), from
    which the driver derives the batch's load job id."""

    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig, store: BlobStore, prefix: str,
                 schema: list[bigquery.SchemaField] | None = None) -> None:
        self._client = client
        self._store = store
        self._prefix = prefix
        self._live = LiveTable(client, cfg.table_ref, call_options(cfg), schema)  # schema: conform.LiveTable
        self.staged = StagedFile()
        self._scratch: Path | None = None
        self._files: list[tuple[Path, str, str]] = []  # local files, each with its schema digest and format
        self._file: pq.ParquetWriter | NdjsonWriter | None = None
        self._closed = False

    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        """Stage the rows that fit the table; `insert_ids` go unused (the load job's id comes from the batch's
        plan, bigquery/jobs.py, and a load job has no insertIds)."""
        assert not self._closed, "write after close"
        fitted = self._live.fit(rows)
        staged, failures = fitted.rows, fitted.failures
        paths = json_columns(self._live.schema)
        if paths and staged.num_rows:
            # A JSON column's values go into the file as they are: those that would break it fail here.
            bad = json_failures(staged, paths, required_json_columns(self._live.schema))
            if bad:
                failures = sorted([*failures, *(RowError(int(fitted.positions[i]), kind, f"table "
                                                         f"{self._live.table_ref}: {text}")
                                                for i, (kind, text) in bad.items())], key=lambda f: f.index)
                keep = np.ones(staged.num_rows, dtype=bool)
                keep[list(bad)] = False
                staged = staged.filter(pa.array(keep))
        if staged.num_rows:
            self._stage(staged, NDJSON if paths else PARQUET, paths)
            self.staged.rows += staged.num_rows
        return failures

    def _stage(self, rows: pa.RecordBatch, source_format: str, paths: frozenset[str]) -> None:
        if self._file is not None and (not self._file.schema.equals(rows.schema)
                                       or self._files[-1][2] != source_format):
            self._file.close()
            self._file = None
        if self._file is None:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="firehose-staging-", dir=_scratch_parent()))
            path = self._scratch / f"{len(self._files)}{SUFFIXES[source_format]}"
            if source_format == NDJSON:
                self._file = NdjsonWriter(path, rows.schema, paths)
            else:
                # Imported here, not at the top: pyarrow.parquet and its filesystems (~4 MB per process) are
                # of no use to the workers of the streaming modes, which import this module through modes.py.
                import pyarrow.parquet as pq

                self._file = pq.ParquetWriter(path, rows.schema)
            self._files.append((path, _schema_digest(rows.schema), source_format))
        self._file.write_batch(rows)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._put_files()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def _put_files(self) -> None:
        for path, digest, source_format in self._files:
            # A unique name per file and task attempt: a failed attempt's object is never among the reported ones.
            name = f"{self._prefix}part-{uuid.uuid4().hex}{SUFFIXES[source_format]}"
            try:
                self._store.put_file(name, path)
            except STORE_ERRORS as exc:
                raise SinkError(classify_exception(exc), f"staging rows as {self._store.uri(name)} failed: "
                                f"{exc}") from exc
            self.staged.objects.append(name)
            self.staged.schemas.append(digest)
            self.staged.formats.append(source_format)


def staged_json(writer: object) -> str | None:
    """The stats-row column of a task: its staged file as JSON, if it staged one."""
    return writer.staged.to_json() if isinstance(writer, StagingWriter) else None


def load_job_id(table_ref: str, checkpoint: str, batch_id: int, plan: BatchPlan) -> str:
    """The same for every run of one batch (table, checkpoint, batch and its plan), whatever it staged."""
    return batch_job_id("firehose_bq_", table_ref, checkpoint, batch_id, plan)


def combine(paths: Sequence[Path], target: Path) -> Path:
    """Staged Parquet files as one file (a load job takes one upload); a single file is taken as it is.
    Files whose columns differ (the table grew during the batch) are written under the union of their
    columns, a file's missing ones NULL (empty for REPEATED)."""
    if len(paths) == 1:
        return paths[0]
    import pyarrow.parquet as pq  # see StagingWriter._stage

    schema = _union([pq.read_schema(p).remove_metadata() for p in paths])
    with pq.ParquetWriter(target, schema) as out:
        for path in paths:
            for batch in pq.ParquetFile(path).iter_batches():
                out.write_batch(_aligned(batch, schema))
    return target


def combine_json(paths: Sequence[Path], formats: Sequence[str], target: Path) -> Path:
    """Staged files of which some are newline-delimited JSON as one such file (a load job has one source
    format): JSON files as they are, Parquet ones (staged before the table gained its JSON column) turned
    into JSON lines. A single JSON file is taken as it is."""
    if len(paths) == 1 and formats[0] == NDJSON:
        return paths[0]
    import pyarrow.parquet as pq  # see StagingWriter._stage

    with open(target, "wb") as out:
        for path, source_format in zip(paths, formats, strict=True):
            if source_format == NDJSON:
                with open(path, "rb") as staged:
                    shutil.copyfileobj(staged, out)
            else:
                for batch in pq.ParquetFile(path).iter_batches():
                    out.write(lines(batch, CONVERTED))
    return target


def _union(schemas: Sequence[pa.Schema]) -> pa.Schema:
    merged: dict[str, pa.Field] = {}
    for schema in schemas:
        for column in schema:
            merged[column.name] = _merged(merged[column.name], column) if column.name in merged else column
    return pa.schema([f if all(f.name in s.names for s in schemas) else f.with_nullable(True)
                      for f in merged.values()])


def _merged(one: pa.Field, other: pa.Field) -> pa.Field:
    """Two staged versions of one column. Tables only grow (fields are added, REQUIRED relaxes), so they
    differ only in RECORD fields one of them lacks, and in nullability."""
    nullable = one.nullable or other.nullable
    if one.type == other.type:
        return one.with_nullable(nullable)
    if pa.types.is_struct(one.type) and pa.types.is_struct(other.type):
        fields = {f.name: f for f in one.type}
        for f in other.type:
            fields[f.name] = _merged(fields[f.name], f) if f.name in fields else f.with_nullable(True)
        return pa.field(one.name, pa.struct([f if f.name in other.type.names else f.with_nullable(True)
                                             for f in fields.values()]), nullable)
    if pa.types.is_list(one.type) and pa.types.is_list(other.type):
        return pa.field(one.name, pa.list_(_merged(one.type.value_field, other.type.value_field)), nullable)
    raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"staged files disagree on column {one.name}: {one.type} and "
                    f"{other.type}")


def _aligned(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = []
    for column in schema:
        if column.name not in batch.schema.names:
            empty = pa.array([[]] * batch.num_rows, column.type) if pa.types.is_list(column.type) else \
                pa.nulls(batch.num_rows, column.type)
            columns.append(empty)
        else:
            # A cast between struct types matches their fields by name and leaves missing ones NULL.
            columns.append(batch.column(column.name).cast(column.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def load_job_config(source_format: str = PARQUET) -> bigquery.LoadJobConfig:
    """Append the staged files into the existing table. Their columns are matched by name (the files carry
    the table's own spellings; JSON lines name their members); for Parquet, list inference makes BigQuery
    read a Parquet LIST as a REPEATED column instead of a RECORD holding `list.element`."""
    config = bigquery.LoadJobConfig(
        source_format=source_format,
        write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
        create_disposition=bigquery.CreateDisposition.CREATE_NEVER,
    )
    if source_format == PARQUET:
        parquet = bigquery.ParquetOptions()
        parquet.enable_list_inference = True
        config.parquet_options = parquet
    return config


@dataclass(frozen=True)
class LoadOutcome:
    job_id: str
    rows: int
    already_loaded: bool  # the job had run before (a replay): nothing was loaded again


class FileLoader:
    """Driver side: one load job over the objects every task of a micro-batch staged in `store`.

    `handling`: whose retry types and schedule a failed load follows (default: the policy's defaults
    within cfg's SINK_BIGQUERY_RETRY_DEADLINE_MS)."""

    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig, store: BlobStore, checkpoint: str,
                 handling: ErrorHandling | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._cfg = cfg
        self._store = store
        self._checkpoint = checkpoint
        self._handling = handling or ErrorHandling(retry_deadline_ms=cfg.retry_deadline_ms)
        self._call = attempt_options(cfg)
        self._sleep, self._clock = sleep, clock
        self._jobs = BatchJobs(client, "load job", cfg.table_ref, self._call, cfg.job_timeout_ms / 1000, sleep, clock)

    def load(self, batch_id: int, staged: Sequence[StagedFile], plan: BatchPlan) -> LoadOutcome | None:
        """Load the batch's files into the table, or find that an earlier run of the batch (the same `plan`,
        bigquery/jobs.py) did; raise SinkError on
        failure (after the retries of a retryable one). The files stay: the caller drops the batch's
        staging once all its tables are loaded."""
        if sum(f.rows for f in staged) == 0:
            return None
        plan = list(plan)  # taken once per attempt
        return retry_call(lambda: self._load(batch_id, staged, plan), self._handling.write_backoff(),
                          retry_on=self._handling.retries, give_up=gave_up,
                          what=f"batch {batch_id}: load into {self._cfg.table_ref}", sleep=self._sleep,
                          clock=self._clock)

    def _load(self, batch_id: int, staged: Sequence[StagedFile], plan: BatchPlan) -> LoadOutcome:
        rows = sum(f.rows for f in staged)
        started = self._clock()
        run = self._jobs.run(load_job_id(self._cfg.table_ref, self._checkpoint, batch_id, plan),
                             lambda job_id: self._start(batch_id, job_id, staged))
        if run.already:
            log.info("batch %d: load job %s already loaded these rows (a replay): not loading again",
                     batch_id, run.job_id)
        else:
            log.info("batch %d: load job %s loaded %d rows from %d file(s) into %s in %.2f s", batch_id, run.job_id,
                     rows, len(staged), self._cfg.table_ref, self._clock() - started)
        return LoadOutcome(run.job_id, rows, run.already)

    def _start(self, batch_id: int, job_id: str, staged: Sequence[StagedFile]) -> bigquery.LoadJob:
        names = [name for f in staged for name in f.objects]
        unseen = self._unseen(names)
        if unseen is not None:
            # Typically a cluster whose executors staged to their own local disks.
            raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"a staged object is not visible to the driver "
                            f"({self._store.uri(unseen)}): SINK_BIGQUERY_FILE_LOADS_STAGING_URI must be "
                            f"gs://bucket/prefix or a directory that the driver and every executor share")
        uris = [self._store.uri(name) for name in names]
        formats = [source_format for f in staged for source_format in f.formats]
        rows = sum(f.rows for f in staged)
        # JSON lines need no common schema (each names its members); Parquet objects do.
        one_format = len(set(formats)) == 1
        alike = one_format and (formats[0] == NDJSON or len({d for f in staged for d in f.schemas}) == 1)
        if uris[0].startswith(GCS_SCHEME) and alike and len(uris) <= MAX_SOURCE_URIS:
            log.info("batch %d: load job %s: %d rows from %d staged object(s) under %s", batch_id, job_id, rows,
                     len(uris), self._store.uri())
            return self._client.load_table_from_uri(uris, self._cfg.table_ref, job_id=job_id,
                                                    job_config=load_job_config(formats[0]), **self._call)
        return self._upload(batch_id, job_id, names, uris, formats, rows)

    def _unseen(self, names: Sequence[str]) -> str | None:
        """The first staged object the store does not list (one listing per directory the names are in)."""
        present: set[str] = set()
        for directory in sorted({posixpath.dirname(name) for name in names}):
            try:
                present.update(self._store.names(f"{directory}/" if directory else ""))
            except STORE_ERRORS as exc:
                raise SinkError(classify_exception(exc), f"listing the staged objects under "
                                f"{self._store.uri(directory)} failed: {exc}") from exc
        return next((name for name in names if name not in present), None)

    def _upload(self, batch_id: int, job_id: str, names: Sequence[str], uris: Sequence[str], formats: Sequence[str],
                rows: int) -> bigquery.LoadJob:
        """The staged objects combined into one file that the driver uploads with the load job: always from a
        directory; from Cloud Storage when their columns or formats differ (or they are too many for one job).
        One of them newline-delimited JSON (the table has a JSON column) makes the whole load JSON."""
        local = not uris[0].startswith(GCS_SCHEME)
        source_format = NDJSON if NDJSON in formats else PARQUET
        # Beside the staged files when they are local (that disk holds the batch already), else the scratch space.
        parent = Path(uris[0]).parent if local else Path(_scratch_parent() or tempfile.gettempdir())
        try:
            # A directory that cannot be removed (its disk turned read-only) must not hide why the load failed.
            directory = tempfile.TemporaryDirectory(prefix=".load-", dir=parent, ignore_cleanup_errors=True)
        except OSError as exc:
            raise SinkError(classify_exception(exc), f"the driver cannot combine the staged files for the load "
                            f"in {parent}: {exc}") from exc
        with directory as scratch:
            paths = [Path(uri) for uri in uris] if local else self._download(names, formats, Path(scratch))
            target = Path(scratch) / f"load{SUFFIXES[source_format]}"
            try:
                source = combine_json(paths, formats, target) if source_format == NDJSON else combine(paths, target)
            except OSError as exc:  # pyarrow's too: ArrowIOError is an OSError
                raise SinkError(classify_exception(exc), f"combining the staged files into {target} failed: "
                                f"{exc}") from exc
            log.info("batch %d: load job %s: %d rows, %d bytes from %d staged object(s), uploaded", batch_id, job_id,
                     rows, source.stat().st_size, len(uris))
            with open(source, "rb") as data:
                # No `size`: the client then always takes the resumable upload, which the emulator and
                # BigQuery both accept (a multipart upload under 5 MB fails on the emulator). No retries
                # of the upload's own (num_retries=0): a failed upload is a failed attempt of the load.
                return self._client.load_table_from_file(data, self._cfg.table_ref, job_id=job_id,
                                                         job_config=load_job_config(source_format), num_retries=0,
                                                         timeout=self._call["timeout"])

    def _download(self, names: Sequence[str], formats: Sequence[str], scratch: Path) -> list[Path]:
        paths = []
        for number, (name, source_format) in enumerate(zip(names, formats, strict=True)):
            path = scratch / f"{number}{SUFFIXES[source_format]}"
            try:
                path.write_bytes(self._store.get(name))
            except STORE_ERRORS as exc:
                raise SinkError(classify_exception(exc), f"reading the staged object {self._store.uri(name)} "
                                f"failed: {exc}") from exc
            paths.append(path)
        return paths


def parse_staged(values: Iterable[str | None]) -> list[StagedFile]:
    return [StagedFile.from_json(v) for v in values if v]


def discard(store: BlobStore, prefix: str) -> None:
    """Drop what a batch staged under `prefix`: after its loads, or when it failed (its replay stages the
    rows again). A failure here loses nothing, so it is logged, not raised: the objects only take room."""
    try:
        store.delete_prefix(prefix)
    except STORE_ERRORS as exc:
        log.warning("could not delete the staged objects under %s (%s); they are not needed any more",
                    store.uri(prefix), exc)
