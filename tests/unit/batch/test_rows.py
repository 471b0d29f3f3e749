"""Source batch → table rows in Arrow: metadata and key columns, tombstones, failures by record index."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from firehose_bq.batch.rows import KEY_UNKNOWN, METADATA_VALUES, NULL_KEY, TOMBSTONE, RowBuilder, SchemaIds, insert_ids
from firehose_bq.decode import make_value_decoder, native_unavailable
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.decode.unknown import UnknownFieldsJson
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ErrorType
from firehose_bq.registry.confluent import encode_frame, message_indexes
from firehose_bq.schema import ADDITIONAL_PROPERTIES, KEY_COLUMN, METADATA_COLUMNS, MetadataColumns, SchemaOptions, \
    table_schema
from firehose_bq.arrow_schema import arrow_schema
from tests.unit.batch.sources import source_batch
from tests.unit.populated import populated_key, populated_messages

LOAD_US = 1_763_891_000_250_000  # 2025-11-23T09:43:20.25Z


def builder(descriptors: Descriptors, message: str, metadata: MetadataColumns = MetadataColumns(), key: str | None = None,
            changelog: bool = False, decoder: str = "python") -> RowBuilder:
    """Decoders as batch.core.row_builder makes them: unknown fields detected in the value and the key."""
    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    values = make_value_decoder(descriptors.message_class(message), prefer=decoder)
    keys = make_value_decoder(descriptors.message_class(key), 2, prefer=decoder) if key else None
    return RowBuilder(values, metadata, keys, changelog=changelog)


def test_rows_carry_the_table_schema_metadata_and_load_time(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Inner")
    source = source_batch([cls(label="a").SerializeToString(), cls(label="b", counts=[1, 2]).SerializeToString()],
                          offsets=[10, 11], timestamps_ms=[1_000, -1])
    rows = builder(test_descriptors, "testdata.Inner").build(source, LOAD_US)
    table = rows.table()
    expected = arrow_schema(table_schema(cls.DESCRIPTOR, MetadataColumns()))
    assert table.schema.names == expected.names
    assert [f.type for f in table.schema] == [f.type for f in expected]
    first, second = table.to_pylist()
    assert first["label"] == "a" and second["counts"] == [1, 2]
    assert (first["message_topic"], first["message_partition"], first["message_offset"]) == ("t", 0, 10)
    assert first["message_timestamp"] == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert second["message_timestamp"] is None  # Kafka's -1: no timestamp
    assert first["load_time"] == second["load_time"] == datetime(2025, 11, 23, 9, 43, 20, 250000, tzinfo=UTC)
    assert insert_ids(source).to_pylist() == ["t_0_10", "t_0_11"]


def test_every_metadata_column_and_the_namespace(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Inner")
    value = cls(label="x").SerializeToString()
    source = source_batch([value] * 3, headers=[[("h", b"\x01"), ("n", None)], [], None],
                          timestamp_types=[0, 1, -1], leader_epochs=[5, -1, None])
    metadata = MetadataColumns(columns=tuple(METADATA_COLUMNS))
    table = builder(test_descriptors, "testdata.Inner", metadata).build(source, LOAD_US).table()
    rows = table.to_pylist()
    assert [r["message_headers"] for r in rows] == [[{"key": "h", "value": b"\x01"}, {"key": "n", "value": None}], [], []]
    assert [r["message_timestamp_type"] for r in rows] == ["CreateTime", "LogAppendTime", "NoTimestampType"]
    assert [r["message_leader_epoch"] for r in rows] == [5, None, None]
    assert table.schema.field("message_headers").type == arrow_schema(metadata.fields()).field("message_headers").type

    nested = builder(test_descriptors, "testdata.Inner", MetadataColumns(namespace="kafka")).build(source, LOAD_US)
    row = nested.table().to_pylist()[0]
    assert set(row["kafka"]) == set(MetadataColumns.NAMES) and "message_offset" not in row
    assert "message_topic" not in builder(test_descriptors, "testdata.Inner", MetadataColumns(enabled=False)).build(
        source, LOAD_US).table().schema.names


def test_failures_name_their_record_and_leave_the_rows(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    values = [cls(id="ok").SerializeToString(), b"\xff\xff", None, cls(count=1).SerializePartialToString(),
              cls(id="fine").SerializeToString()]
    rows = builder(test_descriptors, "testdata.Legacy").build(source_batch(values), LOAD_US)
    assert rows.sources.tolist() == [0, 4] and [r["id"] for r in rows.table().to_pylist()] == ["ok", "fine"]
    kinds = [(f.index, f.error_type) for f in rows.failures]
    assert kinds == [(1, ErrorType.DESERIALIZATION_ERROR), (2, ErrorType.INVALID_MESSAGE_ERROR),
                     (3, ErrorType.INVALID_MESSAGE_ERROR)]
    assert rows.failures[1].message == TOMBSTONE and "id" in rows.failures[2].message


def test_key_column_and_its_failures(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Inner")
    key_cls = test_descriptors.message_class("testdata.Key")
    key = key_cls(id="k1")
    key.day.year, key.day.month, key.day.day = 2026, 11, 23
    value = cls(label="v").SerializeToString()
    source = source_batch([value] * 3, keys=[key.SerializeToString(), None, b"\xff"])
    rows = builder(test_descriptors, "testdata.Inner", MetadataColumns(enabled=False), key="testdata.Key").build(
        source, LOAD_US)
    table = rows.table()
    assert table.schema.names == ["label", "counts", KEY_COLUMN]
    assert [r[KEY_COLUMN] for r in table.to_pylist()] == [{"id": "k1", "day": datetime(2026, 11, 23).date()}, None]
    assert [(f.index, f.error_type) for f in rows.failures] == [(2, ErrorType.DESERIALIZATION_ERROR)]
    assert rows.failures[0].message.startswith("key: ")


def test_changelog_keeps_tombstones_as_deletes_and_needs_keys(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Inner")
    key = test_descriptors.message_class("testdata.Key")(id="k").SerializeToString()
    source = source_batch([cls(label="v").SerializeToString(), None, None], keys=[key, key, None])
    rows = builder(test_descriptors, "testdata.Inner", key="testdata.Key", changelog=True).build(source, LOAD_US)
    assert rows.sources.tolist() == [0, 1] and rows.deletes.tolist() == [False, True]
    assert rows.values.to_pylist()[1] is None and rows.key.to_pylist()[1] == {"id": "k", "day": None}
    assert [(f.index, f.message) for f in rows.failures] == [(2, NULL_KEY)]
    with pytest.raises(ValueError):
        builder(test_descriptors, "testdata.Inner", changelog=True)


def test_unknown_fields_are_reported_by_record(test_descriptors: Descriptors) -> None:
    inner = test_descriptors.message_class("testdata.Inner")
    newer = inner(label="x").SerializeToString() + b"\xa0\x06\x01"  # field 100, varint 1
    rows = builder(test_descriptors, "testdata.Inner").build(source_batch([inner().SerializeToString(), newer]),
                                                             LOAD_US)
    assert rows.unknown_fields == [1] and rows.sources.tolist() == [0, 1]


def test_take_keeps_rows_and_their_sources_together(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Inner")
    source = source_batch([cls(label=str(i)).SerializeToString() for i in range(4)], offsets=[5, 6, 7, 8])
    rows = builder(test_descriptors, "testdata.Inner").build(source, LOAD_US).take([1, 3])
    assert rows.sources.tolist() == [1, 3]
    assert [(r["label"], r["message_offset"]) for r in rows.table().to_pylist()] == [("1", 6), ("3", 8)]


def test_schema_options_reach_the_decoder(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Node")
    msg = cls(name="a")
    msg.child.name = "b"
    msg.child.child.name = "c"
    decoder = ReferenceDecoder(cls, options=SchemaOptions(max_depth=2))
    rows = RowBuilder(decoder, MetadataColumns(enabled=False)).build(source_batch([msg.SerializeToString()]), LOAD_US)
    assert rows.table().to_pylist()[0]["child"] == {"name": "b", "child": '{"name": "c"}'}
    assert pa.types.is_string(rows.table().schema.field("child").type.field("child").type)


def test_metadata_values_cover_every_metadata_column() -> None:
    assert METADATA_VALUES.keys() == METADATA_COLUMNS.keys()


def test_chosen_metadata_columns_from_what_kafka_gives(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    source = source_batch([cls(id="a").SerializeToString()] * 4, offsets=[7, 8, 9, 10],
                          timestamps_ms=[5, -1, None, 0],
                          headers=[[("h", b"\x00\xff"), ("empty", None)], [], [("h", b"")], None],
                          timestamp_types=[0, 1, None, -1], leader_epochs=[3, -1, None, 0])
    names = ("message_headers", "message_timestamp_type", "message_leader_epoch", "message_timestamp")
    table = builder(test_descriptors, "testdata.Legacy", MetadataColumns(columns=names)).build(source, LOAD_US).table()
    assert table.schema.names == ["id", "count", "tags", *names]
    assert [tuple(r[n] for n in names) for r in table.to_pylist()] == [
        ([{"key": "h", "value": b"\x00\xff"}, {"key": "empty", "value": None}], "CreateTime", 3,
         datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)),
        ([], "LogAppendTime", None, None),
        ([{"key": "h", "value": b""}], "NoTimestampType", None, None),
        ([], "NoTimestampType", 0, datetime(1970, 1, 1, tzinfo=UTC)),
    ]


def test_bad_values_fail_alone_and_keep_their_record(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.AllTypes")
    too_far = cls()
    too_far.f_timestamp.seconds = 253402300800  # year 10000: BigQuery cannot hold it
    good = cls(f_string="ok").SerializeToString()
    source = source_batch([good, b"\x0a\x05ab", None, too_far.SerializeToString(), good], offsets=range(10, 15))
    rows = builder(test_descriptors, "testdata.AllTypes").build(source, LOAD_US)
    assert [r["f_string"] for r in rows.table().to_pylist()] == ["ok", "ok"]
    assert rows.sources.tolist() == [0, 4]
    assert insert_ids(source).take(pa.array(rows.sources)).to_pylist() == ["t_0_10", "t_0_14"]
    assert [(f.index, f.error_type) for f in rows.failures] == [
        (1, ErrorType.DESERIALIZATION_ERROR), (2, ErrorType.INVALID_MESSAGE_ERROR),
        (3, ErrorType.INVALID_MESSAGE_ERROR)]
    assert "outside" in rows.failures[2].message


def test_a_key_with_an_invalid_value_fails_its_record(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    key_cls = test_descriptors.message_class("testdata.Key")
    source = source_batch([cls(id="v").SerializeToString()] * 2,
                          keys=[key_cls(id="k").SerializeToString(), key_cls(day={"year": 2026}).SerializeToString()])
    rows = builder(test_descriptors, "testdata.Legacy", MetadataColumns(enabled=False), key="testdata.Key").build(
        source, LOAD_US)
    assert rows.sources.tolist() == [0]
    assert [(f.index, f.error_type) for f in rows.failures] == [(1, ErrorType.INVALID_MESSAGE_ERROR)]
    assert rows.failures[0].message.startswith("key: ") and "google.type.Date 2026-0-0" in rows.failures[0].message


def test_a_tombstone_row_holds_only_its_key_and_metadata(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.Legacy")
    key = test_descriptors.message_class("testdata.Key")(id="k").SerializeToString()
    source = source_batch([cls(id="v").SerializeToString(), None], keys=[key, key], offsets=[10, 11])
    rows = builder(test_descriptors, "testdata.Legacy", MetadataColumns(columns=("message_offset",)),
                   key="testdata.Key", changelog=True).build(source, LOAD_US)
    row, tombstone = rows.table().to_pylist()
    assert row == {"id": "v", "count": None, "tags": [], KEY_COLUMN: {"id": "k", "day": None}, "message_offset": 10}
    assert (tombstone["id"], tombstone[KEY_COLUMN], tombstone["message_offset"]) == (None, {"id": "k", "day": None}, 11)
    assert rows.deletes.tolist() == [False, True]


def test_unknown_fields_with_a_key_column(test_descriptors: Descriptors) -> None:
    cls = test_descriptors.message_class("testdata.AllTypes")
    key = test_descriptors.message_class("testdata.Key")(id="k").SerializeToString()
    values = [cls(f_string="a").SerializeToString() + b"\xf8\x03\x01", cls(f_string="b").SerializeToString()]
    rows = builder(test_descriptors, "testdata.AllTypes", MetadataColumns(enabled=False), key="testdata.Key").build(
        source_batch(values, keys=[key, key]), LOAD_US)
    assert rows.unknown_fields == [0] and rows.failures == []
    assert [(r["f_string"], r[KEY_COLUMN]) for r in rows.table().to_pylist()] == [("a", {"id": "k", "day": None}),
                                                                                ("b", {"id": "k", "day": None})]


NEWER = b"\xa0\x06\x01"  # field 100 = 1: in no version of the test protos


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_keys_unknown_fields_are_reported_by_record(test_descriptors: Descriptors, decoder: str) -> None:
    """Appended (not a changelog): the key is decoded without them, like a value; the record is listed in
    `unknown_fields` (for the hold and the policy) and in `key_unknown_fields` (whose they are)."""
    cls, key_cls = test_descriptors.message_class("testdata.Inner"), test_descriptors.message_class("testdata.Key")
    key = key_cls(id="k").SerializeToString()
    source = source_batch([cls(label=x).SerializeToString() for x in "ab"] + [cls(label="c").SerializeToString() + NEWER],
                          keys=[key, key + NEWER, key + NEWER])
    rows = builder(test_descriptors, "testdata.Inner", MetadataColumns(enabled=False), key="testdata.Key",
                   decoder=decoder).build(source, LOAD_US)
    assert rows.failures == [] and rows.sources.tolist() == [0, 1, 2]
    assert rows.unknown_fields == [1, 2] and rows.key_unknown_fields == [1, 2]
    assert [r[KEY_COLUMN] for r in rows.table().to_pylist()] == [{"id": "k", "day": None}] * 3


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_changelogs_key_with_unknown_fields_fails_its_record(test_descriptors: Descriptors, decoder: str) -> None:
    """Merged by a key cut short, two keys would become one row: an UNKNOWN_FIELDS_ERROR naming the key,
    one per record (whatever else is wrong with it), and still listed for the hold."""
    cls, key_cls = test_descriptors.message_class("testdata.Inner"), test_descriptors.message_class("testdata.Key")
    key = key_cls(id="k").SerializeToString()
    value = cls(label="v").SerializeToString()
    source = source_batch([value, value, None, value + NEWER, b"\xff", value + NEWER],
                          keys=[key, key + NEWER, key + NEWER, key + NEWER, key + NEWER, key])
    rows = builder(test_descriptors, "testdata.Inner", MetadataColumns(enabled=False), key="testdata.Key",
                   changelog=True, decoder=decoder).build(source, LOAD_US)
    # 0: fine; 1: the key's; 2: a tombstone of such a key (it would delete another key's row); 3: both
    # key and value, one error; 4: a value that does not parse keeps its own error; 5: the value's alone
    # follow the policy later (batch core).
    assert [(f.index, f.error_type) for f in rows.failures] == [
        (1, ErrorType.UNKNOWN_FIELDS_ERROR), (2, ErrorType.UNKNOWN_FIELDS_ERROR), (3, ErrorType.UNKNOWN_FIELDS_ERROR),
        (4, ErrorType.DESERIALIZATION_ERROR)]
    assert [f.message for f in rows.failures[:3]] == [KEY_UNKNOWN] * 3 and KEY_UNKNOWN.startswith("key: ")
    assert rows.sources.tolist() == [0, 5] and rows.deletes.tolist() == [False, False]
    assert rows.unknown_fields == [1, 2, 3, 4, 5] and rows.key_unknown_fields == [1, 2, 3, 4]


@pytest.mark.parametrize("options", [SchemaOptions(), SchemaOptions(max_depth=1), SchemaOptions(max_depth=3)])
def test_rows_are_the_tables_columns(test_descriptors: Descriptors, options: SchemaOptions) -> None:
    """The lock-step between schema.py (the table) and the decoders (the rows), with every extra column."""
    key_cls = test_descriptors.message_class("testdata.Key")
    key = populated_key(test_descriptors).SerializeToString()
    metadata = MetadataColumns(namespace="kafka", columns=tuple(METADATA_COLUMNS))
    for msg in populated_messages(test_descriptors):
        values = ReferenceDecoder(type(msg), options=options)
        keys = ReferenceDecoder(key_cls, depth=2, options=options)
        source = source_batch([msg.SerializeToString()], keys=[key], headers=[[("h", b"v")]])
        rows = RowBuilder(values, metadata, keys).build(source, LOAD_US)
        assert rows.failures == [], (msg.DESCRIPTOR.full_name, rows.failures)
        table = rows.table()
        expected = arrow_schema(table_schema(msg.DESCRIPTOR, metadata, options, key=key_cls.DESCRIPTOR))
        assert table.schema.names == expected.names
        message = [n for n in expected.names if n != "kafka"]
        assert [table.schema.field(n).type for n in message] == [expected.field(n).type for n in message], \
            msg.DESCRIPTOR.full_name
        # The namespace's struct is built from the columns as they are, without the table's NOT NULL on
        # its REPEATED child: compared field by field.
        assert [(f.name, f.type) for f in table.schema.field("kafka").type] == \
            [(f.name, f.type) for f in expected.field("kafka").type]


@pytest.mark.parametrize("decoder", ["native", "python"])
@pytest.mark.parametrize("framed", [False, True])
def test_additional_properties_hold_the_flagged_rows_unknown_fields(test_descriptors: Descriptors, decoder: str,
                                                                    framed: bool) -> None:
    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    cls = test_descriptors.message_class("testdata.AllTypes")
    frame = (lambda v: encode_frame(3, message_indexes(cls.DESCRIPTOR), v)) if framed else (lambda v: v)
    plain = cls(f_string="a", r_message=[{"label": "x"}]).SerializeToString()
    inner_newer = b"\x0a\x01y" + b"\x38\x05"  # Inner{label: "y", <7: 5>}
    newer = (cls(f_string="b").SerializeToString() + b"\xa0\x06\x01"  # <100: 1>
             + b"\xb2\x01" + bytes([len(inner_newer)]) + inner_newer)  # r_message[0] = that Inner
    broken = b"\xff"
    source = source_batch([frame(v) for v in (plain, newer, broken, newer)], offsets=[1, 2, 3, 4],
                          keys=[b"\x0a\x01k"] * 4)  # Inner{label: "k"}
    values = make_value_decoder(cls, confluent_framed=framed, prefer=decoder)
    key = make_value_decoder(test_descriptors.message_class("testdata.Inner"), 2, prefer=decoder)
    metadata = MetadataColumns(namespace="kafka")
    rows = RowBuilder(values, metadata, key, unknown=UnknownFieldsJson(cls, framed)).build(source, LOAD_US)
    assert rows.unknown_fields == [1, 3] and rows.sources.tolist() == [0, 1, 3]
    assert [(f.index, f.error_type) for f in rows.failures] == [(2, ErrorType.DESERIALIZATION_ERROR)]
    table = rows.table()
    schema = table_schema(cls.DESCRIPTOR, metadata, key=test_descriptors.find_message("testdata.Inner"),
                          additional_properties=True)
    assert table.schema.names == [f.name for f in schema] and table.schema.names[-1] == ADDITIONAL_PROPERTIES
    assert table.schema.field(ADDITIONAL_PROPERTIES).type == pa.string()
    expected = {"100": [1], "r_message": [{"7": [5]}]}
    assert [r[ADDITIONAL_PROPERTIES] and json.loads(r[ADDITIONAL_PROPERTIES]) for r in table.to_pylist()] == \
        [None, expected, expected]
    assert table.to_pylist()[1]["r_message"] == [{"label": "y", "counts": []}]  # known columns as ever
    assert rows.take([2]).table()[ADDITIONAL_PROPERTIES].to_pylist() == [json.dumps(expected, separators=(",", ":"))]


def test_without_additional_properties_there_is_no_column(test_descriptors: Descriptors) -> None:
    inner = test_descriptors.message_class("testdata.Inner")
    newer = inner(label="x").SerializeToString() + b"\xa0\x06\x01"
    rows = builder(test_descriptors, "testdata.Inner").build(source_batch([newer]), LOAD_US)
    assert rows.additional is None and ADDITIONAL_PROPERTIES not in rows.table().schema.names


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_frame_with_a_schema_id_of_no_version_of_the_subject_is_refused(test_descriptors: Descriptors,
                                                                          decoder: str) -> None:
    """Same message indexes, another subject's schema id: the bytes would decode, into a wrong row."""
    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    cls = test_descriptors.message_class("testdata.Inner")
    indexes = message_indexes(cls.DESCRIPTOR)
    ok, newer = cls(label="a").SerializeToString(), cls(label="b").SerializeToString() + b"\xa0\x06\x01"
    source = source_batch([encode_frame(1, indexes, ok), encode_frame(9, indexes, ok), b"\x00\x00",
                           encode_frame(5, indexes, newer), encode_frame(2 ** 32 - 1, indexes, newer), None,
                           encode_frame(9, [7], ok)], offsets=list(range(10, 17)))
    allowed = SchemaIds("orders-value", frozenset({5, 1, 2}))
    values = make_value_decoder(cls, confluent_framed=True, detect_unknown_fields=True, prefer=decoder)
    rows = RowBuilder(values, MetadataColumns(), schema_ids=allowed).build(source, LOAD_US)
    assert rows.unknown_schema_ids == [1, 4] and rows.sources.tolist() == [0, 3]
    assert rows.unknown_fields == [3, 4]
    refused = "schema id {} is not a version of subject orders-value (known: 1, 2, 5)"
    by_index = {f.index: (f.error_type, f.message) for f in rows.failures}
    assert [by_index[i] for i in (1, 4)] == [(ErrorType.DESERIALIZATION_ERROR, refused.format(9)),
                                            (ErrorType.DESERIALIZATION_ERROR, refused.format(2 ** 32 - 1))]
    # a malformed frame and one naming another message keep their own error; a NULL value is a tombstone
    assert by_index[2][0] is ErrorType.DESERIALIZATION_ERROR and "not a version" not in by_index[2][1]
    assert "message indexes [7]" in by_index[6][1] and by_index[5] == (ErrorType.INVALID_MESSAGE_ERROR, TOMBSTONE)
    assert [r["label"] for r in rows.table().to_pylist()] == ["a", "b"]
    unchecked = RowBuilder(values, MetadataColumns()).build(source, LOAD_US)
    assert unchecked.unknown_schema_ids == [] and unchecked.sources.tolist() == [0, 1, 3, 4]


def test_an_unknown_schema_ids_message_lists_a_long_history_cut() -> None:
    ids = SchemaIds("s", frozenset(range(100, 130)))
    assert ids.refusal(7) == ("schema id 7 is not a version of subject s (known: "
                              + ", ".join(map(str, range(100, 120))) + ", ...)")


# Click's second version declares a message above it: Click's message indexes go from [0] to [1].
CLICK_V1 = 'syntax = "proto3"; package shop; message Click { string id = 1; int64 n = 2; }'
CLICK_V2 = ('syntax = "proto3"; package shop; message Referrer { string url = 1; }\n'
            'message Click { string id = 1; int64 n = 2; Referrer ref = 3; map<string, Referrer> by = 4; '
            'message Inner { string x = 1; } }')


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_an_older_versions_frame_names_the_class_by_that_versions_indexes(decoder: str) -> None:
    """Confluent's serializers write the indexes of the writer's schema, the frame's schema id: a producer
    still on version 1 names Click [0], which the latest version gives to Referrer."""
    from firehose_bq.registry.confluent import ConfluentSchema, compile_proto

    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    v1, v2 = (ConfluentSchema(i, Descriptors((compile_proto("shop.proto", {"shop.proto": text}, "test"),)),
                              "shop.proto") for i, text in ((1, CLICK_V1), (2, CLICK_V2)))
    assert v1.indexes_by_name() == {"shop.Click": (0,)}
    # map entries are not counted, as Confluent's serializers count
    assert v2.indexes_by_name() == {"shop.Referrer": (0,), "shop.Click": (1,), "shop.Click.Inner": (1, 0)}
    old, click, referrer = (v.descriptors.message_class(n) for v, n in
                            ((v1, "shop.Click"), (v2, "shop.Click"), (v2, "shop.Referrer")))
    source = source_batch([encode_frame(1, [0], old(id="old", n=1).SerializeToString()),
                           encode_frame(2, [1], click(id="new", n=2, ref={"url": "u"}).SerializeToString()),
                           encode_frame(2, [0], referrer(url="r").SerializeToString()),  # a Referrer of version 2
                           encode_frame(1, [1], old(id="x").SerializeToString()),  # version 1 has no [1]
                           b"\x00\x00\x00\x00\x01\x03"],  # version 1's id, a cut frame
                          offsets=list(range(5)))
    ids = SchemaIds("shop-value", frozenset({1, 2}), "shop.Click", indexes=(1,), moved={1: (0,)})
    values = make_value_decoder(click, confluent_framed=True, detect_unknown_fields=True, prefer=decoder)
    rows = RowBuilder(values, MetadataColumns(), schema_ids=ids).build(source, LOAD_US)
    assert [(r["id"], r["n"]) for r in rows.table().to_pylist()] == [("old", 1), ("new", 2)]
    assert rows.sources.tolist() == [0, 1] and rows.unknown_schema_ids == [] and rows.unknown_fields == []
    by_index = {f.index: (f.error_type, f.message) for f in rows.failures}
    assert sorted(by_index) == [2, 3, 4] and {t for t, _ in by_index.values()} == {ErrorType.DESERIALIZATION_ERROR}
    assert "names message indexes [0] (schema id 2), the configured class shop.Click is [1]" in by_index[2][1]
    assert by_index[3][1].endswith("names message indexes [1] (schema id 1), the configured class shop.Click is [0] "
                                   "in that version")
    # what goes to the DLQ is the record as it was written, not the frame rewritten for decoding
    assert source["value"][0].as_py()[5:6] == b"\x00"


def test_an_older_versions_indexes_reach_a_class_named_with_a_leading_dot() -> None:
    """INPUT_SCHEMA_PROTO_CLASS may be spelled as protobuf spells full names, `.shop.Click` (find_message
    takes it): the older version's indexes are still the class's, so its writers' records land."""
    from firehose_bq.batch.core import row_builder
    from firehose_bq.registry.confluent import compile_proto
    from firehose_bq.sink_schema import SinkSpec

    v1, v2 = (Descriptors((compile_proto("shop.proto", {"shop.proto": text}, "test"),)) for text in (CLICK_V1, CLICK_V2))
    latest = Descriptors(v2.sets, schema_ids=frozenset({1, 2}), moved_indexes={1: {"shop.Click": (0,)}})
    source = source_batch([encode_frame(1, [0], v1.message_class("shop.Click")(id="old", n=1).SerializeToString())])
    spec = SinkSpec(latest, ".shop.Click", MetadataColumns(), confluent_framed=True, schema_subject="shop-value",
                    decoder="python")
    rows = row_builder(spec, False, ".shop.Click").build(source, LOAD_US)
    assert rows.failures == [] and [(r["id"], r["n"]) for r in rows.table().to_pylist()] == [("old", 1)]


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_a_version_without_the_class_has_no_record_of_it(decoder: str) -> None:
    """Version 1 declared only Purchase, at [0]; version 2 declares Click above it. A version-1 record
    names Purchase by [0], the latest's indexes of Click: it is refused, never decoded as a Click."""
    from firehose_bq.registry.cache import _moved_indexes
    from firehose_bq.registry.confluent import ConfluentSchema, compile_proto

    if decoder == "native" and native_unavailable():
        pytest.skip(native_unavailable())
    texts = {1: 'syntax = "proto3"; package shop; message Purchase { string id = 1; int64 n = 2; }',
             2: ('syntax = "proto3"; package shop; message Click { string id = 1; int64 n = 2; }\n'
                 'message Purchase { string id = 1; int64 n = 2; }')}
    schemas = {i: ConfluentSchema(i, Descriptors((compile_proto("shop.proto", {"shop.proto": t}, "test"),)), "shop.proto")
               for i, t in texts.items()}

    class Registry:
        def schema(self, schema_id: int) -> ConfluentSchema:
            return schemas[schema_id]

    moved = _moved_indexes(Registry(), schemas[2], frozenset({1, 2}))  # type: ignore[arg-type]
    purchase, click = (schemas[i].descriptors.message_class(n) for i, n in ((1, "shop.Purchase"), (2, "shop.Click")))
    source = source_batch([encode_frame(1, [0], purchase(id="p", n=7).SerializeToString()),
                           encode_frame(2, [0], click(id="c", n=1).SerializeToString())])
    ids = SchemaIds("shop-value", frozenset({1, 2}), "shop.Click", (0,),
                    {i: names["shop.Click"] for i, names in moved.items() if "shop.Click" in names})
    values = make_value_decoder(click, confluent_framed=True, detect_unknown_fields=True, prefer=decoder)
    rows = RowBuilder(values, MetadataColumns(), schema_ids=ids).build(source, LOAD_US)
    assert [r["id"] for r in rows.table().to_pylist()] == ["c"]
    assert [(f.index, f.error_type) for f in rows.failures] == [(0, ErrorType.DESERIALIZATION_ERROR)]
    assert rows.failures[0].message.endswith("(schema id 1), the configured class shop.Click is not declared in "
                                             "that version")
