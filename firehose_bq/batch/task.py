"""The function each Spark task of the streaming job runs: it reads the records of the Kafka offset ranges the
source planned for it and runs the batch core over them, answering with one small result for the driver.
Two forms of the same task (pipeline.py `_run_tasks` says which runs when): `run_groups` over an RDD of the
planned ranges, and `run_task` over the source's DataFrame (`mapInArrow`).

It lives apart from pipeline.py on purpose. Spark pickles the function by reference, so a Python worker
imports the module that defines it before the task can start, and every worker of a fresh job pays for
that import on the job's critical path. Here that is the batch core, the write path and the range reader
alone, not the driver's modules (the Spark query wiring, kafka-python's metadata client, telemetry).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from firehose_bq import logs
from firehose_bq.batch.core import TaskPlan, TaskResult, process_batch
from firehose_bq.bigquery.client import Clients
from firehose_bq.policy import ErrorHandling
from firehose_bq.sink_schema import CheckedTables, SinkSpec
from firehose_bq.source.kafka_client import RANGE_COLUMNS, RangeReader

# The schema of what each task yields: its TaskResult as JSON (batch/core.py).
RESULT_SCHEMA = "result STRING"
# Where a rerun of a batch starts reading each (topic, partition): the first offset its first run left.
Resume = dict[tuple[str, int], int]
# The one thing a Python worker keeps from one task to the next: Spark reuses its workers, and gives a
# task nothing that outlives it, so the BigQuery clients every micro-batch's writers borrow are kept at
# the module the tasks run from (Clients says why; it starts empty in each forked worker).
WORKER_CLIENTS = Clients()
# Likewise the routed tables the worker checked (CheckedTables says why), not checked again for a while.
WORKER_TABLES = CheckedTables()


def run_task(spec: SinkSpec, plan: TaskPlan, handling: ErrorHandling, worker_logging: logs.WorkerLogging | None,
             reader: RangeReader, resume: Resume | None, ranges: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One task over the source's rows, its Kafka offset ranges (`mapInArrow`); yields its TaskResult as one row."""
    # A row per Kafka partition: taken whole first, as the task may stop before reading them all.
    planned = [row for batch in ranges for row in zip(*(batch[name].to_pylist() for name in RANGE_COLUMNS),
                                                      strict=True)]
    yield pa.RecordBatch.from_pydict({"result": [_run(spec, plan, handling, worker_logging, reader, resume,
                                                      planned).to_json()]})


def run_groups(spec: SinkSpec, plan: TaskPlan, handling: ErrorHandling, worker_logging: logs.WorkerLogging | None,
               reader: RangeReader, resume: Resume | None,
               groups: Iterable[Sequence[tuple[str, int, int, int]]]) -> Iterator[str]:
    """The task of each group of ranges (an RDD partition holds one: the source's planned partition); yields
    each one's TaskResult as JSON."""
    for planned in groups:
        yield _run(spec, plan, handling, worker_logging, reader, resume, list(planned)).to_json()


def _run(spec: SinkSpec, plan: TaskPlan, handling: ErrorHandling, worker_logging: logs.WorkerLogging | None,
         reader: RangeReader, resume: Resume | None, planned: list[tuple[str, int, int, int]]) -> TaskResult:
    """The batch core over the records of `planned` (`resume`: read only these partitions, from these offsets, as
    a rerun does). It runs in a Python worker, which logs as the driver does (`worker_logging`: format,
    masking, batch id)."""
    logs.apply_in_worker(worker_logging)
    with logs.log_context(**(worker_logging.fields if worker_logging is not None else {})):
        result = process_batch(_records(reader, planned, resume), spec, plan, handling, WORKER_CLIENTS,
                               WORKER_TABLES)
    result.planned = planned
    if result.held:
        result.resume += _unreached(planned, resume, result.resume)
    return result


def _records(reader: RangeReader, planned: list[tuple[str, int, int, int]], resume: Resume | None) \
        -> Iterator[pa.RecordBatch]:
    """The records of each planned range, read only as the batch core asks for them: a task that stops early
    (a batch held for a registry refresh) leaves the rest unread."""
    for topic, partition, start, end in _to_read(planned, resume):
        yield from reader.read(topic, partition, start, end)


def _to_read(planned: list[tuple[str, int, int, int]], resume: Resume | None) -> Iterator[tuple[str, int, int, int]]:
    """The planned ranges this run reads, in order: with `resume`, only its partitions, from its offsets."""
    for topic, partition, start, end in planned:
        if resume is not None:
            if (topic, partition) not in resume:
                continue
            start = max(start, resume[(topic, partition)])
        if start < end:
            yield topic, partition, start, end


def _unreached(planned: list[tuple[str, int, int, int]], resume: Resume | None,
               held: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Where the rerun of a task that held (`held`: the partitions of the source batch it held at) starts
    the ranges it never reached. The rerun reads only the partitions in its resume: a range left out would
    be committed unread. Ranges are read in order, so those after the last held partition's are unreached."""
    ranges = list(_to_read(planned, resume))
    stopped = {(topic, partition) for topic, partition, _ in held}
    last = max((i for i, (topic, partition, _, _) in enumerate(ranges) if (topic, partition) in stopped), default=-1)
    return [(topic, partition, start) for topic, partition, start, _ in ranges[last + 1:]]
