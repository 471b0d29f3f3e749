"""convert.py's generated converter, which the reference decoder runs: its fast paths against the slow,
obvious implementations, and the shapes that stress code generation. The value rules it keeps are tested
through both decoders in tests/unit/decode/test_protobuf_values.py."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pyarrow as pa
import pytest

from google.cloud.bigquery import SchemaField

from firehose_bq.convert import compile_message
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.descriptors import Descriptors
from firehose_bq.schema import SchemaOptions, bigquery_fields
from tests.unit.populated import populated_key, populated_messages


@pytest.fixture(scope="module")
def all_types(test_descriptors: Descriptors):  # noqa: ANN201
    return test_descriptors.message_class("testdata.AllTypes")


def fits(value: object, f: SchemaField) -> bool:
    """Whether `value` is what the converter may give for column `f`: exactly its fields (pyarrow would take
    a misnamed one as a NULL column, silently), each in the Python form of its Arrow type."""
    if f.mode == "REPEATED":
        return isinstance(value, list) and all(fits(v, _one(f)) for v in value)
    if value is None:
        return f.mode == "NULLABLE"
    if f.field_type == "RECORD":
        return (isinstance(value, dict) and value.keys() == {s.name for s in f.fields}
                and all(fits(value[s.name], s) for s in f.fields))
    kinds = {"INTEGER": int, "FLOAT": float, "BOOLEAN": bool, "STRING": str, "BYTES": bytes, "NUMERIC": Decimal,
             "TIMESTAMP": int, "DATE": int}  # TIMESTAMP in microseconds, DATE in days since the epoch
    return isinstance(value, kinds[f.field_type]) and (f.field_type != "INTEGER" or not isinstance(value, bool))


def _one(f: SchemaField) -> SchemaField:
    return SchemaField(f.name, f.field_type, mode="NULLABLE", fields=f.fields)


@pytest.mark.parametrize("options", [SchemaOptions(), SchemaOptions(max_depth=1), SchemaOptions(max_depth=3),
                                     SchemaOptions(uint64_type="NUMERIC")])
def test_rows_fit_the_schema(test_descriptors: Descriptors, options: SchemaOptions) -> None:
    """The lock-step between schema.py and convert.py, on fully populated messages (and the key's, at depth 2)."""
    key = populated_key(test_descriptors)
    for msg, depth in [(m, 1) for m in populated_messages(test_descriptors)] + [(key, 2)]:
        row = compile_message(msg.DESCRIPTOR, depth, options)(msg)
        schema = bigquery_fields(msg.DESCRIPTOR, depth, options)
        assert fits(row, SchemaField("row", "RECORD", fields=schema)), (msg.DESCRIPTOR.full_name, row)


# -- the generated converter's fast paths, checked against the slow, obvious implementations ------------

def random_value(rng, depth: int = 0):  # noqa: ANN001, ANN201
    """A JSON-able Python value of the kinds a google.protobuf.Value holds, with the awkward cases."""
    texts = ["", "plain", "é ü ß", "日本語", "emoji 😀", 'quote " and \\ backslash', "\n\t\r\x00\x1f", "\u2028\u2029",
             "</script>", "a\udcff"[:1]]
    numbers = [0.0, -0.0, 1.0, -1.5, 0.1, 1e300, -1e-300, 5e-324, 1e16, 2.0**53 + 2, 123456789.125, 1.7976931348623157e308]
    choice = rng.randrange(6 if depth < 4 else 4)
    if choice == 0:
        return rng.choice(texts)
    if choice == 1:
        return rng.choice(numbers)
    if choice == 2:
        return rng.random() < 0.5
    if choice == 3:
        return None
    if choice == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(texts) + str(i): random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_struct_value_and_list_value_text_is_what_json_format_writes() -> None:
    import random

    from google.protobuf import struct_pb2

    from firehose_bq.convert import _json, _list_text, _struct_text, _value_text

    rng = random.Random(7)
    for _ in range(300):
        struct = struct_pb2.Struct()
        struct.update({f"k{i}": random_value(rng) for i in range(rng.randrange(5))})
        assert _struct_text(struct) == _json(struct)
        values = struct_pb2.ListValue()
        values.extend([random_value(rng) for _ in range(rng.randrange(4))])
        assert _list_text(values) == _json(values)
        value = struct_pb2.Value()
        value.struct_value.update({"x": random_value(rng)})
        assert _value_text(value) == _json(value)
    assert _struct_text(struct_pb2.Struct()) == "{}" == _json(struct_pb2.Struct())
    assert _value_text(struct_pb2.Value()) == "null" == _json(struct_pb2.Value())  # no kind set
    assert _value_text(struct_pb2.Value(null_value=0)) == "null"
    assert _list_text(struct_pb2.ListValue()) == "[]"
    number = struct_pb2.Value(number_value=1.0)
    assert _value_text(number) == _json(number) == "1.0"


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_struct_numbers_fail_as_json_format_does(number: float) -> None:
    from google.protobuf import struct_pb2

    from firehose_bq.convert import _json, _struct_text

    struct = struct_pb2.Struct()
    struct.update({"ok": 1, "nested": {"list": [1, "x", number]}})
    with pytest.raises(ValueError) as expected:
        _json(struct)
    with pytest.raises(ValueError) as got:
        _struct_text(struct)
    assert str(got.value) == str(expected.value)


def dynamic_class(name: str, fields: list[tuple[str, int, str | None]], extra: list = ()):  # noqa: ANN001, ANN201
    """A message class built from a descriptor made here: field names protoc-generated fixtures can't have
    in a checked-in .proto this test owns. fields: (name, FieldDescriptorProto type, message type name)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name=f"{name.lower()}.proto", package="dyn", syntax="proto3")
    for message_name, message_fields in [(name, fields), *extra]:
        message = file.message_type.add(name=message_name)
        for number, (field_name, type_, type_name) in enumerate(message_fields, start=1):
            fd = message.field.add(name=field_name, number=number, type=type_,
                                   label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if type_name:
                fd.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"dyn.{name}"))


def test_field_names_that_are_not_plain_python_become_constants_not_code() -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    names = ["class", "None", "lambda", "m", "meta", "_t1", "_list", "__class__x", "import"]
    cls = dynamic_class("Awkward", [(n, F.TYPE_STRING, None) for n in names])
    msg = cls()
    for n in names:
        setattr(msg, n, f"value of {n}")
    assert compile_message(cls.DESCRIPTOR)(msg) == {n: f"value of {n}" for n in names}
    out = ReferenceDecoder(cls).decode(pa.array([msg.SerializeToString()], pa.binary()))
    assert out.values.to_pylist() == [{n: f"value of {n}" for n in names}] and not out.failures


def test_nested_records_deeper_than_the_inline_limit() -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    from firehose_bq.convert import MAX_INLINE_LEVELS

    levels = MAX_INLINE_LEVELS + 3
    extra = [(f"L{i}", [("name", F.TYPE_STRING, None), ("down", F.TYPE_MESSAGE, f".dyn.L{i + 1}")])
             for i in range(1, levels)] + [(f"L{levels}", [("name", F.TYPE_STRING, None)])]
    cls = dynamic_class("L0", [("name", F.TYPE_STRING, None), ("down", F.TYPE_MESSAGE, ".dyn.L1")], extra)
    msg = cls(name="0")
    node = msg
    for i in range(1, levels + 1):
        node = node.down
        node.name = str(i)
    expected: dict = {"name": str(levels)}
    for i in reversed(range(levels)):
        expected = {"name": str(i), "down": expected}
    assert compile_message(cls.DESCRIPTOR)(msg) == expected
    cut = compile_message(cls.DESCRIPTOR, options=SchemaOptions(max_depth=3))(msg)
    assert json.loads(cut["down"]["down"]["down"]) == json.loads(json.dumps(expected["down"]["down"]["down"]))


@pytest.mark.parametrize("enabled", [True, False])
def test_cycle_collector_is_left_as_it_was(test_descriptors: Descriptors, enabled: bool) -> None:
    import gc

    cls = test_descriptors.message_class("testdata.Legacy")
    decoder = ReferenceDecoder(cls)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        out = decoder.decode(pa.array([cls(id="a").SerializeToString(), b"\x0a\x05ab"], pa.binary()))
        assert gc.isenabled() is enabled
        assert out.values.to_pylist() == [{"id": "a", "count": None, "tags": []}, None] and len(out.failures) == 1
    finally:
        gc.enable() if was else gc.disable()


