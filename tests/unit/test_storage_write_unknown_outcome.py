"""Storage Write's honest at-least-once: a request whose answer is lost (a deadline, a broken connection)
may have been appended; the error policy sends its rows again, so they can land twice in a run that never
crashed. The writer cannot tell, so it says so: a warning with the count (found by review: the README had
promised duplicates only from a crash replay). Exactly-once would need committed streams with offsets
(bigquery/storage_write.py's docstring says why the default stream stays). The scripted write client is
the one of tests/unit/test_storage_write.py.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud.bigquery_storage_v1 import types

from tests.unit.test_storage_write import batches, make_writer, ok, rows_of, status, write_with_retries

UNKNOWN = "got no answer from AppendRows"


class LandedTable:
    """What the table holds: every row of every request the server accepted, whether or not its answer
    reached the writer."""

    def __init__(self) -> None:
        self.ids: Counter[int] = Counter()

    def store(self, raw: list[Any]) -> None:
        for rows in batches(raw):
            self.ids.update(rows.column("Id").to_pylist())


def lands_then_deadline(table: LandedTable):  # noqa: ANN201
    """The server appends the request, then the client's deadline passes before the answer arrives."""

    def handler(raw: list[Any]) -> Any:
        table.store(raw)
        raise api_exceptions.DeadlineExceeded("Deadline Exceeded")
        yield  # pragma: no cover - a generator: it raises when the writer reads the responses

    return handler


def lands(table: LandedTable):  # noqa: ANN201
    def handler(raw: list[Any]) -> list[types.AppendRowsResponse]:
        table.store(raw)
        return ok(raw)

    return handler


def test_an_append_that_landed_but_timed_out_is_sent_again_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    table = LandedTable()
    writer, _, client = make_writer([lands_then_deadline(table), lands(table)])

    with caplog.at_level(logging.WARNING, logger="firehose_bq.bigquery.storage_write"):
        done, _ = write_with_retries(writer, rows_of(3))

    # What the task reports: all written, nothing failed; the batch commits.
    assert (done.written, done.errors) == (3, [])
    assert len(client.connections) == 2  # the policy re-sent the rows it could not know were appended
    assert table.ids == Counter({0: 2, 1: 2, 2: 2}), "at-least-once: the default stream keeps both copies"
    assert [r.getMessage().split(" into ")[0] for r in caplog.records if UNKNOWN in r.getMessage()] == ["3 row(s)"]


def test_a_request_answered_with_an_error_is_no_unknown_outcome(caplog: pytest.LogCaptureFixture) -> None:
    # BigQuery answered: the request was not appended, and sending it again duplicates nothing.
    table = LandedTable()
    writer, _, _ = make_writer([status(14, "the backend is busy"), lands(table)])
    with caplog.at_level(logging.WARNING, logger="firehose_bq.bigquery.storage_write"):
        done, _ = write_with_retries(writer, rows_of(3))
    assert (done.written, table.ids) == (3, Counter({0: 1, 1: 1, 2: 1}))
    assert not [r for r in caplog.records if UNKNOWN in r.getMessage()]


def test_rows_after_a_connection_break_are_sent_again_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Several requests on one connection: the server appends all of them, the stream breaks after the
    first answer. The unanswered ones are re-sent."""
    import tests.unit.test_storage_write as sw

    table = LandedTable()

    def first_answer_then_break(raw: list[Any]) -> Any:
        table.store(raw)
        yield ok(raw[:1])[0]
        raise api_exceptions.ServiceUnavailable("Socket closed")

    monkeypatch.setattr(sw.storage_write, "MAX_REQUEST_BYTES", 1_500)  # 4 requests on the connection
    writer, _, client = make_writer([first_answer_then_break, lands(table)])

    with caplog.at_level(logging.WARNING, logger="firehose_bq.bigquery.storage_write"):
        done, _ = write_with_retries(writer, rows_of(40))

    assert (done.written, done.errors) == (40, [])
    resent = pa.Table.from_batches(batches(client.connections[1])).num_rows
    twice = sorted(i for i, n in table.ids.items() if n > 1)
    assert resent == len(twice) > 0  # the unanswered requests' rows, and only those, are in twice
    warned = [r.getMessage() for r in caplog.records if UNKNOWN in r.getMessage()]
    assert [w.split(" into ")[0] for w in warned] == [f"{resent} row(s)"]
