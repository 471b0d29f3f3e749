"""Confluent protobuf: the wire format, and schema ids (with references) → compiled message classes."""

from __future__ import annotations

import json
import urllib.error

import pytest

from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.registry.confluent import ConfluentRegistry, ConfluentSchema, Frame, WireFormatError, compile_proto, encode_frame, \
    frame_payload, message_indexes, parse_frame, shown_indexes
from tests.unit.registry.fixtures import MONEY_PROTO, ORDER_PROTO, FakeGet

URL = "http://sr.test:8081"
MONEY_REF = {"name": "regtest/money.proto", "subject": "regtest/money.proto-value", "version": 3}


def test_a_lone_zero_byte_means_the_first_message() -> None:
    assert parse_frame(b"\x00\x00\x00\x00\x07\x00payload") == Frame(7, (0,), 6)


def test_multi_level_indexes_are_zigzag_varints_after_a_count() -> None:
    # id 300; count 2 (zig-zag 4), then 1 (2) and 100 (200 = 0xC8 0x01 as a varint)
    assert parse_frame(b"\x00\x00\x00\x01\x2c\x04\x02\xc8\x01pay") == Frame(300, (1, 100), 9)


@pytest.mark.parametrize("indexes", [[0], [1], [1, 0], [1, 0, 0], [3, 200, 70000]])
def test_encoding_and_parsing_round_trip(indexes: list[int]) -> None:
    framed = encode_frame(2**31 - 1, indexes, b"\x08\x01")
    frame = parse_frame(framed)
    assert (frame.schema_id, list(frame.message_indexes), framed[frame.payload_offset:]) == (2**31 - 1, indexes,
                                                                                             b"\x08\x01")
    assert (framed[5:6] == b"\x00") == (indexes == [0])


@pytest.mark.parametrize("data, problem", [
    (b"", "wire format"),
    (b"\x01\x00\x00\x00\x07\x00", "wire format"),  # wrong magic byte
    (b"\x00\x00\x00\x07", "wire format"),  # no indexes
    (b"\x00\x00\x00\x00\x07\x01", "count -1"),
    (b"\x00\x00\x00\x00\x07\x04\x02", "count 2 does not fit"),
    (b"\x00\x00\x00\x00\x07\x02\x82", "truncated"),
])
def test_malformed_frames_are_wire_format_errors(data: bytes, problem: str) -> None:
    with pytest.raises(WireFormatError, match=problem):
        parse_frame(data)


def test_index_varints_are_64_bit_like_protobufs() -> None:
    # ten bytes, the last one's high bits past 64: dropped, as protobuf drops them
    assert parse_frame(b"\x00\x00\x00\x00\x07\x02" + b"\xff" * 9 + b"\x7f").message_indexes == (-2**63,)
    with pytest.raises(WireFormatError, match="overlong"):
        parse_frame(b"\x00\x00\x00\x00\x07\x02" + b"\x80" * 10 + b"\x00")


# Confluent's Java rule (ProtobufSchema.toMessageIndexes over the schema text): message declarations only,
# so the map entry protoc makes for `counts` (declared before `Inner`) is not counted.
MAPS_PROTO = """syntax = "proto3";
package maps;
enum Kind { A = 0; }
message First { map<string, int32> counts = 1; message Inner { message Deep {} map<string, Deep> deep = 1; }
                message Other {} }
message Second {}
"""


@pytest.fixture(scope="module")
def maps_schema() -> Descriptors:
    return Descriptors((compile_proto("maps.proto", {"maps.proto": MAPS_PROTO}, "test"),), ("test",))


@pytest.mark.parametrize("name, indexes", [("maps.First", (0,)), ("maps.Second", (1,)), ("maps.First.Inner", (0, 0)),
                                           ("maps.First.Other", (0, 1)), ("maps.First.Inner.Deep", (0, 0, 0))])
def test_message_indexes_count_declared_messages_only(maps_schema: Descriptors, name: str,
                                                      indexes: tuple[int, ...]) -> None:
    assert message_indexes(maps_schema.find_message(name)) == indexes
    schema = ConfluentSchema(3, maps_schema, "maps.proto")
    assert schema.message_name(indexes) == name  # the registry's lookup walks the same way back


def test_a_frame_naming_another_message_is_refused_with_both_paths(maps_schema: Descriptors) -> None:
    expected, name = message_indexes(maps_schema.find_message("maps.First.Other")), "maps.First.Other"
    assert frame_payload(encode_frame(3, [0, 1], b"\x08\x01"), expected, name) == 8
    assert frame_payload(b"\x00\x00\x00\x00\x03\x04\x00\x02rest", expected, name) == 8  # [0, 1] spelled out
    with pytest.raises(WireFormatError) as refused:
        frame_payload(encode_frame(3, [1], b""), expected, name)
    assert str(refused.value) == ("written as another message type: its Confluent frame names message indexes [1] "
                                  "(schema id 3), the configured class maps.First.Other is [0, 1]")
    # [0] counts as [0] however it is spelled: the lone byte 0, or count 1 then 0
    assert frame_payload(b"\x00\x00\x00\x00\x03\x02\x00", (0,), "maps.First") == 7
    assert frame_payload(b"\x00\x00\x00\x00\x03\x00", (0,), "maps.First") == 6


def test_shown_indexes_are_cut_for_hostile_frames() -> None:
    assert shown_indexes([]) == "[]" and shown_indexes([1, -2]) == "[1, -2]"
    assert shown_indexes(list(range(8))) == "[0, 1, 2, 3, 4, 5, 6, 7]"
    assert shown_indexes(list(range(9))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...]"


def schema_json(text: str, references: list[dict[str, object]] | None = None, kind: str = "PROTOBUF") -> bytes:
    return json.dumps({"schema": text, "schemaType": kind, "references": references or []}).encode()


def registry(routes: dict[str, object], user_info: str | None = "user:pa55") -> tuple[ConfluentRegistry, FakeGet]:
    get = FakeGet({URL + path: answer for path, answer in routes.items()})
    return ConfluentRegistry(URL, user_info=Secret(user_info) if user_info else None, timeout_s=2, get=get), get


ORDER_ROUTES = {
    "/schemas/ids/21": schema_json(ORDER_PROTO, [MONEY_REF]),
    "/subjects/regtest%2Fmoney.proto-value/versions/3": schema_json(MONEY_PROTO),
}


def test_a_schema_with_references_compiles_once_and_resolves_nested_messages() -> None:
    confluent, get = registry(ORDER_ROUTES)
    names = {tuple(i): confluent.schema(21).message_name(i) for i in ([0], [1], [1, 0], [1, 0, 0])}
    assert names == {(0,): "regtest.Header", (1,): "regtest.Order", (1, 0): "regtest.Order.Line",
                     (1, 0, 0): "regtest.Order.Line.Note"}
    line_class = confluent.message_class(21, [1, 0])
    line = line_class(sku="A-1", notes=[{"text": "fragile"}])
    line.price.units = 5
    decoded = confluent.decode(encode_frame(21, [1, 0], line.SerializeToString()))
    assert decoded == line and decoded.DESCRIPTOR.full_name == "regtest.Order.Line"
    assert get.urls() == [URL + path for path in ORDER_ROUTES]  # compiled once, then cached
    assert {headers["Authorization"] for _, headers, _ in get.requests} == {"Basic dXNlcjpwYTU1"}


def test_message_indexes_outside_the_schema_are_a_schema_error() -> None:
    confluent, _ = registry(ORDER_ROUTES)
    with pytest.raises(SchemaError, match=r"schema id 21 has no message at indexes \[1, 4\]"):
        confluent.message_class(21, [1, 4])


def test_registry_failures_name_the_schema_id_or_reference() -> None:
    confluent, _ = registry({"/schemas/ids/9": urllib.error.URLError("refused"),
                             "/schemas/ids/21": ORDER_ROUTES["/schemas/ids/21"],
                             "/subjects/regtest%2Fmoney.proto-value/versions/3": urllib.error.URLError("refused")})
    with pytest.raises(SchemaError, match=f"cannot fetch schema id 9 from the Confluent registry at {URL}"):
        confluent.schema(9)
    with pytest.raises(SchemaError, match="reference 'regtest/money.proto' \\(subject 'regtest/money.proto-value' "
                                          "version 3\\) of schema id 21"):
        confluent.schema(21)


@pytest.mark.parametrize("body, problem", [
    (schema_json('{"type": "record"}', kind="AVRO"), "schema id 5 is AVRO, not PROTOBUF"),
    (json.dumps({"schema": "{}"}).encode(), "schema id 5 is AVRO, not PROTOBUF"),
    (schema_json("syntax = 'proto3'; message {"), "schema id 5 does not compile: .*confluent_schema_5.proto"),
    (schema_json("syntax = 'proto3'; import 'x.proto';", [{"name": "../x.proto", "subject": "x", "version": 1}]),
     "reference name '../x.proto' leaves the source tree"),
    (b"<html>", "did not answer JSON"),
    (b'{"error_code": 40403}', "answered without a `schema`"),
])
def test_unusable_schemas_are_schema_errors(body: bytes, problem: str) -> None:
    confluent, _ = registry({"/schemas/ids/5": body, "/subjects/x/versions/1": schema_json("syntax = 'proto3';")})
    with pytest.raises(SchemaError, match=problem):
        confluent.schema(5)


def test_from_config_is_off_without_a_url() -> None:
    assert ConfluentRegistry.from_config(RegistryConfig()) is None
    on = ConfluentRegistry.from_config(RegistryConfig(confluent_url=URL + "/", confluent_basic_auth=Secret("u:p")))
    assert on is not None and on.url == URL


def version_json(schema_id: int) -> bytes:
    return json.dumps({"subject": "orders-value", "id": schema_id, "schema": "syntax = 'proto3';",
                       "schemaType": "PROTOBUF"}).encode()


VERSIONS = "/subjects/orders-value/versions?deleted=true"


def test_subject_ids_fetch_each_version_once_and_forget_the_ones_that_are_gone() -> None:
    confluent, get = registry({VERSIONS: [b"[1, 2]", b"[2, 3]"],
                               "/subjects/orders-value/versions/1?deleted=true": version_json(7),
                               "/subjects/orders-value/versions/2?deleted=true": version_json(8),
                               "/subjects/orders-value/versions/3?deleted=true": version_json(11)})
    assert confluent.subject_ids("orders-value") == {7, 8}
    assert confluent.subject_ids("orders-value") == {8, 11}  # version 1 hard-deleted, version 3 new
    versions = [url.removeprefix(URL) for url in get.urls() if url != URL + VERSIONS]
    assert versions == [f"/subjects/orders-value/versions/{v}?deleted=true" for v in (1, 2, 3)]
    assert get.urls().count(URL + VERSIONS) == 2


@pytest.mark.parametrize("listed, version, problem", [
    (b'{"error_code": 40401}', None, "did not answer a list of version numbers"),
    (b'[1, "2"]', None, "did not answer a list of version numbers"),
    (b"[1]", json.dumps({"schema": "syntax = 'proto3';"}).encode(),
     "version 1 of subject 'orders-value': .* answered without a schema `id`"),
    (b"[1]", urllib.error.URLError("refused"), "cannot fetch version 1 of subject 'orders-value'"),
])
def test_unusable_version_lists_are_schema_errors(listed: bytes, version: object, problem: str) -> None:
    confluent, _ = registry({VERSIONS: listed, "/subjects/orders-value/versions/1?deleted=true": version})
    with pytest.raises(SchemaError, match=problem):
        confluent.subject_ids("orders-value")
