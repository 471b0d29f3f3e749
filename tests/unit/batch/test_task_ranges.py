"""A task's records: the source hands each Spark task offset ranges, and the task reads them itself."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from firehose_bq.batch.task import _records
from firehose_bq.source.kafka_client import RANGE_COLUMNS


class Reads:
    """A RangeReader that records which ranges were read, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int]] = []

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        self.calls.append((topic, partition, start, end))
        yield pa.RecordBatch.from_pydict({"offset": list(range(start, end))})


def ranges(*rows: tuple[str, int, int, int]) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({name: [row[i]] for i, name in enumerate(RANGE_COLUMNS)}) for row in rows]


def test_every_range_is_read_in_turn_and_only_when_asked_for() -> None:
    reads = Reads()
    records = _records(reads, [("t", 0, 3, 5), ("t", 1, 0, 2)], None)  # type: ignore[arg-type]
    assert next(records)["offset"].to_pylist() == [3, 4]
    assert reads.calls == [("t", 0, 3, 5)]  # a task that stops here leaves the second range unread
    assert next(records)["offset"].to_pylist() == [0, 1]
    assert reads.calls == [("t", 0, 3, 5), ("t", 1, 0, 2)]


def test_a_rerun_reads_only_the_held_partitions_from_where_they_stopped() -> None:
    reads = Reads()
    resume = {("t", 1): 6, ("u", 0): 9}
    got = [b["offset"].to_pylist() for b in _records(reads, [("t", 0, 0, 5), ("t", 1, 2, 8), ("u", 0, 4, 9)],
                                                     resume)]  # type: ignore[arg-type]
    assert got == [[6, 7]]
    assert reads.calls == [("t", 1, 6, 8)]  # u/0 had nothing left past its resume offset


def test_a_task_reports_the_ranges_it_was_given_whole_however_much_it_read(monkeypatch) -> None:  # noqa: ANN001
    """They are the batch's plan, from which the driver derives its load and MERGE job ids: a task held for
    a refresh, or its rerun from where it stopped, must report what a replay in one go reports."""
    import json

    from firehose_bq.batch import task as task_mod
    from firehose_bq.batch.core import TaskResult

    def holds_at_first_batch(sources, *args):  # noqa: ANN001, ANN202 - the batch core, holding at once
        next(iter(sources))
        return TaskResult(held="t/1@2", resume=[("t", 1, 2)])

    monkeypatch.setattr(task_mod, "process_batch", holds_at_first_batch)
    given = [("t", 0, 3, 5), ("t", 1, 2, 8)]
    for resume in (None, {("t", 1): 6}):
        [out] = task_mod.run_task(None, None, None, None, Reads(), resume, iter(ranges(*given)))  # type: ignore[arg-type]
        result = TaskResult.from_json(out["result"][0].as_py())
        assert result.planned == given
        assert json.loads(result.to_json())["planned"] == [list(r) for r in given]


def test_both_forms_of_a_task_run_the_same_ranges_and_report_the_same(monkeypatch) -> None:  # noqa: ANN001
    """`run_groups` (an RDD partition holding one group of ranges, as the pipeline ships it) and `run_task` (the
    source's rows through mapInArrow): the same reads, the same result."""
    from firehose_bq.batch import task as task_mod
    from firehose_bq.batch.core import TaskResult

    def counts(sources, *args):  # noqa: ANN001, ANN202 - the batch core, counting what it was given
        result = TaskResult()
        result.stats.messages = sum(batch.num_rows for batch in sources)
        return result

    monkeypatch.setattr(task_mod, "process_batch", counts)
    given = [("t", 0, 3, 5), ("t", 1, 2, 8), ("u", 0, 0, 1)]
    resume = {("t", 1): 6, ("u", 0): 0}
    mapped, grouped = Reads(), Reads()
    [out] = task_mod.run_task(None, None, None, None, mapped, resume, iter(ranges(*given)))  # type: ignore[arg-type]
    [text] = task_mod.run_groups(None, None, None, None, grouped, resume, [tuple(given)])  # type: ignore[arg-type]
    assert out["result"][0].as_py() == text
    assert TaskResult.from_json(text).stats.messages == 3 and TaskResult.from_json(text).planned == given
    assert mapped.calls == grouped.calls == [("t", 1, 6, 8), ("u", 0, 0, 1)]


def test_a_task_held_before_its_later_ranges_has_its_rerun_read_them(monkeypatch) -> None:  # noqa: ANN001
    """The rerun reads only the partitions in `resume`: one the task never reached must be there too, from
    its start, or the batch commits with its records never read."""
    from firehose_bq.batch import task as task_mod
    from firehose_bq.batch.core import TaskResult

    def holds_in_first_range(sources, *args):  # noqa: ANN001, ANN202 - the batch core, holding in t/0's records
        next(iter(sources))
        return TaskResult(held="t/0@3", resume=[("t", 0, 3)])

    monkeypatch.setattr(task_mod, "process_batch", holds_in_first_range)
    given = [("t", 0, 3, 5), ("t", 1, 2, 8), ("u", 0, 4, 4)]
    [out] = task_mod.run_task(None, None, None, None, Reads(), None, iter(ranges(*given)))  # type: ignore[arg-type]
    result = TaskResult.from_json(out["result"][0].as_py())
    assert result.resume == [("t", 0, 3), ("t", 1, 2)]  # u/0 is empty: nothing to read again
    reads = Reads()
    rerun = [b["offset"].to_pylist() for b in _records(reads, given, {(t, p): o for t, p, o in result.resume})]
    assert rerun == [[3, 4], [2, 3, 4, 5, 6, 7]]
