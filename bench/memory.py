"""P4: resident memory of the whole job (Python driver, Spark's JVM, Python workers) while it drains a
backlog of MESSAGES records, default 1M. Target: peak PSS < 1.5 GiB (pages the forked Python workers share
counted once) and flat (no growth from batch to batch).

The job runs in a child process (a fresh JVM, nothing left over from other benchmarks); this process
samples the RSS of the child's process tree from /proc once a second. The no-op writer is used, so the
emulator's insert rate does not pace the drain; SPARK_MAX_OFFSETS_PER_TRIGGER paces it.

`python -m bench.memory [MESSAGES] [CLIENT]` runs P4 alone. CLIENT (SOURCE_KAFKA_CLIENT) defaults to the
job's own default, `auto`: confluent-kafka when it is installed, as it is here; `kafka-python` measures the
other reader. (Until the reader skipped librdkafka's non-fatal background errors of other topics, the
confluent-kafka reader failed its task here on "FindCoordinator response error: Local: Bad message
format", so P4 used to force kafka-python.)"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from bench.localstack import REPO, local_stack, produce_fast
from bench.proctree import Proc, pss_bytes, tree
from firehose_bq.config import Config, SparkConfig
from firehose_bq.source.kafka_client import AUTO, resolve_client

MESSAGES = 1_000_000
# The local broker (noida-db) stalls serving a fetch from the start of a partition holding ~500k
# messages; 8 partitions keep each under ~125k for the default million.
PARTITIONS = 8
PER_BATCH = 100_000
TOPIC = "p4"
GIB = 1024**3
SAMPLE_SECONDS = 1.0


def child(env: dict[str, str]) -> None:
    """The job: drain the topic with available-now and the no-op writer, logging each batch's progress."""
    from firehose_bq.pipeline import Pipeline
    from firehose_bq.spark import spark_session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.WARNING)
    cfg = Config.from_env(env)
    spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[2]"), {"spark.ui.enabled": "false"})
    summary = Pipeline(cfg, spark, write=False).run(available_now=True)
    for line in summary.render().splitlines():
        print(f"summary: {line}", flush=True)
    spark.stop()


def run(messages: int = MESSAGES, client: str = AUTO) -> dict[str, float]:
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC, "SOURCE_KAFKA_CLIENT": client,
               "SPARK_MAX_OFFSETS_PER_TRIGGER": str(PER_BATCH), "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-p4",
               "SOURCE_KAFKA_CONSUMER_GROUP_ID": "bench-p4"}
        started = time.perf_counter()
        produce_fast(Config.from_env(env), TOPIC, messages, PARTITIONS)
        print(f"P4 memory while draining a backlog of {messages:,} example bookings ({PARTITIONS} partitions, "
              f"{PER_BATCH:,} per batch, local[2], {resolve_client(client)} reader, no-op writer; produced in "
              f"{time.perf_counter() - started:.0f} s)", flush=True)
        job = subprocess.Popen([sys.executable, "-m", "bench.memory", "--child", json.dumps(env)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first_batch: list[float] = []  # when the first batch finished: samples before it are start-up
        batch_line = re.compile(r" batch \d+: (\d+ messages|lag )")  # pipeline.py's lines per batch

        tail: collections.deque[str] = collections.deque(maxlen=40)  # shown if the job fails

        def relay() -> None:
            assert job.stdout is not None
            for line in job.stdout:
                tail.append(line)
                if batch_line.search(line) and not first_batch:
                    first_batch.append(time.monotonic())
                if batch_line.search(line) or line.startswith("summary: "):  # not Spark's own chatter
                    print("    " + line.rstrip().removeprefix("summary: "))

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        samples: list[tuple[float, int, int]] = []  # (time, RSS sum, PSS sum)
        peak_parts: dict[str, tuple[int, int]] = {}  # role: (RSS, PSS) when the PSS sum peaked
        while job.poll() is None:
            procs = tree(job.pid)
            pss = {p.pid: pss_bytes(p.pid) for p in procs}
            samples.append((time.monotonic(), sum(p.rss_bytes for p in procs), sum(pss.values())))
            if samples[-1][2] >= max(s[2] for s in samples):
                peak_parts = roles(job.pid, procs, pss)
            time.sleep(SAMPLE_SECONDS)
        reader.join(timeout=10)
    if job.returncode != 0 or not first_batch:
        # A job that drained nothing measured nothing: its memory is no figure.
        raise RuntimeError(f"P4 job failed (exit code {job.returncode}, {'a' if first_batch else 'no'} batch "
                           f"logged):\n{''.join(tail)}")
    draining = [s for s in samples if first_batch and s[0] >= first_batch[0]] or samples
    quarter = max(1, len(draining) // 4)
    figures = {}
    for column, name in ((1, "RSS"), (2, "PSS")):
        peak = max(s[column] for s in samples)
        first = statistics.mean(s[column] for s in draining[:quarter])
        last = statistics.mean(s[column] for s in draining[-quarter:])
        figures[name] = (peak, last / first - 1)
        print(f"  peak {name} {peak / GIB:.2f} GiB (target < 1.5 GiB for PSS); while draining: first quarter "
              f"{first / GIB:.2f} GiB, last quarter {last / GIB:.2f} GiB, trend {last / first - 1:+.0%}")
    print(f"  ({len(samples)} samples, {SAMPLE_SECONDS:.0f} s apart; RSS sums count pages the forked Python "
          "workers share once per process, PSS splits them)")
    print("  at the PSS peak, PSS (RSS): " + ", ".join(f"{name} {pss / GIB:.2f} ({rss / GIB:.2f}) GiB"
                                                       for name, (rss, pss) in peak_parts.items()))
    return {"p4_peak_rss_gib": figures["RSS"][0] / GIB, "p4_rss_trend": figures["RSS"][1],
            "p4_peak_pss_gib": figures["PSS"][0] / GIB, "p4_pss_trend": figures["PSS"][1]}


def roles(root: int, procs: list[Proc], pss: dict[int, int]) -> dict[str, tuple[int, int]]:
    """(RSS, PSS) by role: the Python driver (the job's own process), the JVM, the Python processes the
    JVM started (worker daemons, planning processes, the source runner), and the workers the daemons forked
    (tasks and the source's read(): their pages imported by the daemon are shared with it)."""
    jvms = {p.pid for p in procs if p.name == "java"}
    groups: dict[str, list[Proc]] = {"Python driver": [], "JVM": [], "started": [], "forked": []}
    for p in procs:
        role = ("Python driver" if p.pid == root else "JVM" if p.pid in jvms
                else "started" if p.ppid in jvms else "forked")
        groups[role].append(p)
    for role, label in (("started", "Python daemons and runners"), ("forked", "Python workers")):
        members = groups.pop(role)
        groups[f"{len(members)} {label}"] = members
    return {name: (sum(p.rss_bytes for p in members), sum(pss[p.pid] for p in members))
            for name, members in groups.items()}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child({**os.environ, **json.loads(sys.argv[2])})
    else:
        run(int(sys.argv[1]) if len(sys.argv) > 1 else MESSAGES, *sys.argv[2:3])
