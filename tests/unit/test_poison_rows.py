"""A request BigQuery refuses as a whole for one bad row: the policy isolates the row, at a bounded cost.

The fake writer behaves as BigQuery's whole-request refusals do: a request holding a poison row fails
as a whole (nothing of it written) with an `invalid_request` SinkError; with `chunk` set it sends its
rows in requests of that many, as insertAll does, and a refused request ends the call with a
PartialWriteError naming the rows not sent (the requests before it are written).
"""

from __future__ import annotations

import math
import pickle

import pyarrow as pa
import pytest

from firehose_bq.errors import ErrorType, PartialWriteError, RowError, SinkError
from firehose_bq.policy import ISOLATION_ROWS, IsolationBudget
from tests.unit.clock import Clock
from tests.unit.test_policy import FlakyWriter, batch, handling, run

INVALID = "400 POST insertAll: Request contains an invalid argument."


class PoisonWriter(FlakyWriter):
    """FlakyWriter (row-level `flaky` 5xx, whole-call `down` outages) whose requests holding a `poison` id,
    or every request when `table_refuses`, are refused as invalid as a whole. The requests numbered in
    `outages` (1 = the first request of the first call) fail part-way through a call with `down_error`."""

    def __init__(self, poison: set[str] = frozenset(), chunk: int = 0, table_refuses: bool = False,
                 outages: set[int] = frozenset(), **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.poison, self.chunk, self.table_refuses, self.outages = poison, chunk, table_refuses, outages
        self.calls: list[list[str]] = []  # the ids of each writer call
        self.sent = 0  # requests sent, the refused ones included

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        ids = rows["id"].to_pylist()
        self.calls.append(ids)
        size = self.chunk or len(ids)
        failures: list[RowError] = []
        for start in range(0, len(ids), size):
            part = ids[start:start + size]
            unsent = tuple(range(start, len(ids)))
            self.sent += 1
            if self.sent in self.outages:
                error = self.down_error
                raise PartialWriteError(error.error_type, error.message, unsent, tuple(failures), error.invalid_request)
            if self.table_refuses or self.poison & set(part):
                raise PartialWriteError(ErrorType.SINK_4XX_ERROR, INVALID, unsent, tuple(failures), invalid_request=True)
            # The rest is FlakyWriter's: outages, row-level 5xx, stored rows (and its insertId check).
            failures += [RowError(f.index + start, f.error_type, f.message)
                         for f in super().write(rows.slice(start, len(part)), insert_ids.slice(start, len(part)))]
        return failures


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def log2(n: int) -> int:
    return math.ceil(math.log2(n))


def test_one_poison_row_among_10k_is_isolated_and_every_other_row_written_once() -> None:
    writer = PoisonWriter(poison={"6173"})
    done, waits = run(handling(), writer, batch(ids(10_000)))

    assert [(e.index, e.error_type) for e in done.dead] == [(6173, ErrorType.SINK_4XX_ERROR)]
    assert "rejected as a whole" in done.dead[0].message and INVALID in done.dead[0].message
    assert sorted(writer.stored, key=int) == [i for i in ids(10_000) if i != "6173"]  # each once
    # Every row of the refused request went out again in a half: each counts as retried, none waited.
    assert (done.written, done.retried, done.failed, waits) == (9_999, 10_000, [], [])
    # The first request, then two halves per level down to the row: 1 + 2·⌈log2 n⌉ calls at most.
    assert len(writer.calls) <= 1 + 2 * log2(10_000) == 29


def test_two_poison_rows_are_isolated_at_a_cost_of_log_n_each() -> None:
    writer = PoisonWriter(poison={"17", "8000"})
    done, _ = run(handling(), writer, batch(ids(10_000)))

    assert sorted(e.index for e in done.dead) == [17, 8000]
    assert sorted(writer.stored, key=int) == [i for i in ids(10_000) if i not in ("17", "8000")]
    assert len(writer.calls) <= 1 + 2 * 2 * log2(10_000)


def test_adjacent_poison_rows_are_each_isolated() -> None:
    writer = PoisonWriter(poison={"0", "1", "2"})
    done, _ = run(handling(), writer, batch(ids(64)))
    assert sorted(e.index for e in done.dead) == [0, 1, 2] and len(writer.stored) == 61


@pytest.mark.parametrize("n", [100, 500, 10_000])
def test_a_run_of_adjacent_poison_rows_at_the_front_is_isolated_not_taken_for_a_refusing_table(n: int) -> None:
    """A producer's burst of bad records: depth first, every piece of the first half is refused until past
    the run; taken for a table refusing every row, it stopped the job, and again on every restart."""
    poison = {str(i) for i in range(ISOLATION_ROWS)}
    writer = PoisonWriter(poison=poison)
    done, _ = run(handling(), writer, batch(ids(n)))

    assert sorted(str(e.index) for e in done.dead) == sorted(poison) and done.failed == []
    assert sorted(writer.stored, key=int) == ids(n)[ISOLATION_ROWS:]  # each once
    assert len(writer.calls) <= 1 + IsolationBudget.of(n).requests


def test_a_table_refusing_every_row_stops_the_job_after_a_few_requests_dead_lettering_none() -> None:
    writer = PoisonWriter(table_refuses=True)
    with pytest.raises(SinkError) as stopped:
        run(handling(), writer, batch(ids(10_000)))

    assert stopped.value.error_type is ErrorType.SINK_4XX_ERROR and INVALID in stopped.value.message
    assert "the table, not a row, refuses it" in stopped.value.message
    # Not 2n: the first request, then 2·⌈log2 n⌉+2 refused ones at most.
    assert len(writer.calls) <= 1 + IsolationBudget.of(10_000).until_accepted == 31
    assert writer.stored == []


def test_a_refused_request_of_one_row_fails_its_row_at_once_instead_of_stopping_on_every_restart() -> None:
    """A quiet partition's micro-batch of one record: its replay after a stop would hold it alone again."""
    writer = PoisonWriter(poison={"0"})
    done, waits = run(handling(), writer, batch(["0"]))

    assert [(e.index, e.error_type) for e in done.dead] == [(0, ErrorType.SINK_4XX_ERROR)]
    assert "a request holding only this row" in done.dead[0].message and INVALID in done.dead[0].message
    assert (done.written, done.failed, waits, len(writer.calls)) == (0, [], [], 1)


def test_a_table_refusing_every_row_still_stops_the_job_on_a_request_of_two() -> None:
    writer = PoisonWriter(table_refuses=True)
    with pytest.raises(SinkError, match="the table, not a row"):
        run(handling(), writer, batch(["0", "1"]))
    assert writer.stored == []


def test_more_poison_rows_than_the_budget_fail_in_parts_and_the_rest_is_written_once() -> None:
    poison = {str(i) for i in range(0, 10_000, 97)}  # 104 bad rows, spread out
    writer = PoisonWriter(poison=poison)
    done, _ = run(handling(), writer, batch(ids(10_000)))

    budget = IsolationBudget.of(10_000)
    # Within the budget, then each piece left once: at most one per level of each half's halving.
    assert len(writer.calls) <= 1 + budget.requests + 2 * (log2(10_000) + 1)
    dead = {str(e.index) for e in done.dead}
    assert poison <= dead  # no bad row written, none lost
    assert set(writer.stored) | dead == set(ids(10_000)) and not set(writer.stored) & dead
    assert len(writer.stored) == len(set(writer.stored))  # what went in, went in once
    assert done.failed == [] and writer.stored  # the job goes on: nothing stops it on every restart
    together = [e for e in done.dead if "not told apart" in e.message]
    assert together and all(e.error_type is ErrorType.SINK_4XX_ERROR for e in done.dead)
    assert f"more than {ISOLATION_ROWS} bad rows" in together[0].message


def test_isolation_budget_holds_eight_spread_rows() -> None:
    poison = {str(i) for i in range(500, 10_000, 1_250)}  # 8 rows, one in each eighth
    writer = PoisonWriter(poison=poison)
    done, _ = run(handling(), writer, batch(ids(10_000)))
    assert sorted(str(e.index) for e in done.dead) == sorted(poison)
    assert len(writer.stored) == 10_000 - 8 and len(writer.calls) <= 1 + IsolationBudget.of(10_000).requests


def test_a_retryable_whole_request_error_is_retried_not_split() -> None:
    outage = SinkError(ErrorType.SINK_5XX_ERROR, "backendError")  # not invalid_request: no row's fault
    writer = PoisonWriter(down=2, down_error=outage)
    done, waits = run(handling(), writer, batch(ids(100)))
    assert [len(r) for r in writer.calls] == [100, 100, 100] and len(waits) == 2
    assert done.written == 100 and not done.errors


def test_a_refusal_of_a_retried_type_is_retried_not_split() -> None:
    writer = PoisonWriter(poison={"3"})
    with pytest.raises(SinkError):
        run(handling(ERROR_TYPES_FOR_RETRY="SINK_4XX_ERROR", RETRY_MAX_ATTEMPTS="3"), writer, batch(ids(10)))
    assert [len(r) for r in writer.calls] == [10, 10, 10]  # the user's retry list first: no isolation


def test_a_missing_table_stops_the_job_without_splitting() -> None:
    gone = SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t")  # invalid_request False
    writer = PoisonWriter(down=1, down_error=gone)
    with pytest.raises(SinkError, match="Not found"):
        run(handling(), writer, batch(ids(100)))
    assert len(writer.calls) == 1


def test_rows_failing_retryably_inside_a_half_are_retried_alone_after_isolation() -> None:
    # Row 7 (first half) is poison; row 60 (second half) fails with a 5xx once, row 61 is invalid on its own.
    writer = PoisonWriter(poison={"7"}, flaky={"60": 1}, bad={"61"})
    done, waits = run(handling(), writer, batch(ids(100)))

    assert sorted((e.index, e.error_type) for e in done.dead) == [(7, ErrorType.SINK_4XX_ERROR),
                                                                   (61, ErrorType.SINK_4XX_ERROR)]
    assert writer.calls[-1] == ["60"] and len(waits) == 1  # the retry sends only what is owed
    assert sorted(writer.stored, key=int) == [i for i in ids(100) if i not in ("7", "61")]
    assert (done.written, done.retried) == (98, 100)  # every row went out again in a half (row 60 twice)


def test_an_outage_during_isolation_resends_only_what_is_not_in_the_table() -> None:
    class OutageMidway(PoisonWriter):
        def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
            if len(self.calls) == 2:  # the first request, its first half, then BigQuery is down for one call
                self.calls.append(rows["id"].to_pylist())
                raise SinkError(ErrorType.SINK_RETRYABLE_ERROR, "Connection refused")
            return super().write(rows, insert_ids)

    writer = OutageMidway(poison={"80"})
    done, waits = run(handling(), writer, batch(ids(100)))

    assert [e.index for e in done.dead] == [80] and len(waits) == 1
    assert writer.calls[:3] == [ids(100), ids(50), ids(100)[50:]]
    assert writer.calls[3] == ids(100)[50:]  # the retry: the first half is in, never sent again
    assert sorted(writer.stored, key=int) == [i for i in ids(100) if i != "80"]


def test_an_outage_after_the_budget_ran_out_loses_no_row_of_the_parts_refused_before_it() -> None:
    """Parts refused once the budget ran out are failed together only at the end: an outage before then ends
    the isolation, and their rows, not in the table, are owed like every other; dropped, the batch was
    committed without them (neither written nor dead-lettered)."""
    poison = {str(i) for i in range(7, 1_000, 37)}  # 27 bad rows: more than the budget isolates
    calls = len(run_calls(PoisonWriter(poison=poison), 1_000))

    class OutageAtTheEnd(PoisonWriter):  # BigQuery is down for the isolation's last request, then back
        def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
            if len(self.calls) == calls - 1:
                self.calls.append(rows["id"].to_pylist())
                raise SinkError(ErrorType.SINK_RETRYABLE_ERROR, "Connection refused")
            return super().write(rows, insert_ids)

    writer = OutageAtTheEnd(poison=poison)
    done, waits = run(handling(), writer, batch(ids(1_000)))

    dead = {str(e.index) for e in done.dead}
    assert set(writer.stored) | dead == set(ids(1_000)) and not set(writer.stored) & dead and poison <= dead
    assert len(writer.stored) == len(set(writer.stored)) and done.failed == [] and len(waits) == 1


def run_calls(writer: PoisonWriter, n: int) -> list[list[str]]:
    run(handling(), writer, batch(ids(n)))
    return writer.calls


def test_requests_written_before_the_refused_one_are_not_sent_again() -> None:
    writer = PoisonWriter(poison={"1234"}, chunk=500)
    done, _ = run(handling(), writer, batch(ids(10_000)))

    assert [e.index for e in done.dead] == [1234]
    assert sorted(writer.stored, key=int) == [i for i in ids(10_000) if i != "1234"]  # each once
    # Requests 1 and 2 (rows 0..999) went in with the first call: isolation works on the 9,000 unsent.
    assert writer.requests[:2] == [ids(500), ids(1_000)[500:]] and len(writer.calls) <= 1 + 2 * log2(9_000)


def test_isolated_rows_follow_the_policy_lists() -> None:
    done, _ = run(handling(dlq=False), PoisonWriter(poison={"5"}), batch(ids(20)))
    assert [(e.index, e.error_type) for e in done.failed] == [(5, ErrorType.SINK_4XX_ERROR)] and not done.dead
    assert done.written == 19


def test_isolated_rows_keep_their_source_index_and_insert_id() -> None:
    # Rows are records 10, 20, ... of the source batch: FlakyWriter checks each row's insertId is its own.
    pending = batch([str(i) for i in range(10, 210, 10)], list(range(10, 210, 10)))
    writer = PoisonWriter(poison={"130"})
    done, _ = run(handling(), writer, pending, clock=Clock())
    assert [e.index for e in done.dead] == [130] and done.written == 19


def test_the_flag_survives_pickling() -> None:
    error = PartialWriteError(ErrorType.SINK_4XX_ERROR, "invalid", (1, 2), (), invalid_request=True)
    again = pickle.loads(pickle.dumps(error))
    assert again.invalid_request and again.unsent == (1, 2)
    assert pickle.loads(pickle.dumps(SinkError(ErrorType.SINK_4XX_ERROR, "x", True))).invalid_request


@pytest.mark.parametrize("other", ["bad", "flaky"])
def test_a_poison_row_beside_rows_refused_on_their_own_is_isolated_not_taken_for_a_refusing_table(other: str) -> None:
    """BigQuery answering a part row by row (a 4XX row, a transient 5XX row) is a table that takes requests:
    taken for a refusing table, a poison row and one bad row stopped the job on every restart."""
    writer = PoisonWriter(poison={"0"}, **({"bad": {"1"}} if other == "bad" else {"flaky": {"1": 1}}))
    done, _ = run(handling(), writer, batch(ids(2)))

    assert [e.index for e in done.dead if "rejected as a whole" in e.message] == [0]
    if other == "bad":
        assert [(e.index, e.message) for e in done.dead if e.index == 1] == [(1, "invalid")] and writer.stored == []
    else:
        assert writer.stored == ["1"] and done.written == 1


@pytest.mark.parametrize(("n", "poison"), [
    (100, {0, 25, 50, 75}), (10_000, {0, 2_500, 5_000, 7_500}),  # each piece tried next began with a bad row
    (12, set(range(7))),  # a run filling most of a small request
], ids=["quarters-100", "quarters-10k", "run-7-of-12"])
def test_bad_rows_at_the_front_of_every_piece_tried_are_isolated_not_taken_for_a_refusing_table(
        n: int, poison: set[int]) -> None:
    """While no row has gone in, the policy tries the farthest piece next; depth first and left first, each
    piece it tried began with a bad row, and four bad rows of 10,000 looked like a refusing table: the job
    stopped, and again on every restart."""
    writer = PoisonWriter(poison={str(i) for i in poison})
    done, _ = run(handling(), writer, batch(ids(n)))

    assert sorted(e.index for e in done.dead) == sorted(poison) and done.failed == []
    assert sorted(writer.stored, key=int) == [i for i in ids(n) if int(i) not in poison]  # each once
    assert len(writer.calls) <= 1 + IsolationBudget.of(n).requests
