"""The function each Spark task of the streaming job runs (`mapInArrow`): the batch core over the task's
Kafka records, answering with one small row for the driver.

It lives apart from pipeline.py on purpose. Spark pickles the function by reference, so a Python worker
imports the module that defines it before the task can start, and every worker of a fresh job pays for
that import on the job's critical path. Here that is the batch core and the write path alone, not the
driver's modules (the Spark query wiring, the Kafka source's metadata client, telemetry).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from firehose_bq import logs
from firehose_bq.batch.core import TaskPlan, process_batch
from firehose_bq.policy import ErrorHandling
from firehose_bq.sink_schema import SinkSpec

# The schema of what each task yields: its TaskResult as JSON (batch/core.py).
RESULT_SCHEMA = "result STRING"


def run_task(spec: SinkSpec, plan: TaskPlan, handling: ErrorHandling, worker_logging: logs.WorkerLogging | None,
             batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task: the batch core over its Kafka partition's records; yields its TaskResult. It runs
    in a Python worker, which logs as the driver does (`worker_logging`: format, masking, batch id)."""
    logs.apply_in_worker(worker_logging)
    with logs.log_context(**(worker_logging.fields if worker_logging is not None else {})):
        result = process_batch(batches, spec, plan, handling)
    yield pa.RecordBatch.from_pydict({"result": [result.to_json()]})
