"""The Storage Write API write path: rows as protobuf messages into the table's default stream.

The writer reads the live table's schema once, turns it into a self-contained proto2 descriptor
(RECORD → nested message, REPEATED → repeated; column types per BigQuery's documented Storage Write
mapping) and serializes each row (the converter's STORAGE encoding) as a message of it. Rows go to the
default stream, `projects/…/streams/_default`: committed as soon as the append succeeds, at-least-once.

Requests are kept under the 10 MB AppendRows limit. BigQuery rejects a request as a whole when any of
its rows is bad and names those rows in `row_errors`: the named rows become MessageErrors and the rest
of the request is sent again, exactly like insertAll's stopped rows. A request that fails for another
reason is retried while the failure is transient (until SINK_BIGQUERY_RETRY_DEADLINE_MS), else it
raises SinkError classified like any other BigQuery failure.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField
from google.cloud.bigquery_storage_v1 import BigQueryWriteClient, types
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from firehose_bq.bigquery.classify import classify_exception
from firehose_bq.bigquery.client import call_options, credentials
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import ConvertedBatch, KafkaRecords, Row
from firehose_bq.errors import ErrorType, MessageError, SinkError

log = logging.getLogger(__name__)

FDP = descriptor_pb2.FieldDescriptorProto

# BigQuery caps an AppendRows request at 10 MB; 9 MB of rows leaves room for the stream name and the
# writer schema (a few KB even for wide tables).
MAX_REQUEST_BYTES = 9 * 1024 * 1024
# Each serialized row sits in ProtoRows as a length-delimited field: one tag byte and a varint length.
ROW_ENVELOPE_BYTES = 6
# As insertAll's stopped rows: one round re-sends the good rows of a rejected request; more rounds
# only guard against a backend that keeps rejecting them.
ROW_ERROR_RESEND_ROUNDS = 3
# Back-off between attempts after a transient failure (quota, unavailable), doubling up to the cap.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0

# https://cloud.google.com/bigquery/docs/write-api#data_type_conversions — the proto type each column
# type takes. TIMESTAMP is int64 microseconds and DATE int32 days since the epoch (the converter's
# STORAGE encoding); the types BigQuery also accepts as text are sent as text.
PROTO_TYPES: dict[str, int] = {
    "STRING": FDP.TYPE_STRING,
    "BYTES": FDP.TYPE_BYTES,
    "INTEGER": FDP.TYPE_INT64,
    "INT64": FDP.TYPE_INT64,
    "FLOAT": FDP.TYPE_DOUBLE,
    "FLOAT64": FDP.TYPE_DOUBLE,
    "BOOLEAN": FDP.TYPE_BOOL,
    "BOOL": FDP.TYPE_BOOL,
    "TIMESTAMP": FDP.TYPE_INT64,
    "DATE": FDP.TYPE_INT32,
    "DATETIME": FDP.TYPE_STRING,
    "TIME": FDP.TYPE_STRING,
    "NUMERIC": FDP.TYPE_STRING,
    "BIGNUMERIC": FDP.TYPE_STRING,
    "JSON": FDP.TYPE_STRING,
    "GEOGRAPHY": FDP.TYPE_STRING,
    "INTERVAL": FDP.TYPE_STRING,
}
RECORD_TYPES = ("RECORD", "STRUCT")
# Descriptor field names must be proto identifiers; BigQuery matches them to columns by name.
PROTO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Transient failures worth another attempt with the same rows.
RETRYABLE = (api_exceptions.ServiceUnavailable, api_exceptions.TooManyRequests, api_exceptions.Aborted,
             api_exceptions.DeadlineExceeded, api_exceptions.InternalServerError)


def descriptor_proto(fields: Sequence[SchemaField], name: str = "Row") -> descriptor_pb2.DescriptorProto:
    """A self-contained proto2 message for rows of `fields` (every nested type declared inside it).

    Columns whose type has no Storage Write form here (RANGE), or whose names are not proto identifiers,
    are left out: rows then leave them NULL.
    """
    message = descriptor_pb2.DescriptorProto(name=name)
    taken = {f.name for f in fields}
    # Field numbers follow column positions, skipped columns included: tables only grow at the end (of
    # the row or of a RECORD), so rows serialized before a re-read still decode under the newer schema.
    for number, column in enumerate(fields, start=1):
        kind = column.field_type.upper()
        if not PROTO_NAME.fullmatch(column.name) or (kind not in PROTO_TYPES and kind not in RECORD_TYPES):
            log.warning("column %s (%s) cannot be written through the Storage Write API; left NULL",
                        column.name, kind)
            continue
        label = FDP.LABEL_REPEATED if (column.mode or "").upper() == "REPEATED" else FDP.LABEL_OPTIONAL
        proto_field = message.field.add(name=column.name, number=number, label=label)
        if kind in RECORD_TYPES:
            nested = _unique(f"{column.name}_record", taken)
            taken.add(nested)
            message.nested_type.append(descriptor_proto(column.fields, nested))
            proto_field.type = FDP.TYPE_MESSAGE
            proto_field.type_name = nested  # relative: resolved in this message's scope
        else:
            proto_field.type = PROTO_TYPES[kind]  # type: ignore[assignment]
    return message


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    return candidate


class UnknownColumnError(ValueError):
    """A row names a column the table (as this writer last read it) does not have."""


@dataclass(frozen=True)
class RowLayout:
    """One table schema as a protobuf message class, and how rows become messages of it."""

    descriptor: descriptor_pb2.DescriptorProto
    message_class: type[Message]
    # Column name, lower-cased → its spelling in the descriptor, per message type (BigQuery column
    # names are case-insensitive; the converter's names may differ in case from an older table's).
    spellings: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, schema: Sequence[SchemaField]) -> RowLayout:
        descriptor = descriptor_proto(schema)
        # A pool of its own: the message name "Row" would clash in the default pool.
        pool = descriptor_pool.DescriptorPool()
        file = descriptor_pb2.FileDescriptorProto(name="firehose_bq_storage_write_row.proto", syntax="proto2")
        file.message_type.append(descriptor)
        pool.Add(file)
        message_type = pool.FindMessageTypeByName(descriptor.name)
        spellings: dict[str, dict[str, str]] = {}

        def index(d: Any) -> None:
            spellings[d.full_name] = {f.name.lower(): f.name for f in d.fields}
            for nested in d.nested_types:
                index(nested)

        index(message_type)
        return cls(descriptor, message_factory.GetMessageClass(message_type), spellings)

    def serialize(self, row: Row) -> bytes:
        """The row as a serialized message; ValueError/TypeError when a value does not fit its column."""
        try:
            # The fast path: upb builds nested messages from dicts and lists itself and skips Nones.
            return self.message_class(**row).SerializeToString()
        except ValueError:
            # Maybe only a column name spelled in another case; anything else fails again below.
            return self.message_class(**self._respell(row, self.message_class.DESCRIPTOR)).SerializeToString()

    def _respell(self, row: Row, descriptor: Any) -> Row:
        names = self.spellings[descriptor.full_name]
        out: Row = {}
        for key, value in row.items():
            name = names.get(key.lower())
            if name is None:
                if value is None or value == []:
                    continue  # nothing to write: a NULL column BigQuery would not miss either
                raise UnknownColumnError(f"no such field: {key}")
            sub = descriptor.fields_by_name[name].message_type
            if sub is not None and isinstance(value, dict):
                value = self._respell(value, sub)
            elif sub is not None and isinstance(value, list):
                value = [self._respell(v, sub) if isinstance(v, dict) else v for v in value]
            elif sub is None and isinstance(value, (dict, list)) and not descriptor.fields_by_name[name].is_repeated:
                value = json.dumps(value, separators=(",", ":"))  # a JSON column given as a structure
            out[name] = value
        return out


@dataclass
class Chunk:
    """Positions in the batch sent together as one AppendRows request."""

    positions: list[int]
    resends: int = 0  # how many times rows of it were sent again after other rows were rejected


@dataclass(frozen=True)
class Outcome:
    """What happened to one request: appended, rows rejected, or failed as a whole (`failure`)."""

    row_errors: dict[int, str] = field(default_factory=dict)  # index in the request → BigQuery's text
    failure: Exception | None = None

    @property
    def appended(self) -> bool:
        return not self.row_errors and self.failure is None


def make_write_client(cfg: BigQueryConfig) -> BigQueryWriteClient:
    if cfg.storage_api_endpoint and cfg.api_endpoint:
        # The local emulator: plaintext gRPC, no credentials.
        import grpc
        from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

        channel = grpc.insecure_channel(cfg.storage_api_endpoint)
        return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))
    options = ClientOptions(api_endpoint=cfg.storage_api_endpoint) if cfg.storage_api_endpoint else None
    return BigQueryWriteClient(credentials=credentials(cfg), client_options=options)


class StorageWriteWriter:
    """RowWriter into the table's default stream; one per Spark task, closed when the task ends."""

    def __init__(self, client: bigquery.Client, write_client: BigQueryWriteClient, cfg: BigQueryConfig,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._write_client = write_client
        self._table = cfg.table_ref
        self._stream = f"projects/{cfg.project_id}/datasets/{cfg.dataset}/tables/{cfg.table}/streams/_default"
        self._call = call_options(cfg)
        self._read_timeout_s = cfg.client_timeout_ms / 1000
        self._retry_deadline_s = cfg.retry_deadline_ms / 1000
        self._sleep = sleep
        self._layout: RowLayout | None = None
        self._layout_fresh = False  # read for the current batch: re-reading cannot help

    def close(self) -> None:
        try:
            self._write_client.transport.close()
        finally:
            self._client.close()

    def write(self, batch: ConvertedBatch, records: KafkaRecords) -> list[MessageError]:
        """Write every row of `batch`; return the rows BigQuery (or the table's schema) rejected."""
        self._layout_fresh = False
        failures: list[MessageError] = []
        payloads: dict[int, bytes] = {}
        for position, row in enumerate(batch.rows):
            try:
                data = self._serialize(row)
            except (ValueError, TypeError) as exc:  # out of range, wrong type, no such column
                failures.append(_error(batch, records, position, ErrorType.SINK_4XX_ERROR,
                                       f"row does not fit the columns of {self._table}: {exc}"))
                continue
            if len(data) + ROW_ENVELOPE_BYTES > MAX_REQUEST_BYTES:
                failures.append(_error(batch, records, position, ErrorType.PAYLOAD_TOO_LARGE,
                                       f"row is {len(data)} bytes as a message; an AppendRows request takes "
                                       f"at most {MAX_REQUEST_BYTES}"))
                continue
            payloads[position] = data
        if payloads:
            failures.extend(self._append(batch, records, payloads))
        return failures

    # --- rows → messages ---------------------------------------------------------------------------

    def _serialize(self, row: Row) -> bytes:
        if self._layout is None:
            self._read_layout()
        assert self._layout is not None
        try:
            return self._layout.serialize(row)
        except UnknownColumnError:
            if self._layout_fresh:
                raise
            # The table may have gained the column since this writer read it: read it once more.
            self._read_layout()
            return self._layout.serialize(row)

    def _read_layout(self) -> None:
        try:
            table = self._client.get_table(self._table, **self._call)
        except (api_exceptions.GoogleAPIError, ConnectionError, TimeoutError) as exc:
            raise SinkError(classify_exception(exc), f"reading the schema of {self._table} failed: {exc}") from exc
        self._layout = RowLayout.of(table.schema)
        self._layout_fresh = True

    # --- requests --------------------------------------------------------------------------------

    def _append(self, batch: ConvertedBatch, records: KafkaRecords,
                payloads: dict[int, bytes]) -> list[MessageError]:
        failures: list[MessageError] = []
        queue = [Chunk(positions) for positions in _chunks(payloads)]
        deadline = time.monotonic() + self._retry_deadline_s
        backoff = FIRST_BACKOFF_S
        while queue:
            again: list[Chunk] = []
            transient: Exception | None = None
            for chunk, outcome in zip(queue, self._send(queue, payloads), strict=True):
                if outcome.appended:
                    continue
                if outcome.failure is not None:
                    if not isinstance(outcome.failure, RETRYABLE):
                        raise SinkError(classify_exception(outcome.failure),
                                        f"AppendRows into {self._table} failed: {outcome.failure}")
                    transient = outcome.failure
                    again.append(chunk)
                    continue
                rejected = {chunk.positions[i] for i in outcome.row_errors}
                failures.extend(_error(batch, records, chunk.positions[i], ErrorType.SINK_4XX_ERROR, text)
                                for i, text in sorted(outcome.row_errors.items()))
                rest = [p for p in chunk.positions if p not in rejected]
                if not rest:
                    continue
                if chunk.resends + 1 >= ROW_ERROR_RESEND_ROUNDS:
                    failures.extend(_error(batch, records, p, ErrorType.SINK_5XX_ERROR,
                                           f"BigQuery kept rejecting the request after {ROW_ERROR_RESEND_ROUNDS} "
                                           "attempts without naming this row") for p in rest)
                    continue
                log.info("re-sending %d row(s) of a request BigQuery rejected for %d other row(s)", len(rest),
                         len(rejected))
                again.append(Chunk(rest, chunk.resends + 1))
            if transient is not None:
                if time.monotonic() + backoff > deadline:
                    raise SinkError(classify_exception(transient), f"AppendRows into {self._table} kept failing "
                                    f"for {self._retry_deadline_s:.0f} s: {transient}")
                log.warning("AppendRows into %s: %s; retrying %d request(s) in %.1f s", self._table, transient,
                            len(again), backoff)
                self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            queue = again
        return failures

    def _send(self, chunks: list[Chunk], payloads: dict[int, bytes]) -> list[Outcome]:
        """One AppendRows connection carrying `chunks`, one request each; an Outcome per chunk.

        As BigQuery's protocol has it, only the first request of a connection names the stream and
        carries the writer schema. A connection that breaks leaves its unanswered requests failed
        with the connection's error (they may have been written: at-least-once).
        """
        assert self._layout is not None
        requests = (self._request(chunk, payloads, first=i == 0) for i, chunk in enumerate(chunks))
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
            outcomes.extend(Outcome(failure=exc) for _ in range(len(chunks) - len(outcomes)))
        if len(outcomes) < len(chunks):
            closed = api_exceptions.ServiceUnavailable("AppendRows connection closed before every response")
            outcomes.extend(Outcome(failure=closed) for _ in range(len(chunks) - len(outcomes)))
        return outcomes

    def _request(self, chunk: Chunk, payloads: dict[int, bytes], *, first: bool) -> types.AppendRowsRequest:
        assert self._layout is not None
        request = types.AppendRowsRequest.pb()()
        request.proto_rows.rows.serialized_rows.extend(payloads[p] for p in chunk.positions)
        if first:
            request.write_stream = self._stream
            request.proto_rows.writer_schema.proto_descriptor.CopyFrom(self._layout.descriptor)
        return types.AppendRowsRequest.wrap(request)


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
        return Outcome(failure=api_exceptions.ServiceUnavailable(
            f"the table's newest columns are not yet visible to the Storage Write API: {response.error.message}"))
    return Outcome(failure=api_exceptions.from_grpc_status(response.error.code, response.error.message,
                                                           response=response))


def _storage_error_code(status: Any) -> int | None:
    """The StorageError code among a google.rpc.Status's details, if BigQuery attached one."""
    storage_error = types.StorageError.pb()()
    for detail in status.details:
        if detail.Is(storage_error.DESCRIPTOR) and detail.Unpack(storage_error):
            return int(storage_error.code)
    return None


def _chunks(payloads: dict[int, bytes]) -> Iterator[list[int]]:
    """Positions grouped into requests under MAX_REQUEST_BYTES, in batch order."""
    positions: list[int] = []
    total = 0
    for position, data in payloads.items():
        size = len(data) + ROW_ENVELOPE_BYTES
        if positions and total + size > MAX_REQUEST_BYTES:
            yield positions
            positions, total = [], 0
        positions.append(position)
        total += size
    if positions:
        yield positions


def _error(batch: ConvertedBatch, records: KafkaRecords, position: int, kind: ErrorType, text: str) -> MessageError:
    i = batch.sources[position]
    return MessageError(kind, records.topics[i], records.partitions[i], records.offsets[i], text)
