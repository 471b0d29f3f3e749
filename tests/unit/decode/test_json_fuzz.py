"""Mutated JSON: the native decoder and the reference accept and reject the same documents, and agree on the
rows they accept (byte flips, deletions, stray tokens, spliced and truncated documents)."""

from __future__ import annotations

import random

import pytest
from google.cloud.bigquery import SchemaField as F
from hypothesis import given, settings
from hypothesis import strategies as st

from firehose_bq.errors import ErrorType
from tests.unit.decode.json_support import assert_same, needs_native

pytestmark = needs_native

COLUMNS = [
    F("event_id", "STRING", "REQUIRED"),
    F("sent_at", "TIMESTAMP"),
    F("count", "INTEGER"),
    F("price", "NUMERIC"),
    F("ratio", "FLOAT"),
    F("active", "BOOLEAN"),
    F("day", "DATE"),
    F("blob", "BYTES"),
    F("client", "RECORD", fields=[F("os", "STRING"), F("version", "STRING"),
                                  F("screen", "RECORD", fields=[F("w", "INTEGER"), F("h", "INTEGER")])]),
    F("labels", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "STRING")]),
    F("items", "RECORD", "REPEATED", fields=[F("sku", "STRING", "REQUIRED"), F("qty", "INTEGER")]),
    F("tags", "STRING", "REPEATED"),
    F("extra", "STRING"),
    F("additional_properties", "STRING"),
]
SEEDS = [
    b'{"event-id": "e1", "sent_at": "2024-05-01T10:00:00.123Z", "count": "12", "price": 19.99, "ratio": 0.5, '
    b'"active": true, "day": "2024-05-01", "blob": "AAEC", "client": {"os": "linux", "Version": 3.1, '
    b'"screen": {"w": 1920, "h": 1080, "dpi": 96}}, "labels": {"a": "1", "b": "x\\u00e9"}, '
    b'"items": [{"sku": "s1", "qty": 2}, {"sku": "s2", "gift": true}], "tags": ["x", "y"], '
    b'"extra": {"nested": [1, {"k": null}]}, "new_field": [1, 2, 3]}',
    b'{"event_id":"e2","sent_at":1714557600.5,"count":1e2,"price":"-0.000000001","ratio":"NaN","active":"FALSE",'
    b'"labels":[{"key":"k","value":"v"}],"items":[],"tags":null,"client":null,"\xc3\xa9t\xc3\xa9":"\\ud83d\\ude00"}',
    b'{\n  "EVENT_ID" : "e3" ,\n  "sent_at" : "2024-05-01 10:00:00 UTC",\n  "1st" : {"deep": [[[]]]},\n'
    b'  "items" : [ { "sku" : "s" , "qty" : -0 } ]\n}',
]
TOKENS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\\u", b"\\ud800", b"null", b"true", b"-", b".", b"e",
          b"0", b"1e999", b" ", b"\x00", b"\x1f", b"\x7f", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xff",
          b'"":', b"NaN", b'{"sku":null}']


def mutate(document: bytes, rnd: random.Random) -> bytes:
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(document) + 1)
        op = rnd.randrange(6)
        if op == 0 and at < len(document):
            document = document[:at] + bytes([rnd.randrange(256)]) + document[at + 1:]
        elif op == 1:
            document = document[:at] + document[at + rnd.randint(1, 4):]
        elif op == 2:
            document = document[:at] + rnd.choice(TOKENS) + document[at:]
        elif op == 3:
            end = min(len(document), at + rnd.randint(1, 20))
            document = document[:end] + document[at:end] + document[end:]
        elif op == 4:
            other = rnd.choice(SEEDS)
            cut = rnd.randrange(len(other) + 1)
            document = document[:at] + other[cut:cut + rnd.randint(1, 30)] + document[at:]
        else:
            document = document[:at]
    return document


def test_the_seed_documents_decode() -> None:
    out = assert_same(COLUMNS, SEEDS, True)
    assert out.failures == []


@pytest.mark.parametrize("seed", range(4))
def test_mutated_documents_are_accepted_and_rejected_alike(seed: int) -> None:
    rnd = random.Random(seed)
    documents: list[bytes | None] = [mutate(rnd.choice(SEEDS), rnd) for _ in range(1_500)]
    for additional_properties in (True, False):
        out = assert_same(COLUMNS, documents, additional_properties)
        kinds = {f.error_type for f in out.failures}
        # the mutations are meant to hit both kinds of failure, and to leave some documents whole
        assert kinds == {ErrorType.DESERIALIZATION_ERROR, ErrorType.INVALID_MESSAGE_ERROR}
        assert len(out.failures) < len(documents)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_arbitrary_bytes_are_accepted_and_rejected_alike(documents: list[bytes]) -> None:
    assert_same(COLUMNS, [b"{" + d for d in documents], True)
