"""Rows fitted to a live table before they leave: spellings, casts, and the rows that cannot be sent."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from google.cloud.bigquery import SchemaField as F

from firehose_bq.arrow_schema import TIMESTAMP, arrow_schema
from firehose_bq.bigquery.conform import LiveTable, fit
from firehose_bq.errors import ErrorType, RowError, SinkError

UTC = dt.UTC
MISFIT, OUT_OF_RANGE = ErrorType.SINK_4XX_ERROR, ErrorType.INVALID_MESSAGE_ERROR


def batch(columns: dict[str, Any], types: dict[str, pa.DataType] | None = None) -> pa.RecordBatch:
    types = types or {}
    return pa.RecordBatch.from_arrays([pa.array(v, types.get(k)) for k, v in columns.items()], names=list(columns))


def failures(fitted: Any) -> list[tuple[int, ErrorType, str]]:
    return [(f.index, f.error_type, f.message) for f in fitted.failures]


def test_names_match_case_insensitively_and_leave_in_the_tables_spelling_at_every_depth() -> None:
    table = [F("OrderNo", "STRING"),
             F("Pick", "RECORD", fields=[F("Lat", "FLOAT"), F("Inner", "RECORD", fields=[F("X", "INTEGER")])]),
             F("Items", "RECORD", mode="REPEATED", fields=[F("SKU", "STRING")])]
    rows = pa.RecordBatch.from_pylist(
        [{"orderno": "A1", "pick": {"lat": 1.5, "inner": {"x": 7}}, "items": [{"sku": "s"}]}],
        schema=arrow_schema([F("orderno", "STRING"),
                             F("pick", "RECORD", fields=[F("lat", "FLOAT"), F("inner", "RECORD", fields=[F("x", "INTEGER")])]),
                             F("items", "RECORD", mode="REPEATED", fields=[F("sku", "STRING")])]))

    fitted = fit(rows, table, "p.d.t")

    assert fitted.failures == [] and fitted.unknown == []
    assert fitted.rows.schema == arrow_schema(table)
    assert fitted.rows.to_pylist() == [{"OrderNo": "A1", "Pick": {"Lat": 1.5, "Inner": {"X": 7}}, "Items": [{"SKU": "s"}]}]


def test_a_column_the_table_lacks_is_dropped_when_null_and_fails_the_rows_that_hold_a_value() -> None:
    table = [F("id", "INTEGER"), F("rec", "RECORD", fields=[F("a", "INTEGER")])]
    rows = batch({"id": [1, 2, 3], "never": [None, None, None], "later": [None, "x", None],
                  "tags_later": [[], [], ["t"]],
                  "rec": [{"a": 1, "b": None}, {"a": 2, "b": None}, {"a": 3, "b": 5}]},
                 {"tags_later": pa.list_(pa.string())})

    fitted = fit(rows, table, "p.d.t")

    assert failures(fitted) == [(1, MISFIT, "table p.d.t has no column later"),
                                (2, MISFIT, "table p.d.t has no column tags_later")]
    assert sorted(fitted.unknown) == ["later", "rec.b", "tags_later"]
    assert fitted.rows.schema.names == ["id", "rec"]
    assert fitted.rows.to_pylist() == [{"id": 1, "rec": {"a": 1}}]
    assert fitted.positions.tolist() == [0]


def test_required_columns_and_fields() -> None:
    table = [F("id", "INTEGER", mode="REQUIRED"),
             F("rec", "RECORD", fields=[F("must", "STRING", mode="REQUIRED"), F("may", "STRING")]),
             F("items", "RECORD", mode="REPEATED", fields=[F("sku", "STRING", mode="REQUIRED")])]
    rows = pa.RecordBatch.from_pylist([
        {"id": 1, "rec": None, "items": []},  # a NULL record has no REQUIRED field to miss
        {"id": None, "rec": {"must": "x"}, "items": []},
        {"id": 3, "rec": {"must": None, "may": "y"}, "items": []},
        {"id": 4, "rec": {"must": "x"}, "items": [{"sku": "a"}, {"sku": None}]},
    ], schema=pa.schema([pa.field("id", pa.int64()),
                         pa.field("rec", pa.struct([("must", pa.string()), ("may", pa.string())])),
                         pa.field("items", pa.list_(pa.struct([("sku", pa.string())])))]))

    fitted = fit(rows, table)

    assert failures(fitted) == [(1, MISFIT, "NULL in REQUIRED column id"),
                                (2, MISFIT, "NULL in REQUIRED column rec.must"),
                                (3, MISFIT, "NULL in REQUIRED column items.sku")]
    assert fitted.positions.tolist() == [0]


def test_a_required_column_the_batch_lacks_fails_every_row_but_an_absent_repeated_one_does_not() -> None:
    table = [F("id", "INTEGER"), F("must", "STRING", mode="REQUIRED"), F("tags", "STRING", mode="REPEATED")]
    fitted = fit(batch({"id": [1, 2]}), table)
    assert failures(fitted) == [(0, MISFIT, "REQUIRED column must is missing"),
                                (1, MISFIT, "REQUIRED column must is missing")]
    assert fit(batch({"id": [1], "must": ["x"]}), table).failures == []


def test_null_arrays_become_empty_and_null_elements_fail_the_row() -> None:
    table = [F("tags", "STRING", mode="REPEATED"),
             F("maps", "RECORD", mode="REPEATED", fields=[F("key", "STRING"), F("value", "STRING")])]
    rows = batch({"tags": [None, ["a", None], ["b"]],
                  "maps": [None, [], [{"key": "k", "value": None}]]},
                 {"tags": pa.list_(pa.string()), "maps": pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))})

    fitted = fit(rows, table)

    assert failures(fitted) == [(1, MISFIT, "NULL element in REPEATED column tags: BigQuery arrays cannot hold NULL")]
    assert fitted.rows.to_pylist() == [{"tags": [], "maps": []}, {"tags": ["b"], "maps": [{"key": "k", "value": None}]}]
    assert fitted.rows.column("tags").null_count == 0


def test_values_are_cast_to_the_columns_type_only_when_nothing_is_lost() -> None:
    table = [F("n", "INTEGER"), F("f", "FLOAT"), F("s", "STRING"), F("ts", "TIMESTAMP"), F("num", "NUMERIC"),
             F("b", "BYTES")]
    rows = batch({"n": [1, 2, 3], "f": [1, 2**60, None], "s": [None, 5, None],
                  "ts": [dt.datetime(2026, 1, 2), None, None], "num": [Decimal("1.5"), None, None],
                  "b": ["text", None, None]},
                 {"n": pa.int32(), "f": pa.int64(), "s": pa.int64(), "ts": pa.timestamp("ms"),
                  "num": pa.decimal128(5, 1), "b": pa.string()})

    fitted = fit(rows, table)

    assert [(p, kind) for p, kind, _ in failures(fitted)] == [(1, MISFIT)]  # 2**60 is no exact float; 5 no STRING
    assert "value does not fit column f (double)" in fitted.failures[0].message
    # Row 1 fails on its first problem only; the integer in the STRING column fails it too, had it not.
    assert fit(batch({"s": [None, 5]}, {"s": pa.int64()}), table).failures == [
        RowError(1, MISFIT, "a int64 value does not fit column s (string)")]
    assert fitted.rows.schema == arrow_schema(table)
    assert fitted.rows.to_pylist() == [
        {"n": 1, "f": 1.0, "s": None, "ts": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "num": Decimal("1.500000000"),
         "b": b"text"},
        {"n": 3, "f": None, "s": None, "ts": None, "num": None, "b": None}]


def test_timestamps_and_dates_outside_bigquerys_range_fail_with_or_without_a_table() -> None:
    micros = [253_402_300_799_999_999, 253_402_300_800_000_000, -62_135_596_800_000_000, -62_135_596_800_000_001, None]
    rows = pa.RecordBatch.from_arrays(
        [pa.array(micros, pa.int64()).cast(TIMESTAMP),
         pa.array([2_932_896, 0, 2_932_897, -719_162, -719_163], pa.int32()).cast(pa.date32()),
         pa.array([[], [], [], [], [{"at": 300_000_000_000_000_000}]],
                  pa.list_(pa.struct([("at", pa.int64())]))).cast(pa.list_(pa.struct([("at", TIMESTAMP)])))],
        names=["ts", "d", "nested"])
    table = [F("ts", "TIMESTAMP"), F("d", "DATE"), F("nested", "RECORD", mode="REPEATED", fields=[F("at", "TIMESTAMP")])]
    expected = [(1, "TIMESTAMP value of ts"), (2, "DATE value of d"), (3, "TIMESTAMP value of ts"),
                (4, "DATE value of d")]

    for fitted in (fit(rows, table), fit(rows, None)):
        found = [(p, kind, text.split(" is outside")[0]) for p, kind, text in failures(fitted)]
        assert found == [(p, OUT_OF_RANGE, text) for p, text in expected]
        assert fitted.positions.tolist() == [0]
    assert fit(rows.select(["nested"]).slice(4), None).failures == [
        RowError(0, OUT_OF_RANGE, "TIMESTAMP value of nested.at is outside BigQuery's range 0001-01-01 .. 9999-12-31")]


def test_values_hidden_under_a_null_struct_are_not_judged() -> None:
    # A NULL struct's children may hold anything (a native decoder need not clear them).
    child = pa.array([0, 300_000_000_000_000_000], pa.int64()).cast(TIMESTAMP)
    rec = pa.StructArray.from_arrays([child], names=["at"], mask=pa.array([False, True]))
    fitted = fit(pa.RecordBatch.from_arrays([rec], names=["rec"]), [F("rec", "RECORD", fields=[F("at", "TIMESTAMP")])])
    assert fitted.failures == [] and fitted.rows.column("rec").to_pylist()[1] is None


def test_a_row_fails_on_its_first_problem_in_column_order_and_positions_survive_a_sliced_input() -> None:
    table = [F("a", "INTEGER", mode="REQUIRED"), F("b", "DATE")]
    rows = batch({"x": [9, 9, 9, 9], "a": [None, None, 1, 2], "b": [-800_000, 0, 0, -800_000]},
                 {"b": pa.int32()}).slice(1)
    rows = pa.RecordBatch.from_arrays([rows.column("a"), rows.column("b").cast(pa.date32())], names=["a", "b"])

    fitted = fit(rows, table)

    assert [(p, kind) for p, kind, _ in failures(fitted)] == [(0, MISFIT), (2, OUT_OF_RANGE)]
    assert fitted.positions.tolist() == [1] and fitted.rows.column("a").to_pylist() == [1]


def test_a_column_whose_type_has_no_arrow_form_takes_no_values() -> None:
    table = [F("id", "INTEGER"), F("span", "RANGE", range_element_type="DATE")]
    fitted = fit(batch({"id": [1, 2], "span": [None, "x"]}), table, "p.d.t")
    assert failures(fitted) == [(1, MISFIT, "table p.d.t has a column whose type cannot be written here, for span")]


def test_a_column_given_twice_in_two_spellings_fails_the_rows_where_the_second_holds_a_value() -> None:
    fitted = fit(batch({"Name": ["a", "b"], "name": [None, "c"]}), [F("name", "STRING")], "t")
    assert failures(fitted) == [(1, MISFIT, "table t is given twice for column name")]


def test_large_and_dictionary_columns_are_read_as_their_plain_types() -> None:
    rows = pa.RecordBatch.from_arrays(
        [pa.array(["a", "b", "a"]).dictionary_encode(), pa.array([["x"], [], None], pa.large_list(pa.large_string()))],
        names=["s", "l"])
    fitted = fit(rows, [F("s", "STRING"), F("l", "STRING", mode="REPEATED")])
    assert fitted.rows.to_pylist() == [{"s": "a", "l": ["x"]}, {"s": "b", "l": []}, {"s": "a", "l": []}]


def test_a_batch_of_no_rows_fits() -> None:
    fitted = fit(batch({"id": []}, {"id": pa.int64()}), [F("id", "INTEGER")])
    assert fitted.rows.num_rows == 0 and fitted.failures == [] and fitted.positions.dtype == np.int64


class FakeClient:
    def __init__(self, *schemas: list[F]) -> None:
        self.schemas = list(schemas)
        self.reads = 0

    def get_table(self, ref: str, **_: Any) -> Any:
        self.reads += 1
        schema = self.schemas[min(self.reads, len(self.schemas)) - 1]
        if isinstance(schema, Exception):
            raise schema
        return type("Table", (), {"schema": schema})()


def test_the_live_table_is_read_again_once_when_a_batch_holds_a_column_it_lacks() -> None:
    client = FakeClient([F("id", "INTEGER")], [F("id", "INTEGER"), F("coupon", "STRING")])
    live = LiveTable(client, "p.d.t", {})  # type: ignore[arg-type]
    assert live.fit(batch({"id": [1]})).failures == []
    assert client.reads == 1

    fitted = live.fit(batch({"id": [2], "coupon": ["FREE"]}))

    assert fitted.failures == [] and client.reads == 2
    assert fitted.rows.to_pylist() == [{"id": 2, "coupon": "FREE"}]


def test_a_writer_handed_the_columns_its_task_just_checked_reads_the_table_only_for_a_column_they_lack() -> None:
    """A routed table's check (sink_schema.TableKeeper.ensure) read its columns moments before: the writer
    starts from them, and reads the table as before once rows hold a column they lack."""
    client = FakeClient([F("id", "INTEGER"), F("coupon", "STRING")])
    live = LiveTable(client, "p.d.t", {}, known=[F("id", "INTEGER")])  # type: ignore[arg-type]
    assert live.fit(batch({"id": [1]})).failures == [] and client.reads == 0
    fitted = live.fit(batch({"id": [2], "coupon": ["FREE"]}))
    assert fitted.failures == [] and client.reads == 1
    assert fitted.rows.to_pylist() == [{"id": 2, "coupon": "FREE"}]


def test_a_column_unknown_right_after_reading_the_table_is_not_read_again() -> None:
    client = FakeClient([F("id", "INTEGER")])
    fitted = LiveTable(client, "p.d.t", {}).fit(batch({"id": [1], "nope": ["x"]}))  # type: ignore[arg-type]
    assert [f.index for f in fitted.failures] == [0] and client.reads == 1


def test_a_table_that_cannot_be_read_raises_a_classified_sink_error() -> None:
    from google.api_core import exceptions

    client = FakeClient(exceptions.NotFound("no table"))  # type: ignore[arg-type]
    with pytest.raises(SinkError) as raised:
        LiveTable(client, "p.d.t", {}).fit(batch({"id": [1]}))  # type: ignore[arg-type]
    assert raised.value.error_type is ErrorType.SINK_4XX_ERROR and "p.d.t" in raised.value.message
