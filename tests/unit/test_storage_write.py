"""Storage Write: the writer's request logic with Arrow rows, against a scripted stand-in for the gRPC client.

Pure request and response logic; the real protocol against the emulator is tests/integration/test_writers.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud.bigquery import SchemaField as F
from google.cloud.bigquery_storage_v1 import types
from google.rpc import status_pb2

from firehose_bq.arrow_schema import TIMESTAMP, arrow_schema
from firehose_bq.bigquery import storage_write
from firehose_bq.bigquery.classify import classify_exception
from firehose_bq.bigquery.storage_write import StorageWriteWriter
from firehose_bq.config import BigQueryConfig
from firehose_bq.batch.rows import Writable
from firehose_bq.errors import ErrorType, PartialWriteError, SinkError, TableChangedError
from firehose_bq.policy import ErrorHandling, write_with_policy

TABLE = [F("Id", "INTEGER", mode="REQUIRED"), F("name", "STRING"), F("at", "TIMESTAMP"),
         F("pickup", "RECORD", fields=[F("Lat", "FLOAT"), F("name", "STRING")]),
         F("tags", "STRING", mode="REPEATED")]
# What the job derives: the same columns, spelled in other cases.
OURS = [F("id", "INTEGER", mode="REQUIRED"), F("name", "STRING"), F("at", "TIMESTAMP"),
        F("pickup", "RECORD", fields=[F("lat", "FLOAT"), F("name", "STRING")]),
        F("tags", "STRING", mode="REPEATED")]


def rows_of(count: int, start: int = 0, **columns: list[Any] | pa.Array) -> pa.RecordBatch:
    data: dict[str, list[Any]] = {
        "id": list(range(start, start + count)),
        "name": [f"name {i}" for i in range(start, start + count)],
        "at": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * count,
        "pickup": [{"lat": -6.2, "name": "stop"}] * count,
        "tags": [["a", "b"]] * count,
    }
    data.update(columns)
    schema = arrow_schema(OURS)
    extra = [pa.field(name, pa.array(values).type) for name, values in columns.items() if name not in schema.names]
    schema = pa.schema([*schema, *extra])
    return pa.RecordBatch.from_pydict(data, schema=schema)


# --------------------------------------------------------------------------- the writer, scripted


class FakeTable:
    def __init__(self, schema: list[F]) -> None:
        self.schema = schema


class FakeBigQuery:
    def __init__(self, schema: list[F]) -> None:
        self.schema = schema
        self.reads = 0
        self.closed = False

    def get_table(self, ref: str, **_: Any) -> FakeTable:
        self.reads += 1
        return FakeTable(self.schema)

    def close(self) -> None:
        self.closed = True


class FakeTransport:
    closed = False

    def close(self) -> None:
        self.closed = True


class FakeWriteClient:
    """Answers each AppendRows connection with the next scripted handler."""

    def __init__(self, handlers: list[Any]) -> None:
        self.handlers = list(handlers)
        self.connections: list[list[Any]] = []  # the raw requests of each connection
        self.metadata: list[Any] = []
        self.transport = FakeTransport()

    def append_rows(self, requests: Iterator[types.AppendRowsRequest], retry: Any, timeout: float,
                    metadata: Any) -> Iterator[types.AppendRowsResponse]:
        raw = [types.AppendRowsRequest.pb(r) for r in requests]
        self.connections.append(raw)
        self.metadata.append(metadata)
        handler = self.handlers.pop(0)
        return iter(handler(raw))


def batches(connection: list[Any]) -> list[pa.RecordBatch]:
    """The rows each request of a connection carries, read as a receiver must: with the schema of the
    connection's first request."""
    schema = pa.ipc.read_schema(pa.py_buffer(connection[0].arrow_rows.writer_schema.serialized_schema))
    return [pa.ipc.read_record_batch(pa.py_buffer(r.arrow_rows.rows.serialized_record_batch), schema)
            for r in connection]


def ok(raw: list[Any]) -> list[types.AppendRowsResponse]:
    return [types.AppendRowsResponse(append_result=types.AppendRowsResponse.AppendResult()) for _ in raw]


def reject(bad: dict[int, str]):  # noqa: ANN201
    """Every request with rows at the given indexes is rejected naming them (index in the request)."""

    def handler(raw: list[Any]) -> list[types.AppendRowsResponse]:
        responses = []
        for rows in batches(raw):
            named = {i: m for i, m in bad.items() if i < rows.num_rows}
            if named:
                responses.append(types.AppendRowsResponse(
                    error=status_pb2.Status(code=3, message="Errors found while processing rows."),
                    row_errors=[types.RowError(index=i, code=types.RowError.RowErrorCode.FIELDS_ERROR, message=m)
                                for i, m in named.items()]))
            else:
                responses.append(ok([rows])[0])
        return responses

    return handler


def status(code: int, message: str):  # noqa: ANN201
    return lambda raw: [types.AppendRowsResponse(error=status_pb2.Status(code=code, message=message)) for _ in raw]


def raises(exc: Exception):  # noqa: ANN201
    def handler(raw: list[Any]) -> Iterator[Any]:
        raise exc
        yield  # pragma: no cover - makes this a generator, raising when read

    return handler


CFG = BigQueryConfig(project_id="p", dataset="d", table="t")
STREAM = "projects/p/datasets/d/tables/t/streams/_default"


def make_writer(handlers: list[Any], cfg: BigQueryConfig = CFG, table: list[F] = TABLE):  # noqa: ANN201
    bq = FakeBigQuery(table)
    client = FakeWriteClient(handlers)
    writer = StorageWriteWriter(bq, client, cfg)  # type: ignore[arg-type]
    return writer, bq, client


def write_with_retries(writer: StorageWriteWriter, rows: pa.RecordBatch) -> tuple[Any, list[float]]:
    """`rows` written as a task writes them: through the error policy, which owns the retries."""
    waits: list[float] = []
    pending = Writable(rows, None, np.arange(rows.num_rows, dtype=np.int64))
    return write_with_policy(ErrorHandling(), pending, [], lambda: writer, waits.append), waits


def test_rows_go_out_as_arrow_in_the_tables_spelling_and_only_the_first_request_names_stream_and_schema(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 1_500)  # a few rows per request
    writer, bq, client = make_writer([ok])

    assert writer.write(rows_of(40), None) == []

    (requests,) = client.connections
    assert len(requests) >= 3
    assert requests[0].write_stream == STREAM
    assert all(not r.write_stream and not r.arrow_rows.HasField("writer_schema") for r in requests[1:])
    assert all(len(r.arrow_rows.rows.serialized_record_batch) <= 1_500 for r in requests)
    sent = pa.Table.from_batches(batches(requests))
    assert sent.schema == arrow_schema(TABLE)  # the table's names (Id, Lat) and types, REQUIRED as non-null
    expected = [{"Id": r["id"], "name": r["name"], "at": r["at"], "pickup": {"Lat": -6.2, "name": "stop"},
                 "tags": r["tags"]} for r in rows_of(40).to_pylist()]
    assert sent.to_pylist() == expected
    assert client.metadata[0] == (("x-goog-request-params", f"write_stream={STREAM}"),)
    assert bq.reads == 1
    writer.close()
    assert not client.transport.closed and not bq.closed, "the clients are borrowed: their maker closes them"


def test_the_writer_schema_is_the_schema_message_alone() -> None:
    # A schema written as an IPC stream carries an end-of-stream marker after which the emulator stores no rows.
    writer, _, client = make_writer([ok])
    writer.write(rows_of(2), None)
    raw = client.connections[0][0].arrow_rows.writer_schema.serialized_schema
    assert raw == arrow_schema(TABLE).serialize().to_pybytes()
    assert not raw.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")


def test_rejected_rows_fail_and_the_rest_of_their_request_is_sent_again() -> None:
    writer, _, client = make_writer([reject({1: "Timestamp field value is out of range"}), ok])

    failures = writer.write(rows_of(5), None)

    assert [(f.index, f.error_type) for f in failures] == [(1, ErrorType.SINK_4XX_ERROR)]
    assert "FIELDS_ERROR: Timestamp field value is out of range" in failures[0].message
    first, second = client.connections
    assert batches(second)[0].column("Id").to_pylist() == [0, 2, 3, 4]
    assert second[0].write_stream  # a new connection names the stream again


def test_rows_a_request_keeps_rejecting_without_naming_them_fail_as_5xx() -> None:
    always = reject({0: "bad"})
    writer, _, client = make_writer([always] * storage_write.ROW_ERROR_RESEND_ROUNDS)

    failures = writer.write(rows_of(4), None)

    # Each round names its first row; what is left after the last round is SINK_5XX_ERROR.
    assert [(f.index, f.error_type) for f in failures] == [
        (0, ErrorType.SINK_4XX_ERROR), (1, ErrorType.SINK_4XX_ERROR), (2, ErrorType.SINK_4XX_ERROR),
        (3, ErrorType.SINK_5XX_ERROR)]
    assert len(client.connections) == storage_write.ROW_ERROR_RESEND_ROUNDS


def test_transient_failures_are_retried_by_the_error_policy_with_its_backoff() -> None:
    writer, _, client = make_writer([
        raises(api_exceptions.ServiceUnavailable("connection reset")), status(8, "quota"), ok])

    done, waits = write_with_retries(writer, rows_of(3))

    assert (done.written, done.retried, done.errors) == (3, 3, [])
    assert len(client.connections) == 3
    assert waits == [0.01, 0.02]  # RETRY_EXPONENTIAL_BACKOFF_*'s defaults


def test_a_request_failing_as_a_whole_names_the_rows_not_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 1_500)  # a few rows per request

    def first_rejects_a_row_second_fails(raw: list[Any]) -> list[types.AppendRowsResponse]:
        responses = reject({1: "bad"})(raw[:1]) + ok(raw[1:])
        responses[1] = types.AppendRowsResponse(error=status_pb2.Status(code=14, message="unavailable"))
        return responses

    writer, _, client = make_writer([first_rejects_a_row_second_fails])
    with pytest.raises(PartialWriteError) as failed:
        writer.write(rows_of(40), None)

    first, second, *rest = [b.column("Id").to_pylist() for b in batches(client.connections[0])]
    assert len(client.connections) == 1 and rest  # the later requests went in
    assert failed.value.error_type is ErrorType.SINK_5XX_ERROR
    # Not appended: the failed request, and the rest of the one whose row 1 was rejected (its resend).
    assert failed.value.unsent == tuple(sorted([i for i in first if i != first[1]] + second))
    assert [(f.index, f.error_type) for f in failed.value.failures] == [(first[1], ErrorType.SINK_4XX_ERROR)]


def test_extra_fields_right_after_a_schema_change_are_waited_for() -> None:
    from google.protobuf import any_pb2

    detail = any_pb2.Any()
    detail.Pack(types.StorageError.pb()(code=types.StorageError.StorageErrorCode.SCHEMA_MISMATCH_EXTRA_FIELDS,
                                        error_message="Input schema has more fields than BigQuery schema"))

    def lagging(raw: list[Any]) -> list[types.AppendRowsResponse]:
        status = status_pb2.Status(code=3, message="Input schema has more fields than BigQuery schema",
                                   details=[detail])
        return [types.AppendRowsResponse(error=status) for _ in raw]

    writer, _, client = make_writer([lagging, lagging, ok])

    done, waits = write_with_retries(writer, rows_of(2))
    assert done.written == 2 and len(client.connections) == 3 and len(waits) == 2


def test_extra_fields_of_a_table_that_lost_columns_are_its_change_not_waited_for() -> None:
    """The writer's columns came from a check a routed job's worker kept (sink_schema.CheckedTables), and the
    table was dropped and created again with fewer since: waiting for BigQuery to see columns that no longer
    exist would wait the whole retry budget in vain. The write fails at once as TableChangedError (the task
    then checks the table again, which evolves it: batch/core.py `_heals`), naming the lost columns."""
    from google.protobuf import any_pb2

    detail = any_pb2.Any()
    detail.Pack(types.StorageError.pb()(code=types.StorageError.StorageErrorCode.SCHEMA_MISMATCH_EXTRA_FIELDS,
                                        error_message="Input schema has more fields than BigQuery schema"))
    extra = status_pb2.Status(code=3, message="Input schema has more fields than BigQuery schema", details=[detail])
    bq = FakeBigQuery([F("Id", "INTEGER", mode="REQUIRED"), F("pickup", "RECORD", fields=[F("Lat", "FLOAT")])])
    client = FakeWriteClient([lambda raw: [types.AppendRowsResponse(error=extra) for _ in raw]])
    writer = StorageWriteWriter(bq, client, CFG, TABLE)  # type: ignore[arg-type]

    with pytest.raises(TableChangedError) as changed:
        write_with_retries(writer, rows_of(2))
    assert changed.value.error_type is ErrorType.SINK_4XX_ERROR and changed.value.unsent == (0, 1)
    assert "has no column(s) name, at, pickup.name, tags any more" in changed.value.message
    assert len(client.connections) == 1 and bq.reads == 1  # not retried; the table read once, to tell


def test_a_transient_failure_is_raised_at_once_classified_for_the_policy() -> None:
    writer, _, client = make_writer([status(8, "Exceeds 'AppendRows throughput' quota")])

    with pytest.raises(SinkError) as failed:
        writer.write(rows_of(2), None)
    assert failed.value.error_type is ErrorType.SINK_RETRYABLE_ERROR
    assert "quota" in failed.value.message and len(client.connections) == 1


@pytest.mark.parametrize(("handler", "kind"), [
    (status(3, "Input schema has more fields than BigQuery schema"), ErrorType.SINK_4XX_ERROR),
    (raises(api_exceptions.NotFound("Table not found")), ErrorType.SINK_4XX_ERROR),
    (raises(api_exceptions.PermissionDenied("no")), ErrorType.SINK_4XX_ERROR),
])
def test_whole_request_failures_raise_classified(handler: Any, kind: ErrorType) -> None:
    writer, _, _ = make_writer([handler])

    with pytest.raises(SinkError) as failed:
        writer.write(rows_of(2), None)
    assert failed.value.error_type is kind


def test_rows_that_do_not_fit_the_table_fail_before_sending() -> None:
    writer, bq, client = make_writer([ok])
    past_9999 = pa.array([0, 0, 300_000_000_000_000_000, 0, 0], pa.int64()).cast(TIMESTAMP)
    rows = rows_of(5, id=[0, None, 2, 3, 4], at=past_9999, not_a_column=[None, None, None, "x", None])

    failures = writer.write(rows, None)

    assert [(f.index, f.error_type, f.message) for f in failures] == [
        (1, ErrorType.SINK_4XX_ERROR, "NULL in REQUIRED column Id"),
        (2, ErrorType.INVALID_MESSAGE_ERROR, "TIMESTAMP value of at is outside BigQuery's range 0001-01-01 .. 9999-12-31"),
        (3, ErrorType.SINK_4XX_ERROR, "table p.d.t has no column not_a_column")]
    assert bq.reads == 1  # read for this very batch: reading again cannot help
    (sent,) = batches(client.connections[0])
    assert sent.column("Id").to_pylist() == [0, 4] and "not_a_column" not in sent.schema.names


def test_a_column_added_since_the_table_was_read_is_found_by_reading_it_again() -> None:
    writer, bq, client = make_writer([ok, ok])
    assert writer.write(rows_of(2), None) == []
    bq.schema = [*bq.schema, F("coupon", "STRING")]  # evolved by the driver meanwhile

    assert writer.write(rows_of(2, coupon=["FREE", None]), None) == []

    assert bq.reads == 2
    assert batches(client.connections[1])[0].column("coupon").to_pylist() == ["FREE", None]


def test_a_row_over_the_request_limit_is_payload_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 3_000)
    writer, _, client = make_writer([ok])
    names = [f"name {i}" for i in range(20)]
    names[7] = "x" * 5_000

    failures = writer.write(rows_of(20, name=names), None)

    assert [(f.index, f.error_type) for f in failures] == [(7, ErrorType.PAYLOAD_TOO_LARGE)]
    sent = [i for b in batches(client.connections[0]) for i in b.column("Id").to_pylist()]
    assert sent == [i for i in range(20) if i != 7]  # the others in order, split around it


class RawRpcError(grpc.RpcError, grpc.Call):
    """A gRPC failure as grpc raises it, before api_core wraps it."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "from the channel"

    def trailing_metadata(self) -> tuple:
        return ()

    def initial_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


@pytest.mark.parametrize(("exc", "kind"), [
    (api_exceptions.from_grpc_status(3, "bad row"), ErrorType.SINK_4XX_ERROR),  # INVALID_ARGUMENT
    (api_exceptions.from_grpc_status(8, "quota"), ErrorType.SINK_RETRYABLE_ERROR),  # RESOURCE_EXHAUSTED
    (api_exceptions.from_grpc_status(10, "conflict"), ErrorType.SINK_RETRYABLE_ERROR),  # ABORTED
    (api_exceptions.from_grpc_status(14, "unavailable"), ErrorType.SINK_5XX_ERROR),  # UNAVAILABLE
    (api_exceptions.from_grpc_status(4, "deadline"), ErrorType.SINK_5XX_ERROR),  # DEADLINE_EXCEEDED
    (RawRpcError(grpc.StatusCode.NOT_FOUND), ErrorType.SINK_4XX_ERROR),
    (RawRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED), ErrorType.SINK_RETRYABLE_ERROR),
])
def test_grpc_failures_are_classified_by_status(exc: BaseException, kind: ErrorType) -> None:
    assert classify_exception(exc) is kind


def refuse_holding(poison: int, details: list[Any] | None = None):  # noqa: ANN201
    """Every request holding row `poison` is refused as a whole, naming no row (what a value BigQuery cannot
    take but the writer's checks let through gets); the others are appended."""

    def handler(raw: list[Any]) -> list[types.AppendRowsResponse]:
        refusal = types.AppendRowsResponse(error=status_pb2.Status(code=3, message="Cannot convert the rows",
                                                                   details=details or []))
        return [refusal if poison in rows.column("Id").to_pylist() else ok([rows])[0] for rows in batches(raw)]

    return handler


def test_a_request_refused_as_invalid_has_its_row_isolated_by_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 20_000)  # several requests per connection
    writer, _, client = make_writer([refuse_holding(321)] * 64)

    done, waits = write_with_retries(writer, rows_of(1_000))

    assert [(e.index, e.error_type) for e in done.errors] == [(321, ErrorType.SINK_4XX_ERROR)]
    assert "rejected as a whole" in done.errors[0].message and "Cannot convert the rows" in done.errors[0].message
    appended = [i for connection in client.connections for rows, response in
                zip(batches(connection), refuse_holding(321)(connection), strict=True)
                if not response.error.code for i in rows.column("Id").to_pylist()]
    assert sorted(appended) == [i for i in range(1_000) if i != 321]  # each row once, none twice
    assert (done.written, waits) == (999, [])
    assert len(client.connections) <= 1 + 2 * 10  # 1 + 2·⌈log2 n⌉ of the refused request's rows at most


def test_a_refusal_naming_the_stream_stops_the_job_without_isolating() -> None:
    from google.protobuf import any_pb2

    detail = any_pb2.Any()
    detail.Pack(types.StorageError.pb()(code=types.StorageError.StorageErrorCode.STREAM_FINALIZED,
                                        error_message="Stream is finalized"))
    writer, _, client = make_writer([refuse_holding(0, [detail])] * 8)

    with pytest.raises(PartialWriteError) as stopped:
        write_with_retries(writer, rows_of(10))
    assert not stopped.value.invalid_request and len(client.connections) == 1
