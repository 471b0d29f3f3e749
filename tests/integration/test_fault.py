"""At-least-once, proven by force: `firehose-bq run` is killed with SIGKILL (driver, JVM and Python
workers alike) while a micro-batch's rows are landing, restarted on the same checkpoint, killed again,
and finally run to the end; then every produced offset must be in the table.

Duplicates are counted and printed, not asserted: a replayed batch re-sends rows that already landed,
and only insertId de-duplication keeps them out, for as long as the ids are remembered (the emulator:
60 s, BigQuery: "at least one minute"). A restart that takes longer than that (Spark's start-up on a
busy machine) replays into an emptied cache, exactly as it would on BigQuery.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound
from google.cloud import bigquery

from bench.proctree import kill_tree, processes
from firehose_bq.config import Config
from tests.integration.conftest import REPO
from tests.integration.test_end_to_end import end_offsets, produce_bookings

pytestmark = pytest.mark.integration

COUNT = 36_000  # three runs, each killed a few batches late, still leave the final run work
PER_BATCH = 3_000  # several micro-batches per run, each long enough to be caught half-written
KILLS = 3
# A run needs ~20 s to start Spark and finish a batch on 2 quiet cores, 40-60 s on busy ones; this bounds
# each wait. The whole test takes ~105 s on quiet cores (four Spark start-ups), ~215 s on busy ones.
WAIT_S = 120
BATCH_DONE = re.compile(r"batch (\d+): (\d+) messages")
LARGEST = re.compile(r"largest batch\s+(\d+) messages")
READ = re.compile(r"messages read\s+(\d+)")


def table_rows(client: bigquery.Client, cfg: Config) -> int:
    try:
        return int(next(iter(client.query(f"SELECT COUNT(*) n FROM `{cfg.bigquery.table_ref}`").result())).n)
    except NotFound:
        return 0  # the run has not created the table yet


def start_job(env: dict[str, str], log_path: Path, *extra: str, cwd: Path = REPO) -> subprocess.Popen[str]:
    # A session of its own: the job's process group is never the test's.
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "firehose_bq.cli", "run", *extra], env=env, cwd=cwd,
                                stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@dataclass(frozen=True)
class Landed:
    """How the table's rows cover the produced offsets."""

    distinct: int
    missing: list[tuple[int, int]]
    duplicates: int  # rows beyond the first of their offset
    unexpected: list[tuple[int, int]]  # offsets that were never produced


def landed_offsets(client: bigquery.Client, cfg: Config, produced: dict[int, int]) -> Landed:
    rows = client.query(f"SELECT message_partition p, message_offset o, COUNT(*) n FROM `{cfg.bigquery.table_ref}` "
                        "GROUP BY p, o").result()
    seen = {(r.p, r.o): r.n for r in rows}
    return Landed(distinct=len(seen),
                  missing=[(p, o) for p, end in produced.items() for o in range(end) if (p, o) not in seen],
                  duplicates=sum(n - 1 for n in seen.values()),
                  unexpected=[po for po in seen if po[0] not in produced or not 0 <= po[1] < produced[po[0]]])


def kill_mid_batch(job: subprocess.Popen[str], log_path: Path, client: bigquery.Client, cfg: Config,
                   rng: random.Random) -> str:
    """Wait for a batch of this run to finish, then for the next one's rows to start landing; SIGKILL
    the whole process tree a random moment later. Returns what the moment looked like."""
    started = time.monotonic()
    deadline = started + WAIT_S
    while not BATCH_DONE.search(log_path.read_text()):
        assert job.poll() is None, f"job ended before its first batch:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"no batch within {WAIT_S} s:\n{log_path.read_text()}"
        time.sleep(0.1)
    done = BATCH_DONE.findall(log_path.read_text())
    waited = time.monotonic() - started
    landed = table_rows(client, cfg)
    while table_rows(client, cfg) == landed:  # the next batch is being written once the count moves
        assert job.poll() is None, f"job ended unexpectedly:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"no rows landing within {WAIT_S} s:\n{log_path.read_text()}"
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.3))
    victims = kill_tree(job.pid)
    job.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (left := [p for p in victims if p.pid in processes()]) and time.monotonic() < deadline:
        time.sleep(0.1)  # SIGKILL is delivered asynchronously
    assert not left, f"survived SIGKILL: {left}"
    return (f"{len(victims)} processes ({', '.join(sorted({p.name for p in victims}))}) killed after batch "
            f"{done[-1][0]} ({waited:.0f} s after start); rows in table before the next batch {landed}, "
            f"after the kill {table_rows(client, cfg)}")


def test_kill_9_mid_batch_then_restart_loses_no_offset(job_env: dict[str, str], job_config: Config,
                                                       bq_client: bigquery.Client, tmp_path: Path) -> None:
    produce_bookings(job_config, COUNT)
    produced = end_offsets(job_config.source.brokers, job_config.source.topics[0])
    assert sum(produced.values()) == COUNT
    env = {**os.environ, **job_env, "SPARK_MAX_OFFSETS_PER_TRIGGER": str(PER_BATCH),
           "SPARK_TRIGGER_INTERVAL_MS": "0", "FIREHOSE_LOG_LEVEL": "INFO"}
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    print(f"\nfault test: {COUNT} messages, {PER_BATCH} per batch, {KILLS} kills, seed {seed}")
    for kill in range(KILLS):
        log_path = tmp_path / f"run-{kill}.log"
        job = start_job(env, log_path)
        try:
            print(f"  kill {kill + 1}: {kill_mid_batch(job, log_path, bq_client, job_config, rng)}")
        finally:
            if job.poll() is None:
                kill_tree(job.pid)
                job.wait(timeout=30)

    final_log = tmp_path / "final.log"
    final = start_job(env, final_log, "--available-now")
    try:
        final.wait(timeout=WAIT_S + 60)
    finally:
        if final.poll() is None:
            kill_tree(final.pid)
    assert final.returncode == 0, final_log.read_text()

    landed = landed_offsets(bq_client, job_config, produced)
    print(f"  after {KILLS} kills and a final run: {landed.distinct} distinct offsets of {COUNT}, "
          f"missing {len(landed.missing)}, duplicate rows {landed.duplicates}")
    assert landed.missing == [], f"{len(landed.missing)} offsets never reached the table, e.g. {landed.missing[:5]}"
    assert landed.unexpected == []
    # Pacing: SPARK_MAX_OFFSETS_PER_TRIGGER caps every micro-batch, and a backlog fills batches to the cap.
    sizes = [int(n) for log in tmp_path.glob("*.log") for _, n in BATCH_DONE.findall(log.read_text())]
    assert max(sizes) == PER_BATCH, sizes
    # The final run's summary says so too, unless the kills left it less than a batch: micro-batches of
    # PER_BATCH rows take ~0.1 s here, and a run may finish several between the rows starting to land and
    # the kill.
    final_text = final_log.read_text()
    read = READ.search(final_text)
    assert read is not None, final_text[-2000:]
    if int(read.group(1)):
        largest = LARGEST.search(final_text)
        assert largest is not None and int(largest.group(1)) == min(PER_BATCH, int(read.group(1))), final_text[-2000:]
