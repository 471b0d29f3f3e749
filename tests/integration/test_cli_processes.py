"""The command line as users run it: the stack's lifecycle, a streaming run stopped by SIGTERM, and its
log lines from Spark's Python workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer

from firehose_bq.devstack.stack import Stack
from firehose_bq.devstack.stack import isolated_env
from tests.integration.conftest import REPO
from tests.integration.test_end_to_end import produce_bookings

pytestmark = pytest.mark.integration

SERVICES = ("kafka", "bigquery", "gcs")


def firehose(*args: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "firehose_bq.cli", *args], env={**os.environ, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{proc.name}: {cmdline}")
    return found


def test_stack_up_status_down_leaves_no_process_behind(tmp_path: Path, stack: Stack) -> None:
    # A second stack beside the session's, so the session's stays untouched.
    state = tmp_path / "cli-stack"
    env = {**isolated_env(state),
           "FIREHOSE_STACK_TOOLS_DIR": str(stack.tools)}

    up = firehose("stack", "up", env=env)
    assert up.returncode == 0, up.stderr
    assert all(f"{name}: started" in up.stdout for name in SERVICES)
    again = firehose("stack", "up", env=env)
    assert all(f"{name}: already running" in again.stdout for name in SERVICES)
    status = firehose("stack", "status", env=env)
    assert status.returncode == 0 and status.stdout.count("running, healthy") == len(SERVICES)
    envs = dict(line.split("=", 1) for line in firehose("stack", "status", "--env", env=env).stdout.split())
    assert envs["SOURCE_KAFKA_BROKERS"] == f"127.0.0.1:{env['FIREHOSE_STACK_KAFKA_PORT']}"
    assert envs["SINK_BIGQUERY_API_ENDPOINT"] == f"http://127.0.0.1:{env['FIREHOSE_STACK_BIGQUERY_PORT']}"
    assert envs["DLQ_GCS_API_ENDPOINT"] == f"http://127.0.0.1:{env['FIREHOSE_STACK_GCS_PORT']}"
    assert processes_mentioning(str(state))

    down = firehose("stack", "down", env=env)
    assert down.returncode == 0 and all(f"{name}: stopped" in down.stdout for name in SERVICES)
    deadline = time.monotonic() + 10
    while processes_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(state)) == []
    stopped = firehose("stack", "status", env=env)
    assert stopped.returncode == 1 and stopped.stdout.count("stopped") == len(SERVICES)


@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm", "ctrl-c"])
def test_streaming_run_stops_cleanly_on_sigterm(job_env: dict[str, str], job_config, bq_client, ctrl_c: bool) -> None:
    """SIGTERM to the job, or a terminal's Ctrl-C: SIGINT to the job's whole process group (the JVM and the
    Python processes Spark started are in it, and must leave the stop to the driver)."""
    produce_bookings(job_config, 200)
    env = {**job_env, "SPARK_TRIGGER_INTERVAL_MS": "500", "FIREHOSE_LOG_LEVEL": "INFO"}
    log_path = Path(job_env["SPARK_CHECKPOINT_LOCATION"]).with_suffix(".log")
    with open(log_path, "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "firehose_bq.cli", "run"], env={**os.environ, **env},
                               cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
                               process_group=0 if ctrl_c else None)
        deadline = time.monotonic() + 240
        while "batch 0:" not in log_path.read_text() and time.monotonic() < deadline:
            assert job.poll() is None, log_path.read_text()
            time.sleep(0.5)
        if ctrl_c:
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, log_path.read_text()
    name = "SIGINT" if ctrl_c else "SIGTERM"
    assert f"{name} received: stopping after the current micro-batch" in log_path.read_text()
    assert "messages read      200" in out
    count = next(iter(bq_client.query(f"SELECT COUNT(*) n FROM `{job_config.bigquery.table_ref}`").result())).n
    assert count == 200


def test_lines_logged_in_spark_tasks_are_json_with_the_tasks_context(job_env: dict[str, str], job_config) -> None:
    """Dead letters are logged inside the Python workers: with LOG_FORMAT=json they are JSON lines that
    carry the micro-batch, Kafka partition, table and error type, as the driver's lines do."""
    produce_bookings(job_config, 20)
    topic = job_config.source.topics[0]
    producer = KafkaProducer(bootstrap_servers=job_config.source.brokers)
    producer.send(topic, b"\xff\xff not a booking", partition=1).get(timeout=30)
    producer.close()
    done = firehose("run", "--available-now", env={**job_env, "LOG_FORMAT": "json", "DLQ_SINK_ENABLE": "true",
                                                   "DLQ_WRITER_TYPE": "LOG"})
    assert done.returncode == 0, done.stderr
    # Every line is JSON: ours, the workers' and the JVM's (log4j2-json.properties). The one exception is the
    # JVM's own notice at start-up, which no logging configuration reaches.
    lines = done.stderr.splitlines()
    assert [line for line in lines if not line.startswith("{")] == ["WARNING: Using incubator modules: jdk.incubator.vector"]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    jvm = [r for r in records if r["logger"].startswith("org.apache.")]
    assert jvm and all(r.keys() >= {"time", "level", "message"} and r["time"].endswith("+00:00") for r in jvm)
    ours = [r for r in records if r["logger"].startswith("firehose_bq")]
    letter = next(line for line in ours if line["message"].startswith("dead letter "))
    policy = next(line for line in ours if "go to the DLQ with DESERIALIZATION_ERROR" in line["message"])
    for line in (letter, policy):
        assert line["logger"].startswith("firehose_bq.") and isinstance(line["batch_id"], int)
        assert (line["topic"], line["partition"], line["table"], line["error_type"]) == (
            topic, 1, job_config.bigquery.table_ref, "DESERIALIZATION_ERROR")


def test_the_fork_servers_and_worker_daemons_lines_are_json_under_log_format_json_from_an_env_file(
        job_env: dict[str, str], job_config, tmp_path: Path) -> None:
    """The fork server and the workers' daemon write their lines without logging (their forks are Spark's
    processes); with OPENBLAS_NUM_THREADS=2 numpy starts threads as they import, so both step aside and say
    so. Under LOG_FORMAT=json, here only in an env file that Spark's processes never read, those lines are
    the job's JSON records too: they were plain text."""
    produce_bookings(job_config, 5)
    env_file = tmp_path / "job.env"
    env_file.write_text("LOG_FORMAT=json\n")
    done = firehose("run", "--available-now", "--env-file", str(env_file), env={**job_env, "OPENBLAS_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if not line.startswith("{")] == ["WARNING: Using incubator modules: jdk.incubator.vector"]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    server = [r["message"] for r in records if r["logger"] == "firehose_bq.fork_server"]
    daemon = [r["message"] for r in records if r["logger"] == "firehose_bq.worker_daemon"]
    assert server and all("not serving" in m and "threads run" in m for m in server), server
    assert daemon and all("starting PySpark's own daemon instead" in m for m in daemon), daemon


def test_a_run_stopped_by_bad_data_logs_only_json_lines(job_env: dict[str, str], job_config) -> None:
    """A log shipper meets a failing run's lines most: the stop for a message that cannot be decoded (the DLQ
    off) carries Spark's own ERROR with its Java trace, and every line of it must still parse as JSON."""
    produce_bookings(job_config, 5)
    producer = KafkaProducer(bootstrap_servers=job_config.source.brokers)
    producer.send(job_config.source.topics[0], b"\xff\xff not a booking", partition=0).get(timeout=30)
    producer.close()
    done = firehose("run", "--available-now", env={**job_env, "LOG_FORMAT": "json"})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if not line.startswith("{")] == ["WARNING: Using incubator modules: jdk.incubator.vector"]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records[-1]["message"].startswith("error: ") and "DESERIALIZATION_ERROR" in records[-1]["message"]
    assert any(r["logger"].startswith("org.apache.spark") and r["level"] == "ERROR" for r in records), records


JVM_LONG_TRACE = """
from firehose_bq.config import SparkConfig
from firehose_bq.spark import spark_session
spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[1]"), json_logs=True)
jvm = spark.sparkContext._jvm
cause = jvm.java.lang.IllegalStateException("the root cause " + "y" * 30000 + " ends here")
log = jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.review")
log.error("a long message " + "x" * 30000 + " ends here", jvm.java.lang.RuntimeException("outer", cause))
spark.stop()
"""


def test_a_long_jvm_trace_keeps_its_root_cause_under_json_logs() -> None:
    """A failed Spark job's trace (Python traceback, then Java's, the root cause last) can pass 16,384
    characters, where log4j's JSON layout cut every string by default; text lines were never cut."""
    done = subprocess.run([sys.executable, "-c", JVM_LONG_TRACE], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(line) for line in done.stderr.splitlines() if "org.apache.spark.review" in line]
    assert line["message"].endswith(" ends here") and len(line["message"]) > 30000
    assert "the root cause " in line["exception"] and " ends here" in line["exception"]


def test_a_missing_topic_stops_the_run_before_spark_starts(job_env: dict[str, str]) -> None:
    """The source is checked before the JVM starts: a clear line in seconds, not Spark's traces after it."""
    done = firehose("run", "--available-now", env=job_env, timeout=60)  # job_env's topic was never created
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"topic {job_env['SOURCE_KAFKA_TOPIC']!r} does not exist" in done.stderr
    assert "org.apache.spark" not in done.stdout + done.stderr and "SparkContext" not in done.stderr
