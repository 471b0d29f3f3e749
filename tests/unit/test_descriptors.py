"""Descriptors: what a user sees when INPUT_SCHEMA_PROTO_CLASS names no message of the set."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2

from firehose_bq import descriptors
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from tests.unit.registry.fixtures import regtest_set, with_new_field


def _set_with_imports() -> Descriptors:
    """A user's file plus what `--include_imports` brings: descriptor.proto alone has 30-odd messages,
    all sorting before the user's package."""
    fds = descriptor_pb2.FileDescriptorSet()
    for module in (descriptor_pb2, timestamp_pb2):
        module.DESCRIPTOR.CopyToProto(fds.file.add())
    user = fds.file.add(name="shop/orders.proto", package="shop.v1", syntax="proto3")
    for name in ("Order", "OrderKey", "Refund"):
        user.message_type.add(name=name)
    return Descriptors((fds.SerializeToString(),), ("orders.desc",))


def test_a_misspelled_class_is_answered_with_the_nearest_names_and_the_sets_own_messages() -> None:
    with pytest.raises(SchemaError) as caught:
        _set_with_imports().find_message("shop.v1.Ordr")
    text = str(caught.value)
    assert "'shop.v1.Ordr' is not in the descriptors from orders.desc" in text
    assert "did you mean shop.v1.Order" in text
    listed = text.split("known messages: ", 1)[1]
    assert listed.startswith("shop.v1.Order, shop.v1.OrderKey, shop.v1.Refund, google.protobuf.")
    assert listed.endswith("more)")


def test_a_name_like_none_lists_the_messages_without_a_guess() -> None:
    with pytest.raises(SchemaError) as caught:
        _set_with_imports().find_message("zzz.Nothing")
    assert "did you mean" not in str(caught.value) and "known messages: shop.v1.Order" in str(caught.value)


def test_a_proto2_file_whose_json_names_clash_loads() -> None:
    """protoc accepts a proto2 message with `fooBar` and `foo_bar` (both JSON name fooBar) with a warning,
    and Java and C++ load it; upb refuses the whole file ("duplicate json_name"), which stopped every job
    on the set. The sink writes proto names only, so the pool gets the later field a JSON name of its own."""
    fds = descriptor_pb2.FileDescriptorSet()
    legacy = fds.file.add(name="legacy/names.proto", package="legacy", syntax="proto2")
    clash = legacy.message_type.add(name="Clash")
    field = descriptor_pb2.FieldDescriptorProto
    for number, name in enumerate(["fooBar", "foo_bar", "foo_bar_"], 1):
        clash.field.add(name=name, number=number, json_name="fooBar", type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    inner = clash.nested_type.add(name="Inner")
    for number, name in enumerate(["a_b", "aB"], 1):  # no json_name: the default one
        inner.field.add(name=name, number=number, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    blob = fds.SerializeToString()
    loaded = Descriptors((blob,), ("names.desc",))
    cls = loaded.message_class("legacy.Clash")
    assert [f.name for f in cls.DESCRIPTOR.fields] == ["fooBar", "foo_bar", "foo_bar_"]
    assert cls.FromString(cls(fooBar=1, foo_bar=2, foo_bar_=3).SerializeToString()).foo_bar == 2
    assert [f.name for f in loaded.find_message("legacy.Clash.Inner").fields] == ["a_b", "aB"]
    assert loaded.sets == (blob,)  # the sets (and so the fingerprint) stay as fetched


def test_a_pool_is_built_once_per_process_for_equal_sets_and_only_the_last_two_are_kept(tmp_path: Path) -> None:
    import pickle

    from firehose_bq import descriptors as module

    v1 = regtest_set(tmp_path)
    v2, v3 = with_new_field(v1), with_new_field(v1, field="other")
    first = descriptors.Descriptors((v1,), ("a",))
    # What a Spark task gets with every micro-batch: the same sets, unpickled, without a pool.
    again = pickle.loads(pickle.dumps(first))
    assert again._pool is None and again.pool() is first.pool()
    assert descriptors.Descriptors((v2,)).pool() is not first.pool()
    descriptors.Descriptors((v3,)).pool()
    assert len(module._POOLS) <= 2 and descriptors.Descriptors((v1,)).pool() is not first.pool()
    assert descriptors.Descriptors((v3,)).message_class("regtest.Header").DESCRIPTOR.fields_by_name["other"]
