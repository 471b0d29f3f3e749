"""insertAll request splitting and per-row outcomes, against a fake client (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions

from firehose_bq.bigquery import insert_all
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.config import BigQueryConfig
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.errors import ErrorType, SinkError


class FakeClient:
    """Answers insert_rows_json like BigQuery: `bad` rows are invalid, the rest of such a request stopped."""

    def __init__(self, bad: set[str] = frozenset(), fail: Exception | None = None) -> None:
        self.bad, self.fail = bad, fail
        self.requests: list[tuple[list[dict], list[str | None]]] = []
        self.stored: list[dict] = []

    def insert_rows_json(self, table: str, rows: list[dict], row_ids: list, **_: Any) -> list[dict]:
        self.requests.append((rows, row_ids))
        if self.fail:
            raise self.fail
        invalid = [i for i, r in enumerate(rows) if r["id"] in self.bad]
        if not invalid:
            self.stored.extend(rows)
            return []
        return [{"index": i, "errors": [{"reason": "invalid", "location": "id", "message": "bad id"}]
                 if i in invalid else [{"reason": "stopped", "location": "", "message": ""}]}
                for i in range(len(rows))]


def batch(ids: list[str], payload: str = "") -> tuple[ConvertedBatch, KafkaRecords]:
    n = len(ids)
    records = KafkaRecords(["t"] * n, [1] * n, list(range(100, 100 + n)), [0] * n, [b""] * n)
    rows = [{"id": i, "p": payload} for i in ids]
    return ConvertedBatch(rows, [records.insert_id(k) for k in range(n)], list(range(n))), records


def writer(client: FakeClient, **overrides: Any) -> InsertAllWriter:
    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", **overrides)
    return InsertAllWriter(client, cfg)  # type: ignore[arg-type]


def test_requests_respect_the_row_limit_and_carry_insert_ids() -> None:
    client = FakeClient()
    assert writer(client, insert_all_batch_size=2).write(*batch(["a", "b", "c", "d", "e"])) == []
    assert [len(rows) for rows, _ in client.requests] == [2, 2, 1]
    assert client.requests[0][1] == ["t_1_100", "t_1_101"]
    assert len(client.stored) == 5


def test_insert_ids_can_be_turned_off() -> None:
    client = FakeClient()
    writer(client, row_insert_id_enable=False).write(*batch(["a"]))
    assert client.requests[0][1] == [None]


def test_requests_respect_the_byte_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    converted, records = batch(["a", "b", "c"], payload="x" * 25)
    # What one row costs in a request: its JSON, its insertId and the envelope around both.
    row = len(json.dumps(converted.rows[0], separators=(",", ":"))) + len("t_1_100") + insert_all.ROW_ENVELOPE_BYTES
    monkeypatch.setattr(insert_all, "MAX_REQUEST_BYTES", 2 * row + 2)  # room for two rows, not three
    client = FakeClient()
    failures = writer(client).write(converted, records)
    assert failures == []
    assert [len(rows) for rows, _ in client.requests] == [2, 1]


def test_oversized_row_is_payload_too_large_and_never_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(insert_all, "MAX_REQUEST_BYTES", 100)
    converted, records = batch(["a", "b"])
    converted.rows[1]["p"] = "x" * 200
    client = FakeClient()
    failures = writer(client).write(converted, records)
    assert [(f.error_type, f.offset) for f in failures] == [(ErrorType.PAYLOAD_TOO_LARGE, 101)]
    assert [r["id"] for rows, _ in client.requests for r in rows] == ["a"]


def test_stopped_rows_are_resent_without_the_invalid_ones() -> None:
    client = FakeClient(bad={"b"})
    failures = writer(client).write(*batch(["a", "b", "c"]))
    assert [(f.error_type, f.offset, f.message) for f in failures] == [
        (ErrorType.SINK_4XX_ERROR, 101, "invalid at id: bad id")]
    assert [r["id"] for r in client.stored] == ["a", "c"]
    assert client.requests[1][1] == ["t_1_100", "t_1_102"]  # same insertIds on the re-send


def test_a_failed_request_raises_a_classified_sink_error() -> None:
    client = FakeClient(fail=exceptions.NotFound("table gone"))
    with pytest.raises(SinkError) as raised:
        writer(client).write(*batch(["a"]))
    assert raised.value.error_type is ErrorType.SINK_4XX_ERROR
    assert "p.d.t" in str(raised.value)
