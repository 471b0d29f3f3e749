"""The native decoder against the reference: random messages of every test proto, fuzzed bytes, batches
mixing NULL, corrupt and newer-proto values, depth 2, Confluent frames, and the hand-picked edges of
upb's wire rules. Equal values, failure indexes and types, and unknown-field rows, every time."""

from __future__ import annotations

import decimal
import json
import random
import struct
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firehose_bq import sample
from firehose_bq.decode import native_unavailable
from firehose_bq.decode.native import NativeDecoder, UnsupportedShape
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType, SchemaError
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.registry.confluent import WireFormatError, encode_frame, frame_payload, message_indexes
from firehose_bq.schema import SchemaOptions
from tests.unit.decode import wire
from tests.unit.decode.compare import UNSUPPORTED, assert_same, decoders
from tests.unit.decode.protos import load_trees, messages
from tests.unit.decode.wire import LEN, VARINT, length_delimited, tag, varint

pytestmark = pytest.mark.skipif(bool(native_unavailable()), reason="the native decoder is not built")

SETTINGS = settings(max_examples=15, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
# Every combination a column plan depends on: the top level, the key's level, cut fields, sanitized names,
# uint64/fixed64 columns of each type.
OPTIONS = [(1, SchemaOptions(), False), (2, SchemaOptions(), False), (1, SchemaOptions(max_depth=3), False),
           (2, SchemaOptions(max_depth=2, sanitize_names=True), False), (1, SchemaOptions(max_depth=1), False),
           (1, SchemaOptions(max_depth=5), True), (1, SchemaOptions(uint64_type="STRING"), False),
           (2, SchemaOptions(max_depth=3, uint64_type="NUMERIC"), False)]


def _all_messages() -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        trees = load_trees(Path(tmp))
        return [(tree, desc.full_name) for tree, compiled in trees.items() for desc in messages(compiled)]


ALL_MESSAGES = _all_messages()


def binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


@pytest.mark.parametrize("tree,name", ALL_MESSAGES, ids=[f"{t}:{n}" for t, n in ALL_MESSAGES])
@pytest.mark.parametrize("depth,options,framed", OPTIONS,
                         ids=["top", "key", "cut3", "key-cut2-sanitized", "cut1", "framed-cut5", "u64-string",
                              "key-cut3-u64-numeric"])
def test_random_messages_agree(trees: dict[str, Descriptors], tree: str, name: str, depth: int,
                               options: SchemaOptions, framed: bool) -> None:
    """Batches of valid messages, messages with unknown fields and invalid UTF-8, NULLs and noise."""
    pair = decoders(trees[tree], name, depth, options, framed)
    if pair is None:
        pytest.skip("no table for this message with these options")
    desc = trees[tree].find_message(name)

    @SETTINGS
    @given(st.lists(st.one_of(wire.message(desc), wire.message(desc, unknown=True), st.none(),
                              st.binary(max_size=12)), max_size=12))
    def check(values: list[bytes | None]) -> None:
        if framed:
            values = [None if v is None else encode_frame(7, message_indexes(desc), v) for v in values]
        assert_same(binary(values), *pair)

    check()


@pytest.mark.parametrize("tree,name", ALL_MESSAGES, ids=[f"{t}:{n}" for t, n in ALL_MESSAGES])
def test_fuzzed_bytes_fail_exactly_where_upb_fails(trees: dict[str, Descriptors], tree: str, name: str) -> None:
    """Over a thousand mutated messages per message type: flipped, cut, spliced, inserted bytes, noise."""
    pair = decoders(trees[tree], name, 1, SchemaOptions(max_depth=4, sanitize_names=True))
    if pair is None:
        pytest.skip("no table for this message")
    desc = trees[tree].find_message(name)

    @settings(max_examples=5, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(wire.message(desc, unknown=True), min_size=4, max_size=8), st.integers(0, 2**32))
    def check(seeds: list[bytes], seed: int) -> None:
        rng = random.Random(seed)
        seeds = [s for s in seeds if s] or [b"\x08\x01"]
        values: list[bytes | None] = [mutate(rng, rng.choice(seeds)) for _ in range(600)]
        values += [rng.randbytes(rng.randrange(1, 40)) for _ in range(60)]
        assert_same(binary(values), *pair)

    check()


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        roll = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if roll == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif roll == 1:
            del out[at:]
        elif roll == 2:
            out[at:at] = rng.randbytes(rng.randrange(1, 4))
        elif roll == 3 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randrange(1, 8)]
        elif roll == 4 and out:
            out[min(at, len(out) - 1)] = rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x0C, 0x0B, 0x0E])
        else:
            out += data[: rng.randrange(len(data) + 1)]  # a message concatenated: protobuf merges
    return bytes(out)


@given(values=st.lists(st.binary(max_size=30) | st.none(), max_size=40))
@settings(max_examples=60, deadline=None, database=None, derandomize=True)
def test_noise_agrees(trees: dict[str, Descriptors], values: list[bytes | None]) -> None:
    for name in ("testdata.AllTypes", "testdata.Proto2All", "testdata.Edge3"):
        assert_same(binary(values), *decoders(trees["testdata"], name, 1, RECURSIVE))


@pytest.mark.parametrize("old,new,name", [("evo_v1", "evo_v2", "evo.Event"), ("dlq_v1", "dlq_v2", "dlq.Event")])
@pytest.mark.parametrize("depth", [1, 2], ids=["value", "key"])
def test_newer_writers_are_unknown_fields(trees: dict[str, Descriptors], old: str, new: str, name: str,
                                          depth: int) -> None:
    """Values serialized with a newer proto (v2) and decoded with the table's (v1): the new fields are
    unknown fields, exactly where the reference says so; as a value and as a Kafka key (whose columns sit
    at depth 2, and whose unknown fields the batch core must see too: a key cut short is another key)."""

    @settings(max_examples=10, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(wire.message(trees[new].find_message(name)) | st.none(), min_size=20, max_size=40))
    def check(values: list[bytes | None]) -> None:
        assert_same(binary(values), *decoders(trees[old], name, depth))

    check()
    v2 = trees[new].message_class(name)
    newer = v2(id="x", tags=["a"]) if name == "dlq.Event" else v2(id="x", tags=["a"], detail={"priority": 3})
    got = assert_same(binary([newer.SerializeToString()]), *decoders(trees[old], name, depth))
    assert got.unknown_fields == [0]


def test_sample_bookings_agree_in_big_batches(trees: dict[str, Descriptors]) -> None:
    cls = trees["example"].message_class(sample.EXAMPLE_MESSAGE)
    values: list[bytes | None] = [sample.booking(i, cls).SerializeToString() for i in range(3000)]
    values[7] = None
    values[11] = b"\x0a\xff"
    got = assert_same(binary(values), *decoders(trees["example"], sample.EXAMPLE_MESSAGE))
    assert [f.index for f in got.failures] == [11] and got.values[7].as_py() is None


# A top-level message that is not the file's first, and a nested one: their frames must say so.
FRAMED = ["regtest.Header", "regtest.Order", "regtest.Order.Line.Note"]


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("name", FRAMED)
def test_confluent_frames(trees: dict[str, Descriptors], depth: int, name: str) -> None:
    """Frames naming the class, other messages of its file, random and hostile index arrays, cut anywhere
    (the header too), header noise, mutated: both decoders refuse the same rows with the same message."""
    tree = trees["registry"]
    desc = tree.find_message(name)
    own = list(message_indexes(desc))
    native, reference = decoders(tree, name, depth, SchemaOptions(), framed=True)
    index_arrays = st.one_of(st.just(own), st.just(own), st.sampled_from([[0], [1], [1, 0], [1, 0, 0], [], [-1], [2**40]]),
                             st.lists(st.integers(0, 3) | st.integers(-2**63, 2**63 - 1), max_size=12))

    @settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(wire.message(desc, unknown=True), index_arrays, st.integers(0, 2**32 - 1),
                              st.integers(0, 6)), max_size=30), st.integers(0, 2**32))
    def check(frames: list[tuple[bytes, list[int], int, int]], seed: int) -> None:
        rng = random.Random(seed)
        values: list[bytes | None] = []
        for payload, indexes, schema_id, roll in frames:
            value = encode_frame(schema_id, indexes, payload)
            if roll == 0:
                value = mutate(rng, value)
            elif roll == 1:
                value = value[:rng.randrange(len(value) + 1)]
            elif roll == 2:  # magic byte and id, then noise where the indexes go
                value = b"\x00" + rng.randbytes(4 + rng.randrange(12)) + payload
            values.append(value)
        assert_frames_agree(values, native, reference, name, tuple(own))

    check()
    values: list[bytes | None] = [None, b"", b"\x00", b"\x01\x00\x00\x00\x01\x00", b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x01\x01",
               b"\x00\x00\x00\x00\x01\x02", b"\x00\x00\x00\x00\x01\x04\x02", b"\x00\x00\x00\x00\x01" + b"\xff" * 10,
               b"\x00\x00\x00\x00\x01" + b"\x80" * 9 + b"\x00", b"\x00\x00\x00\x00\x01\x03\x0a\x00",
               b"\x00\x00\x00\x00\x01\x02" + b"\xff" * 9 + b"\x01", b"\x00\x00\x00\x00\x01\x7e" + b"\x02" * 63,
               b"\x00\xff\xff\xff\xff\x12" + b"\x02" * 9, encode_frame(1, own, b""), encode_frame(1, [len(own)], b""),
               encode_frame(1, own + [0], b""), encode_frame(1, own[:-1], b"")]
    assert_frames_agree(values, native, reference, name, tuple(own))


def assert_frames_agree(values: list[bytes | None], native: NativeDecoder, reference: ReferenceDecoder,
                        name: str, expected: tuple[int, ...]) -> None:
    """Native == reference, and every row whose frame `frame_payload` refuses fails in both with its text."""
    got = assert_same(binary(values), native, reference)
    want = reference.decode(binary(values))
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            frame_payload(value, expected, name)
        except WireFormatError as exc:
            for out in (got, want):
                failure = next(f for f in out.failures if f.index == i)
                assert (failure.error_type, failure.message) == (ErrorType.DESERIALIZATION_ERROR, str(exc))
            assert not got.values[i].is_valid


def test_sliced_large_binary_and_empty_inputs(trees: dict[str, Descriptors]) -> None:
    native, reference = decoders(trees["testdata"], "testdata.AllTypes")
    cls = trees["testdata"].message_class("testdata.AllTypes")
    values = binary([cls(f_int32=i, r_string=["x"] * (i % 3), f_message={"label": str(i)}).SerializeToString()
                     for i in range(40)] + [None] * 3)
    assert_same(values.slice(5, 30), native, reference)
    assert_same(values.cast(pa.large_binary()).slice(3), native, reference)
    assert_same(binary([]), native, reference)
    assert_same(binary([None, None]), native, reference)
    with pytest.raises(TypeError):
        native.decode(pa.array(["text"]))


# -- hand-picked edges: what upb does, written down ----------------------------------------------------

# Edge3 and Proto2All contain themselves: at the default depth their tables would pass BigQuery's columns limit.
RECURSIVE = SchemaOptions(max_depth=4)


def _one(trees: dict[str, Descriptors], name: str, value: bytes, options: SchemaOptions = RECURSIVE):  # noqa: ANN202
    native, reference = decoders(trees["testdata"], name, 1, options)
    before = native.escaped_rows
    got = assert_same(binary([value]), native, reference)
    return got, native.escaped_rows - before


def fixed64(number: int, value: int) -> bytes:
    return tag(number, 1) + struct.pack("<Q", value)


EDGES = [
    # (message, bytes, failure type or None, unknown fields?, escaped?)
    ("testdata.AllTypes", tag(7, VARINT) + b"\xff" * 9 + b"\x7f", None, False, False),  # 10th byte's excess bits
    ("testdata.AllTypes", tag(7, VARINT) + b"\xff" * 10 + b"\x01", "DESERIALIZATION_ERROR", False, False),
    ("testdata.AllTypes", b"\x00\x01", "DESERIALIZATION_ERROR", False, False),  # field number 0
    ("testdata.AllTypes", b"\xf8\xff\xff\xff\x0f\x01", None, True, False),  # the largest field number
    ("testdata.AllTypes", b"\x80\x80\x80\x80\x10\x01", "DESERIALIZATION_ERROR", False, False),  # tag past 2^32
    ("testdata.AllTypes", b"\xb8\x80\x00\x01", None, False, False),  # an overlong tag
    ("testdata.AllTypes", b"\x0c", "DESERIALIZATION_ERROR", False, False),  # an end-group outside a group
    ("testdata.AllTypes", b"\xfb\x01\x08\x01\xfc\x01", None, True, False),  # an unknown group
    ("testdata.AllTypes", b"\xfb\x01\xfc\x02", "DESERIALIZATION_ERROR", False, False),
    ("testdata.AllTypes", b"\xfb\x01\x80\x00\x05\x03\x04\xfc\x01", None, True, False),  # field 0 in a group: fine
    ("testdata.AllTypes", tag(2, LEN) + b"\x02\xc3\x28", "DESERIALIZATION_ERROR", False, False),  # proto3 UTF-8
    ("testdata.AllTypes", tag(7, LEN) + b"\x01\x05", None, True, False),  # a packed run on a singular field
    ("testdata.AllTypes", fixed64(11, 2**63), "INVALID_MESSAGE_ERROR", False, False),
    ("testdata.AllTypes", fixed64(11, 2**64 - 1) + fixed64(11, 5), None, False, False),  # the last value wins
    ("testdata.AllTypes", tag(8, VARINT) + varint(2**63) + tag(99, VARINT) + b"\x01", "INVALID_MESSAGE_ERROR", True,
     False),  # unknown fields are reported even for a row that fails on a value
    ("testdata.AllTypes", length_delimited(18, tag(1, VARINT) + varint(253402300800)), "INVALID_MESSAGE_ERROR", False,
     False),
    ("testdata.AllTypes", length_delimited(18, tag(2, VARINT) + varint(-1)), "INVALID_MESSAGE_ERROR", False, False),
    ("testdata.AllTypes", length_delimited(18, tag(1, VARINT) + varint(-62135596800)), None, False, False),
    ("testdata.AllTypes", length_delimited(20, tag(1, VARINT) + varint(5) + tag(2, VARINT) + varint(-1)),
     "INVALID_MESSAGE_ERROR", False, False),  # Duration signs differ
    ("testdata.AllTypes", length_delimited(20, tag(1, VARINT) + varint(-315576000000)), None, False, False),
    ("testdata.AllTypes", length_delimited(19, length_delimited(1, length_delimited(1, b"k") + length_delimited(
        2, tag(2, 1) + struct.pack("<d", float("nan"))))), "INVALID_MESSAGE_ERROR", False, True),  # the reference names it
    ("testdata.AllTypes", length_delimited(17, b"") * 2, None, False, True),  # a message field twice: merged
    ("testdata.AllTypes", length_delimited(28, b"") + length_delimited(27, b"x"), None, False, True),  # oneof
    ("testdata.AllTypes", length_delimited(27, b"x") + length_delimited(28, b""), None, False, False),
    ("testdata.AllTypes", length_delimited(27, b"x") + length_delimited(27, b"yz"), None, False, False),
    ("testdata.Proto2All", tag(1, VARINT) + varint(4), None, True, False),  # a closed enum's unknown number
    ("testdata.Proto2All", length_delimited(3, varint(3) + varint(4) + varint(5)), None, True, False),
    ("testdata.Proto2All", length_delimited(21, length_delimited(1, b"k") + tag(3, VARINT) + b"\x01"), None, True,
     False),  # a map entry with an unknown field is not in the map
    ("testdata.Proto2All", length_delimited(4, length_delimited(1, b"k") + tag(2, VARINT) + varint(3)), None, True,
     False),  # a map entry whose closed enum value is unknown
    ("testdata.Proto2All", length_delimited(5, b"\xc3\x28"), "INVALID_MESSAGE_ERROR", False, True),  # proto2 UTF-8
    ("testdata.Proto2All", length_delimited(8, b""), "INVALID_MESSAGE_ERROR", False, False),  # required missing
    ("testdata.Proto2All", b"\x4a\x00\x22\x00", "INVALID_MESSAGE_ERROR", False, False),  # upb's path bug
    ("testdata.Proto2All", fixed64(12, 2**64 - 1) + length_delimited(150, b""), "INVALID_MESSAGE_ERROR", True, False),
    ("testdata.Required2", b"", "INVALID_MESSAGE_ERROR", False, False),
    ("testdata.Wrapped", length_delimited(12, tag(1, VARINT) + varint(2023) + tag(2, VARINT) + varint(2)
                                          + tag(3, VARINT) + varint(29)), "INVALID_MESSAGE_ERROR", False, False),
    ("testdata.Edge3", length_delimited(8, length_delimited(5, b"") + length_delimited(5, b"")), None, False, True),
    ("testdata.Edge3", length_delimited(8, length_delimited(5, tag(9, 0) + b"\x01") + tag(2, 1) + b"\x00" * 8), None,
     False, False),  # a Struct replaced in its Value's oneof: its unknown field is gone too
]


@pytest.mark.parametrize("name,value,failure,unknown,escaped", EDGES)
def test_edges(trees: dict[str, Descriptors], name: str, value: bytes, failure: str | None, unknown: bool,
               escaped: bool) -> None:
    got, escapes = _one(trees, name, value)
    assert [f.error_type.value for f in got.failures] == ([failure] if failure else [])
    assert got.unknown_fields == ([0] if unknown else [])
    assert escapes == int(escaped)


def _nested(number: int, levels: int, inner: bytes = b"") -> bytes:
    for _ in range(levels):
        inner = length_delimited(number, inner)
    return inner


@pytest.mark.parametrize("levels", [99, 100, 101])
def test_nesting_limit_is_upbs(trees: dict[str, Descriptors], levels: int) -> None:
    """upb refuses messages nested deeper than 100 levels; groups and map entries count too."""
    node = decoders(trees["testdata"], "testdata.Node", 1, SchemaOptions(max_depth=3))
    assert_same(binary([_nested(2, levels)]), *node)
    group = b""
    for _ in range(levels - 1):
        group = tag(40, 3) + group + tag(40, 4)
    assert_same(binary([length_delimited(2, group), group]), *node)
    edge = decoders(trees["testdata"], "testdata.Edge3", 1, SchemaOptions(max_depth=2))
    chain = b""
    for _ in range(levels // 2):
        chain = length_delimited(29, length_delimited(1, b"k") + length_delimited(2, chain))
    struct_chain = b""
    for _ in range(levels // 3):
        struct_chain = length_delimited(1, length_delimited(1, b"k") + length_delimited(2, length_delimited(5, struct_chain)))
    assert_same(binary([chain, length_delimited(25, struct_chain)]), *edge)


@pytest.mark.parametrize("uint64_type,expected", [("NUMERIC", 2**64 - 1), ("STRING", str(2**64 - 1))])
def test_uint64_opt_in_keeps_every_value(trees: dict[str, Descriptors], uint64_type: str, expected: object) -> None:
    options = SchemaOptions(max_depth=4, uint64_type=uint64_type)
    value = fixed64(11, 2**64 - 1) + tag(8, VARINT) + varint(2**63)
    got, _ = _one(trees, "testdata.AllTypes", value, options)
    row = got.values[0].as_py()
    if uint64_type == "NUMERIC":
        assert row["f_fixed64"] == decimal.Decimal(2**64 - 1) and row["f_uint64"] == decimal.Decimal(2**63)
    else:
        assert row["f_fixed64"] == expected and row["f_uint64"] == str(2**63)
    absent, _ = _one(trees, "testdata.AllTypes", b"", options)  # proto3 leaves a 0 off the wire: it reads 0
    zero = decimal.Decimal(0) if uint64_type == "NUMERIC" else "0"
    assert absent.values[0].as_py()["f_fixed64"] == zero and absent.values[0].as_py()["f_uint64"] == zero
    edge, _ = _one(trees, "testdata.Edge3", length_delimited(14, varint(2**64 - 1) + varint(1))
                   + length_delimited(5, tag(1, VARINT) + varint(2**64 - 1) + length_delimited(2, tag(1, VARINT) + varint(2**63))),
                   options)
    assert edge.failures == []


def test_every_test_proto_is_decoded_natively_but_extensions(trees: dict[str, Descriptors]) -> None:
    """The test protos are the shapes users have: only a message with known extensions falls back."""
    unsupported = set()
    for tree, name in ALL_MESSAGES:
        cls = message_factory.GetMessageClass(trees[tree].find_message(name))
        try:
            NativeDecoder(cls, 1, SchemaOptions(max_depth=3, sanitize_names=True))
        except UnsupportedShape:
            unsupported.add(name)
        except SchemaError:  # no table for it at all: not a decoder question
            continue
    assert unsupported == UNSUPPORTED


def test_a_batch_too_big_for_one_column_is_decoded_in_halves(trees: dict[str, Descriptors],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    native, reference = decoders(trees["testdata"], "testdata.AllTypes")
    cls = trees["testdata"].message_class("testdata.AllTypes")
    values = binary([cls(f_string="s" * i, r_timestamp=[{"seconds": i}], m_scalar={"k": i}).SerializeToString()
                     for i in range(64)] + [b"\xff", None])
    decode = native._decode

    def small_batches_only(batch: pa.Array):  # noqa: ANN202
        if len(batch) > 10:
            raise OverflowError("a column of the batch is over 2 GiB")
        return decode(batch)

    monkeypatch.setattr(native, "_decode", small_batches_only)
    assert_same(values, native, reference)


def test_failures_name_the_problem(trees: dict[str, Descriptors]) -> None:
    got, _ = _one(trees, "testdata.Required2", length_delimited(2, b""))
    assert "testdata.Required2.id" in got.failures[0].message and "testdata.Req.a" in got.failures[0].message
    got, _ = _one(trees, "testdata.AllTypes", b"\x0a\x05ab")
    assert got.failures[0].error_type is ErrorType.DESERIALIZATION_ERROR
    assert "testdata.AllTypes" in got.failures[0].message


@pytest.mark.parametrize(("value", "path"), [
    (length_delimited(5, b"\xc3\x28"), "s"),
    (length_delimited(23, b"ok") + length_delimited(23, b"\xff"), "r_s[1]"),
    (length_delimited(21, length_delimited(1, b"\xe2\x82") + length_delimited(2, b"v")), "m_str.key"),
    (length_delimited(21, length_delimited(1, b"k")) + length_delimited(21, length_delimited(1, b"\xff")), "m_str.key"),
    (length_delimited(22, length_delimited(21, length_delimited(1, b"\xff"))), "child.m_str.key"),
    (length_delimited(22, length_delimited(8, tag(1, VARINT) + b"\x01" + length_delimited(2, b"a\x80b"))),
     "child.req.b"),
])
def test_invalid_utf8_in_a_proto2_string_names_its_field(trees: dict[str, Descriptors], value: bytes,
                                                         path: str) -> None:
    """A proto2 string need not be UTF-8, a STRING column must: the row fails naming the field, the same
    from both decoders (the native one hands such a row to the reference)."""
    got, _ = _one(trees, "testdata.Proto2All", value)
    assert [f.error_type for f in got.failures] == [ErrorType.INVALID_MESSAGE_ERROR]
    assert got.failures[0].message.startswith(f"{path}: invalid UTF-8 in a string field"), got.failures[0].message


def test_an_any_cut_to_json_is_unpacked_with_the_jobs_descriptors(trees: dict[str, Descriptors]) -> None:
    """json_format unpacks an Any through a descriptor pool: the job's, where the packed type is, not
    protobuf's default pool (which knows none of the user's types)."""
    tree = trees["testdata"]
    packed, leaf = tree.message_class("testdata.Packed"), tree.message_class("testdata.Leaf")
    msg = packed(note="n")
    msg.any.Pack(leaf(s="x", r=[1]))
    msg.anys.add().Pack(leaf(e=1))
    msg.inner.by_name["k"].Pack(leaf(s="y"))
    unknown_type = packed()
    unknown_type.any.type_url = "type.googleapis.com/nowhere.Missing"
    native, reference = decoders(tree, "testdata.Packed", 1, SchemaOptions(max_depth=1))
    got = assert_same(binary([msg.SerializeToString(), unknown_type.SerializeToString()]), native, reference)
    row = got.values.to_pylist()[0]
    assert json.loads(row["any"]) == {"@type": "type.googleapis.com/testdata.Leaf", "s": "x", "r": [1]}
    assert [json.loads(a) for a in row["anys"]] == [{"@type": "type.googleapis.com/testdata.Leaf", "e": "O_ONE"}]
    assert json.loads(row["inner"]) == {"by_name": {"k": {"@type": "type.googleapis.com/testdata.Leaf", "s": "y"}}}
    # A type no descriptor knows cannot be unpacked: the row fails, naming it.
    assert [(f.index, f.error_type) for f in got.failures] == [(1, ErrorType.INVALID_MESSAGE_ERROR)]
    assert "nowhere.Missing" in got.failures[0].message


@pytest.mark.parametrize(("value", "path"), [
    (length_delimited(22, length_delimited(5, b"\xc3\x28")), "s"),  # child, cut to JSON
    (length_delimited(9, tag(1, VARINT) + b"\x01" + length_delimited(2, b"\xff")), "b"),  # r_req[0], cut
    (length_delimited(21, length_delimited(1, b"k") + length_delimited(2, b"\xe2\x82")), "value"),  # m_str, cut
    (length_delimited(21, length_delimited(1, b"\xe2\x82") + length_delimited(2, b"v")), "key"),
    (length_delimited(22, length_delimited(22, length_delimited(23, b"a\x80b"))), "child.r_s[0]"),
])
def test_invalid_utf8_in_a_proto2_string_cut_to_json_fails_its_row(trees: dict[str, Descriptors], value: bytes,
                                                                    path: str) -> None:
    """json_format writes a non-UTF-8 proto2 string as Python's repr ("b'\\\\xc3('"): the row fails as it
    does where the string has a column, instead of landing with text the producer never sent."""
    got, _ = _one(trees, "testdata.Proto2All", value, SchemaOptions(max_depth=1))
    assert [f.error_type for f in got.failures] == [ErrorType.INVALID_MESSAGE_ERROR], got.values.to_pylist()
    assert got.failures[0].message.startswith(f"{path}: invalid UTF-8 in a string field"), got.failures[0].message
