"""The file-loads write path: tasks stage rows as files, the driver runs one load job per micro-batch.

BigQuery allows 1,500 load jobs per table per day, so a load job per Spark task is out of the question.
Instead each task appends its converted rows, as newline-delimited JSON, to one file of its own in the
batch's staging directory and reports the file (name, row count, Kafka offset ranges) in its stats
row. The driver, once every task of the micro-batch succeeded, loads all of those files in one job
(WRITE_APPEND, the live table's schema, no autodetect), waits for it, and only then deletes the batch's
staging directory and lets Spark commit the offsets.

Replays are idempotent: the job id is derived from the table, the checkpoint, the batch id and the Kafka
offsets the files hold (never from the file bytes: `load_time` differs in every attempt). A batch
replayed after a crash between "load done" and "offsets committed" finds its job done and loads nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from requests import exceptions as http_exceptions

from firehose_bq.bigquery.classify import REASON_TYPES, classify_exception, classify_row_errors, describe_row_errors
from firehose_bq.bigquery.client import call_options
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.errors import ErrorType, MessageError, SinkError

log = logging.getLogger(__name__)

STAGED_SUFFIX = ".ndjson"
# BigQuery job ids: letters, digits, `_` and `-`, at most 1,024 characters.
_JOB_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# A job id that exists but failed cannot be reused; the retry of such a batch takes the next suffix.
# Each attempt is a load job against the daily quota, so a batch that keeps failing stops here.
MAX_JOB_ATTEMPTS = 20
# Load-job errors kept in the SinkError's text; BigQuery returns up to ~100 per job.
ERRORS_SHOWN = 5
DEFAULT_STAGING_DIR = "staging"


@dataclass(frozen=True)
class OffsetRange:
    """The Kafka records one staged file holds from one partition: first and last offset, row count."""

    topic: str
    partition: int
    first: int
    last: int
    rows: int


@dataclass
class StagedFile:
    """What a task staged; travels to the driver as JSON in the task's stats row."""

    path: str
    rows: int = 0
    ranges: list[OffsetRange] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "rows": self.rows,
                           "ranges": [[r.topic, r.partition, r.first, r.last, r.rows] for r in self.ranges]})

    @classmethod
    def from_json(cls, text: str) -> StagedFile:
        data = json.loads(text)
        return cls(data["path"], data["rows"], [OffsetRange(*r) for r in data["ranges"]])


def staging_root(config: Config) -> Path:
    """Where micro-batches stage their files; Config.validate has already rejected remote locations."""
    uri = config.bigquery.file_loads_staging_uri
    if uri:
        return Path(uri.removeprefix("file://"))
    return Path(config.spark.checkpoint_location.removeprefix("file://")) / DEFAULT_STAGING_DIR


def batch_dir(root: Path, batch_id: int) -> Path:
    return root / f"batch-{batch_id}"


def for_batch(cfg: BigQueryConfig, root: Path, batch_id: int) -> BigQueryConfig:
    """The config shipped to this batch's tasks: its staging URI is the batch's own directory."""
    return replace(cfg, file_loads_staging_uri=str(batch_dir(root, batch_id)))


def encode_row(row: dict) -> bytes:
    # The converter's JSON encoding is what BigQuery reads from NDJSON too (RFC 3339, base64, "NaN").
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


class StagingWriter:
    """A task's RowWriter for file loads: appends rows to one NDJSON file in the batch's directory.

    Nothing reaches BigQuery here, so no row fails here: BigQuery judges them in the driver's load job.
    """

    def __init__(self, cfg: BigQueryConfig) -> None:
        directory = Path(cfg.file_loads_staging_uri)
        directory.mkdir(parents=True, exist_ok=True)
        # A unique name per task attempt: a failed attempt's partial file is never among the reported ones.
        self.staged = StagedFile(str(directory / f"part-{uuid.uuid4().hex}{STAGED_SUFFIX}"))
        self._file: IO[bytes] | None = open(self.staged.path, "wb")  # noqa: SIM115 - closed by close()
        self._ranges: dict[tuple[str, int], list[int]] = {}  # (topic, partition) → [first, last, rows]

    def write(self, batch: ConvertedBatch, records: KafkaRecords) -> list[MessageError]:
        assert self._file is not None, "write after close"
        self._file.write(b"".join(encode_row(row) for row in batch.rows))
        for i in batch.sources:
            offset = records.offsets[i]
            span = self._ranges.setdefault((records.topics[i], records.partitions[i]), [offset, offset, 0])
            span[0], span[1], span[2] = min(span[0], offset), max(span[1], offset), span[2] + 1
        self.staged.rows += len(batch.rows)
        return []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.staged.ranges = [OffsetRange(t, p, first, last, rows)
                              for (t, p), (first, last, rows) in sorted(self._ranges.items())]


def staged_json(writer: object) -> str | None:
    """The stats-row column of a task: its staged file as JSON, if it staged one."""
    return writer.staged.to_json() if isinstance(writer, StagingWriter) else None


def load_job_id(table_ref: str, checkpoint: str, batch_id: int, staged: Sequence[StagedFile]) -> str:
    """Deterministic over replays of one batch: the same table, checkpoint, batch and Kafka records."""
    ranges = sorted((r.topic, r.partition, r.first, r.last, r.rows) for f in staged for r in f.ranges)
    digest = hashlib.sha256(json.dumps([table_ref, checkpoint, batch_id, ranges]).encode()).hexdigest()[:24]
    table = _JOB_ID_UNSAFE.sub("_", table_ref.split(".", 1)[-1])[:200]
    return f"firehose_bq_{table}_b{batch_id}_{digest}"


def attempt_job_id(base: str, attempt: int) -> str:
    return base if attempt == 0 else f"{base}_retry{attempt}"


def checkpoint_identity(checkpoint_location: str) -> str:
    """The streaming query's persistent id from the checkpoint's `metadata` file, else the location.

    The id is new for a new checkpoint, so a fresh checkpoint on the same path never mistakes an old
    run's jobs for its own."""
    path = Path(checkpoint_location.removeprefix("file://")) / "metadata"
    try:
        return str(json.loads(path.read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return checkpoint_location


def concatenate(files: Iterable[StagedFile], target: Path) -> int:
    """All staged files as one NDJSON file (every row ends in a newline); returns its size."""
    with open(target, "wb") as out:
        for staged in files:
            with open(staged.path, "rb") as part:
                shutil.copyfileobj(part, out, 1024 * 1024)
        return out.tell()


@dataclass(frozen=True)
class LoadOutcome:
    job_id: str
    rows: int
    already_loaded: bool  # the job had run before (a replay): nothing was loaded again


class FileLoader:
    """Driver side: one load job over the files every task of a micro-batch staged."""

    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig, root: Path, checkpoint: str) -> None:
        self._client = client
        self._cfg = cfg
        self._root = root
        self._checkpoint = checkpoint
        self._call = call_options(cfg)

    def load(self, batch_id: int, staged: Sequence[StagedFile]) -> LoadOutcome | None:
        """Load the batch's files into the table, or find that an earlier attempt did; raise SinkError on
        failure. The files stay: the caller drops the batch's directory once all its tables are loaded."""
        rows = sum(f.rows for f in staged)
        if rows == 0:
            return None
        base = load_job_id(self._cfg.table_ref, self._checkpoint, batch_id, staged)
        started = time.monotonic()
        for attempt in range(MAX_JOB_ATTEMPTS):
            job_id = attempt_job_id(base, attempt)
            job = self._existing(job_id)
            already = job is not None
            if job is None:
                job = self._start(batch_id, job_id, staged)
            if job is None:  # 409: created by an earlier attempt between our lookup and our request
                job, already = self._existing(job_id), True
                if job is None:
                    raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"load job {job_id} exists (409) but cannot be read")
            self._wait(job)
            if job.error_result:
                if already:
                    log.info("batch %d: earlier load job %s failed; trying a new one", batch_id, job_id)
                    continue
                raise self._failure(job)
            if already:
                log.info("batch %d: load job %s already loaded these rows (a replay): not loading again",
                         batch_id, job_id)
            else:
                log.info("batch %d: load job %s loaded %d rows from %d file(s) into %s in %.2f s", batch_id, job_id,
                         rows, len(staged), self._cfg.table_ref,
                         time.monotonic() - started)
            return LoadOutcome(job_id, rows, already)
        raise SinkError(ErrorType.SINK_UNKNOWN_ERROR,
                        f"batch {batch_id}: {MAX_JOB_ATTEMPTS} load jobs for it failed ({base}...); stopping")

    def _existing(self, job_id: str) -> bigquery.LoadJob | None:
        try:
            return self._client.get_job(job_id, **self._call)  # type: ignore[return-value]
        except api_exceptions.NotFound:
            return None
        except (api_exceptions.GoogleAPIError, http_exceptions.RequestException, ConnectionError) as exc:
            raise SinkError(classify_exception(exc), f"looking up load job {job_id} failed: {exc}") from exc

    def _start(self, batch_id: int, job_id: str, staged: Sequence[StagedFile]) -> bigquery.LoadJob | None:
        directory = batch_dir(self._root, batch_id)
        combined = directory / f"load-{job_id}{STAGED_SUFFIX}"
        try:
            size = concatenate(staged, combined)
        except FileNotFoundError as exc:
            combined.unlink(missing_ok=True)
            # Typically a cluster whose executors staged to their own local disks.
            raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, f"a staged file is not visible to the driver "
                            f"({exc.filename}): SINK_BIGQUERY_FILE_LOADS_STAGING_URI must be a directory that "
                            f"the driver and every executor share") from exc
        table = self._table()
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
            create_disposition=bigquery.CreateDisposition.CREATE_NEVER,
            schema=table.schema,
            autodetect=False,
            ignore_unknown_values=False,
            max_bad_records=0,
        )
        log.info("batch %d: load job %s: %d rows, %d bytes from %d staged file(s)", batch_id, job_id,
                 sum(f.rows for f in staged), size, len(staged))
        try:
            with open(combined, "rb") as source:
                # No `size`: the client then always takes the resumable upload, which the emulator and
                # BigQuery both accept (a multipart upload under 5 MB fails on the emulator).
                return self._client.load_table_from_file(source, table, job_id=job_id, job_config=config,
                                                         timeout=self._call["timeout"])
        except api_exceptions.Conflict:
            return None
        except (api_exceptions.GoogleAPIError, http_exceptions.RequestException, ConnectionError,
                TimeoutError) as exc:
            raise SinkError(classify_exception(exc), f"load job {job_id} into {self._cfg.table_ref} could not "
                            f"be started: {exc}") from exc
        finally:
            combined.unlink(missing_ok=True)

    def _table(self) -> bigquery.Table:
        try:
            return self._client.get_table(self._cfg.table_ref, **self._call)
        except (api_exceptions.GoogleAPIError, http_exceptions.RequestException, ConnectionError) as exc:
            raise SinkError(classify_exception(exc), f"reading the schema of {self._cfg.table_ref} failed: "
                            f"{exc}") from exc

    def _wait(self, job: bigquery.LoadJob) -> None:
        timeout = self._cfg.file_loads_job_timeout_ms / 1000
        try:
            job.result(timeout=timeout, retry=self._call["retry"])
        except api_exceptions.GoogleAPICallError as exc:
            if job.error_result:
                return  # the job finished with an error: the caller reports the job's own errors
            # Polling the job failed (after the client's retries): its outcome is unknown.
            raise SinkError(classify_exception(exc), f"waiting for load job {job.job_id} failed: {exc}") from exc
        except (TimeoutError, http_exceptions.RequestException, ConnectionError,
                api_exceptions.RetryError) as exc:
            # concurrent.futures.TimeoutError is TimeoutError: the job may still be running; the replay
            # of this batch looks the same job id up again instead of loading the rows a second time.
            raise SinkError(ErrorType.SINK_RETRYABLE_ERROR, f"load job {job.job_id} did not finish within "
                            f"{timeout:.0f} s: {exc or type(exc).__name__}") from exc

    def _failure(self, job: bigquery.LoadJob) -> SinkError:
        result = job.error_result or {}
        errors = [e for e in (job.errors or []) if isinstance(e, dict)] or [result]
        kind = (REASON_TYPES.get(str(result.get("reason", "")))
                or classify_row_errors(errors))
        shown = describe_row_errors(errors[:ERRORS_SHOWN])
        more = f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
        # A load job's errors name a file position, not a Kafka record: they are reported for the job.
        return SinkError(kind, f"load job {job.job_id} into {self._cfg.table_ref} failed: {shown}{more}")


def parse_staged(values: Iterable[str | None]) -> list[StagedFile]:
    return [StagedFile.from_json(v) for v in values if v]


def discard_batch_dir(root: Path, batch_id: int) -> None:
    """Drop what a batch staged: after its load, or when it failed (its replay stages the rows again)."""
    shutil.rmtree(batch_dir(root, batch_id), ignore_errors=True)
