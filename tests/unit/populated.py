"""Fully populated test messages of every shape: each column of their tables holds a value."""

from __future__ import annotations

from google.protobuf.message import Message

from firehose_bq.descriptors import Descriptors


def populated_messages(descriptors: Descriptors) -> list[Message]:
    """testdata.AllTypes, Wrapped, a Tree four maps deep and a Node chain 20 levels deep."""
    all_types = descriptors.message_class("testdata.AllTypes")
    full = all_types(f_string="s", f_bytes=b"b", r_string=["x"], m_scalar={"k": 1}, r_enum=[1], r_bytes=[b"1"])
    full.f_message.counts.append(1)
    full.r_message.add(label="r")
    full.m_message[1].label = "m"
    full.f_timestamp.seconds = 1
    full.r_timestamp.add(seconds=2)
    full.f_struct.update({"a": [1, {"b": None}]})
    full.f_duration.seconds = 3
    full.c_inner.label = "c"
    wrapped = descriptors.message_class("testdata.Wrapped")(
        w_double={"value": 1.5}, w_bool={"value": True}, r_int64=[{"value": 1}], m_string={"a": {"value": "b"}},
        day={"year": 2000, "month": 1, "day": 1}, r_day=[{"year": 2000, "month": 1, "day": 1}])
    tree = descriptors.message_class("testdata.Tree")()
    tree.children["a"].children["b"].children["c"].children["d"].label = "d"
    node = root = descriptors.message_class("testdata.Node")(name="a")
    for _ in range(19):
        node = node.child
        node.name = "a"
    return [full, wrapped, tree, root]


def populated_key(descriptors: Descriptors) -> Message:
    return descriptors.message_class("testdata.Key")(id="k", day={"year": 2000, "month": 1, "day": 1})
