"""P2c: the whole job as a user runs it (`firehose-bq run --available-now`, the default write method, into
the BigQuery emulator), start-up included, against one plain process that consumes and parses the same
topic with confluent-kafka. Target ≥ 0.1×: the job pays a JVM, a SparkSession and BigQuery; it must still
be within an order of magnitude of reading the topic at all.

The job runs as a subprocess with the environment a user would give it (config/local.env plus the
stack's addresses). Two figures: the job's own rate, as its run summary reports it (from the streaming
query's start to the topic drained: what the job sustains once running), which the target is for, and
the command's wall time from start to exit (a cold JVM and SparkSession included), for the record."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.localstack import REPO, local_stack, produce_fast
from bench.pipeline import plain_run
from firehose_bq import descriptors, sample
from firehose_bq.config import Config
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA
from firehose_bq.spark import class_archive

MESSAGES = 60_000
PARTITIONS = 2
TOPIC = "p2c"


# The run summary's lines: `elapsed            12.3 s (4,878 messages/s)`, `rows written       60000`.
ELAPSED = re.compile(r"^elapsed\s+([0-9.]+) s", re.M)
WRITTEN = re.compile(r"^rows written\s+([0-9]+)$", re.M)
LOGS = Path(tempfile.gettempdir()) / "firehose-bench-jobs"


@dataclass(frozen=True)
class JobRun:
    seconds: float  # the run summary's elapsed: from the streaming query's start to the topic drained
    wall: float  # the command from start to exit
    written: int  # rows written, as the summary counts them


def run_job(env: dict[str, str], name: str) -> JobRun:
    """`firehose-bq run --available-now` in a subprocess with `env` over this process's environment; its
    output is kept in LOGS/`name`.log, for a look at where a run's time went."""
    command = [str(Path(sys.executable).with_name("firehose-bq")), "run", "--available-now"]
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    LOGS.mkdir(exist_ok=True)
    (LOGS / f"{name}.log").write_text(done.stdout + done.stderr)
    elapsed, written = ELAPSED.search(done.stdout), WRITTEN.search(done.stdout)
    if done.returncode != 0 or elapsed is None or written is None:
        raise RuntimeError(f"the job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return JobRun(float(elapsed.group(1)), wall, int(written.group(1)))


def run(messages: int = MESSAGES) -> dict[str, float]:
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC, "SINK_BIGQUERY_DATASET_NAME": "p2c",
               "SINK_BIGQUERY_TABLE_NAME": "bookings", "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-p2c",
               "SOURCE_KAFKA_CONSUMER_GROUP_ID": "bench-p2c"}
        cfg = Config.from_env(env)
        produce_fast(cfg, TOPIC, messages, PARTITIONS)
        parse = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE).FromString
        plain = plain_run(cfg.source.brokers, TOPIC, CONFLUENT_KAFKA, parse)
        job = run_job({**env, "FIREHOSE_LOG_LEVEL": "INFO"}, "p2c-job")
        assert job.written == messages, f"{job.written} of {messages} rows written"
        seconds, wall = job.seconds, job.wall
        job_rate, plain_rate = messages / seconds, plain.rate
        archive = class_archive(cfg.spark, os.environ)
        print(f"P2c the whole job: `firehose-bq run --available-now`, write method "
              f"{cfg.bigquery.effective_write_method} (the default), {messages} example bookings, "
              f"{PARTITIONS} partitions; the driver JVM maps "
              f"{f'the class archive {archive.path}' if archive else 'no class archive (`firehose-bq jvm-archive`)'}")
        print(f"  job {seconds:.1f} s = {job_rate:,.0f} msg/s   plain confluent-kafka consume+parse "
              f"{plain_rate:,.0f} msg/s   ratio {job_rate / plain_rate:.3f}x (target ≥ 0.1x)")
        print(f"  the command from start to exit, cold JVM and SparkSession included: {wall:.1f} s "
              f"({messages / wall:,.0f} msg/s, {messages / wall / plain_rate:.3f}x); the job's log: {LOGS}/p2c-job.log")
    return {"p2c": job_rate / plain_rate}


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else MESSAGES)
