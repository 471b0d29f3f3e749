"""An operator's failure drills against the real local stack: the job (`firehose-bq run`) on a proto of its
own (protos/drill/fleet/telemetry.proto), its processes, and what landed, counted by Kafka offset (or, for
upsert, by key). Used by test_drills.py, and by hand for drills not worth a test (`running_stack`,
`drill_env`, `produce`, `start_job`, then `landed_offsets`; under `flock /tmp/firehose-heavy.lock`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from google.cloud import bigquery
from google.protobuf import message_factory

from bench.proctree import Proc, cmdline, kill_tree, processes, tree
from firehose_bq import descriptors, sample
from tests.integration.conftest import REPO

PROTOS = Path(__file__).parent / "protos" / "drill"
VEHICLES = 300
BATCH_DONE = re.compile(r"batch (\d+): (\d+) messages")


def drill_env(stack_env: dict[str, str], desc: Path, work: Path, mode: str, **extra: str) -> dict[str, str]:
    """A job of write mode `mode` (or `upsert`) on a fresh topic, dataset and checkpoint under `work`."""
    suffix = uuid.uuid4().hex[:8]
    env = {**stack_env,
           "SOURCE_KAFKA_TOPIC": f"fleet-{suffix}", "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"drill-{suffix}",
           "INPUT_SCHEMA_PROTO_CLASS": "fleet.v1.Reading", "SCHEMA_REGISTRY_STENCIL_URLS": str(desc),
           "SINK_BIGQUERY_DATASET_NAME": f"drill_{suffix}", "SINK_BIGQUERY_TABLE_NAME": "readings",
           "SPARK_CHECKPOINT_LOCATION": str(work / "checkpoint"), "SPARK_MASTER": "local[2]",
           "SPARK_TRIGGER_INTERVAL_MS": "0", "FIREHOSE_LOG_LEVEL": "INFO"}
    if mode == "upsert":
        env.update({"SINK_BIGQUERY_UPSERT_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "vehicle",
                    "INPUT_SCHEMA_PROTO_KEY_CLASS": "fleet.v1.VehicleKey", "SINK_BIGQUERY_MERGE_INTERVAL_MS": "200"})
    else:
        env["SINK_BIGQUERY_WRITE_METHOD"] = mode
    if mode == "file_loads":
        env["SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS"] = "0"
    return {**env, **extra}


def readings(desc: Path) -> Callable[[int], sample.Record]:
    """Reading i: vehicle i % VEHICLES (its key), seq i, every kind of field filled."""
    loaded = descriptors.load([str(desc)])
    reading = loaded.message_class("fleet.v1.Reading")
    key_class = message_factory.GetMessageClass(reading.DESCRIPTOR.file.message_types_by_name["VehicleKey"])

    def make(i: int) -> sample.Record:
        vehicle = f"V-{i % VEHICLES:04d}"
        msg = reading(vehicle_id=vehicle, seq=i, engine=1 + i % 3, odometer_m=-i if i % 7 == 0 else i * 11,
                      raw=i.to_bytes(4, "big"), faults=[f"F{i % 5}"] * (i % 3))
        msg.position.lat, msg.position.lon, msg.position.heading = 52.0 + i / 1e6, 13.0 - i / 1e6, float(i % 360)
        for w in range(i % 5):
            msg.wheels.add(index=w, pressure_kpa=220.0 + w, alarm=w == 3)
        msg.labels["depot"] = f"D{i % 4}"
        if i % 2:
            msg.labels["driver"] = f"drv-{i % 17}"
        msg.observed_at.FromNanoseconds(1_760_000_000_000_000_000 + i * 1_000_001_000)
        return key_class(vehicle_id=vehicle).SerializeToString(), msg.SerializeToString(), [("src", b"drill")]

    return make


def produce(env: dict[str, str], desc: Path, count: int, start: int = 0) -> None:
    sample.ensure_topic(env["SOURCE_KAFKA_BROKERS"], env["SOURCE_KAFKA_TOPIC"], 3)
    sample.produce(env["SOURCE_KAFKA_BROKERS"], env["SOURCE_KAFKA_TOPIC"], readings(desc), count, start=start,
                   progress=False)


def start_job(env: dict[str, str], log_path: Path, *extra: str) -> subprocess.Popen[str]:
    """`firehose-bq run` in a session of its own (its process group is never the caller's)."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "firehose_bq.cli", "run", *extra], env={**os.environ, **env},
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_log(job: subprocess.Popen[str], log_path: Path, pattern: re.Pattern[str], count: int = 1,
             timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while len(pattern.findall(log_path.read_text())) < count:
        assert job.poll() is None, f"job ended (code {job.returncode}) early:\n{log_path.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {pattern.pattern!r} x{count} in {timeout} s:\n{log_path.read_text()[-4000:]}"
        time.sleep(0.1)


def role(proc: Proc) -> str:
    """What a process of the job is: the driver, its JVM, the fork server, a fork of it (named by its module:
    fork_server.process_name) or a process Spark started as usual (or a fork's stand-in: `python`)."""
    line = cmdline(proc.pid)
    if "firehose_bq.cli" in line:
        return "driver"
    if proc.name == "java":
        return "jvm"
    if "firehose_bq.fork_server" in line:  # the server, and its forks (whose command line stays the server's)
        return "fork-server" if proc.name.startswith("python") and proc.name != "python_streamin" \
            else f"fork:{proc.name}"
    return proc.name


def job_processes(root: int) -> list[Proc]:
    """The job's processes: its driver `root` and everything it started, followed by parent PID."""
    return tree(root)


def describe(procs: list[Proc]) -> str:
    return ", ".join(f"{p.pid}:{role(p)}" for p in procs)


def survivors(pids: list[int]) -> list[Proc]:
    live = processes()
    return [live[p] for p in pids if p in live]


def wait_gone(pids: list[int], timeout: float) -> list[Proc]:
    deadline = time.monotonic() + timeout
    while (left := survivors(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def row_count(client: bigquery.Client, table: str) -> int:
    try:
        job = client.query(f"SELECT COUNT(*) n FROM `{table}`", job_config=bigquery.QueryJobConfig(use_query_cache=False))
        return int(next(iter(job.result())).n)
    except Exception:  # noqa: BLE001 - not created yet
        return 0


@dataclass(frozen=True)
class Landed:
    distinct: int
    missing: list[tuple[int, int]]
    duplicates: int


def landed_offsets(client: bigquery.Client, table: str, produced: dict[int, int]) -> Landed:
    rows = client.query(f"SELECT message_partition p, message_offset o, COUNT(*) n FROM `{table}` GROUP BY p, o").result()
    seen = {(r.p, r.o): r.n for r in rows}
    return Landed(len(seen), [(p, o) for p, end in produced.items() for o in range(end) if (p, o) not in seen],
                  sum(n - 1 for n in seen.values()))


def upsert_state(client: bigquery.Client, table: str, count: int) -> tuple[int, list[str]]:
    """(rows, vehicles whose row is not their last reading's) after readings 0..count-1."""
    rows = list(client.query(f"SELECT vehicle_id v, seq FROM `{table}`").result())
    last = {f"V-{i % VEHICLES:04d}": i for i in range(max(0, count - VEHICLES), count)}
    wrong = [r.v for r in rows if last.get(r.v) != r.seq]
    return len(rows), wrong


def end_offsets(env: dict[str, str]) -> dict[int, int]:
    from tests.integration.test_end_to_end import end_offsets as ends

    return ends(env["SOURCE_KAFKA_BROKERS"], env["SOURCE_KAFKA_TOPIC"])


@contextmanager
def running_stack(work: Path) -> Iterator[tuple[dict[str, str], object]]:
    from firehose_bq.devstack.stack import Stack, isolated_env
    from firehose_bq.devstack.stack_config import StackConfig

    # A persistent emulator: an outage drill stops and starts it, and its tables must survive that.
    cfg = StackConfig.from_env({**os.environ, **isolated_env(work / "stack"), "FIREHOSE_STACK_BIGQUERY_PERSISTENT": "true"})
    stack = Stack(cfg)
    stack.up(report=lambda line: None)
    try:
        yield stack.env(), stack
    finally:
        stack.down(report=lambda line: None)


def kill_group(job: subprocess.Popen[str]) -> None:
    if job.poll() is None:
        kill_tree(job.pid)
        job.wait(timeout=30)

