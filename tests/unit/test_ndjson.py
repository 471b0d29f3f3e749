"""Newline-delimited JSON staging for tables with a JSON column: which columns, which values, which text."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
from google.cloud.bigquery import SchemaField as F

from firehose_bq.arrow_schema import NUMERIC, TIMESTAMP
from firehose_bq.bigquery import ndjson
from firehose_bq.bigquery.json_rows import JsonForm, row_texts
from firehose_bq.errors import ErrorType


def test_json_columns_are_found_at_any_depth_and_only_they() -> None:
    table = [F("id", "INTEGER"), F("doc", "JSON"), F("s", "STRING"),
             F("rec", "RECORD", fields=[F("inner", "JSON", mode="REPEATED"), F("n", "INTEGER"),
                                        F("deeper", "RECORD", mode="REPEATED", fields=[F("j", "JSON")])])]
    assert ndjson.json_columns(table) == {"doc", "rec.inner", "rec.deeper.j"}
    assert ndjson.json_columns([F("s", "STRING"), F("r", "RECORD", fields=[F("x", "BYTES")])]) == frozenset()


def test_a_json_columns_value_goes_in_as_the_json_value_itself_on_one_line() -> None:
    rows = pa.RecordBatch.from_pydict({
        "doc": ['{"a":\n [1,\r\n "x\\ny"]}', '"just text"', "5", None],
        "s": ['{"a": 1}', "two\nlines", None, None],  # a STRING column: a JSON string, escaped
        "rec": pa.array([{"inner": ["{}", "[1]"]}, {"inner": []}, None, {"inner": ["null"]}]),
    })
    data = bytes(ndjson.lines(rows, ndjson.load_form(frozenset({"doc", "rec.inner"}))))

    assert data.endswith(b"\n") and data.count(b"\n") == 4, "one line per row, however the JSON text was broken"
    parsed = [json.loads(line) for line in data.decode().splitlines()]
    assert parsed == [{"doc": {"a": [1, "x\ny"]}, "s": '{"a": 1}', "rec": {"inner": [{}, [1]]}},
                      {"doc": "just text", "s": "two\nlines", "rec": {"inner": []}},
                      {"doc": 5},
                      {"rec": {"inner": [None]}}]


def test_load_jobs_get_wide_integers_as_strings_and_the_other_text_forms_of_insert_all() -> None:
    rows = pa.RecordBatch.from_pydict({
        "i": pa.array([2**53 - 1, 2**53, -(2**53), -(2**63), None], pa.int64()),
        "u": pa.array([0, 2**64 - 1, 1, 2, 3], pa.uint64()),
        "small": pa.array([1, 2, 3, 4, 5], pa.int32()),
        "b": pa.array([b"\x00\xff", None, b"", None, None], pa.binary()),
        "t": pa.array([0, None, None, None, None], TIMESTAMP),
        "n": pa.array([Decimal("1.000000001"), None, None, None, None], NUMERIC),
    })
    parsed = [json.loads(line) for line in bytes(ndjson.lines(rows, ndjson.CONVERTED)).decode().splitlines()]

    assert [r.get("i") for r in parsed] == [2**53 - 1, str(2**53), str(-(2**53)), str(-(2**63)), None]
    assert [r["u"] for r in parsed] == [0, str(2**64 - 1), 1, 2, 3] and [r["small"] for r in parsed] == [1, 2, 3, 4, 5]
    assert parsed[0]["b"] == "AP8=" and parsed[2]["b"] == ""
    assert parsed[0]["t"] == "1970-01-01T00:00:00.000000Z" and parsed[0]["n"] == "1.000000001"
    # insertAll's own text is unchanged: numbers as numbers, a JSON column's text as a string.
    assert json.loads(row_texts(rows.slice(1, 1)).to_pylist()[0])["i"] == 2**53
    assert row_texts(pa.RecordBatch.from_pydict({"doc": ['{"a":1}']})).to_pylist() == ['{"doc":"{\\"a\\":1}"}']
    assert row_texts(pa.RecordBatch.from_pydict({"doc": ['{"a":1}']}), JsonForm(frozenset({"doc"}))).to_pylist() \
        == ['{"doc":{"a":1}}']


def test_lines_of_a_slice_and_of_no_rows() -> None:
    rows = pa.RecordBatch.from_pydict({"i": [1, 2, 3]})
    assert bytes(ndjson.lines(rows.slice(1, 2), ndjson.CONVERTED)) == b'{"i":2}\n{"i":3}\n'
    assert bytes(ndjson.lines(rows.slice(0, 0), ndjson.CONVERTED)) == b""


def test_json_values_a_load_job_would_fail_on_are_found_per_row_at_any_depth() -> None:
    rows = pa.RecordBatch.from_pydict({
        "doc": ['{"ok": [1, 2.5e300, 18446744073709551616]}', "not json", '{"x": 1e400}', "NaN", None, "[1] [2]",
                "-1" + "0" * 400, "{}"],
        "rec": pa.array([{"inner": ["1"]}] * 7 + [{"inner": ["{}", "null"]}]),
    })
    failed = ndjson.json_failures(rows, frozenset({"doc", "rec.inner"}))

    assert sorted(failed) == [1, 2, 3, 5, 6, 7]
    assert failed[1][0] is ErrorType.SINK_4XX_ERROR and failed[1][1].startswith("column doc: the value is not JSON text")
    assert failed[2] == (ErrorType.INVALID_MESSAGE_ERROR, "column doc: the value holds a number beyond FLOAT64's "
                                                          "range (1e400), which BigQuery's JSON type cannot store")
    assert failed[6][0] is ErrorType.INVALID_MESSAGE_ERROR
    assert failed[7] == (ErrorType.SINK_4XX_ERROR, "column rec.inner: a JSON null element: BigQuery arrays cannot "
                                                   "hold NULL")
    deep = "[" * 501 + "]" * 501
    assert [ndjson.problem(text, False) is None for text in (
        "[" * 500 + "]" * 500, deep, '"[[[' + "[" * 600 + '"', '"\\ud83d\\ude00"', '{"\\ud800": 1}', '["\\udc00"]')] \
        == [True, False, True, True, False, False]
    assert ndjson.problem(deep, False) == (ErrorType.SINK_4XX_ERROR, "the value nests deeper than BigQuery's JSON "
                                                                     "type does (500 levels)")
    # A JSON null as a whole (NULLABLE) column's value is NULL, which it may be.
    assert ndjson.json_failures(pa.RecordBatch.from_pydict({"doc": ["null"]}), frozenset({"doc"})) == {}



def test_a_json_null_in_a_nullable_field_of_a_repeated_records_element_is_null_there_not_a_null_element() -> None:
    # Only an array's own elements cannot be NULL; a field of a RECORD element may be, as anywhere else.
    rows = pa.RecordBatch.from_pydict({
        "recs": pa.array([[{"j": "null"}, {"j": "{}"}], [{"j": None}], [{"j": "[null]"}]]),
        "deep": pa.array([[{"r": [{"j": "null"}]}], [{"r": [{"j": "1"}]}], [{"r": []}]]),
        "js": pa.array([["1"], ["null"], []]),
    })
    failed = ndjson.json_failures(rows, frozenset({"recs.j", "deep.r.j", "js"}))

    assert failed == {1: (ErrorType.SINK_4XX_ERROR, "column js: a JSON null element: BigQuery arrays cannot hold NULL")}


def test_a_json_null_in_a_required_json_column_fails_its_row_at_any_depth() -> None:
    # A load job reads a JSON line's `null` as NULL (as it does an element's): in a REQUIRED column the whole
    # job would fail, batch after batch. Where the RECORD holding the column is NULL, the column is too.
    table = [F("doc", "JSON", mode="REQUIRED"), F("opt", "JSON"),
             F("rec", "RECORD", fields=[F("j", "JSON", mode="REQUIRED")]),
             F("recs", "RECORD", mode="REPEATED", fields=[F("j", "JSON", mode="REQUIRED")])]
    assert ndjson.required_json_columns(table) == {"doc", "rec.j", "recs.j"}
    rows = pa.RecordBatch.from_pydict({
        "doc": ["null", " null ", "{}", "{}", "{}", "0"],
        "opt": ["null", "{}", "null", "{}", "{}", "null"],
        "rec": pa.array([{"j": "1"}, {"j": "1"}, {"j": "null"}, None, {"j": "1"}, {"j": "[null]"}]),
        "recs": pa.array([[], [], [], [{"j": "{}"}, {"j": "null"}], [{"j": "{}"}], [{"j": '"null"'}]]),
    })
    failed = ndjson.json_failures(rows, ndjson.json_columns(table), ndjson.required_json_columns(table))

    assert sorted(failed) == [0, 1, 2, 3]
    assert failed[0] == (ErrorType.SINK_4XX_ERROR, "column doc: a JSON null, which a load job reads as NULL: "
                                                   "the REQUIRED column cannot hold it")
    assert failed[2][1].startswith("column rec.j: a JSON null") and failed[3][1].startswith("column recs.j: a JSON null")
    # NULLABLE columns take it, as before; so does a caller that names no REQUIRED column.
    assert ndjson.json_failures(rows, ndjson.json_columns(table)) == {}
