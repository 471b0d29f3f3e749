"""Arrow rows → BigQuery's JSON text, one string per row, built column by column with Arrow compute.

The JSON forms are BigQuery's (what insertAll and JSON loads read): TIMESTAMP as RFC 3339 with
microseconds and `Z`, DATE as YYYY-MM-DD, BYTES as base64, NaN and ±Infinity as the strings "NaN",
"Infinity" and "-Infinity", NUMERIC/BIGNUMERIC as decimal strings, RECORD as an object, REPEATED as an
array. A NULL value is left out of its object (the same as NULL to BigQuery, and shorter); a NULL array
is written as []. Two choices differ between readers (`JsonForm`): a load job reads a JSON column's value
as the JSON value itself (an object, not a string holding one) and wants integers beyond 2^53 as strings;
insertAll takes a JSON column's text as a string. Only BYTES (base64), decimals and strings holding control characters take a Python
step per value; everything else stays in Arrow kernels, which is what makes this several times faster
than building dicts and handing them to `json.dumps`.
"""

from __future__ import annotations

import binascii
import json
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

_NULL_TEXT = pa.scalar(None, pa.string())
# JSON strings must escape `"`, `\` and the control characters U+0000..U+001F; nothing else needs it.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_CONTROL = re.compile(r"[\x00-\x1f]")
# The integers a double holds exactly: JSON readers that read numbers as doubles keep these, and only these.
MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class JsonForm:
    """How the text is written where BigQuery's readers differ. The default is insertAll's."""

    raw: frozenset[str] = frozenset()
    """Dotted paths (as the rows spell them) of JSON columns whose strings are JSON text, written as they are
    (a load job reads a JSON column's "raw JSON values"). The caller has checked that each is JSON: its
    line breaks, which can then only be whitespace between tokens, become spaces (one line per row)."""
    wide_integers_as_text: bool = False
    """Integers beyond ±(2^53 - 1) as strings: BigQuery's load jobs ask for that ("pass it as a string to
    avoid data corruption"), as a JSON number that wide may be read as a double."""


INSERT_ALL = JsonForm()


def row_texts(rows: pa.RecordBatch, form: JsonForm = INSERT_ALL) -> pa.StringArray:
    """One JSON object per row (never NULL)."""
    members = [_member(name, column, form, name) for name, column in zip(rows.schema.names, rows.columns, strict=True)]
    return _object(members, len(rows))


def json_string(values: pa.Array) -> pa.StringArray:
    """Each string as a JSON string literal (quotes included); NULL stays NULL."""
    return _quote(_escape(values.cast(pa.string())))


def value_texts(values: pa.Array, form: JsonForm = INSERT_ALL, path: str = "") -> pa.StringArray:
    """Each value as JSON text; NULL stays NULL (its member is then left out). `path`: the values' column,
    dotted, for `form.raw`."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_dictionary(kind):
        return value_texts(values.dictionary_decode(), form, path)
    if pa.types.is_struct(kind):
        members = [_member(kind.field(i).name, child, form, f"{path}.{kind.field(i).name}")
                   for i, child in enumerate(values.flatten())]
        return _null_where_null(values, _object(members, len(values)))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _array(values, form, path)  # the elements are the column's values: the same path
    if path in form.raw and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        text = values.cast(pa.string())
        return pc.replace_substring(pc.replace_substring(text, "\r", " "), "\n", " ")
    if pa.types.is_timestamp(kind):
        # Cast to a naive timestamp first: its text is UTC (Arrow's storage) and takes no time-zone
        # lookups, which makes it some 30x faster than formatting the aware one. BigQuery keeps
        # microseconds: finer units are cut to them (safe=False), as BigQuery would.
        naive = values.cast(pa.timestamp("us"), safe=False).cast(pa.string())
        return pc.binary_join_element_wise('"', pc.replace_substring(naive, " ", "T", max_replacements=1), 'Z"', "")
    if pa.types.is_date(kind):
        return _quote(values.cast(pa.date32()).cast(pa.string()))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        encoded = [None if v is None else binascii.b2a_base64(v, newline=False).decode("ascii")
                   for v in values.to_pylist()]
        return _quote(pa.array(encoded, pa.string()))
    if pa.types.is_floating(kind):
        return _float_texts(values)
    if pa.types.is_decimal(kind):
        # Plain notation: Arrow's cast would write 1E-9.
        return _quote(pa.array([None if v is None else format(v, "f") for v in values.to_pylist()], pa.string()))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return json_string(values)
    if pa.types.is_integer(kind):
        return _integer_texts(values, form)
    if pa.types.is_boolean(kind):
        return values.cast(pa.string())
    if pa.types.is_null(kind):
        return pa.nulls(len(values), pa.string())
    raise TypeError(f"no JSON form for Arrow type {kind}")


def _member(name: str, values: pa.Array, form: JsonForm, path: str) -> pa.StringArray:
    """`"name":value,` per row, empty where the value is NULL (left out of its object)."""
    return pc.fill_null(pc.binary_join_element_wise(f"{json.dumps(name)}:", value_texts(values, form, path), ",", ""),
                        "")


def _object(members: list[pa.Array], count: int) -> pa.StringArray:
    if not members:
        return pa.array(["{}"] * count, pa.string())
    # Members end in a comma, so the last one is trimmed. (Not binary_join_element_wise's
    # null_handling="skip": in pyarrow 26 it drops the rows in which every member is NULL.)
    inner = pc.utf8_rtrim(pc.binary_join_element_wise(*members, ""), characters=",")
    return pc.binary_join_element_wise("{", inner, "}", "")


def _array(values: pa.Array, form: JsonForm, path: str) -> pa.StringArray:
    elements = value_texts(values.flatten(), form, path)  # the valid lists' elements, this slice only
    lengths = pc.fill_null(pc.list_value_length(values), 0)
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths.cast(pa.int64()))])
    # A NULL element stays `null` inside its array (BigQuery then rejects that row, naming it).
    lists = pa.LargeListArray.from_arrays(offsets, pc.fill_null(elements, "null"))
    return pc.binary_join_element_wise("[", pc.binary_join(lists, ","), "]", "")


def _integer_texts(values: pa.Array, form: JsonForm) -> pa.StringArray:
    text = values.cast(pa.string())
    if not form.wide_integers_as_text or values.type.bit_width < 64:
        return text
    wide = pc.greater(values, pa.scalar(MAX_SAFE_INTEGER, values.type))
    if pa.types.is_signed_integer(values.type):
        wide = pc.or_(wide, pc.less(values, pa.scalar(-MAX_SAFE_INTEGER, values.type)))
    wide = pc.fill_null(wide, False)
    return pc.if_else(wide, _quote(text), text) if pc.any(wide).as_py() else text


def _float_texts(values: pa.Array) -> pa.StringArray:
    text = values.cast(pa.string())  # shortest round-trip form, e.g. 0.1, 1e+20, -0
    # `-0` is a JSON integer: read as one (BigQuery's parser and the emulator's alike) it is 0, and the sign
    # the other write paths keep is lost. `-0.0` is read as the float.
    text = pc.if_else(pc.equal(text, "-0"), "-0.0", text)
    finite = pc.is_finite(values)
    if pc.all(pc.fill_null(finite, True)).as_py():
        return text
    spelled = pc.if_else(pc.is_nan(values), '"NaN"', pc.if_else(pc.greater(values, 0), '"Infinity"', '"-Infinity"'))
    return pc.if_else(pc.fill_null(finite, True), text, spelled)


def _escape(values: pa.StringArray) -> pa.StringArray:
    if not pc.any(pc.match_substring_regex(values, _NEEDS_ESCAPE)).as_py():
        return values
    escaped = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(escaped, r"[\x00-\x1f]")).as_py():
        escaped = pa.array([None if v is None else _CONTROL.sub(_control_escape, v) for v in escaped.to_pylist()],
                           pa.string())
    return escaped


def _control_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _quote(values: pa.StringArray) -> pa.StringArray:
    return pc.binary_join_element_wise('"', values, '"', "")


def _null_where_null(values: pa.Array, texts: pa.StringArray) -> pa.StringArray:
    if not values.null_count:
        return texts
    return pc.if_else(values.is_valid(), texts, _NULL_TEXT)
