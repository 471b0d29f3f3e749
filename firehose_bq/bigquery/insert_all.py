"""The insertAll (streaming insert) write path.

Rows go out in requests kept under BigQuery's limits. Per-row rejections come back as data
(`MessageError`s); valid rows that BigQuery only *stopped* because another row in the same request
was bad are sent again without the bad rows, so one bad message never takes good ones down with it.
A request that fails as a whole (after the client's own retries) raises SinkError.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence

from google.api_core.exceptions import GoogleAPIError
from google.cloud import bigquery
from requests import exceptions as http_exceptions

from firehose_bq.bigquery.client import call_options
from firehose_bq.bigquery.classify import (
    classify_exception,
    classify_row_errors,
    describe_row_errors,
    is_only_stopped,
)
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import ConvertedBatch, KafkaRecords, Row
from firehose_bq.errors import ErrorType, MessageError, SinkError

log = logging.getLogger(__name__)

# BigQuery caps an insertAll request at 10 MB of JSON; 9 MB leaves room for the envelope and insertIds.
MAX_REQUEST_BYTES = 9 * 1024 * 1024
# Per row, the request also carries {"insertId": "...", "json": ...} around the row's own JSON.
ROW_ENVELOPE_BYTES = 32
# Re-sending stopped rows converges in one round (the bad rows are gone); more rounds only guard
# against a backend that keeps stopping rows, which then surface as SINK_5XX_ERROR.
STOPPED_RESEND_ROUNDS = 3


class InsertAllWriter:
    def __init__(self, client: bigquery.Client, cfg: BigQueryConfig) -> None:
        self._client = client
        self._table = cfg.table_ref
        self._batch_size = cfg.insert_all_batch_size
        self._use_ids = cfg.row_insert_id_enable
        self._call = call_options(cfg)

    def close(self) -> None:
        self._client.close()

    def write(self, batch: ConvertedBatch, records: KafkaRecords) -> list[MessageError]:
        """Write every row of `batch`; return the rows BigQuery rejected, as MessageErrors."""
        failures: list[MessageError] = []
        sizes = [len(json.dumps(row, separators=(",", ":"))) + len(row_id) + ROW_ENVELOPE_BYTES
                 for row, row_id in zip(batch.rows, batch.insert_ids, strict=True)]
        too_large = {i for i, size in enumerate(sizes) if size > MAX_REQUEST_BYTES}
        for position in sorted(too_large):
            failures.append(self._error(batch, records, position, ErrorType.PAYLOAD_TOO_LARGE,
                                        f"row is {sizes[position]} bytes of JSON; an insertAll request "
                                        f"takes at most {MAX_REQUEST_BYTES}"))
        for chunk in self._chunks(sizes, too_large):
            failures.extend(self._send(batch, records, chunk))
        return failures

    def _chunks(self, sizes: Sequence[int], skip: set[int]) -> Iterator[list[int]]:
        """Positions in the batch, grouped into requests under the row and byte limits."""
        positions: list[int] = []
        total = 0
        for i, size in enumerate(sizes):
            if i in skip:
                continue
            if positions and (len(positions) >= self._batch_size or total + size > MAX_REQUEST_BYTES):
                yield positions
                positions, total = [], 0
            positions.append(i)
            total += size + 1
        if positions:
            yield positions

    def _send(self, batch: ConvertedBatch, records: KafkaRecords, positions: list[int]) -> list[MessageError]:
        failures: list[MessageError] = []
        pending = positions
        for _ in range(STOPPED_RESEND_ROUNDS):
            row_errors = self._insert([batch.rows[p] for p in pending],
                                      [batch.insert_ids[p] for p in pending] if self._use_ids else None)
            stopped = []
            for entry in row_errors:
                position = pending[int(entry["index"])]
                errors = entry.get("errors", [])
                if is_only_stopped(errors):
                    stopped.append(position)
                else:
                    failures.append(self._error(batch, records, position, classify_row_errors(errors),
                                                describe_row_errors(errors)))
            if not stopped:
                return failures
            log.info("re-sending %d row(s) that BigQuery stopped because of other rows", len(stopped))
            pending = stopped
        failures.extend(self._error(batch, records, p, ErrorType.SINK_5XX_ERROR,
                                    f"BigQuery kept stopping the row after {STOPPED_RESEND_ROUNDS} requests")
                        for p in pending)
        return failures

    def _insert(self, rows: list[Row], ids: list[str] | None) -> Sequence[dict]:
        try:
            return self._client.insert_rows_json(
                self._table, rows, row_ids=ids if ids is not None else [None] * len(rows),
                **self._call,
            )
        # GoogleAPIError covers HTTP errors and RetryError (the client's retry deadline ran out).
        except (GoogleAPIError, http_exceptions.RequestException, ConnectionError, TimeoutError) as exc:
            raise SinkError(classify_exception(exc), f"insertAll into {self._table} failed: {exc}") from exc

    @staticmethod
    def _error(batch: ConvertedBatch, records: KafkaRecords, position: int, kind: ErrorType,
               text: str) -> MessageError:
        i = batch.sources[position]
        return MessageError(kind, records.topics[i], records.partitions[i], records.offsets[i], text)

