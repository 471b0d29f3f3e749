"""The Spark task as a fresh Python worker meets it: what unpickling it imports."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pyspark import cloudpickle

from firehose_bq.batch.task import run_groups, run_task
from firehose_bq.config import Config
from firehose_bq.descriptors import Descriptors
from firehose_bq.modes import STORAGE_WRITE, StreamingTask
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, RangeReader
from tests.unit.batch.test_core import handling, spec
from tests.unit.test_config import MINIMAL

REPO = Path(__file__).resolve().parents[3]
# What a streaming write mode's worker has no use for, each paid again by every fresh worker of a job: the
# driver's modules, and the Parquet writer that only the file-loads modes' tasks use.
NOT_FOR_A_STREAMING_TASK = ("firehose_bq.pipeline", "firehose_bq.spark", "firehose_bq.source.kafka_source", "kafka",
                            "pyarrow.parquet")


@pytest.mark.parametrize("form", [run_groups, run_task])
def test_a_worker_unpickling_a_streaming_task_imports_only_what_the_task_needs(form: Callable[..., object],
                                                                              test_descriptors: Descriptors,
                                                                              tmp_path: Path) -> None:
    # As pipeline.py ships it to its RDD of ranges or to mapInArrow (Spark's cloudpickle pickles the function
    # by reference).
    cfg = Config.from_env(MINIMAL)
    task = functools.partial(form, spec(test_descriptors), StreamingTask(cfg.bigquery, STORAGE_WRITE), handling(),
                             None, RangeReader("b:1", CONFLUENT_KAFKA, 1000), None)
    path = tmp_path / "task.pickle"
    path.write_bytes(cloudpickle.dumps(task))
    worker = ("import pickle, sys\npickle.loads(open(sys.argv[1], 'rb').read())\n"
              f"print(' '.join(m for m in {NOT_FOR_A_STREAMING_TASK!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", worker, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
