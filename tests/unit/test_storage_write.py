"""Storage Write: table schema → proto descriptor, rows → messages, and the writer's request logic.

The writer tests drive StorageWriteWriter with a scripted stand-in for the gRPC client (pure request
and response logic); the real protocol against the emulator is tests/integration/test_storage_write.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud.bigquery import SchemaField
from google.cloud.bigquery_storage_v1 import types
from google.protobuf import descriptor_pb2
from google.rpc import status_pb2

from firehose_bq import descriptors, sample
from firehose_bq.bigquery import storage_write
from firehose_bq.bigquery.classify import classify_exception
from firehose_bq.bigquery.storage_write import RowLayout, StorageWriteWriter, UnknownColumnError, descriptor_proto
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import STORAGE, KafkaRecords, RowConverter
from firehose_bq.errors import ErrorType, SinkError
from firehose_bq.schema import MetadataColumns, table_schema

FDP = descriptor_pb2.FieldDescriptorProto
REPO = Path(__file__).resolve().parents[2]
LOAD_TIME = "2026-11-23T01:02:03.456789Z"


@pytest.fixture(scope="module")
def booking_class():  # noqa: ANN201
    return descriptors.load((str(REPO / "descriptors" / "example.desc"),)).message_class(sample.EXAMPLE_MESSAGE)


def sample_schema(booking_class: Any) -> list[SchemaField]:
    return table_schema(booking_class.DESCRIPTOR, MetadataColumns())


def records(values: list[bytes]) -> KafkaRecords:
    n = len(values)
    return KafkaRecords(["bookings"] * n, [0] * n, list(range(100, 100 + n)), [1_767_225_600_123] * n, values)


def convert(booking_class: Any, values: list[bytes]):  # noqa: ANN201
    return RowConverter(booking_class, MetadataColumns(), encoding=STORAGE).convert(records(values), LOAD_TIME)


# --------------------------------------------------------------------------- schema → descriptor


def test_every_column_type_maps_to_its_documented_proto_type() -> None:
    schema = [
        SchemaField("s", "STRING"), SchemaField("i", "INTEGER"), SchemaField("i64", "INT64"),
        SchemaField("f", "FLOAT"), SchemaField("b", "BOOLEAN"), SchemaField("raw", "BYTES"),
        SchemaField("ts", "TIMESTAMP"), SchemaField("d", "DATE"), SchemaField("dt", "DATETIME"),
        SchemaField("t", "TIME"), SchemaField("n", "NUMERIC"), SchemaField("bn", "BIGNUMERIC"),
        SchemaField("j", "JSON"), SchemaField("g", "GEOGRAPHY"), SchemaField("req", "STRING", mode="REQUIRED"),
        SchemaField("tags", "STRING", mode="REPEATED"),
    ]
    message = descriptor_proto(schema)
    got = {f.name: (f.type, f.label) for f in message.field}
    opt, rep = FDP.LABEL_OPTIONAL, FDP.LABEL_REPEATED
    assert got == {
        "s": (FDP.TYPE_STRING, opt), "i": (FDP.TYPE_INT64, opt), "i64": (FDP.TYPE_INT64, opt),
        "f": (FDP.TYPE_DOUBLE, opt), "b": (FDP.TYPE_BOOL, opt), "raw": (FDP.TYPE_BYTES, opt),
        "ts": (FDP.TYPE_INT64, opt), "d": (FDP.TYPE_INT32, opt), "dt": (FDP.TYPE_STRING, opt),
        "t": (FDP.TYPE_STRING, opt), "n": (FDP.TYPE_STRING, opt), "bn": (FDP.TYPE_STRING, opt),
        "j": (FDP.TYPE_STRING, opt), "g": (FDP.TYPE_STRING, opt),
        # REQUIRED stays optional in proto2: BigQuery, not the serializer, judges a missing value.
        "req": (FDP.TYPE_STRING, opt), "tags": (FDP.TYPE_STRING, rep),
    }
    assert [f.number for f in message.field] == list(range(1, len(schema) + 1))


def test_records_become_nested_messages_declared_inside_the_row(booking_class: Any) -> None:
    message = descriptor_proto(sample_schema(booking_class))
    fields = {f.name: f for f in message.field}
    nested = {n.name: n for n in message.nested_type}
    for column, label in (("pickup", FDP.LABEL_OPTIONAL), ("items", FDP.LABEL_REPEATED),
                          ("attributes", FDP.LABEL_REPEATED), ("eta", FDP.LABEL_OPTIONAL)):
        assert fields[column].type == FDP.TYPE_MESSAGE
        assert fields[column].label == label
        assert fields[column].type_name in nested
    assert [f.name for f in nested[fields["items"].type_name].field] == ["sku", "quantity", "price_micros"]
    assert [(f.name, f.type) for f in nested[fields["eta"].type_name].field] == [
        ("seconds", FDP.TYPE_INT64), ("nanos", FDP.TYPE_INT64)]
    # Self-contained: no reference leaves the message (BigQuery decodes rows with this one descriptor).
    assert all(not f.type_name.startswith(".") for f in message.field)


def test_nested_type_names_never_clash_with_columns() -> None:
    schema = [SchemaField("a", "RECORD", fields=[SchemaField("x", "STRING")]), SchemaField("a_record", "STRING")]
    message = descriptor_proto(schema)
    names = [f.name for f in message.field] + [n.name for n in message.nested_type]
    assert len(names) == len(set(names))
    RowLayout.of(schema).serialize({"a": {"x": "1"}, "a_record": "2"})  # the descriptor loads and works


def test_columns_without_a_storage_form_are_left_out() -> None:
    schema = [SchemaField("ok", "STRING"), SchemaField("span", "RANGE", range_element_type="DATE")]
    assert [f.name for f in descriptor_proto(schema).field] == ["ok"]


# --------------------------------------------------------------------------- rows → messages


def test_sample_rows_round_trip_through_the_messages(booking_class: Any) -> None:
    count = 12
    batch = convert(booking_class, [sample.booking(i, booking_class).SerializeToString() for i in range(count)])
    layout = RowLayout.of(sample_schema(booking_class))
    for i, row in enumerate(batch.rows):
        msg = layout.message_class.FromString(layout.serialize(row))
        v = sample.booking_values(i)
        seconds, nanos = v["created_at"]
        assert msg.order_number == v["order_number"]
        assert msg.customer_id == v["customer_id"]
        assert msg.status == v["status"]  # enum → STRING name
        assert msg.amount == v["amount"]
        assert msg.discount == v["discount"]
        assert msg.is_paid == v["is_paid"]
        assert msg.signature == v["signature"]  # BYTES raw, not base64
        assert (msg.passenger_count, msg.balance_delta, msg.region_code) == (
            v["passenger_count"], v["balance_delta"], v["region_code"])
        assert (msg.pickup.latitude, msg.pickup.longitude, msg.pickup.name) == tuple(v["pickup"].values())
        assert msg.HasField("dropoff") == ("dropoff" in v)
        assert [(x.sku, x.quantity, x.price_micros) for x in msg.items] == [tuple(x.values()) for x in v["items"]]
        assert list(msg.tags) == v["tags"]
        assert [(a.key, a.value) for a in msg.attributes] == sorted(v["attributes"].items())
        assert msg.created_at == seconds * 1_000_000 + nanos // 1000  # TIMESTAMP: int64 micros
        assert (msg.eta.seconds, msg.eta.nanos) == v["eta"]
        assert msg.context  # Struct: JSON text
        assert list(msg.status_history) == v["status_history"]
        assert msg.message_offset == 100 + i
        assert msg.message_timestamp == 1_767_225_600_123_000
        assert msg.load_time == int(datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC).timestamp() * 1_000_000)


def test_date_and_json_columns_take_the_storage_encoding() -> None:
    layout = RowLayout.of([SchemaField("day", "DATE"), SchemaField("doc", "JSON")])
    days = (date(2026, 1, 2) - date(1970, 1, 1)).days
    msg = layout.message_class.FromString(layout.serialize({"day": days, "doc": '{"a":1}'}))
    assert (msg.day, msg.doc) == (days, '{"a":1}')


def test_nulls_are_left_unset() -> None:
    layout = RowLayout.of([SchemaField("s", "STRING"), SchemaField("r", "RECORD", fields=[SchemaField("x", "INTEGER")]),
                           SchemaField("tags", "STRING", mode="REPEATED")])
    msg = layout.message_class.FromString(layout.serialize({"s": None, "r": None, "tags": None}))
    assert not msg.HasField("s") and not msg.HasField("r") and list(msg.tags) == []


def test_column_names_match_case_insensitively() -> None:
    layout = RowLayout.of([SchemaField("OrderNo", "STRING"), SchemaField("Pick", "RECORD",
                                                                         fields=[SchemaField("Lat", "FLOAT")])])
    msg = layout.message_class.FromString(layout.serialize({"orderno": "A1", "pick": {"lat": 1.5}}))
    assert (msg.OrderNo, msg.Pick.Lat) == ("A1", 1.5)


def test_a_row_that_does_not_fit_raises() -> None:
    layout = RowLayout.of([SchemaField("n", "INTEGER")])
    with pytest.raises(UnknownColumnError):
        layout.serialize({"n": 1, "extra": "x"})
    with pytest.raises(ValueError):
        layout.serialize({"n": 2**64})  # beyond INT64
    with pytest.raises(TypeError):
        layout.serialize({"n": "seven"})


# --------------------------------------------------------------------------- the writer, scripted


class FakeTable:
    def __init__(self, schema: list[SchemaField]) -> None:
        self.schema = schema


class FakeBigQuery:
    def __init__(self, schema: list[SchemaField]) -> None:
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


def ok(raw: list[Any]) -> list[types.AppendRowsResponse]:
    return [types.AppendRowsResponse(append_result=types.AppendRowsResponse.AppendResult()) for _ in raw]


def reject(bad: dict[int, str]):  # noqa: ANN201
    """Every request with rows at the given indexes is rejected naming them (index in the request)."""

    def handler(raw: list[Any]) -> list[types.AppendRowsResponse]:
        responses = []
        for request in raw:
            rows = len(request.proto_rows.rows.serialized_rows)
            named = {i: m for i, m in bad.items() if i < rows}
            if named:
                responses.append(types.AppendRowsResponse(
                    error=status_pb2.Status(code=3, message="Errors found while processing rows."),
                    row_errors=[types.RowError(index=i, code=types.RowError.RowErrorCode.FIELDS_ERROR, message=m)
                                for i, m in named.items()]))
            else:
                responses.extend(ok([request]))
        return responses

    return handler


def status(code: int, message: str):  # noqa: ANN201
    return lambda raw: [types.AppendRowsResponse(error=status_pb2.Status(code=code, message=message)) for _ in raw]


def raises(exc: Exception):  # noqa: ANN201
    def handler(raw: list[Any]) -> Iterator[Any]:
        raise exc
        yield  # pragma: no cover - makes this a generator, raising when read

    return handler


CFG = BigQueryConfig(project_id="p", dataset="d", table="t", retry_deadline_ms=5_000)


def make_writer(booking_class: Any, handlers: list[Any], cfg: BigQueryConfig = CFG):  # noqa: ANN201
    sleeps: list[float] = []
    bq = FakeBigQuery(sample_schema(booking_class))
    client = FakeWriteClient(handlers)
    writer = StorageWriteWriter(bq, client, cfg, sleep=sleeps.append)  # type: ignore[arg-type]
    return writer, bq, client, sleeps


def sample_batch(booking_class: Any, count: int):  # noqa: ANN201
    values = [sample.booking(i, booking_class).SerializeToString() for i in range(count)]
    return convert(booking_class, values), records(values)


def test_first_request_names_the_stream_and_schema_and_later_ones_do_not(booking_class: Any, monkeypatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 2_000)  # a few rows per request
    writer, bq, client, _ = make_writer(booking_class, [ok])
    batch, recs = sample_batch(booking_class, 40)

    assert writer.write(batch, recs) == []

    (requests,) = client.connections
    assert len(requests) > 3
    assert requests[0].write_stream == "projects/p/datasets/d/tables/t/streams/_default"
    assert requests[0].proto_rows.writer_schema.proto_descriptor.name == "Row"
    assert all(not r.write_stream and not r.proto_rows.HasField("writer_schema") for r in requests[1:])
    assert all(r.ByteSize() <= 2_000 + 10_000 for r in requests)  # rows under the cap, plus the schema
    sent = [row for r in requests for row in r.proto_rows.rows.serialized_rows]
    assert len(sent) == 40
    assert client.metadata[0] == (("x-goog-request-params", "write_stream=projects/p/datasets/d/tables/t/streams/_default"),)
    assert bq.reads == 1
    writer.close()
    assert client.transport.closed and bq.closed


def test_rejected_rows_fail_and_the_rest_of_their_request_is_sent_again(booking_class: Any) -> None:
    writer, _, client, _ = make_writer(booking_class, [reject({1: "Timestamp field value is out of range"}), ok])
    batch, recs = sample_batch(booking_class, 5)

    failures = writer.write(batch, recs)

    assert [(f.error_type, f.offset) for f in failures] == [(ErrorType.SINK_4XX_ERROR, 101)]
    assert "FIELDS_ERROR: Timestamp field value is out of range" in failures[0].message
    first, second = client.connections
    resent = list(second[0].proto_rows.rows.serialized_rows)
    assert resent == [r for i, r in enumerate(first[0].proto_rows.rows.serialized_rows) if i != 1]
    assert second[0].write_stream  # a new connection names the stream again


def test_rows_a_request_keeps_rejecting_without_naming_them_fail_as_5xx(booking_class: Any) -> None:
    always = reject({0: "bad"})
    writer, _, client, _ = make_writer(booking_class, [always] * storage_write.ROW_ERROR_RESEND_ROUNDS)
    batch, recs = sample_batch(booking_class, 4)

    failures = writer.write(batch, recs)

    kinds = sorted((f.offset, f.error_type) for f in failures)
    # Each round names its first row; what is left after the last round is SINK_5XX_ERROR.
    assert kinds == [(100, ErrorType.SINK_4XX_ERROR), (101, ErrorType.SINK_4XX_ERROR),
                     (102, ErrorType.SINK_4XX_ERROR), (103, ErrorType.SINK_5XX_ERROR)]
    assert len(client.connections) == storage_write.ROW_ERROR_RESEND_ROUNDS


def test_transient_failures_are_retried_with_backoff(booking_class: Any) -> None:
    writer, _, client, sleeps = make_writer(booking_class, [
        raises(api_exceptions.ServiceUnavailable("connection reset")), status(8, "quota"), ok])
    batch, recs = sample_batch(booking_class, 3)

    assert writer.write(batch, recs) == []
    assert len(client.connections) == 3
    assert sleeps == [storage_write.FIRST_BACKOFF_S, storage_write.FIRST_BACKOFF_S * 2]


def test_extra_fields_right_after_a_schema_change_are_waited_for(booking_class: Any) -> None:
    from google.protobuf import any_pb2

    detail = any_pb2.Any()
    detail.Pack(types.StorageError.pb()(code=types.StorageError.StorageErrorCode.SCHEMA_MISMATCH_EXTRA_FIELDS,
                                        error_message="Input schema has more fields than BigQuery schema"))

    def lagging(raw: list[Any]) -> list[types.AppendRowsResponse]:
        status = status_pb2.Status(code=3, message="Input schema has more fields than BigQuery schema",
                                   details=[detail])
        return [types.AppendRowsResponse(error=status) for _ in raw]

    writer, _, client, sleeps = make_writer(booking_class, [lagging, lagging, ok])
    batch, recs = sample_batch(booking_class, 2)

    assert writer.write(batch, recs) == []
    assert len(client.connections) == 3 and len(sleeps) == 2


def test_transient_failures_past_the_deadline_raise_a_retryable_sink_error(booking_class: Any) -> None:
    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", retry_deadline_ms=0)
    writer, _, _, _ = make_writer(booking_class, [status(8, "Exceeds 'AppendRows throughput' quota")], cfg)
    batch, recs = sample_batch(booking_class, 2)

    with pytest.raises(SinkError) as failed:
        writer.write(batch, recs)
    assert failed.value.error_type is ErrorType.SINK_RETRYABLE_ERROR
    assert "quota" in failed.value.message


@pytest.mark.parametrize(("handler", "kind"), [
    (status(3, "Input schema has more fields than BigQuery schema"), ErrorType.SINK_4XX_ERROR),
    (raises(api_exceptions.NotFound("Table not found")), ErrorType.SINK_4XX_ERROR),
    (raises(api_exceptions.PermissionDenied("no")), ErrorType.SINK_4XX_ERROR),
])
def test_whole_request_failures_raise_classified(booking_class: Any, handler: Any, kind: ErrorType) -> None:
    writer, _, _, _ = make_writer(booking_class, [handler])
    batch, recs = sample_batch(booking_class, 2)

    with pytest.raises(SinkError) as failed:
        writer.write(batch, recs)
    assert failed.value.error_type is kind


def test_rows_that_do_not_fit_the_table_fail_before_sending(booking_class: Any) -> None:
    writer, bq, client, _ = make_writer(booking_class, [ok])
    batch, recs = sample_batch(booking_class, 3)
    batch.rows[1]["customer_id"] = 2**64  # no INT64 holds it
    batch.rows[2]["not_a_column"] = "x"

    failures = writer.write(batch, recs)

    assert [(f.offset, f.error_type) for f in failures] == [(101, ErrorType.SINK_4XX_ERROR),
                                                            (102, ErrorType.SINK_4XX_ERROR)]
    assert "no such field: not_a_column" in failures[1].message
    assert bq.reads == 1  # read for this very batch: reading again cannot help
    assert len(client.connections[0][0].proto_rows.rows.serialized_rows) == 1


def test_a_column_added_since_the_table_was_read_is_found_by_reading_it_again(booking_class: Any) -> None:
    writer, bq, client, _ = make_writer(booking_class, [ok, ok])
    batch, recs = sample_batch(booking_class, 2)
    assert writer.write(batch, recs) == []
    bq.schema = [*bq.schema, SchemaField("coupon", "STRING")]  # evolved by the driver meanwhile
    batch, recs = sample_batch(booking_class, 2)
    batch.rows[0]["coupon"] = "FREE"

    assert writer.write(batch, recs) == []

    assert bq.reads == 2
    second = client.connections[1][0]
    assert "coupon" in [f.name for f in second.proto_rows.writer_schema.proto_descriptor.field]


def test_a_row_over_the_request_limit_is_payload_too_large(booking_class: Any, monkeypatch) -> None:
    monkeypatch.setattr(storage_write, "MAX_REQUEST_BYTES", 400)
    writer, _, client, _ = make_writer(booking_class, [ok])
    batch, recs = sample_batch(booking_class, 2)
    batch.rows[0]["order_number"] = "x" * 1000

    failures = writer.write(batch, recs)

    assert [(f.offset, f.error_type) for f in failures] == [(100, ErrorType.PAYLOAD_TOO_LARGE)]
    assert sum(len(r.proto_rows.rows.serialized_rows) for r in client.connections[0]) == 1


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
