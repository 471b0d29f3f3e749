"""The native JSON decoder against the Python reference: random tables, random documents for them (mostly
close to fitting, some hostile), the same rows, failures and unknown-field lists from both."""

from __future__ import annotations

import random
from base64 import b64encode
from typing import Any

import pytest
from google.cloud.bigquery import SchemaField as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firehose_bq.decode.json_rules import MAX_DEPTH
from tests.unit.decode.json_support import assert_same, needs_native

pytestmark = needs_native

# Generated documents are trees: ("obj", [(key, value)]), ("arr", [values]), ("num", text), ("str", text),
# ("lit", "true" | "false" | "null"); `render` writes them as JSON text in randomly chosen spellings.
Tree = tuple[str, Any]
NULL: Tree = ("lit", "null")

NAMES = ["a", "b", "Cd", "e_f", "_1x", "key", "value", "ts", "additional_properties", "Ünï"]
LEAF_TYPES = ["STRING", "BYTES", "INTEGER", "FLOAT", "BOOLEAN", "TIMESTAMP", "DATE", "NUMERIC", "BIGNUMERIC",
              "DATETIME", "TIME", "JSON", "GEOGRAPHY", "INTERVAL"]
MODES = ["NULLABLE", "REQUIRED", "REPEATED"]

digits = st.text("0123456789", min_size=1, max_size=30)
number_text = st.one_of(
    st.builds(lambda sign, whole, frac, exp: sign + whole + frac + exp,
              st.sampled_from(["", "-"]),
              st.one_of(st.just("0"), st.builds(lambda a, b: a + b, st.sampled_from("123456789"),
                                                st.text("0123456789", max_size=25))),
              st.one_of(st.just(""), digits.map(lambda d: "." + d)),
              st.one_of(st.just(""), st.builds(lambda e, s, d: e + s + d, st.sampled_from("eE"),
                                               st.sampled_from(["", "+", "-"]), st.text("0123456789", min_size=1,
                                                                                        max_size=22)))),
    st.sampled_from(["9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
                     "1e400", "1e-400", "0e999999999999999999999", "1.0", "1e3", "2.2250738585072011e-308",
                     "4.9e-324", "2.4703282292062328e-324", "1.7976931348623157e308", "1.7976931348623159e308",
                     "0.1", "-0", "-0.0", "253402300799.9999999", "-62135596800", "99999999999999999999999999999.999999999",
                     "1" + "0" * 400, "0." + "0" * 300 + "1", "123456789012345678901234567890e-20"]),
)
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


@st.composite
def clock(draw: st.DrawFn) -> str:
    two = st.sampled_from(["00", "09", "12", "23", "24", "59", "60", "7"])
    fraction = draw(st.one_of(st.just(""), st.text("0123456789", max_size=12).map(lambda d: "." + d)))
    return f"{draw(two)}:{draw(two)}:{draw(two)}{fraction}"


@st.composite
def calendar_date(draw: st.DrawFn) -> str:
    year = draw(st.sampled_from(["0000", "0001", "1969", "1970", "2000", "2023", "2024", "2100", "9999", "123"]))
    month = draw(st.sampled_from(["00", "01", "02", "12", "13", "1"]))
    day = draw(st.sampled_from(["00", "01", "28", "29", "30", "31", "32"]))
    return f"{year}-{month}-{day}"


@st.composite
def timestamp_text(draw: st.DrawFn) -> str:
    zone = draw(st.sampled_from(["", "Z", "z", "+01:00", "-05:30", "+0530", "-2359", " UTC", "+24:00", "+01", "UTC",
                                 "+01:60", " Z"]))
    return draw(calendar_date()) + draw(st.sampled_from(["T", "t", " ", "x"])) + draw(clock()) + zone


def base64_text(data: bytes, damage: int) -> str:
    encoded = b64encode(data).decode()
    return [encoded, encoded.rstrip("="), encoded.replace("+", "-").replace("/", "_"), encoded + "=", "*" + encoded,
            encoded[:1] + "=" + encoded[1:]][damage]


def leaf_values(kind: str, rnd: random.Random) -> st.SearchStrategy[Tree]:
    """Values for a column of `kind`: mostly what it takes, else near misses and anything at all."""
    numbers = number_text.map(lambda t: ("num", t))
    near = {
        "INTEGER": number_text, "FLOAT": st.one_of(number_text, st.sampled_from(["NaN", "Infinity", "-Infinity", "nan"])),
        "NUMERIC": number_text, "BIGNUMERIC": number_text,
        "BOOLEAN": st.sampled_from(["true", "TRUE", "False", "yes", "1", ""]),
        "TIMESTAMP": timestamp_text(), "DATE": calendar_date(),
        "DATETIME": st.one_of(calendar_date(), st.builds(lambda d, s, c: d + s + c, calendar_date(),
                                                         st.sampled_from(["T", " ", "t"]), clock())),
        "TIME": clock(),
        "BYTES": st.builds(base64_text, st.binary(max_size=7), st.integers(0, 5)),
    }.get(kind, text).map(lambda t: ("str", t))
    good = {
        "INTEGER": st.integers(-2 ** 63, 2 ** 63 - 1).map(lambda v: ("num", str(v))),
        "FLOAT": st.floats(allow_nan=False, allow_infinity=False).map(lambda v: ("num", repr(v))),
        "NUMERIC": st.decimals(-10 ** 29 + 1, 10 ** 29 - 1, places=9).map(lambda v: ("num", str(v))),
        "BIGNUMERIC": st.decimals(-10 ** 38 + 1, 10 ** 38 - 1, places=38).map(lambda v: ("str", str(v))),
        "BOOLEAN": st.sampled_from([("lit", "true"), ("lit", "false")]),
        "TIMESTAMP": st.one_of(st.datetimes().map(lambda v: ("str", v.isoformat() + "Z")),
                               st.integers(-62135596800, 253402300799).map(lambda v: ("num", str(v)))),
        "DATE": st.dates().map(lambda v: ("str", v.isoformat())),
        "DATETIME": st.datetimes().map(lambda v: ("str", v.isoformat())),
        "TIME": st.times().map(lambda v: ("str", v.isoformat())),
        "BYTES": st.binary(max_size=9).map(lambda v: ("str", b64encode(v).decode())),
    }.get(kind, text.map(lambda t: ("str", t)))
    choice = rnd.random()
    if choice < 0.85:
        return good
    if choice < 0.95:
        return near
    return st.one_of(numbers, st.sampled_from([("lit", "true"), ("lit", "false")]), any_json)


scalar_json = st.one_of(st.sampled_from([("lit", "true"), ("lit", "false"), NULL]), number_text.map(lambda t: ("num", t)),
                        text.map(lambda t: ("str", t)))
any_json = st.recursive(scalar_json, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda v: ("arr", v)),
    st.lists(st.tuples(text, inner), max_size=3).map(lambda v: ("obj", v))), max_leaves=8)


@st.composite
def table(draw: st.DrawFn, depth: int = 0) -> list[F]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique_by=str.lower))
    columns = []
    for name in names:
        choice = draw(st.integers(0, 9))
        mode = draw(st.sampled_from(MODES))
        if depth < 3 and choice == 0:
            columns.append(F(name, "RECORD", mode, fields=draw(table(depth + 1))))
        elif depth < 3 and choice == 1:  # a map
            key = F("key", draw(st.sampled_from(["STRING", "INTEGER", "DATE", "BOOLEAN", "JSON"])))
            value = draw(table(depth + 1))[0]
            columns.append(F(name, "RECORD", "REPEATED", fields=[key, F("value", value.field_type, value.mode,
                                                                          fields=value.fields)]))
        else:
            columns.append(F(name, draw(st.sampled_from(LEAF_TYPES)), mode))
    return columns


@st.composite
def key_for(draw: st.DrawFn, name: str, rnd: random.Random) -> str:
    """A key that lands on `name`: its case changed, underscores spelled - or ., a leading _ before a digit left
    out (usually), or now and then an unrelated key."""
    key = "".join(c.swapcase() if rnd.random() < 0.3 else c for c in name)
    key = "".join(rnd.choice("_-.") if c == "_" else c for c in key)
    if len(key) > 1 and key[0] in "_-." and key[1].isdigit() and rnd.random() < 0.7:
        key = key[1:]
    return key if rnd.random() > 0.05 else draw(text)


# How often things go wrong is decided by a Random drawn per batch (hypothesis favours small integers, so
# deciding with them made most documents fail).

@st.composite
def value_for(draw: st.DrawFn, column: F, rnd: random.Random) -> Tree:
    choice = rnd.random()
    if choice < 0.06:
        return NULL
    if choice < 0.1:
        return draw(any_json)
    if column.mode != "REPEATED":
        return draw(element_for(column, rnd))
    if column.field_type == "RECORD" and {f.name for f in column.fields} == {"key", "value"} and choice < 0.6:
        value_column = next(f for f in column.fields if f.name == "value")
        return "obj", draw(st.lists(st.tuples(text, value_for(value_column, rnd)), max_size=3))
    element = element_for(column, rnd)
    return "arr", draw(st.lists(st.one_of(element, st.just(NULL)) if choice < 0.15 else element, max_size=3))


@st.composite
def element_for(draw: st.DrawFn, column: F, rnd: random.Random) -> Tree:
    if column.field_type != "RECORD":
        return draw(leaf_values(column.field_type, rnd))
    return draw(document_for(column.fields, rnd)) if rnd.random() > 0.05 else draw(any_json)


@st.composite
def document_for(draw: st.DrawFn, columns: list[F], rnd: random.Random) -> Tree:
    pairs = []
    for column in columns:
        if rnd.random() < 0.1 and column.mode != "REQUIRED" or rnd.random() < 0.02:
            continue  # missing
        for _ in range(2 if rnd.random() < 0.03 else 1):  # now and then, twice
            pairs.append((draw(key_for(column.name, rnd)), draw(value_for(column, rnd))))
    pairs += draw(st.lists(st.tuples(text, any_json), max_size=2))  # unknown keys
    return "obj", draw(st.permutations(pairs))


def render(tree: Tree, rnd: random.Random) -> str:
    """JSON text in one of its many spellings: whitespace, escapes (\\u, short, \\/), hex case all random."""
    def ws() -> str:
        return rnd.choice(["", "", "", " ", "\n", "\t ", "\r\n"])

    kind, body = tree
    if kind == "lit" or kind == "num":
        return body
    if kind == "str":
        return quote(body, rnd)
    if kind == "arr":
        return "[" + ws() + ("," + ws()).join(render(v, rnd) + ws() for v in body) + "]"
    return "{" + ws() + ",".join(ws() + quote(k, rnd) + ws() + ":" + ws() + render(v, rnd) + ws()
                                 for k, v in body) + "}"


def quote(value: str, rnd: random.Random) -> str:
    out = []
    for c in value:
        code = ord(c)
        if rnd.random() < 0.08 or c in '"\\' or code < 0x20:
            if c in '"\\' and rnd.random() < 0.5:
                out.append("\\" + c)
            elif code > 0xFFFF:
                high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(f"\\u{high:04x}\\u{low:04X}")
            else:
                short = {"\n": "\\n", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\r": "\\r", "/": "\\/"}.get(c)
                out.append(short if short and rnd.random() < 0.5 else f"\\u{code:04{rnd.choice('xX')}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


HOSTILE = [b"\x80", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\\ud800", b"\\udc00",
           b"\\ud83d\\u0041", b"\\ude00\\ud83d", b"\x00", b"\x1f", b'"', b"\\", b"\\u00", b"{", b"]", b",", b"NaN"]


def damage(document: bytes, rnd: random.Random) -> bytes:
    """Hostile input: bad UTF-8, lone surrogates, control bytes and stray syntax put inside, nesting near the
    limit, or the document cut short."""
    choice = rnd.randrange(4)
    if choice == 0:
        at = rnd.randrange(len(document) + 1)
        return document[:at] + rnd.choice(HOSTILE) + document[at:]
    if choice == 1:
        depth = MAX_DEPTH + rnd.randint(-3, 2)
        nested = b"[" * (depth - 1) + b"]" * (depth - 1)
        return b'{"' + rnd.choice([b"a", b"zz", b"ts"]) + b'":' + nested + b"," + document[1:] \
            if len(document) > 2 else b'{"a":' + nested + b"}"
    if choice == 2:
        return document[:rnd.randrange(len(document) + 1)]
    return document.replace(b'"', b'"\\ud83d\\ude00', 1)


@st.composite
def batch(draw: st.DrawFn) -> tuple[list[F], list[bytes | None], bool]:
    columns = draw(table())
    additional_properties = draw(st.booleans())
    if additional_properties:  # the column to fill must be a NULLABLE STRING; sometimes there is none
        columns = [c for c in columns if c.name.lower() != "additional_properties"]
        if draw(st.integers(0, 3)):
            columns.append(F("additional_properties", "STRING"))
    columns = columns or [F("a", "STRING")]
    rnd = random.Random(draw(st.integers(0, 2 ** 32)))  # uniform, and replayable from the drawn seed
    documents: list[bytes | None] = []
    for _ in range(draw(st.integers(1, 6))):
        if rnd.random() < 0.05:
            documents.append(None)
            continue
        document = render(draw(document_for(columns, rnd)), rnd).encode()
        documents.append(damage(document, rnd) if rnd.random() < 0.12 else document)
    return columns, documents, additional_properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch())
def test_native_and_reference_decode_random_documents_alike(example: tuple[list[F], list[bytes | None], bool]) -> None:
    columns, documents, additional_properties = example
    assert_same(columns, documents, additional_properties)


@pytest.mark.parametrize("seed", range(3))
def test_native_and_reference_agree_on_large_batches(seed: int) -> None:
    """One batch of many documents: rows that fail in between must not shift or leak into the rows around them."""
    rnd = random.Random(seed)
    columns = [F("id", "INTEGER", "REQUIRED"), F("tags", "STRING", "REPEATED"),
               F("m", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "NUMERIC")]),
               F("r", "RECORD", fields=[F("ts", "TIMESTAMP"), F("xs", "RECORD", "REPEATED", fields=[F("b", "BOOLEAN")])]),
               F("additional_properties", "STRING")]
    ids, tags = ["{i}", '"{i}"', "1.5", "null"], ["[]", '["a", 1]', "null", "2"]
    numbers, times = ["1.5", "1e-10", '"2"', "null"], ["1e9", '"2024-01-01T00:00:00Z"', '"x"']
    documents: list[bytes | None] = []
    for i in range(2_000):
        doc = ('{"id": %s, "tags": %s, "m": {"k": %s}, "r": {"ts": %s, "xs": [{"b": true, "u": 1}]}, "new": %d}' % (
            rnd.choice(ids).format(i=i), rnd.choice(tags), rnd.choice(numbers), rnd.choice(times), i)).encode()
        documents.append(None if i % 97 == 0 else damage(doc, rnd) if i % 13 == 0 else doc)
    for additional_properties in (True, False):
        assert_same(columns, documents, additional_properties)


# A user's hostile documents (acceptance run 8), each at a boundary one decoder could read differently
# from the other: number edges reached through exponents, escapes next to surrogates, bytes around the
# document, nesting at the limit inside text and JSON columns.
HOSTILE_TABLE = [F("id", "INTEGER", "REQUIRED"), F("s", "STRING"), F("i", "INTEGER"), F("f", "FLOAT"),
                 F("n", "NUMERIC"), F("bn", "BIGNUMERIC"), F("ts", "TIMESTAMP"), F("j", "JSON"),
                 F("m", "RECORD", "REPEATED", fields=[F("key", "INTEGER"), F("value", "RECORD",
                                                                              fields=[F("z", "BOOLEAN")])]),
                 F("additional_properties", "STRING")]
HOSTILE_DOCUMENTS = [
    b'{"id": 1, "i": 92233720368547758070e-1}', b'{"id": 1, "i": 92233720368547758080e-1}',
    b'{"id": 1, "i": "9223372036854775807.0"}', b'{"id": 1, "i": 0.00000000000000000000000000001e29}',
    b'{"id": 1, "i": 0e99999999999999999999999999}', b'{"id": 1, "i": 1e99999999999999999999999999}',
    b'{"id": 1, "n": 1e-99999999999999999999999999}', b'{"id": 1, "n": 0.' + b"0" * 5000 + b'1e5000}',
    b'{"id": 1, "n": "-0.000"}', b'{"id": 1, "bn": 578960446186580977117854925043439539266.3}',
    b'{"id": 1, "f": 0.' + b"0" * 5000 + b'1}', b'{"id": 1, "f": ' + b"1" * 5000 + b'}', b'{"id": 1, "f": -0}',
    b'{"id": 1, "ts": -1e-99999999999999999999}', b'{"id": 1, "ts": -62135596800.000001}',
    b'{"id": 1, "ts": 253402300799.9999999}', b'{"id": 1, "ts": "0001-01-01T00:00:00+00:01"}',
    b'{"id": 1, "ts": "9999-12-31T23:59:59.9999999-00:00"}', b'{"id": 1, "ts": "2024-01-02T03:04:05.\xd9\xa1Z"}',
    b'{"id": 1, "s": "\\ud83d\\\\ude00"}', b'{"id": 1, "s": "\\\\ud83d"}', b'{"id": 1, "s": "\\uD83D\\uDE00"}',
    b'{"id": 1, "s": "\\ud83d\\ude00\\ud83d"}', b'{"id": 1, "s": "\xe2\x80\xa8\x7f"}', b'{"id": 1, "s": "\\u0000"}',
    b'{"id": 1}\x1a', b'\x00{"id": 1}', b'{\xc2\xa0"id": 1}', b'{\x0c"id": 1}', b'{"id": 1}\r\n\t ', b'\xfe\xff\x00{',
    b'{"id": 1, "s": ' + b'{"a":' * 255 + b'1' + b'}' * 255 + b'}',
    b'{"id": 1, "j": ' + b'[' * 255 + b']' * 255 + b'}', b'{"id": 1, "j": ' + b'[' * 256 + b']' * 256 + b'}',
    b'{"id": 1, "j": {"a": 1, "a": 2}}', b'{"id": 1, "j": 1e400}', b'{"id": 1, "j": [1.7976931348623157e308]}',
    b'{"id": 1, "j": [1.7976931348623159e308]}', b'{"id": 1, "j": {"a": -1' + b"0" * 308 + b'}}',
    b'{"id": 1, "j": {"a": -2' + b"0" * 308 + b'}}', b'{"id": 1, "j": 0.' + b"0" * 5000 + b'1e5309}',
    b'{"id": 1, "j": 0.' + b"0" * 5000 + b'1e5308}', b'{"id": 1, "j": [1e400, }', b'{"id": 1, "j": 1e-99999}',
    b'{"id": 1, "j": [1e400], "i": true}', b'{"id": 1, "i": true, "j": [1e400]}',
    b'{"id": 1, "m": {"1": {"z": true, "extra": 1}, "2": {"z": false}}}',
    b'{"id": 1, "m": {"01": {"z": true}}}', b'{"id": 1, "m": {" 2": {"z": true}}}',
    b'{"id": 1, "Additional-Properties": {"a": 1}, "a-b": 1, "a.b": 2, "zz": 1, "zz": 2}',
    b'{"ID": 1, "Id": 2}', b'{"Id": "5"}',
]


@pytest.mark.parametrize("additional_properties", [True, False])
def test_native_and_reference_agree_on_hostile_documents(additional_properties: bool) -> None:
    out = assert_same(HOSTILE_TABLE, HOSTILE_DOCUMENTS, additional_properties)
    assert 0 < len(out.failures) < len(HOSTILE_DOCUMENTS)  # both sides of each boundary are exercised
    for document in HOSTILE_DOCUMENTS:  # and alone, where no other row's buffers surround it
        assert_same(HOSTILE_TABLE, [document], additional_properties)
