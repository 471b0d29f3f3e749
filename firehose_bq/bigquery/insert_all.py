"""The insertAll (streaming insert) write path, from Arrow rows.

Rows become BigQuery's JSON text column by column (`json_rows.py`) and go out in requests kept under
BigQuery's limits, each row with its insertId. Per-row rejections come back as RowErrors; valid rows
that BigQuery only *stopped* because another row of the request was bad are sent again without the bad
ones, so one bad message never takes good ones down with it. A request that fails as a whole raises
PartialWriteError naming the rows not sent yet; the client does not retry it: the error policy does.

BigQuery judges each row itself (unknown fields, REQUIRED, types), so no table is read here; only values
no BigQuery column can hold (a TIMESTAMP past 9999) fail before sending, as they do on the other paths.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.cloud import bigquery
from requests.adapters import DEFAULT_POOLSIZE

from firehose_bq.bigquery.classify import (
    classify_exception,
    classify_row_errors,
    describe_row_errors,
    is_only_stopped,
    rejects_request,
)
from firehose_bq.bigquery.client import REQUEST_ERRORS, attempt_options
from firehose_bq.bigquery.conform import fit, has_field
from firehose_bq.bigquery.json_rows import json_string, row_texts
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType, PartialWriteError, RowError, SinkError, TableChangedError
from firehose_bq.threads import Stopped, until_failure

log = logging.getLogger(__name__)

# BigQuery caps an insertAll request at 10 MB of JSON; 9 MB leaves room for the HTTP envelope.
MAX_REQUEST_BYTES = 9 * 1024 * 1024
# The request body around its rows: {"rows":[...]} (each row's own bytes and comma are counted exactly).
BODY_BYTES = len('{"rows":[]}')
# Re-sending stopped rows converges in one round (the bad rows are gone); more rounds only guard
# against a backend that keeps stopping rows, which then surface as SINK_5XX_ERROR.
STOPPED_RESEND_ROUNDS = 3


class InsertAllWriter:
    """RowWriter by tabledata.insertAll; the client is borrowed, and so are `slots` (client.Clients.request_slots:
    what all writers of the process hold while a request is in flight; None: the writer's own). `schema`: the
    table's columns as the task's check of a routed table found them (perhaps a worker's kept check), else None;
    only to tell a table that lost columns since (`_lost`)."""

    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig,
                 schema: list[bigquery.SchemaField] | None = None,
                 slots: threading.BoundedSemaphore | None = None) -> None:
        self._client = client
        self._known = schema
        self._table = cfg.table_ref
        self._path = f"{bigquery.TableReference.from_string(cfg.table_ref).path}/insertAll"
        self._batch_size = cfg.insert_all_batch_size
        self._use_ids = cfg.row_insert_id_enable
        self._call = attempt_options(cfg)
        self._concurrent = cfg.insert_all_concurrent_requests
        self._slots = slots if slots is not None else threading.BoundedSemaphore(DEFAULT_POOLSIZE)

    def close(self) -> None:
        pass  # the client is borrowed: whoever made it closes it (`client.Clients`)

    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        """Write every row of `rows`; return those that failed, ordered by position."""
        checked = fit(rows, None)
        failures = list(checked.failures)
        if checked.rows.num_rows:
            ids = insert_ids.take(pa.array(checked.positions)) if insert_ids is not None and self._use_ids else None
            entries = request_entries(checked.rows, ids)
            sizes = pc.binary_length(entries).to_numpy(zero_copy_only=False) + 1  # the comma after each
            texts = entries.to_pylist()
            too_large = sizes + BODY_BYTES > MAX_REQUEST_BYTES
            for i in np.flatnonzero(too_large):
                failures.append(RowError(int(checked.positions[i]), ErrorType.PAYLOAD_TOO_LARGE,
                                           f"row is {sizes[i] - 1} bytes of JSON; an insertAll request takes at "
                                           f"most {MAX_REQUEST_BYTES}"))
            self._send_all([([int(checked.positions[i]) for i in chunk], [texts[i] for i in chunk])
                            for chunk in self._chunks(sizes, too_large)], failures)
        failures.sort(key=lambda f: f.index)
        return failures

    def _send_all(self, requests: list[tuple[list[int], list[str]]], failures: list[RowError]) -> None:
        """Send each request (positions, entries), up to SINK_BIGQUERY_INSERT_ALL_CONCURRENT_REQUESTS at once,
        adding the rows BigQuery rejects to `failures`. The first request that fails as a whole stops those not
        sent yet; PartialWriteError then names the rows of every request that did not go in, whether it failed
        or was never sent (a retry sends those); the requests that went in stay in."""
        def send(positions: list[int], texts: list[str], _stop: threading.Event) -> list[RowError]:
            return self._send(positions, texts)  # a request under way goes on: only those not sent yet stop

        futures = until_failure([functools.partial(send, positions, texts) for positions, texts in requests],
                                self._concurrent, "insert-all", stops=lambda _, error: isinstance(error, SinkError))
        first: SinkError | None = None
        unsent: list[int] = []
        for (positions, _), future in zip(requests, futures, strict=True):
            error = future.exception()
            if error is None:
                failures.extend(future.result())
            elif isinstance(error, (SinkError, Stopped)):
                unsent.extend(positions)
                if first is None and isinstance(error, SinkError):
                    first = error
            else:
                raise error  # a bug, not a failed request
        if first is not None:
            kind = TableChangedError if isinstance(first, TableChangedError) else PartialWriteError
            raise kind(first.error_type, first.message, tuple(sorted(unsent)),
                       tuple(sorted(failures, key=lambda f: f.index)), first.invalid_request) from first

    def _chunks(self, sizes: np.ndarray, skip: np.ndarray) -> Iterator[list[int]]:
        """Indexes into the checked rows, grouped into requests under the row and byte limits."""
        chunk: list[int] = []
        total = BODY_BYTES
        for i, size in enumerate(sizes.tolist()):
            if skip[i]:
                continue
            if chunk and (len(chunk) >= self._batch_size or total + size > MAX_REQUEST_BYTES):
                yield chunk
                chunk, total = [], BODY_BYTES
            chunk.append(i)
            total += size
        if chunk:
            yield chunk

    def _send(self, positions: list[int], texts: list[str]) -> list[RowError]:
        failures: list[RowError] = []
        pending = list(range(len(positions)))
        for _ in range(STOPPED_RESEND_ROUNDS):
            row_errors = self._insert([texts[n] for n in pending])
            if lost := self._lost(row_errors):
                # Nothing of a request with an invalid row is inserted: it is all unsent.
                raise TableChangedError(ErrorType.SINK_4XX_ERROR, f"table {self._table} has no column(s) "
                                        f"{', '.join(lost)} any more, which its check found: it was changed under "
                                        "the job", ())
            stopped = []
            for entry in row_errors:
                n = pending[int(entry["index"])]
                errors = entry.get("errors", [])
                if is_only_stopped(errors):
                    stopped.append(n)
                else:
                    failures.append(RowError(positions[n], classify_row_errors(errors), describe_row_errors(errors)))
            if not stopped:
                return failures
            log.info("re-sending %d row(s) that BigQuery stopped because of other rows", len(stopped))
            pending = stopped
        failures.extend(RowError(positions[n], ErrorType.SINK_5XX_ERROR,
                                   f"BigQuery kept stopping the row after {STOPPED_RESEND_ROUNDS} requests")
                        for n in pending)
        return failures

    def _lost(self, row_errors: Sequence[Mapping[str, Any]]) -> list[str]:
        """The fields that BigQuery says the table has no column for ("no such field") although the check this
        writer's columns come from found them: the table was dropped and created again with fewer since (a
        routed job's worker keeps its checks for a while: sink_schema.CheckedTables)."""
        if self._known is None:
            return []
        lost = {str(e.get("location", "")) for entry in row_errors for e in entry["errors"]
                if e.get("reason") == "invalid" and str(e.get("message", "")).startswith("no such field")}
        return sorted(path for path in lost if path and has_field(self._known, path))

    def _insert(self, entries: list[str]) -> Sequence[Mapping[str, Any]]:
        """One tabledata.insertAll request of ready JSON entries; its insertErrors."""
        body = ('{"rows":[' + ",".join(entries) + "]}").encode("utf-8")
        try:
            # The rows are JSON text already: Client.insert_rows_json would take them as dicts and encode
            # them again (to_pylist + json.dumps cost 3-5x what building the text does). _call_api is the
            # call insert_rows_json itself makes (here with no retry of its own); a str or bytes body is
            # sent as it is.
            with self._slots:
                response = self._client._call_api(  # noqa: SLF001
                    self._call["retry"], span_name="BigQuery.insertRowsJson", span_attributes={"path": self._path},
                    method="POST", path=self._path, data=body, content_type="application/json",
                    timeout=self._call["timeout"],
                )
        except REQUEST_ERRORS as exc:
            raise SinkError(classify_exception(exc), f"insertAll into {self._table} failed: {exc}",
                            rejects_request(exc)) from exc
        return [{"index": int(e["index"]), "errors": e.get("errors", [])} for e in response.get("insertErrors", ())]


def request_entries(rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> pa.StringArray:
    """Each row as an entry of an insertAll request: {"insertId":"...","json":{...}}."""
    texts = row_texts(rows)
    if insert_ids is None:
        return pc.binary_join_element_wise('{"json":', texts, "}", "")
    ids = pc.fill_null(json_string(insert_ids), "null")
    return pc.binary_join_element_wise('{"insertId":', ids, ',"json":', texts, "}", "")
