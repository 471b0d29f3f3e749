"""The Storage Write API write path: Arrow record batches appended to the table's default stream.

The writer reads the live table's schema once (and once more when rows carry a column it does not know:
the table may have grown since), fits each batch to it (`conform.py`: the table's spellings and types,
and the rows that cannot be sent as RowErrors) and appends the rest as `arrow_rows` to
`projects/…/streams/_default`: committed as soon as the append succeeds, at-least-once. Arrow is the
only row format: rows arrive as Arrow already, an append of them costs a serialization of buffers
instead of a protobuf message per row (about 9x the rows per second on the emulator), and every BigQuery
type this sink produces has a documented Arrow form.

Requests are kept under the 10 MB AppendRows limit by splitting the batch by rows on its serialized
size; a single row over it is PAYLOAD_TOO_LARGE. BigQuery rejects a request as a whole when any of its
rows is bad and names those rows in `row_errors`: the named rows become RowErrors and the rest of the
request is sent again. A request that fails for another reason ends the write with a PartialWriteError,
classified like any BigQuery failure, naming the rows not appended: the error policy retries those, and
only those, or, when BigQuery refused the request as invalid without naming a row (`invalid_request`),
isolates the rows that cause it (policy.py). At-least-once, honestly: the default stream has no
insertIds, so a row appended twice stays twice, and that happens without any crash when a request gets
no answer (its deadline passed, the connection broke): BigQuery may have appended it, the writer cannot
know, and the retry sends it again. Each such case is a warning naming the rows' count. Exactly-once
would need a stream per writer with append offsets (a committed stream), a CreateWriteStream call per
task, table and micro-batch, which its per-project hourly quota does not allow a job with many tasks and
tables at a seconds-long trigger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import BigQueryWriteClient, types

from firehose_bq.bigquery.classify import classify_exception, rejects_request
from firehose_bq.bigquery.client import attempt_options
from firehose_bq.bigquery.conform import LiveTable
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType, PartialWriteError, RowError, TableChangedError

log = logging.getLogger(__name__)

# BigQuery caps an AppendRows request at 10 MB; 9 MB of rows leaves room for the stream name and the
# writer schema (a few KB even for wide tables).
MAX_REQUEST_BYTES = 9 * 1024 * 1024
# As insertAll's stopped rows: one round re-sends the good rows of a rejected request; more rounds
# only guard against a backend that keeps rejecting them.
ROW_ERROR_RESEND_ROUNDS = 3


@dataclass
class Chunk:
    """Rows sent together as one AppendRows request, and their positions in the caller's batch."""

    rows: pa.RecordBatch
    positions: np.ndarray
    payload: bytes  # rows.serialize(): one IPC record batch message, no schema
    resends: int = 0  # how many times rows of it were sent again after other rows were rejected


@dataclass(frozen=True)
class Outcome:
    """What happened to one request: appended, rows rejected, or failed as a whole (`failure`)."""

    row_errors: dict[int, str] = field(default_factory=dict)  # index in the request → BigQuery's text
    failure: Exception | None = None
    # The failure refuses the request as invalid without naming a row or the stream (SinkError.invalid_request).
    invalid_request: bool = False
    # False: the request got no answer (deadline, broken connection). BigQuery may have appended it.
    answered: bool = True
    # BigQuery found columns in the writer schema that the table lacks (SCHEMA_MISMATCH_EXTRA_FIELDS).
    extra_fields: bool = False

    @property
    def appended(self) -> bool:
        return not self.row_errors and self.failure is None


class StorageWriteWriter:
    """RowWriter into the table's default stream; one per Spark task, closed when the task ends. The
    clients are borrowed: whoever made them closes them (`client.Clients`)."""

    def __init__(self, client: bigquery.Client, write_client: BigQueryWriteClient, cfg: BigQueryConfig,
                 schema: list[bigquery.SchemaField] | None = None) -> None:
        self._client = client
        self._write_client = write_client
        self._table = cfg.table_ref
        self._stream = f"projects/{cfg.project_id}/datasets/{cfg.dataset}/tables/{cfg.table}/streams/_default"
        self._read_timeout_s = cfg.request_timeout_s
        self._live = LiveTable(client, cfg.table_ref, attempt_options(cfg), schema)  # schema: conform.LiveTable

    def close(self) -> None:
        pass  # nothing of its own: each append's stream ends with its request

    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        """Write every row of `rows`; return those that failed, ordered by position. The default stream
        has no insertIds (BigQuery does not deduplicate it), so `insert_ids` goes unused."""
        fitted = self._live.fit(rows)
        failures = list(fitted.failures)
        if fitted.rows.num_rows:
            chunks, too_large = _chunks(fitted.rows, fitted.positions)
            failures.extend(too_large)
            self._append(chunks, failures)
        failures.sort(key=lambda f: f.index)
        return failures

    # --- requests --------------------------------------------------------------------------------

    def _append(self, queue: list[Chunk], failures: list[RowError]) -> None:
        """Append every chunk, adding the rows BigQuery rejects to `failures`; PartialWriteError when a
        request fails as a whole (the rows of the chunks not appended are its `unsent`)."""
        while queue:
            again: list[Chunk] = []
            failed: list[tuple[Chunk, Outcome]] = []
            outcomes = self._send(queue)
            for chunk, outcome in zip(queue, outcomes, strict=True):
                if outcome.appended:
                    continue
                if outcome.failure is not None:
                    failed.append((chunk, outcome))
                    continue
                failures.extend(RowError(int(chunk.positions[i]), ErrorType.SINK_4XX_ERROR, text)
                                for i, text in sorted(outcome.row_errors.items()) if i < len(chunk.positions))
                rest = np.array([i for i in range(len(chunk.positions)) if i not in outcome.row_errors], dtype=np.int64)
                if not len(rest):
                    continue
                if chunk.resends + 1 >= ROW_ERROR_RESEND_ROUNDS:
                    failures.extend(RowError(int(chunk.positions[i]), ErrorType.SINK_5XX_ERROR,
                                               f"BigQuery kept rejecting the request after {ROW_ERROR_RESEND_ROUNDS} "
                                               "attempts without naming this row") for i in rest)
                    continue
                log.info("re-sending %d row(s) of a request BigQuery rejected for %d other row(s)", len(rest),
                         len(outcome.row_errors))
                again.append(_chunk(chunk.rows.take(pa.array(rest)), chunk.positions[rest], chunk.resends + 1))
            if failed:
                first = failed[0][1]
                error = first.failure
                assert error is not None
                if unknown := sum(len(c.positions) for c, o in zip(queue, outcomes, strict=True)
                                  if o.failure is not None and not o.answered and not o.invalid_request):
                    # Said out loud: the retry sends them again, and the default stream keeps both copies.
                    log.warning("%d row(s) into %s got no answer from AppendRows (%s): BigQuery may have "
                                "appended them, and the retry sends them again, so they may be in the table "
                                "twice", unknown, self._table, error)
                unsent = sorted(int(p) for chunk in [c for c, _ in failed] + again for p in chunk.positions)
                if any(o.extra_fields for _, o in failed):
                    self._lost_columns(failed[0][0].rows.schema, unsent, failures, error)
                raise PartialWriteError(classify_exception(error), f"AppendRows into {self._table} failed ({len(failed)} "
                                        f"of {len(queue)} request(s)): {error}", tuple(unsent),
                                        tuple(sorted(failures, key=lambda f: f.index)),
                                        first.invalid_request) from error
            queue = again

    def _lost_columns(self, sent: pa.Schema, unsent: list[int], failures: list[RowError], error: Exception) -> None:
        """After SCHEMA_MISMATCH_EXTRA_FIELDS: TableChangedError if the live table lacks columns `sent` has.
        The writer's columns came from the live table, or from a check that a routed job's worker kept for a
        while (sink_schema.CheckedTables): if the table was since dropped and created again with fewer
        columns, waiting for them, as for columns just added, would wait in vain until the retries ran out
        (and the local emulator would store the rows without those values)."""
        if lost := self._live.lacks(sent):
            raise TableChangedError(ErrorType.SINK_4XX_ERROR, f"table {self._table} has no column(s) "
                                    f"{', '.join(lost)} any more, which the writer's schema had: it was changed "
                                    "under the job (AppendRows: SCHEMA_MISMATCH_EXTRA_FIELDS)", tuple(unsent),
                                    tuple(sorted(failures, key=lambda f: f.index))) from error

    def _send(self, chunks: list[Chunk]) -> list[Outcome]:
        """One AppendRows connection carrying `chunks`, one request each; an Outcome per chunk.

        As BigQuery's protocol has it, only the first request of a connection names the stream and
        carries the writer schema. A connection that breaks leaves its unanswered requests failed
        with the connection's error (they may have been written: at-least-once).
        """
        requests = (_request(chunk, self._stream if i == 0 else None) for i, chunk in enumerate(chunks))
        outcomes: list[Outcome] = []
        try:
            responses = self._write_client.append_rows(
                requests=requests, retry=None,
                # A stream's deadline covers all its requests: the read timeout for each of them.
                timeout=self._read_timeout_s * len(chunks),
                # Real BigQuery routes the connection by this header; the GAPIC call cannot derive it
                # from a stream of requests.
                metadata=(("x-goog-request-params", f"write_stream={self._stream}"),),
            )
            # Read to the end: the server closes the stream once it has answered the last request.
            outcomes.extend(_outcome(types.AppendRowsResponse.pb(response)) for response in responses)
        except (api_exceptions.GoogleAPIError, ConnectionError, TimeoutError) as exc:
            outcomes.extend(Outcome(failure=exc, invalid_request=rejects_request(exc), answered=False)
                            for _ in range(len(chunks) - len(outcomes)))
        if len(outcomes) < len(chunks):
            closed = api_exceptions.ServiceUnavailable("AppendRows connection closed before every response")
            outcomes.extend(Outcome(failure=closed, answered=False) for _ in range(len(chunks) - len(outcomes)))
        return outcomes


def _request(chunk: Chunk, stream: str | None) -> types.AppendRowsRequest:
    """`stream`: set on a connection's first request, which also carries the writer schema."""
    request = types.AppendRowsRequest.pb()()
    request.arrow_rows.rows.serialized_record_batch = chunk.payload
    if stream is not None:
        request.write_stream = stream
        # schema.serialize(): the schema message alone. A schema written as an IPC stream ends in an
        # end-of-stream marker, after which a reader finds no rows (the emulator then stores none).
        request.arrow_rows.writer_schema.serialized_schema = chunk.rows.schema.serialize().to_pybytes()
    return types.AppendRowsRequest.wrap(request)


def _chunk(rows: pa.RecordBatch, positions: np.ndarray, resends: int = 0) -> Chunk:
    return Chunk(rows, positions, rows.serialize().to_pybytes(), resends)


def _chunks(rows: pa.RecordBatch, positions: np.ndarray) -> tuple[list[Chunk], list[RowError]]:
    """`rows` split into requests under MAX_REQUEST_BYTES (by rows, on the serialized size), in order;
    a single row over the limit is PAYLOAD_TOO_LARGE."""
    chunks: list[Chunk] = []
    too_large: list[RowError] = []
    pending = [(0, rows.num_rows)]
    while pending:
        start, stop = pending.pop()
        piece = rows.slice(start, stop - start)
        # The buffers' size first (no copy): a large batch is cut before any part of it is serialized.
        size = piece.nbytes
        if size <= MAX_REQUEST_BYTES or stop - start == 1:
            chunk = _chunk(piece, positions[start:stop])
            size = len(chunk.payload)  # the IPC framing and padding come on top of the buffers
            if size <= MAX_REQUEST_BYTES:
                chunks.append(chunk)
                continue
            if stop - start == 1:
                too_large.append(RowError(int(positions[start]), ErrorType.PAYLOAD_TOO_LARGE,
                                            f"row is {size} bytes as Arrow; an AppendRows request takes at most "
                                            f"{MAX_REQUEST_BYTES}"))
                continue
        # As many even parts as the size says, with a tenth to spare; a part still over is split again.
        parts = min(stop - start, int(size * 1.1 / MAX_REQUEST_BYTES) + 1)
        bounds = np.linspace(start, stop, parts + 1).astype(int)
        pending.extend(reversed(list(zip(bounds[:-1], bounds[1:], strict=True))))
    return chunks, too_large


def _outcome(response: Any) -> Outcome:
    """`response`: the raw AppendRowsResponse protobuf."""
    if response.HasField("append_result") or not response.error.code:
        return Outcome()
    if response.row_errors:
        return Outcome(row_errors={
            int(e.index): f"{types.RowError.RowErrorCode(e.code).name}: {e.message}" for e in response.row_errors})
    if _storage_error_code(response.error) == types.StorageError.StorageErrorCode.SCHEMA_MISMATCH_EXTRA_FIELDS:
        # The writer schema comes from the live table, so "extra fields" means columns added moments ago
        # that the Storage Write backend does not see yet (it catches up within minutes): worth waiting for.
        # Unless the table lost them since (`StorageWriteWriter._append` reads it again to tell).
        return Outcome(failure=api_exceptions.ServiceUnavailable(
            f"the table's newest columns are not yet visible to the Storage Write API: {response.error.message}"),
            extra_fields=True)
    failure = api_exceptions.from_grpc_status(response.error.code, response.error.message, response=response)
    # A StorageError detail names the stream or table (not found, finalized, offsets, encryption): no row's fault.
    invalid = rejects_request(failure) and _storage_error_code(response.error) is None
    return Outcome(failure=failure, invalid_request=invalid)


def _storage_error_code(status: Any) -> int | None:
    """The StorageError code among a google.rpc.Status's details, if BigQuery attached one."""
    storage_error = types.StorageError.pb()()
    for detail in status.details:
        if detail.Is(storage_error.DESCRIPTOR) and detail.Unpack(storage_error):
            return int(storage_error.code)
    return None
