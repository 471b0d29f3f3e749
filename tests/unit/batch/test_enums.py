"""Enum numbers the descriptors do not name, found at any depth of the decoded rows (batch/enums.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from firehose_bq import descriptors
from firehose_bq.batch.enums import EnumNumbers
from firehose_bq.decode import make_value_decoder
from firehose_bq.schema import SchemaOptions
from tests.conftest import compile_protos

PROTOS = Path(__file__).parent / "protos_enums"


@pytest.fixture(scope="module")
def canvas(tmp_path_factory: pytest.TempPathFactory) -> type:
    path = compile_protos(tmp_path_factory.mktemp("enums") / "enums.desc", PROTOS)
    return descriptors.load([str(path)]).message_class("enumtest.Canvas")


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_number_is_found_wherever_an_enum_sits_and_names_and_nulls_are_not(canvas: type, decoder: str) -> None:
    # The producer's newer enum has GREEN = 2 (and -1): the sink's descriptors do not name them.
    values = [
        canvas(id="named", color=1, paint={"color": 1, "extra": [1]}, by_name={"a": 1}),
        canvas(id="top", color=2),
        canvas(id="record", paint={"color": 2}),
        canvas(id="repeated record", layers=[{"color": 1}, {"extra": [0, -1]}]),
        canvas(id="repeated", palette=[1, 2]),
        canvas(id="map value", by_name={"a": 1, "b": 2}),
        canvas(id="map of records", paints={"p": {"extra": [2]}}),
        canvas(id="deeper", inner={"inner": {"paint": {"color": 7}}}),
        None,
        canvas(id="defaults"),
    ]
    raw = pa.array([v.SerializeToString() if v is not None else None for v in values], pa.binary())
    decoded = make_value_decoder(canvas, 1, SchemaOptions(), prefer=decoder).decode(raw)
    assert EnumNumbers(canvas.DESCRIPTOR, SchemaOptions()).rows(decoded.values) == [1, 2, 3, 4, 5, 6, 7]


def test_a_message_without_open_enums_is_not_looked_at() -> None:
    from google.protobuf import descriptor_pb2, timestamp_pb2

    assert not EnumNumbers(timestamp_pb2.Timestamp.DESCRIPTOR, SchemaOptions()).has_enums()
    # proto2 enums are closed: upb keeps an unknown number as an unknown field, which holds a task already.
    assert not EnumNumbers(descriptor_pb2.FieldDescriptorProto.DESCRIPTOR, SchemaOptions()).has_enums()


@pytest.mark.parametrize("in_key", [False, True])
def test_an_enum_number_holds_the_task_for_a_refresh_and_is_written_as_text_without_the_hold(
        canvas: type, tmp_path: Path, in_key: bool) -> None:
    from dataclasses import replace

    from firehose_bq.batch.core import process_batch
    from firehose_bq.schema import MetadataColumns
    from firehose_bq.sink_schema import SinkSpec
    from tests.unit.batch.sources import source_batch
    from tests.unit.batch.test_core import FakePlan, handling

    loaded = descriptors.load([str(compile_protos(tmp_path / "enums.desc", PROTOS))])
    # In the key: a message of its own (INPUT_SCHEMA_PROTO_KEY_CLASS), its columns one level down (message_key).
    base = SinkSpec(loaded, "enumtest.Canvas", MetadataColumns(columns=("message_offset",)),
                    key_class="enumtest.Paint" if in_key else None)
    if in_key:
        paint, value = loaded.message_class("enumtest.Paint"), canvas(id="v", color=1).SerializeToString()
        batch = source_batch([value, value], keys=[paint(color=1).SerializeToString(),
                                                   paint(extra=[1, 5]).SerializeToString()], offsets=[7, 8])
    else:
        batch = source_batch([canvas(id="a", color=1).SerializeToString(),
                              canvas(id="b", palette=[3]).SerializeToString()], offsets=[7, 8])
    plan = FakePlan()
    held = process_batch([batch], replace(base, hold_on_unknown_fields=True), plan, handling())
    # Before, "b" was written at once with palette ["3"]: a producer's newer enum value, never refreshed for
    # (and a key's extra ["RED", "5"], until this held for the key too).
    assert held.held == "enum number the descriptors do not name at t/0@8" and held.resume == [("t", 0, 7)]
    assert not plan.writer.written
    result = process_batch([batch], base, plan, handling())  # the second run, after a refresh named nothing
    written = [r["message_key"]["extra"] if in_key else r["palette"] for r in plan.writer.written]
    assert not result.held and written == ([[], ["RED", "5"]] if in_key else [[], ["3"]])


def test_the_keys_numbers_are_found_at_the_keys_depth(canvas: type) -> None:
    # The key's columns sit one level down (message_key): with max_depth 3 its `inner.inner` is cut to JSON
    # text, where the value's would still be a RECORD, and its `paint.color` is still a column.
    options = SchemaOptions(max_depth=3)
    raw = pa.array([canvas(id="x", inner={"inner": {"color": 9}}).SerializeToString(),
                    canvas(id="y", paint={"color": 4}).SerializeToString()], pa.binary())
    decoded = make_value_decoder(canvas, 2, options).decode(raw)
    assert EnumNumbers(canvas.DESCRIPTOR, options, 2).rows(decoded.values) == [1]
