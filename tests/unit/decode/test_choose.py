"""make_value_decoder: the native decoder where it can run, the reference with one log line where not."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from firehose_bq import decode
from firehose_bq.decode import NativeUnavailable, make_value_decoder, native_unavailable
from firehose_bq.decode.native import NativeDecoder
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.descriptors import Descriptors

built = pytest.mark.skipif(bool(native_unavailable()), reason="the native decoder is not built")


@built
def test_auto_and_native_use_the_native_decoder(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.AllTypes")
    assert isinstance(make_value_decoder(cls), NativeDecoder)
    assert isinstance(make_value_decoder(cls, prefer="native"), NativeDecoder)
    assert isinstance(make_value_decoder(cls, prefer="python"), ReferenceDecoder)
    with pytest.raises(ValueError, match="prefer"):
        make_value_decoder(cls, prefer="fast")


def test_without_the_build_auto_falls_back_and_native_refuses(test_descriptors: Descriptors,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(decode, "native_unavailable", lambda module="_native": "the native decoder is not built (test)")
    cls = test_descriptors.message_class("testdata.AllTypes")
    with caplog.at_level(logging.WARNING, logger="firehose_bq.decode"):
        assert isinstance(make_value_decoder(cls), ReferenceDecoder)
    assert [r.getMessage() for r in caplog.records] == [
        "decoding testdata.AllTypes with the Python reference decoder (much slower): the native decoder is not "
        "built (test)"]
    with pytest.raises(NativeUnavailable, match="INPUT_SCHEMA_PROTO_DECODER=native"):
        make_value_decoder(cls, prefer="native")


@built
@pytest.mark.parametrize("prefer", ["auto", "native"])
def test_a_shape_the_native_decoder_lacks_falls_back_with_the_reason(test_descriptors: Descriptors, prefer: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    cls = test_descriptors.message_class("testdata.Extendable")
    with caplog.at_level(logging.WARNING, logger="firehose_bq.decode"):
        decoder = make_value_decoder(cls, prefer=prefer)
    assert isinstance(decoder, ReferenceDecoder)
    assert "testdata.Extendable has extensions" in caplog.text
    msg = cls(a=1)
    msg.Extensions[test_descriptors.pool().FindExtensionByName("testdata.note")] = "n"
    out = decoder.decode(pa.array([msg.SerializeToString(), cls(a=2).SerializeToString()], pa.binary()))
    # The table has no column for an extension: its value is flagged as an unknown field is (counted, and
    # kept in additional_properties), not dropped without a word.
    assert out.values.to_pylist() == [{"a": 1}, {"a": 2}] and out.unknown_fields == [0]


@built
def test_groups_are_decoded_by_the_reference_into_their_records(test_descriptors: Descriptors,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    cls = test_descriptors.message_class("testdata.Grouped")
    with caplog.at_level(logging.WARNING, logger="firehose_bq.decode"):
        decoder = make_value_decoder(cls, prefer="native")
    assert isinstance(decoder, ReferenceDecoder)
    assert "groups (delimited message encoding) are not supported" in caplog.text
    msg = cls(id=1)
    msg.extra.a = 2
    msg.extra.s.append("x")
    msg.line.add(qty=3)
    no_qty = cls(id=2)
    no_qty.line.add()
    out = decoder.decode(pa.array([msg.SerializeToString(), no_qty.SerializePartialToString(), b"\x13\x18\x01"],
                                  pa.binary()))
    assert out.values.to_pylist()[0] == {"id": 1, "extra": {"a": 2, "s": ["x"]}, "line": [{"qty": 3}]}
    assert [(f.index, f.error_type.name) for f in out.failures] == [(1, "INVALID_MESSAGE_ERROR"),
                                                                     (2, "DESERIALIZATION_ERROR")]
    assert "line[0].qty" in out.failures[0].message


@built
def test_a_redefined_well_known_type_is_left_to_the_reference(caplog: pytest.LogCaptureFixture) -> None:
    """The native decoder reads Timestamp, Duration, Date, wrappers and Struct with their standard
    layouts; a descriptor set that defines one differently gets the reference decoder."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    FD = descriptor_pb2.FieldDescriptorProto
    stamp = descriptor_pb2.FileDescriptorProto(name="google/protobuf/timestamp.proto", package="google.protobuf",
                                               syntax="proto3")
    stamp.message_type.add(name="Timestamp").field.extend([
        FD(name="seconds", number=1, type=FD.TYPE_INT64, label=FD.LABEL_OPTIONAL),
        FD(name="millis", number=2, type=FD.TYPE_INT64, label=FD.LABEL_OPTIONAL)])
    event = descriptor_pb2.FileDescriptorProto(name="event.proto", package="odd", syntax="proto3",
                                               dependency=["google/protobuf/timestamp.proto"])
    event.message_type.add(name="Event").field.add(name="at", number=1, type=FD.TYPE_MESSAGE,
                                                   type_name=".google.protobuf.Timestamp", label=FD.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(stamp)
    pool.Add(event)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("odd.Event"))
    with caplog.at_level(logging.WARNING, logger="firehose_bq.decode"):
        assert isinstance(make_value_decoder(cls), ReferenceDecoder)
    assert "google.protobuf.Timestamp does not have the standard layout" in caplog.text


def test_a_protobuf_without_the_utf8_feature_api_is_an_unsupported_shape() -> None:
    """Whether upb checks a string's UTF-8 comes from a private protobuf API; without it the native
    plan refuses (UnsupportedShape: the reference decodes) instead of guessing or failing the job."""
    from types import SimpleNamespace

    from firehose_bq.decode.native import UnsupportedShape, _validates_utf8

    with pytest.raises(UnsupportedShape, match="p.M.f"):
        _validates_utf8(SimpleNamespace(full_name="p.M.f"))  # type: ignore[arg-type]
