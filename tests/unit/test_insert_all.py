"""insertAll from Arrow: BigQuery's JSON forms, request splitting and per-row outcomes, against a fake client."""

from __future__ import annotations

import base64
import datetime as dt
import inspect
import json
import math
import threading
import time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from google.api_core import exceptions
from google.cloud import bigquery

from firehose_bq.arrow_schema import TIMESTAMP
from firehose_bq.bigquery import insert_all
from firehose_bq.bigquery.insert_all import InsertAllWriter, request_entries
from firehose_bq.bigquery.json_rows import row_texts
from firehose_bq.config import BigQueryConfig
from firehose_bq.errors import ErrorType, PartialWriteError, SinkError, TableChangedError

# --------------------------------------------------------------------------- JSON text


HOSTILE = ['plain', 'quote " and backslash \\', "controls \x00\x01\t\n\x1f", "ünïcødé ✓ \u2028", "", None]


def test_every_value_takes_bigquerys_json_form() -> None:
    rows = pa.RecordBatch.from_pydict({
        "s": pa.array(HOSTILE),
        "n": pa.array([0, -1, 2**63 - 1, -(2**63), None, 7], pa.int64()),
        "f": pa.array([1.5, math.nan, math.inf, -math.inf, -0.0, None]),
        "small": pa.array([0.1, 1e-7, 1e20, 123456789.123456789, 5e-324, 1.7976931348623157e308]),
        "ok": pa.array([True, False, None, True, False, None]),
        "raw": pa.array([b"\x00\xff", b"", None, b'"\\', bytes(range(256)), b"x"]),
        "ts": pa.array([0, 1, -62_135_596_800_000_000, 253_402_300_799_999_999, None, 1_767_225_600_123_456],
                       pa.int64()).cast(TIMESTAMP),
        "d": pa.array([0, -719_162, 2_932_896, None, 1, 20_000], pa.int32()).cast(pa.date32()),
        "num": pa.array([Decimal("1E-9"), Decimal("-99999999999999999999999999999.999999999"), None,
                         Decimal(0), Decimal("12.5"), Decimal("-0.1")], pa.decimal128(38, 9)),
    })
    texts = row_texts(rows).to_pylist()
    parsed = [json.loads(t) for t in texts]

    assert [p.get("s") for p in parsed] == HOSTILE
    assert [p.get("n") for p in parsed] == [0, -1, 2**63 - 1, -(2**63), None, 7]
    assert [p.get("f") for p in parsed] == [1.5, "NaN", "Infinity", "-Infinity", -0.0, None]
    # -0.0 == 0 in Python: the sign is checked apart (JSON's `-0` is the integer 0 to a JSON reader).
    assert type(parsed[4]["f"]) is float and math.copysign(1.0, parsed[4]["f"]) == -1.0
    assert [p["small"] for p in parsed] == [0.1, 1e-7, 1e20, 123456789.123456789, 5e-324, 1.7976931348623157e308]
    assert [p.get("ok") for p in parsed] == [True, False, None, True, False, None]
    assert [None if "raw" not in p else base64.b64decode(p["raw"]) for p in parsed] == \
        [b"\x00\xff", b"", None, b'"\\', bytes(range(256)), b"x"]
    assert [p.get("ts") for p in parsed] == [
        "1970-01-01T00:00:00.000000Z", "1970-01-01T00:00:00.000001Z", "0001-01-01T00:00:00.000000Z",
        "9999-12-31T23:59:59.999999Z", None, "2026-01-01T00:00:00.123456Z"]
    assert [p.get("d") for p in parsed] == ["1970-01-01", "0001-01-01", "9999-12-31", None, "1970-01-02", "2024-10-04"]
    assert [p.get("num") for p in parsed] == ["0.000000001", "-99999999999999999999999999999.999999999", None,
                                              "0.000000000", "12.500000000", "-0.100000000"]
    assert "null" not in texts[4].replace('"null"', ""), "NULL values are left out of the object"


def test_records_and_arrays_nest_and_null_arrays_are_empty() -> None:
    item = pa.struct([("sku", pa.string()), ("at", TIMESTAMP), ("tags", pa.list_(pa.string()))])
    rows = pa.RecordBatch.from_pydict({
        "rec": pa.array([{"a": 1, "inner": {"x": None}}, None, {"a": None, "inner": None}],
                        pa.struct([("a", pa.int64()), ("inner", pa.struct([("x", pa.float64())]))])),
        "items": pa.array([[{"sku": 'q"', "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "tags": ["t"]}], None,
                           [{"sku": None, "at": None, "tags": None}, {"sku": "b", "at": None, "tags": []}]],
                          pa.list_(item)),
        "map": pa.array([[{"key": "k", "value": "v"}], [], None],
                        pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))),
    })

    parsed = [json.loads(t) for t in row_texts(rows).to_pylist()]

    assert parsed == [
        {"rec": {"a": 1, "inner": {}}, "items": [{"sku": 'q"', "at": "2026-01-02T00:00:00.000000Z", "tags": ["t"]}],
         "map": [{"key": "k", "value": "v"}]},
        {"items": [], "map": []},
        {"rec": {}, "items": [{"tags": []}, {"sku": "b", "tags": []}], "map": []},
    ]


def test_a_sliced_batch_and_a_batch_without_values_encode_what_they_hold() -> None:
    rows = pa.RecordBatch.from_pydict({"l": pa.array([[1], [2, 3], [4]], pa.list_(pa.int64())),
                                       "r": pa.array([{"a": 1}, {"a": 2}, {"a": 3}])}).slice(1, 2)
    assert [json.loads(t) for t in row_texts(rows).to_pylist()] == [{"l": [2, 3], "r": {"a": 2}},
                                                                    {"l": [4], "r": {"a": 3}}]
    empty = pa.RecordBatch.from_pydict({"a": pa.array([None, None], pa.int64())})
    assert row_texts(empty).to_pylist() == ["{}", "{}"]


def test_timestamps_of_any_unit_and_zone_are_utc_text_in_microseconds() -> None:
    instant = 1_767_225_600_123_456_789  # ns
    rows = pa.RecordBatch.from_pydict({
        "ns": pa.array([instant], pa.timestamp("ns", "UTC")),
        "zoned": pa.array([instant // 1000], pa.timestamp("us", "Asia/Jakarta")),
        "naive_s": pa.array([instant // 10**9], pa.timestamp("s")),
        "d64": pa.array([instant // 10**6 // 86_400_000 * 86_400_000], pa.date64()),
    })
    assert json.loads(row_texts(rows)[0].as_py()) == {
        "ns": "2026-01-01T00:00:00.123456Z", "zoned": "2026-01-01T00:00:00.123456Z",
        "naive_s": "2026-01-01T00:00:00.000000Z", "d64": "2026-01-01"}


def test_request_entries_carry_escaped_insert_ids_or_none() -> None:
    rows = pa.RecordBatch.from_pydict({"a": [1]})
    assert request_entries(rows, pa.array(['t"x_0_1'])).to_pylist() == ['{"insertId":"t\\"x_0_1","json":{"a":1}}']
    assert request_entries(rows, None).to_pylist() == ['{"json":{"a":1}}']


# --------------------------------------------------------------------------- the writer


class FakeClient:
    """Answers insertAll like BigQuery: rows whose `id` is in `bad` are invalid, the rest of such a request
    stopped. Sees the request body as it would go over the wire."""

    def __init__(self, bad: set[str] = frozenset(), fail: Exception | None = None, fail_from: int = 0) -> None:
        self.bad, self.fail, self.fail_from = bad, fail, fail_from  # requests from number `fail_from` on fail
        self.requests: list[dict[str, Any]] = []
        self.retries: list[Any] = []
        self.sizes: list[int] = []
        self.stored: list[dict] = []
        self.closed = False

    def _call_api(self, retry: Any, *, span_name: str, span_attributes: dict, method: str, path: str, data: bytes,
                  content_type: str, timeout: float) -> dict[str, Any]:
        assert (method, path, content_type) == ("POST", "/projects/p/datasets/d/tables/t/insertAll", "application/json")
        assert isinstance(data, bytes)
        body = json.loads(data)
        self.requests.append(body)
        self.sizes.append(len(data))
        self.retries.append(retry)
        if self.fail and len(self.requests) > self.fail_from:
            raise self.fail
        rows = body["rows"]
        invalid = [i for i, r in enumerate(rows) if r["json"].get("id") in self.bad]
        if not invalid:
            self.stored.extend(r["json"] for r in rows)
            return {}
        return {"insertErrors": [
            {"index": i, "errors": [{"reason": "invalid", "location": "id", "message": "bad id"}]
             if i in invalid else [{"reason": "stopped", "location": "", "message": ""}]} for i in range(len(rows))]}

    def close(self) -> None:
        self.closed = True


def rows_of(ids: list[str], payload: str = "") -> tuple[pa.RecordBatch, pa.StringArray]:
    n = len(ids)
    rows = pa.RecordBatch.from_pydict({"id": ids, "p": [payload] * n})
    return rows, pa.array([f"t_1_{100 + k}" for k in range(n)])


def writer(client: FakeClient, **overrides: Any) -> InsertAllWriter:
    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", **overrides)
    return InsertAllWriter(client, cfg)  # type: ignore[arg-type]


def ids_sent(client: FakeClient, request: int) -> list[str | None]:
    return [r.get("insertId") for r in client.requests[request]["rows"]]


def test_requests_respect_the_row_limit_and_carry_insert_ids() -> None:
    client = FakeClient()
    w = writer(client, insert_all_batch_size=2)
    assert w.write(*rows_of(["a", "b", "c", "d", "e"])) == []
    assert [len(r["rows"]) for r in client.requests] == [2, 2, 1]
    assert ids_sent(client, 0) == ["t_1_100", "t_1_101"]
    assert [r["id"] for r in client.stored] == ["a", "b", "c", "d", "e"]
    w.close()
    assert not client.closed, "the client is borrowed: its maker closes it"


def test_insert_ids_can_be_turned_off_or_be_absent() -> None:
    client = FakeClient()
    writer(client, row_insert_id_enable=False).write(*rows_of(["a"]))
    writer(client).write(rows_of(["b"])[0], None)
    assert ids_sent(client, 0) == [None] and ids_sent(client, 1) == [None]


def test_requests_respect_the_byte_limit_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, ids = rows_of(["a", "b", "c"], payload="x" * 25)
    entry = len(request_entries(rows.slice(0, 1), ids.slice(0, 1))[0].as_py().encode())
    # A body of two rows: {"rows":[e1,e2]} is BODY_BYTES + two entries + one comma; the writer counts a comma
    # after every entry, so the limit below is the smallest that takes two.
    monkeypatch.setattr(insert_all, "MAX_REQUEST_BYTES", insert_all.BODY_BYTES + 2 * (entry + 1))
    client = FakeClient()
    assert writer(client).write(rows, ids) == []
    assert [len(r["rows"]) for r in client.requests] == [2, 1]
    assert max(client.sizes) <= insert_all.MAX_REQUEST_BYTES


def test_an_oversized_row_is_payload_too_large_and_never_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(insert_all, "MAX_REQUEST_BYTES", 200)
    rows = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "p": ["", "x" * 300, ""]})
    client = FakeClient()
    failures = writer(client).write(rows, pa.array(["t_1_100", "t_1_101", "t_1_102"]))
    assert [(f.index, f.error_type) for f in failures] == [(1, ErrorType.PAYLOAD_TOO_LARGE)]
    assert [r["id"] for body in client.requests for r in (x["json"] for x in body["rows"])] == ["a", "c"]


def test_stopped_rows_are_resent_without_the_invalid_ones() -> None:
    client = FakeClient(bad={"b"})
    failures = writer(client).write(*rows_of(["a", "b", "c"]))
    assert [(f.index, f.error_type, f.message) for f in failures] == [
        (1, ErrorType.SINK_4XX_ERROR, "invalid at id: bad id")]
    assert [r["id"] for r in client.stored] == ["a", "c"]
    assert ids_sent(client, 1) == ["t_1_100", "t_1_102"]  # same insertIds on the re-send


def test_values_no_column_can_hold_fail_before_sending_and_positions_stay_the_inputs() -> None:
    past = pa.array([0, 300_000_000_000_000_000, 0], pa.int64()).cast(TIMESTAMP)
    rows = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "at": past})
    client = FakeClient(bad={"c"})

    failures = writer(client).write(rows, pa.array(["t_1_100", "t_1_101", "t_1_102"]))

    assert [(f.index, f.error_type) for f in failures] == [(1, ErrorType.INVALID_MESSAGE_ERROR),
                                                              (2, ErrorType.SINK_4XX_ERROR)]
    assert ids_sent(client, 0) == ["t_1_100", "t_1_102"] and [r["id"] for r in client.stored] == ["a"]


class ShrunkClient(FakeClient):
    """Its table has only `id` left: BigQuery answers every other field of a row "no such field"."""

    def _call_api(self, retry: Any, **kwargs: Any) -> dict[str, Any]:
        rows = json.loads(kwargs["data"])["rows"]
        self.requests.append(rows)
        return {"insertErrors": [{"index": i, "errors": [{"reason": "invalid", "location": name,
                                                          "message": f"no such field: {name}."}
                                                         for name in r["json"] if name != "id"]}
                                 for i, r in enumerate(rows)]}


def test_a_table_that_lost_columns_its_check_found_is_a_table_change_not_bad_rows() -> None:
    """A routed table dropped and created again with fewer columns while a worker's kept check of it stood
    (sink_schema.CheckedTables): BigQuery answers every row "no such field" for a column the check found. That
    is the table's change, not the rows' fault: TableChangedError (the task checks the table again, which evolves
    it, and writes again: batch/core.py `_heals`) instead of a dead letter per row."""
    client = ShrunkClient()
    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", insert_all_batch_size=2)
    known = [bigquery.SchemaField("id", "STRING"), bigquery.SchemaField("P", "STRING")]
    with pytest.raises(TableChangedError) as changed:
        InsertAllWriter(client, cfg, known).write(*rows_of(["a", "b", "c"], payload="x"))  # type: ignore[arg-type]
    assert changed.value.unsent == (0, 1, 2) and changed.value.error_type is ErrorType.SINK_4XX_ERROR
    assert "has no column(s) p any more" in changed.value.message and len(client.requests) == 1
    # A field the check did not find either is the rows' (unknown field): per-row failures, as before.
    client = ShrunkClient()
    failures = InsertAllWriter(client, cfg, known[:1]).write(*rows_of(["a"], payload="x"))  # type: ignore[arg-type]
    assert [(f.index, f.error_type, f.message) for f in failures] == [
        (0, ErrorType.SINK_4XX_ERROR, "invalid at p: no such field: p.")]


def test_a_failed_request_raises_a_classified_sink_error() -> None:
    client = FakeClient(fail=exceptions.NotFound("table gone"))
    with pytest.raises(SinkError) as raised:
        writer(client).write(*rows_of(["a"]))
    assert raised.value.error_type is ErrorType.SINK_4XX_ERROR
    assert "p.d.t" in str(raised.value)


def test_a_request_failing_part_way_names_the_rows_not_sent_and_the_client_does_not_retry_it() -> None:
    client = FakeClient(bad={"b"}, fail=exceptions.ServiceUnavailable("backend down"), fail_from=2)
    with pytest.raises(PartialWriteError) as raised:
        # One request at a time: which fails is then the third sent.
        writer(client, insert_all_batch_size=2, insert_all_concurrent_requests=1).write(*rows_of(["a", "b", "c", "d",
                                                                                                  "e"]))
    # Request 1 (a, b): b invalid, a re-sent alone (request 2); request 3 (c, d) failed, so e was never sent.
    assert raised.value.error_type is ErrorType.SINK_5XX_ERROR
    assert raised.value.unsent == (2, 3, 4)
    assert [(f.index, f.error_type) for f in raised.value.failures] == [(1, ErrorType.SINK_4XX_ERROR)]
    assert client.retries == [None] * 3  # the error policy retries, not the client


def test_the_clients_insert_call_takes_what_the_writer_passes() -> None:
    """The writer posts its ready JSON through Client._call_api, the call insert_rows_json makes: if an
    upgrade of google-cloud-bigquery changes it, this fails before any row is lost."""
    params = inspect.signature(bigquery.Client._call_api).parameters
    assert {"retry", "span_name", "span_attributes", "kwargs"} <= set(params)
    source = inspect.getsource(bigquery.Client.insert_rows_json)
    assert "self._call_api(" in source and 'method="POST"' in source


class RefusingClient(FakeClient):
    """Refuses every request holding a `poison` row as a whole: HTTP 400, reason `invalid`."""

    def __init__(self, poison: str) -> None:
        super().__init__()
        self.poison = poison

    def _call_api(self, retry: Any, **kwargs: Any) -> dict[str, Any]:
        rows = json.loads(kwargs["data"])["rows"]
        if any(r["json"]["id"] == self.poison for r in rows):
            self.requests.append({"rows": rows})
            raise exceptions.BadRequest("Request contains an invalid argument.", errors=[{"reason": "invalid"}])
        return super()._call_api(retry, **kwargs)


def test_a_request_refused_as_invalid_is_a_partial_write_the_policy_can_isolate() -> None:
    client = RefusingClient("c")
    with pytest.raises(PartialWriteError) as raised:
        writer(client, insert_all_batch_size=2, insert_all_concurrent_requests=1).write(*rows_of(["a", "b", "c", "d",
                                                                                                  "e"]))
    assert raised.value.invalid_request and raised.value.unsent == (2, 3, 4)

    gone = FakeClient(fail=exceptions.NotFound("table gone", errors=[{"reason": "notFound"}]))
    with pytest.raises(SinkError) as raised:
        writer(gone).write(*rows_of(["a"]))
    assert not raised.value.invalid_request


def test_the_policy_isolates_the_row_of_a_refused_insert_all_request() -> None:
    from firehose_bq.batch.rows import Writable
    from firehose_bq.policy import ErrorHandling, write_with_policy

    client = RefusingClient("k")
    rows, ids = rows_of([chr(ord("a") + i) for i in range(20)])
    pending = Writable(rows, ids, np.arange(20, dtype=np.int64))

    done = write_with_policy(ErrorHandling(), pending, [], lambda: writer(client, insert_all_batch_size=4))

    assert [(e.index, e.error_type) for e in done.errors] == [(10, ErrorType.SINK_4XX_ERROR)] and done.written == 19
    assert sorted(r["id"] for r in client.stored) == sorted(set(rows["id"].to_pylist()) - {"k"})  # each once
    sent_ids = [r["insertId"] for body in client.requests for r in body["rows"]]
    assert set(sent_ids) == set(ids.to_pylist())  # each row went with its own insertId


class SlowClient(FakeClient):
    """Holds each request until `together` requests are in flight at once (a barrier: sent one after another,
    they never are, and it breaks), and counts the most in flight at any time."""

    def __init__(self, together: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(together, timeout=10)
        self.lock = threading.Lock()
        self.in_flight = self.most = 0

    def _call_api(self, retry: Any, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            self.barrier.wait()
            return super()._call_api(retry, **kwargs)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_a_writer_has_its_requests_in_flight_at_once_up_to_the_setting() -> None:
    client = SlowClient(together=3)
    ids = [f"r{i}" for i in range(9)]
    assert writer(client, insert_all_batch_size=1, insert_all_concurrent_requests=3).write(*rows_of(ids)) == []
    assert client.most == 3 and sorted(r["id"] for r in client.stored) == ids


def test_the_writers_of_a_process_share_its_request_slots() -> None:
    """Two writers of 3 requests at once, 2 slots: never more than 2 requests in flight (the REST client's
    connections per host, client.Clients.request_slots)."""
    client = SlowClient(together=2)
    slots = threading.BoundedSemaphore(2)
    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", insert_all_batch_size=1,
                         insert_all_concurrent_requests=3)
    writers = [InsertAllWriter(client, cfg, slots=slots) for _ in range(2)]  # type: ignore[arg-type]
    batches = [rows_of([f"{w}{i}" for i in range(6)]) for w in "xy"]
    threads = [threading.Thread(target=w.write, args=batch) for w, batch in zip(writers, batches, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert client.most == 2 and len(client.stored) == 12


class FailingOnClient(FakeClient):
    """Fails the request holding row `fails` as a whole; the request holding row `waits` answers only once that
    failure is 0.2 s old."""

    def __init__(self, fails: str, waits: str) -> None:
        super().__init__()
        self.fails, self.waits = fails, waits
        self.failed = threading.Event()

    def _call_api(self, retry: Any, **kwargs: Any) -> dict[str, Any]:
        ids = [r["json"]["id"] for r in json.loads(kwargs["data"])["rows"]]
        if self.fails in ids:
            self.requests.append({"rows": ids})
            self.failed.set()
            raise exceptions.ServiceUnavailable("backend down")
        if self.waits in ids:
            assert self.failed.wait(10)
            time.sleep(0.2)
        return super()._call_api(retry, **kwargs)


def test_the_first_request_that_fails_stops_those_not_sent_and_those_in_stay_in() -> None:
    client = FailingOnClient(fails="b", waits="a")
    with pytest.raises(PartialWriteError) as raised:
        writer(client, insert_all_batch_size=1, insert_all_concurrent_requests=2).write(*rows_of(list("abcdef")))
    # a and b went out together; b failed; c to f were never sent. a went in, and only it.
    assert [r["id"] for r in client.stored] == ["a"] and len(client.requests) == 2
    assert raised.value.unsent == (1, 2, 3, 4, 5) and raised.value.error_type is ErrorType.SINK_5XX_ERROR
    assert "backend down" in str(raised.value)


def test_a_bug_in_a_request_thread_is_raised_as_it_is() -> None:
    class Broken(FakeClient):
        def _call_api(self, retry: Any, **kwargs: Any) -> dict[str, Any]:
            raise KeyError("not a failed request")

    with pytest.raises(KeyError):
        writer(Broken(), insert_all_batch_size=1).write(*rows_of(["a", "b"]))
