"""Upsert/delete through crashes: `firehose-bq run` killed with SIGKILL at random points, restarted,
ends in exactly the state of an uninterrupted run; `upsert cleanup` then drops the crashed runs' tables."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from google.cloud import bigquery

from firehose_bq.config import Config
from tests.integration.conftest import REPO
from tests.integration.test_cli_processes import firehose
from tests.integration.test_upsert import (
    assert_materialized,
    produce_changelog,
    random_changelog,
    tables_in,
    upsert_env,
)

KILLS = 3
MERGED = "merged into"
TABLES_READY = " via "  # logged once the destination and the run's intermediate table exist


def start_job(env: dict[str, str], log_path: Path) -> subprocess.Popen[str]:
    with open(log_path, "w") as log:
        # Its own session: SIGKILL to the group takes the driver, its JVM and Python workers at once, as a
        # crashed machine or container would.
        return subprocess.Popen([sys.executable, "-m", "firehose_bq.cli", "run", "--available-now"],
                                env={**os.environ, **env}, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
                                text=True, start_new_session=True)


def wait_for(job: subprocess.Popen[str], log_path: Path, text: str, count: int, timeout: float = 240) -> bool:
    """Wait until `text` occurs `count` times in the log; False if the job ended first."""
    deadline = time.monotonic() + timeout
    while log_path.read_text().count(text) < count:
        if job.poll() is not None:
            return False
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.05)
    return True


def test_killed_and_restarted_runs_end_in_the_exact_state(job_env: dict[str, str], bq_client: bigquery.Client,
                                                          tmp_path: Path) -> None:
    env = upsert_env(job_env, SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD="2000", FIREHOSE_LOG_LEVEL="INFO")
    cfg = Config.from_env(env)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    log = random_changelog(seed=seed)
    try:
        produce_changelog(cfg, log)
        killed = 0
        for attempt in range(KILLS):
            log_path = tmp_path / f"run-{attempt}.log"
            job = start_job(env, log_path)
            try:
                # A random point: during the n-th batch's inserts, its merge or its commit.
                merges = rng.randrange(3)
                reached = wait_for(job, log_path, TABLES_READY, 1) and wait_for(job, log_path, MERGED, merges)
                time.sleep(rng.uniform(0, 1.5))
            finally:
                if job.poll() is None:
                    os.killpg(job.pid, signal.SIGKILL)
                    killed += 1
                job.wait(timeout=60)
            assert reached, f"seed {seed}: run {attempt} ended before its kill point:\n{log_path.read_text()[-3000:]}"
        assert killed == KILLS, f"seed {seed}: a run finished before it could be killed"

        final = firehose("run", "--available-now", env=env, timeout=600)
        assert final.returncode == 0, f"seed {seed}:\n{final.stderr[-3000:]}"

        assert_materialized(bq_client, cfg, log)
        # Each killed run left its own intermediate table behind; the clean run dropped its own.
        orphans = [t for t in tables_in(bq_client, cfg) if t != cfg.bigquery.table]
        assert len(orphans) == KILLS, orphans
        listed = firehose("upsert", "cleanup", "--min-idle-minutes", "0", env=env)
        assert listed.returncode == 0 and listed.stdout.count("would drop") == KILLS, listed.stdout + listed.stderr
        dropped = firehose("upsert", "cleanup", "--drop", "--min-idle-minutes", "0", env=env)
        assert dropped.returncode == 0 and dropped.stdout.count("dropped") == KILLS, dropped.stdout + dropped.stderr
        assert tables_in(bq_client, cfg) == [cfg.bigquery.table]
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
