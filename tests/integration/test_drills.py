"""An operator's failure drills, on a proto of their own (protos/drill) and the real local stack: the job
stopped or broken the ways production stops and breaks it, then restarted; every produced Kafka offset
must then be in the table, once (see drills.py for the job, its processes and the counting)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from google.cloud import bigquery

from tests.conftest import compile_protos
from tests.integration import drills

pytestmark = pytest.mark.integration

COUNT = 24_000
PER_BATCH = 2_000


@pytest.fixture
def drill(stack_env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path):  # noqa: ANN201
    desc = compile_protos(tmp_path / "fleet.desc", drills.PROTOS)
    env = drills.drill_env(stack_env, desc, tmp_path, "storage_write", SPARK_MAX_OFFSETS_PER_TRIGGER=str(PER_BATCH))
    drills.produce(env, desc, COUNT)
    yield env
    bq_client.delete_dataset(env["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)


def table_of(env: dict[str, str]) -> str:
    return f"{env['SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID']}.{env['SINK_BIGQUERY_DATASET_NAME']}.readings"


def restart_lands_every_offset_once(env: dict[str, str], bq_client: bigquery.Client, tmp_path: Path,
                                    appended_before_crash: bool = False) -> None:
    """`appended_before_crash`: the job died inside a batch, whose rows Storage Write had partly appended, and
    the restart appends again (README: at-least-once); else not one duplicate."""
    produced = drills.end_offsets(env)
    log_path = tmp_path / "restart.log"
    job = drills.start_job(env, log_path, "--available-now")
    try:
        assert job.wait(timeout=240) == 0, log_path.read_text(errors="replace")[-4000:]
    finally:
        drills.kill_group(job)
    landed = drills.landed_offsets(bq_client, table_of(env), produced)
    assert (landed.distinct, landed.missing[:5]) == (COUNT, [])
    assert landed.duplicates <= (PER_BATCH if appended_before_crash else 0), landed.duplicates


# SIGTERM only: Ctrl-C reaches the same handler (cli.on_signal), and test_cli_processes stops a run with each.
@pytest.mark.parametrize("signum", [signal.SIGTERM], ids=["sigterm"])
def test_a_stop_with_a_backlog_ends_after_the_running_batch(drill: dict[str, str], bq_client: bigquery.Client,
                                                            tmp_path: Path, signum: int) -> None:
    """SIGTERM (a deploy, a node drain) or Ctrl-C (SIGINT to the process group) while a backlog is being read:
    the job stops after the batch it runs, not once the backlog is gone (Kubernetes kills it after its grace
    period, and Storage Write re-appends the batch it was writing). Every batch it ran is committed."""
    log_path = tmp_path / "run.log"
    job = drills.start_job(drill, log_path)
    try:
        drills.wait_log(job, log_path, drills.BATCH_DONE, 1)
        signalled = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        drills.kill_group(job)
    text = log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    batches = [int(n) for _, n in drills.BATCH_DONE.findall(text)]
    # The batch running at the signal, those that ended before the driver looked (every 0.5 s) and the one
    # Spark had planned already; not the backlog.
    assert sum(batches) <= (len(drills.BATCH_DONE.findall(text[:text.index("received: stopping")])) + 4) * PER_BATCH
    assert sum(batches) < COUNT, f"ran the whole backlog before stopping ({took:.1f} s): {batches}"
    landed = drills.landed_offsets(bq_client, table_of(drill), drills.end_offsets(drill))
    assert (landed.distinct, landed.duplicates) == (sum(batches), 0)
    restart_lands_every_offset_once(drill, bq_client, tmp_path)


def fork_server_and_runner(job_pid: int) -> dict[str, int]:
    """The job's fork server (a child of the driver running firehose_bq.fork_server) and the source runner it
    forked (named by its module, fork_server.process_name)."""
    procs = drills.job_processes(job_pid)
    server = next(p.pid for p in procs if p.ppid == job_pid and "firehose_bq.fork_server" in drills.cmdline(p.pid))
    runner = next(p.pid for p in procs if p.name == "python_streamin" and p.ppid == server)
    return {"fork server": server, "source runner": runner}


def kill_one_and_fail(env: dict[str, str], tmp_path: Path, victim: Callable[[int], int]) -> str:
    """Run the job until a batch is done, `kill -9` the process `victim(job's pid)` names, and check that the
    job then fails (code 1) leaving no process of its behind; its last line, the reason it gave."""
    log_path = tmp_path / "run.log"
    job = drills.start_job(env, log_path)
    try:
        drills.wait_log(job, log_path, drills.BATCH_DONE, 1)
        before = [p.pid for p in drills.job_processes(job.pid)]
        os.kill(victim(job.pid), signal.SIGKILL)
        code = job.wait(timeout=60)
        left = drills.wait_gone(before, timeout=15)
    finally:
        drills.kill_group(job)
    text = log_path.read_text(errors="replace")
    assert code == 1, text[-4000:]
    assert left == [], f"left running after the job ended: {drills.describe(left)}"
    return text.strip().splitlines()[-1]


# The fork server: its stand-ins then kill its forks, the source runner among them, so this covers the runner's
# own death too (the same EOFException), at one job's cost (the suite's time is budgeted).
@pytest.mark.parametrize("victim", ["fork server"])
def test_a_killed_source_runner_or_fork_server_stops_the_job_saying_so(
        drill: dict[str, str], bq_client: bigquery.Client, tmp_path: Path, victim: str) -> None:
    """`kill -9` of the fork server (its forks' stand-ins then kill them) or of the source runner alone: Spark
    fails the query with a bare EOFException, whose "terminated with exception: " names nothing. The job must
    stop within seconds saying which process went away, leave no process behind, and resume on restart."""
    last = kill_one_and_fail(drill, tmp_path, lambda job_pid: fork_server_and_runner(job_pid)[victim])
    assert last.startswith("error: [STREAM_FAILED]"), last
    # Where Spark met the end (latestOffset, partitions, ...) and how (the stream's end, an EOFException; a reset
    # connection when the process died mid-exchange) depend on the moment of the kill.
    assert re.search(r"\(cause: java\.[\w.]+(: [^()]+)? in PythonStreamingSourceRunner\.\w+: Spark's Python process "
                     r"for the Kafka source", last), last
    restart_lands_every_offset_once(drill, bq_client, tmp_path)


def test_a_broker_restart_while_the_job_is_idle_is_waited_out(stack, stack_env: dict[str, str],  # noqa: ANN001
                                                             bq_client: bigquery.Client, tmp_path: Path) -> None:
    """The broker down for 45 s while the job has caught up: the source's planner asks it for end offsets on
    every trigger, and its first failed request (30 s) used to stop the job, where a batch's tasks wait for
    records for SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS (120 s). Now the planner waits as long; the job reads on
    once the broker is back, every offset once."""
    desc = compile_protos(tmp_path / "fleet.desc", drills.PROTOS)
    env = drills.drill_env(stack_env, desc, tmp_path, "storage_write")
    drills.produce(env, desc, 1_000)
    log_path = tmp_path / "run.log"
    job = drills.start_job(env, log_path)
    try:
        drills.wait_log(job, log_path, drills.BATCH_DONE, 1)
        stack.stop_service("kafka")
        time.sleep(45)
        assert job.poll() is None, log_path.read_text(errors="replace")[-4000:]
        stack.up(report=lambda line: None)
        drills.produce(env, desc, 1_000, start=1_000)
        deadline = time.monotonic() + 120
        while sum(int(n) for _, n in drills.BATCH_DONE.findall(log_path.read_text(errors="replace"))) < 2_000:
            assert job.poll() is None, log_path.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
    finally:
        drills.kill_group(job)
        stack.up(report=lambda line: None)  # whatever happened, the session's other tests need the broker
    try:
        landed = drills.landed_offsets(bq_client, table_of(env), drills.end_offsets(env))
        assert (landed.distinct, landed.missing[:5], landed.duplicates) == (2_000, [], 0)
    finally:
        bq_client.delete_dataset(env["SINK_BIGQUERY_DATASET_NAME"], delete_contents=True, not_found_ok=True)


def test_a_killed_jvm_stops_the_job_saying_so(drill: dict[str, str], bq_client: bigquery.Client,
                                              tmp_path: Path) -> None:
    """`kill -9` of the driver's JVM alone (the OOM killer's favourite): the job stopped with "error:
    ConnectionRefusedError: [Errno 111] Connection refused", py4j's word for it, from stopping a session
    whose JVM was gone. It must say the JVM ended, leave no process behind, and resume on restart."""
    last = kill_one_and_fail(drill, tmp_path, lambda job_pid: next(
        p.pid for p in drills.job_processes(job_pid) if p.ppid == job_pid and p.name == "java"))
    assert last.startswith("error: Spark's JVM (the driver's java process) ended unexpectedly with status -9"), last
    restart_lands_every_offset_once(drill, bq_client, tmp_path, appended_before_crash=True)
