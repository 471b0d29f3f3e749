"""JSON input: every rule of `json_rules`, run on both decoders (the native one skips when it is not built)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from google.cloud.bigquery import SchemaField as F

from firehose_bq.decode import make_json_decoder
from firehose_bq.decode.json_rules import MAX_DEPTH
from firehose_bq.decode.json_reference import JsonReferenceDecoder
from firehose_bq.decode.values import DecodedValues
from firehose_bq.errors import ErrorType
from tests.unit.decode.json_support import IMPLEMENTATIONS, JsonNativeDecoder, as_values, checked, decoder, \
    needs_native

Decode = Callable[..., DecodedValues]
INVALID, DESER = ErrorType.INVALID_MESSAGE_ERROR, ErrorType.DESERIALIZATION_ERROR


@pytest.fixture(params=IMPLEMENTATIONS)
def decode(request: pytest.FixtureRequest) -> Decode:
    def run(columns: Sequence[F], documents: Sequence[bytes | str | None], additional_properties: bool = False) \
            -> DecodedValues:
        out = decoder(request.param, columns, additional_properties).decode(as_values(documents))
        return checked(out, columns, len(documents))
    return run


def only_row(out: DecodedValues) -> dict[str, Any]:
    assert out.failures == [], out.failures
    return out.values.to_pylist()[0]


def only_error(out: DecodedValues, error_type: ErrorType = INVALID) -> str:
    assert len(out.failures) == 1 and out.values.null_count == 1
    assert out.failures[0].error_type is error_type, out.failures
    return out.failures[0].message


def value(decode: Decode, column: F, json_text: str) -> Any:
    """The stored value of `json_text` given for `column` (named c)."""
    return only_row(decode([column], ['{"c": ' + json_text + "}"]))["c"]


def error(decode: Decode, column: F, json_text: str) -> str:
    return only_error(decode([column], ['{"c": ' + json_text + "}"]))


# ---- keys ------------------------------------------------------------------------------------------------

def test_dashes_and_dots_become_underscores_and_a_leading_digit_gets_one(decode: Decode) -> None:
    columns = [F("user_id", "INTEGER"), F("app_version_name", "STRING"), F("_1st_seen", "DATE"), F("_9", "BOOLEAN")]
    row = only_row(decode(columns, ['{"user-id": 7, "app.version-name": "1.2", "1st-seen": "2024-01-02", "9": true}']))
    assert row == {"user_id": 7, "app_version_name": "1.2", "_1st_seen": date(2024, 1, 2), "_9": True}


def test_keys_match_columns_ignoring_ascii_case_at_every_level(decode: Decode) -> None:
    columns = [F("Client", "RECORD", fields=[F("osName", "STRING")])]
    assert only_row(decode(columns, ['{"cLIENT": {"OSNAME": "linux"}}'])) == {"Client": {"osName": "linux"}}


def test_two_keys_landing_on_one_column_fail_the_row_naming_both(decode: Decode) -> None:
    columns = [F("a_b", "INTEGER"), F("r", "RECORD", fields=[F("x", "STRING")])]
    out = decode(columns, ['{"a-b": 1, "a_b": 2}', '{"r": {"x": "1", "X": "2"}}', '{"a_b": 1, "a_b": 1}',
                           '{"a_b": 3}'])
    assert [(f.index, f.error_type, f.message) for f in out.failures] == [
        (0, INVALID, 'a_b: the keys "a-b" and "a_b" both land on this column'),
        (1, INVALID, 'r.x: the keys "x" and "X" both land on this column'),
        (2, INVALID, 'a_b: the keys "a_b" and "a_b" both land on this column')]
    assert out.values.to_pylist()[3] == {"a_b": 3, "r": None}


def test_escaped_keys_are_matched_by_their_value(decode: Decode) -> None:
    assert only_row(decode([F("a_b", "INTEGER")], ['{"a\\u002Db": 1}'])) == {"a_b": 1}


# ---- maps ------------------------------------------------------------------------------------------------

MAP = F("attrs", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "FLOAT")])


def test_an_object_for_a_repeated_key_value_record_becomes_its_entries_in_document_order(decode: Decode) -> None:
    row = only_row(decode([MAP], ['{"attrs": {"z": 1, "a": "2.5", "m": null, "z": 3}}']))
    assert row == {"attrs": [{"key": "z", "value": 1.0}, {"key": "a", "value": 2.5}, {"key": "m", "value": None},
                             {"key": "z", "value": 3.0}]}


def test_an_array_of_key_value_objects_is_taken_as_it_is(decode: Decode) -> None:
    row = only_row(decode([MAP], ['{"attrs": [{"key": "a", "value": 1}, {"value": 2, "KEY": "b"}]}']))
    assert row == {"attrs": [{"key": "a", "value": 1.0}, {"key": "b", "value": 2.0}]}


def test_map_keys_are_coerced_to_the_key_type_and_values_to_the_value_type(decode: Decode) -> None:
    column = F("m", "RECORD", "REPEATED", fields=[F("key", "INTEGER"), F("value", "RECORD", fields=[F("n", "STRING")])])
    row = only_row(decode([column], ['{"m": {"10": {"n": "a"}, "-2": {"n": 5}}}']))
    assert row == {"m": [{"key": 10, "value": {"n": "a"}}, {"key": -2, "value": {"n": "5"}}]}
    out = decode([column], ['{"m": {"10": {"n": "a"}, "x": {"n": 5}}}', '{"m": {"1": 5}}'])
    assert [f.message for f in out.failures] == [
        "m[1].key: the JSON string is not a JSON number, so it cannot be INTEGER",
        "m[0].value: a JSON number cannot be stored as RECORD"]


def test_an_object_for_a_repeated_record_that_is_not_a_map_fails(decode: Decode) -> None:
    column = F("c", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("other", "STRING")])
    assert error(decode, column, '{"key": "a"}') == \
        "c: a JSON object for a REPEATED RECORD column, which takes an array"
    assert error(decode, F("c", "RECORD", "REPEATED", fields=MAP.fields), '"x"') == \
        "c: a JSON string for a REPEATED RECORD column, which takes an array, or an object as a map"


# ---- STRING ----------------------------------------------------------------------------------------------

def test_complex_values_for_a_string_column_become_compact_json_text(decode: Decode) -> None:
    text = '{ "b" : [1.50, 2E3, -0, true, null, "x\\"\\u00e9\\n\\u001f\\/"], "a": {}, "b": [] }'
    assert value(decode, F("c", "STRING"), text) == '{"b":[1.50,2E3,-0,true,null,"x\\"é\\n\\u001f/"],"a":{},"b":[]}'
    assert value(decode, F("c", "STRING", "REPEATED"), '[[1, 2], {"k": "v"}, "s"]') == ['[1,2]', '{"k":"v"}', "s"]


def test_scalars_for_a_string_column_become_their_text(decode: Decode) -> None:
    column = F("c", "STRING")
    assert [value(decode, column, v) for v in ("true", "false", "1.50", "-1e-7", '"é\\ud83d\\ude00"')] == \
        ["true", "false", "1.50", "-1e-7", "é😀"]


# ---- numbers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("42", 42), ('"42"', 42), ("1.0", 1), ("1e3", 1000), ('"1.5e2"', 150), ("-0", 0), ("-0.0e5", 0),
    ("9223372036854775807", 2 ** 63 - 1), ("-9223372036854775808", -2 ** 63), ("92233720368547758.07e2", 2 ** 63 - 1),
    ("0e99999999999999999999", 0),
])
def test_integer_takes_whole_numbers_and_numbers_in_strings(decode: Decode, text: str, expected: int) -> None:
    assert value(decode, F("c", "INTEGER"), text) == expected


@pytest.mark.parametrize("text, message", [
    ("1.5", "the number is not a whole number, so it cannot be INTEGER"),
    ("1e-400", "the number is not a whole number, so it cannot be INTEGER"),
    ("9223372036854775808", "the number is out of INTEGER range"),
    ("-9223372036854775809", "the number is out of INTEGER range"),
    ("1e400", "the number is out of INTEGER range"),
    ('" 42"', "the JSON string is not a JSON number, so it cannot be INTEGER"),
    ('"042"', "the JSON string is not a JSON number, so it cannot be INTEGER"),
    ('""', "the JSON string is not a JSON number, so it cannot be INTEGER"),
    ("true", "a JSON boolean cannot be stored as INTEGER"),
    ("[1]", "a JSON array cannot be stored as INTEGER"),
])
def test_integer_refuses_what_it_would_have_to_round_clamp_or_guess(decode: Decode, text: str, message: str) -> None:
    assert error(decode, F("c", "INTEGER"), text) == f"c: {message}"


def test_float_takes_numbers_numbers_in_strings_and_the_three_words(decode: Decode) -> None:
    column = F("c", "FLOAT")
    assert [value(decode, column, v) for v in ("1.5", '"-2.25e1"', "1e-400", "0.1", "-0", '"Infinity"',
                                               '"-Infinity"')] == [1.5, -22.5, 0.0, 0.1, -0.0, math.inf, -math.inf]
    assert math.isnan(value(decode, column, '"NaN"'))
    assert math.copysign(1, value(decode, column, "-0")) == -1
    assert value(decode, column, "2.2250738585072011e-308") == 2.2250738585072011e-308
    assert value(decode, column, "9007199254740993") == 9007199254740992.0  # nearest float64, ties to even
    assert error(decode, column, "1e400") == "c: the number is out of FLOAT range"
    assert error(decode, column, '"nan"').startswith("c: the JSON string is not a JSON number, nor \"NaN\"")


@pytest.mark.parametrize("text, expected", [
    ("1.5", Decimal("1.5")), ('"-0.000000001"', Decimal("-1E-9")), ("1.5000000000000", Decimal("1.5")),
    ("99999999999999999999999999999.999999999", Decimal("99999999999999999999999999999.999999999")),
    ("-1e28", Decimal("-1E28")), ("12e-9", Decimal("1.2E-8")), ("0e-99", Decimal(0)),
])
def test_numeric_is_exact(decode: Decode, text: str, expected: Decimal) -> None:
    assert value(decode, F("c", "NUMERIC"), text) == expected


@pytest.mark.parametrize("text, message", [
    ("1.0000000001", "the number has more than 9 decimal places, which NUMERIC would round"),
    ("1e-10", "the number has more than 9 decimal places, which NUMERIC would round"),
    ("1e29", "the number is out of NUMERIC range"),
    ("100000000000000000000000000000", "the number is out of NUMERIC range"),
    ('"NaN"', "the JSON string is not a JSON number, so it cannot be NUMERIC"),
])
def test_numeric_never_rounds(decode: Decode, text: str, message: str) -> None:
    assert error(decode, F("c", "NUMERIC"), text) == f"c: {message}"


def test_bignumeric_keeps_38_digits_on_each_side(decode: Decode) -> None:
    column = F("c", "BIGNUMERIC")
    big = "-" + "9" * 38 + "." + "9" * 38
    assert value(decode, column, big) == Decimal(big)
    assert value(decode, column, '"1e-38"') == Decimal("1E-38")
    assert error(decode, column, "1e38") == "c: the number is out of BIGNUMERIC range"
    assert error(decode, column, "1e-39") == \
        "c: the number has more than 38 decimal places, which BIGNUMERIC would round"


# ---- booleans, dates and times ---------------------------------------------------------------------------

def test_booleans_from_literals_and_strings_in_any_case(decode: Decode) -> None:
    column = F("c", "BOOLEAN")
    assert [value(decode, column, v) for v in ("true", "false", '"TRUE"', '"fAlSe"')] == [True, False, True, False]
    assert error(decode, column, '"yes"') == "c: the JSON string is neither true nor false"
    assert error(decode, column, "1") == "c: a JSON number cannot be stored as BOOLEAN"


def ts(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ('"2024-01-31T12:00:00Z"', ts(2024, 1, 31, 12)),
    ('"2024-01-31t12:00:00.5z"', ts(2024, 1, 31, 12, 0, 0, 500_000)),
    ('"2024-01-31T12:00:00+01:30"', ts(2024, 1, 31, 10, 30)),
    ('"2024-01-31T12:00:00-0130"', ts(2024, 1, 31, 13, 30)),
    ('"2024-01-31 12:00:00"', ts(2024, 1, 31, 12)),
    ('"2024-01-31 12:00:00.123456 UTC"', ts(2024, 1, 31, 12, 0, 0, 123_456)),
    ('"2024-01-31 12:00:00.1234569Z"', ts(2024, 1, 31, 12, 0, 0, 123_456)),  # past microseconds: dropped
    ('"2024-01-31T12:00:00.999999999Z"', ts(2024, 1, 31, 12, 0, 0, 999_999)),
    ("1706702400", ts(2024, 1, 31, 12)),  # epoch seconds, as BigQuery reads a number
    ("1706702400.1234567", ts(2024, 1, 31, 12, 0, 0, 123_456)),
    ("1.7067024e9", ts(2024, 1, 31, 12)),
    ("-1.5", ts(1969, 12, 31, 23, 59, 58, 500_000)),
    ("-0.0000001", ts(1969, 12, 31, 23, 59, 59, 999_999)),  # dropped digits go towards the past, as in text
    ('"1969-12-31T23:59:59.9999999Z"', ts(1969, 12, 31, 23, 59, 59, 999_999)),
    ("0e99999999999999999999", ts(1970, 1, 1)), ("-1e-99999999999", ts(1969, 12, 31, 23, 59, 59, 999_999)),
    ("-0e-7", ts(1970, 1, 1)), ("-0.000e-9", ts(1970, 1, 1)),  # minus zero is zero, not 1 µs before it
    ('"0001-01-01T00:00:00Z"', ts(1, 1, 1)),
    ('"9999-12-31T23:59:59.999999Z"', ts(9999, 12, 31, 23, 59, 59, 999_999)),
    ('"2024-02-29T00:00:00+23:59"', ts(2024, 2, 28, 0, 1)),
    # No zone after a T, as after a space: UTC, as BigQuery reads its canonical format (which allows either).
    ('"2024-05-01T10:00:00"', ts(2024, 5, 1, 10)),
    ('"2024-05-01t10:00:00.25"', ts(2024, 5, 1, 10, 0, 0, 250_000)),
])
def test_timestamps_from_rfc_3339_bigquery_text_and_epoch_seconds(decode: Decode, text: str, expected: datetime) \
        -> None:
    assert value(decode, F("c", "TIMESTAMP"), text) == expected


@pytest.mark.parametrize("text, message", [
    ('"2024-01-31T12:00:00 UTC"', "not a timestamp"),
    ('"2024-01-31T12:00"', "not a timestamp"),
    ('"2024-02-30T12:00:00Z"', "not a timestamp"),
    ('"2024-01-31T23:59:60Z"', "not a timestamp"),
    ('"2024-01-31T24:00:00Z"', "not a timestamp"),
    ('"2024-01-31T12:00:00+24:00"', "not a timestamp"),
    ('"2024-01-31T12:00:00.Z"', "not a timestamp"),
    ('"0000-12-31T12:00:00Z"', "not a timestamp"),
    ('"2024-1-31T12:00:00Z"', "not a timestamp"),
    ('"2024-01-31T12:00:00Europe/Paris"', "not a timestamp"),
    ('"0001-01-01T00:30:00+01:00"', "outside 0001-01-01"),
    ('"9999-12-31T23:59:59-00:01"', "outside 0001-01-01"),
    ("253402300800", "outside 0001-01-01"),
    ("1706702400000", "outside 0001-01-01"),  # milliseconds read as seconds: year 56000
    ("-62135596801", "outside 0001-01-01"),
    ("true", "a JSON boolean cannot be stored as TIMESTAMP"),
])
def test_timestamps_that_are_not_one_or_out_of_range_fail(decode: Decode, text: str, message: str) -> None:
    assert message in error(decode, F("c", "TIMESTAMP"), text)


def test_dates_datetimes_and_times(decode: Decode) -> None:
    assert value(decode, F("c", "DATE"), '"2024-02-29"') == date(2024, 2, 29)
    for bad in ('"2023-02-29"', '"2024-1-1"', '"2024-01-01T00:00:00Z"', "20240101"):
        assert "DATE" in error(decode, F("c", "DATE"), bad) or "date" in error(decode, F("c", "DATE"), bad)
    dt = F("c", "DATETIME")
    assert [value(decode, dt, v) for v in ('"2024-01-01"', '"2024-01-01T10:00:00"', '"2024-01-01 10:00:00.5"',
                                           '"2024-01-01 10:00:00.1234567"')] == \
        ["2024-01-01", "2024-01-01T10:00:00", "2024-01-01 10:00:00.5", "2024-01-01 10:00:00.123456"]
    for bad in ('"2024-01-01T25:00:00"', '"2024-01-01T10:00:00Z"', '"2024-01-01T10:00"', '"2024-13-01"'):
        assert error(decode, dt, bad) == "c: the JSON string is not a datetime YYYY-MM-DD[(T| )HH:MM:SS[.ffffff]]"
    time = F("c", "TIME")
    assert [value(decode, time, v) for v in ('"00:00:00"', '"23:59:59.999999999"')] == ["00:00:00", "23:59:59.999999"]
    for bad in ('"24:00:00"', '"1:00:00"', '"10:00"', "36000"):
        assert error(decode, time, bad).startswith("c: ")


# ---- bytes, JSON, GEOGRAPHY ------------------------------------------------------------------------------

def test_bytes_from_padded_standard_base64(decode: Decode) -> None:
    column = F("c", "BYTES")
    assert [value(decode, column, v) for v in ('"aGVsbG8="', '"aGk="', '""', '"+/8A"')] == \
        [b"hello", b"hi", b"", b"\xfb\xff\x00"]
    for bad in ('"aGVsbG8"', '"aGV*bG8="', '"-_8A"', '"aG=k"', '"a==="', "1"):
        assert error(decode, column, bad).startswith("c: ")


def test_json_columns_take_any_value_as_its_json_text(decode: Decode) -> None:
    column = F("c", "JSON")
    assert [value(decode, column, v) for v in ('{"a": [1.0, null]}', '"text"', "12.50", "true", "null")] == \
        ['{"a":[1.0,null]}', '"text"', "12.50", "true", None]


BEYOND_FLOAT64 = "the value holds a number beyond FLOAT64's range (about ±1.8e308), which BigQuery's JSON type " \
                 "cannot store"


@pytest.mark.parametrize("text", [
    "1e400", "-1e999", "1.7976931348623159e308", "2" + "0" * 308, '{"x": 1e400}', '[1, {"a": [-2e308]}]',
    '{"ok": 1, "deep": [[[{"n": 1e99999999999999999999}]]]}', "0." + "0" * 400 + "1e710"])
def test_a_json_value_holding_a_number_beyond_float64_fails_naming_the_column(decode: Decode, text: str) -> None:
    # BigQuery's JSON type holds int64/uint64 and FLOAT64 numbers, rounds the others to FLOAT64 and refuses
    # what cannot be rounded; in a load job one such value fails the whole job.
    assert error(decode, F("c", "JSON"), text) == f"c: {BEYOND_FLOAT64}"


def test_json_values_beyond_float64_fail_at_their_path_and_only_their_row(decode: Decode) -> None:
    columns = [F("id", "INTEGER"), F("js", "JSON", "REPEATED"), F("r", "RECORD", fields=[F("j", "JSON")]),
               F("m", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "JSON")])]
    out = decode(columns, ['{"id": 1, "js": [1, {"a": 1e400}]}', '{"id": 2, "r": {"j": -1e309}}',
                           '{"id": 3, "m": {"k": [1e400]}}', '{"id": 4, "js": [1e308], "r": {"j": "1e400"}}'])
    assert [(f.index, f.error_type, f.message) for f in out.failures] == [
        (0, INVALID, f"js[1]: {BEYOND_FLOAT64}"), (1, INVALID, f"r.j: {BEYOND_FLOAT64}"),
        (2, INVALID, f"m[0].value: {BEYOND_FLOAT64}")]
    assert out.values.to_pylist()[3] == {"id": 4, "js": ["1e308"], "r": {"j": '"1e400"'}, "m": []}


@pytest.mark.parametrize("text", [
    "1.7976931348623157e308", "-1.7976931348623157e308", "1" + "0" * 308, "18446744073709551616",
    "123456789012345678901234567890", "3.141592653589793238462643383279", "1e-400", "0e999999", "-0.0",
    '{"a": 1, "a": 2}', '"1e400"'])
def test_json_values_bigquery_accepts_are_kept_as_written(decode: Decode, text: str) -> None:
    # Wide integers and long fractions BigQuery rounds to FLOAT64, duplicate keys it keeps the first of:
    # it takes them, so they are not refused here.
    assert value(decode, F("c", "JSON"), text) == text.replace(" ", "")


def test_strings_and_unknown_values_may_hold_numbers_beyond_float64(decode: Decode) -> None:
    out = decode([F("s", "STRING"), F("additional_properties", "STRING")], ['{"s": {"a": 1e400}, "x": 1e400}'],
                 additional_properties=True)
    assert only_row(out) == {"s": '{"a":1e400}', "additional_properties": '{"x":1e400}'}


def test_geography_takes_text_or_a_geojson_object(decode: Decode) -> None:
    column = F("c", "GEOGRAPHY")
    assert value(decode, column, '"POINT(1 2)"') == "POINT(1 2)"
    assert value(decode, column, '{"type": "Point", "coordinates": [1, 2]}') == \
        '{"type":"Point","coordinates":[1,2]}'
    assert error(decode, column, "[1, 2]") == "c: a JSON array cannot be stored as GEOGRAPHY"


# ---- null, REQUIRED, REPEATED ----------------------------------------------------------------------------

def test_null_is_null_for_nullable_and_the_empty_list_for_repeated(decode: Decode) -> None:
    columns = [F("s", "STRING"), F("r", "RECORD", fields=[F("x", "INTEGER", "REQUIRED")]), F("l", "INTEGER", "REPEATED"),
               F("m", "STRING", "REPEATED")]
    assert only_row(decode(columns, ['{"s": null, "r": null, "l": null}'])) == {"s": None, "r": None, "l": [], "m": []}


def test_a_required_column_missing_or_null_fails_naming_its_path(decode: Decode) -> None:
    columns = [F("id", "STRING", "REQUIRED"),
               F("items", "RECORD", "REPEATED", fields=[F("sku", "STRING", "REQUIRED"), F("n", "INTEGER")])]
    out = decode(columns, ['{"items": []}', '{"id": null}', '{"id": "a", "items": [{"sku": "x"}, {"n": 1}]}',
                           '{"id": "a", "items": [{"sku": "x"}, {"sku": null}]}', '{"id": "a"}'])
    assert [(f.index, f.message) for f in out.failures] == [
        (0, "id: the REQUIRED STRING column is missing or null"),
        (1, "id: the REQUIRED STRING column is missing or null"),
        (2, "items[1].sku: the REQUIRED STRING column is missing or null"),
        (3, "items[1].sku: the REQUIRED STRING column is missing or null")]
    assert out.values.to_pylist()[4] == {"id": "a", "items": []}


def test_scalars_for_repeated_columns_and_null_elements_fail(decode: Decode) -> None:
    columns = [F("tags", "STRING", "REPEATED"), F("r", "RECORD", fields=[F("xs", "FLOAT", "REPEATED")])]
    out = decode(columns, ['{"tags": "a"}', '{"tags": ["a", null]}', '{"r": {"xs": [1, "two"]}}', '{"r": [1]}'])
    assert [f.message for f in out.failures] == [
        "tags: a JSON string for a REPEATED STRING column, which takes an array",
        "tags[1]: a null element: BigQuery arrays cannot hold NULL",
        "r.xs[1]: the JSON string is not a JSON number, nor \"NaN\", \"Infinity\" or \"-Infinity\", so it cannot "
        "be FLOAT",
        "r: a JSON array cannot be stored as RECORD"]


# ---- documents that are not JSON -------------------------------------------------------------------------

@pytest.mark.parametrize("document", [
    b"", b"   ", b"nope", b"[1, 2]", b'"text"', b"42", b"null", b'{"a": 1', b'{"a": 1}}', b'{"a": 1} x',
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b"{'a': 1}", b'{"a": 1,}', b'{"a": [1,]}',
    b'{"a": 01}', b'{"a": 1.}', b'{"a": .5}', b'{"a": +1}', b'{"a": 0x10}', b'{"a": tru}', b'{"a": "x\ty"}',
    b'{"a": "\\x"}', b'{"a": "\\u12"}', b'{"a" 1}', b'{a: 1}', b"\xef\xbb\xbf{}", b'{"a": "\xff"}',
    b'{"a": "\xc0\xaf"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xf4\x90\x80\x80"}', b'{"a": "\\ud800"}',
    b'{"a": "\\udc00\\ud800"}', b'{"a": "\\ud83dx"}', b'{"\\ud800": 1}', b'{"a": 1}\x00', b"{\"a\": 1}\x0b",
    b'{"a": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
])
def test_documents_that_are_not_a_json_object_fail_with_deserialization_error(decode: Decode, document: bytes) \
        -> None:
    only_error(decode([F("a", "STRING")], [document]), DESER)


def test_nesting_up_to_the_limit_is_json_and_past_it_is_not(decode: Decode) -> None:
    def nested(depth: int) -> str:  # the top-level object counts as one level
        return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    assert only_row(decode([F("a", "STRING")], [nested(MAX_DEPTH)]))["a"] == "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    only_error(decode([F("a", "STRING")], [nested(MAX_DEPTH + 1)]), DESER)
    only_error(decode([F("b", "STRING")], [nested(MAX_DEPTH + 1)]), DESER)  # unknown values too


def test_a_document_that_is_not_json_wins_over_a_value_that_does_not_fit(decode: Decode) -> None:
    only_error(decode([F("a", "INTEGER")], ['{"a": "x", "b": [}']), DESER)


def test_one_bad_document_fails_only_itself_and_null_values_stay_null(decode: Decode) -> None:
    columns = [F("n", "INTEGER")]
    out = decode(columns, ['{"n": 1}', "{", None, '{"n": "x"}', '{"n": 5}'])
    assert [(f.index, f.error_type) for f in out.failures] == [(1, DESER), (3, INVALID)]
    assert out.values.to_pylist() == [{"n": 1}, None, None, None, {"n": 5}]


# ---- unknown values --------------------------------------------------------------------------------------

TABLE = [
    F("id", "INTEGER"),
    F("client", "RECORD", fields=[F("os", "STRING"), F("geo", "RECORD", fields=[F("country", "STRING")])]),
    F("items", "RECORD", "REPEATED", fields=[F("sku", "STRING")]),
    F("attrs", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "RECORD", fields=[F("v", "INTEGER")])]),
    F("payload", "STRING"),
]
AP = F("additional_properties", "STRING")
UNKNOWN_EVERYWHERE = ('{"id": 1, "New-Top": {"x": [1.50, "é"]}, "client": {"os": "l", "Geo": {"country": "X", '
                      '"city": "P"}, "new_nested": null}, "items": [{"sku": "a"}, {"sku": "b", "qty": 2}, {}], '
                      '"attrs": {"k1": {"v": 1}, "k2": {"v": 2, "w": 3}}, "payload": {"any": "thing"}, "z": 0}')


def test_unknown_values_are_mirrored_into_additional_properties_where_they_were(decode: Decode) -> None:
    out = decode([*TABLE, AP], [UNKNOWN_EVERYWHERE, '{"id": 2, "items": [{"sku": "a"}]}'], additional_properties=True)
    first, second = out.values.to_pylist()
    assert first["additional_properties"] == (
        '{"New-Top":{"x":[1.50,"é"]},"client":{"Geo":{"city":"P"},"new_nested":null},'
        '"items":[{},{"qty":2},{}],"attrs":{"k2":{"w":3}},"z":0}')
    assert first["client"] == {"os": "l", "geo": {"country": "X"}}
    assert first["items"] == [{"sku": "a"}, {"sku": "b"}, {"sku": None}]
    assert first["payload"] == '{"any":"thing"}'  # a STRING column takes an object whole: nothing unknown
    assert second["additional_properties"] is None
    assert out.unknown_fields == [] and out.failures == []


def test_a_key_named_additional_properties_is_kept_as_an_unknown_value(decode: Decode) -> None:
    out = decode([F("id", "INTEGER"), AP], ['{"additional_properties": "mine", "id": 1}'], additional_properties=True)
    assert only_row(out)["additional_properties"] == '{"additional_properties":"mine"}'


def test_without_additional_properties_unknown_values_are_dropped_and_the_rows_listed(decode: Decode) -> None:
    documents = [UNKNOWN_EVERYWHERE, '{"id": 2}', '{"client": {"os": "l", "x": 1}}', '{"attrs": [{"key": "a", "z": 1}]}']
    for columns, on in (([*TABLE, AP], False), (TABLE, True)):  # option off, or no column to fill
        out = decode(columns, documents, additional_properties=on)
        assert out.failures == [] and out.unknown_fields == [0, 2, 3]
        assert out.values.to_pylist()[0]["client"] == {"os": "l", "geo": {"country": "X"}}


def test_unknown_values_never_fail_a_row_whatever_they_hold(decode: Decode) -> None:
    documents = ['{"x": {"deep": [[[{"a": 1e999}]]]}, "y": "\\ud83d\\ude00", "z": -0.0e-0}',
                 '{"x": 1, "x": 2, "X-1": null}']
    out = decode([F("id", "INTEGER"), AP], documents, additional_properties=True)
    assert out.failures == []
    assert [r["additional_properties"] for r in out.values.to_pylist()] == [
        '{"x":{"deep":[[[{"a":1e999}]]]},"y":"😀","z":-0.0e-0}', '{"x":1,"x":2,"X-1":null}']


# ---- the decoders ----------------------------------------------------------------------------------------

def test_sliced_and_large_binary_inputs_decode_like_plain_ones(decode: Decode) -> None:
    documents = ['{"n": 1}', '{"n": 2}', "bad", '{"n": 4}']
    for implementation in ("reference", "native") if JsonNativeDecoder else ("reference",):
        d = decoder(implementation, [F("n", "INTEGER")])
        sliced = d.decode(as_values(documents).slice(1, 3))
        large = d.decode(as_values(documents).cast(pa.large_binary()))
        assert sliced.values.to_pylist() == [{"n": 2}, None, {"n": 4}] and [f.index for f in sliced.failures] == [1]
        assert large.values.to_pylist() == [{"n": 1}, {"n": 2}, None, {"n": 4}]


def test_the_additional_properties_column_must_be_a_nullable_string() -> None:
    with pytest.raises(ValueError, match="NULLABLE STRING"):
        JsonReferenceDecoder([F("additional_properties", "JSON")], additional_properties=True)


def test_the_factory_prefers_the_native_decoder_and_falls_back_to_the_reference() -> None:
    columns = [F("n", "INTEGER")]
    assert isinstance(make_json_decoder(columns, additional_properties=False, prefer="python"), JsonReferenceDecoder)
    expected = JsonNativeDecoder or JsonReferenceDecoder
    assert isinstance(make_json_decoder(columns, additional_properties=False), expected)
    with pytest.raises(ValueError):
        make_json_decoder(columns, additional_properties=False, prefer="fast")


@needs_native
def test_the_native_decoder_hands_arrow_its_buffers_without_copying() -> None:
    out = decoder("native", [F("s", "STRING")]).decode(as_values(['{"s": "a"}']))
    assert out.values.field("s").buffers()[2].to_pybytes() == b"a"
    assert out.values.to_pylist() == [{"s": "a"}]


def test_a_document_that_is_not_json_names_no_protobuf_exception(decode: Decode) -> None:
    """Dead letters carry what failed a record (seed 004's exception class): for JSON input that is not
    protobuf's DecodeError, the default for DESERIALIZATION_ERROR, which would send a user looking for a
    descriptor problem."""
    from firehose_bq.errors import cause_of

    out = decode([F("a", "INTEGER")], [b"[1]", b"\xff", b'{"a": 1} x', b'{"a": true}'])
    causes = {f.index: (f.error_type, cause_of(f)) for f in out.failures}
    assert {i: c for i, c in causes.items() if i < 3} == {
        i: (DESER, "firehose_bq.decode.json_reference.NotJson") for i in range(3)}
    assert causes[3] == (INVALID, "ValueError")
