"""The job on a real Spark cluster: a standalone master and worker started from the installed pyspark,
the package shipped to the executors as README's "Running on a Spark cluster" says (a venv archive in
`spark.archives`, PYSPARK_PYTHON pointing into it), and the executor SIGKILLed while a micro-batch is
in flight. Spark must relaunch the executor and retry the lost tasks (or, if the job gives up, a restart
must finish it) with every offset in the table.

The cluster's daemons get a bare environment (no PYTHONPATH, no virtualenv), as on a machine that never
saw the driver's install; the test then shows that the executors' Python workers run from the unpacked
archive under the worker's work directory, not from the driver's venv (which, on this one machine,
they could otherwise reach).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from google.cloud import bigquery

from bench.proctree import Proc, cmdline, kill_tree, processes, tree
from firehose_bq.config import Config
from firehose_bq.devstack.stack import free_port
from firehose_bq.errors import FirehoseError
from firehose_bq.spark import java_version
from tests.integration.conftest import REPO
from tests.integration.test_end_to_end import end_offsets, produce_bookings
from tests.integration.test_fault import BATCH_DONE, landed_offsets, start_job, table_rows



def java_missing() -> str | None:
    try:
        java_version()
        return None
    except FirehoseError as exc:
        return str(exc)


pytestmark = [pytest.mark.integration, pytest.mark.skipif(java_missing() is not None, reason=str(java_missing()))]

HOST = "127.0.0.1"
COUNT = 6_000
PER_BATCH = 1_000  # several micro-batches, so one of them is caught with tasks running
# What README tells users: spark.archives unpacks the venv under this name in each executor's working
# directory, and PYSPARK_PYTHON is relative to it.
ENV_ALIAS = "environment"
WORKER_PYTHON = f"./{ENV_ALIAS}/bin/python"
START_TIMEOUT_S = 60
JOB_TIMEOUT_S = 300
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# An executor's own log (its work dir's stderr) names every task attempt it starts and finishes.
TASK_LINE = re.compile(r"(Running|Finished) task (\d+)\.(\d+) in stage (\d+)\.\d+ \(TID \d+\)")
# Run in the executors' Python workers' exact start-up conditions; prints where the imports resolve.
IMPORT_PROBE = ("import json, sys, firehose_bq, pyarrow, google.cloud.bigquery as bq; "
                "print(json.dumps({'firehose_bq': firehose_bq.__file__, 'pyarrow': pyarrow.__file__, "
                "'bigquery': bq.__file__, 'prefix': sys.prefix, 'path': sys.path}))")


def run(*args: str | Path, **kwargs: object) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def executor_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """README's recipe, once per session: a wheel of the project, a fresh venv with it and its dependencies
    minus pyspark (executors take pyspark from the cluster's own Spark), packed as a tar.gz."""
    root = tmp_path_factory.mktemp("executor-env")
    marks = [time.monotonic()]
    # Built from a copy, so the test never writes setuptools' build/ into the checkout (nor picks up a stale one).
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".stack", ".checkpoints", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", root / "dist", source)
    (wheel,) = (root / "dist").glob("firehose_bq-*.whl")
    marks.append(time.monotonic())
    venv = root / "firehose-env"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "--quiet", wheel)
    run(venv / "bin" / "pip", "uninstall", "--quiet", "--yes", "pyspark", "py4j")
    marks.append(time.monotonic())
    # gzipped: Spark unpacks a .tar.gz with the system's tar; a plain .tar with its own untar, which refuses
    # the venv's bin/python3.x (a symlink to the base interpreter, outside the archive).
    archive = root / "firehose-env.tar.gz"
    run("tar", "-czf", archive, "-C", venv, ".")
    marks.append(time.monotonic())
    wheel_s, venv_s, pack_s = (end - start for start, end in zip(marks, marks[1:]))
    # The venv, the archive and the executors' unpacked copies (~1.5 GB in all) stay in pytest's basetemp,
    # which pytest rotates: deleting them here took 40-60 s on a busy disk.
    print(f"\nexecutor archive, {archive.stat().st_size / 1e6:.0f} MB, built in {marks[-1] - marks[0]:.0f} s "
          f"(wheel {wheel_s:.0f} s, venv {venv_s:.0f} s, tar.gz {pack_s:.0f} s)")
    return archive


@dataclass
class Standalone:
    """A standalone master and one worker, run by Spark's own spark-daemon.sh, state under `root`."""

    root: Path
    master_port: int
    master_ui_port: int

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    def env(self) -> dict[str, str]:
        # A bare environment: what executors see is what Spark and the archive give them, nothing of ours.
        keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "JAVA_HOME", "USER") if k in os.environ}
        return {**keep, "SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(self.root / "daemon-conf"),
                "SPARK_LOG_DIR": str(self.root / "logs"), "SPARK_PID_DIR": str(self.root / "pids"),
                "SPARK_WORKER_DIR": str(self.work_dir), "SPARK_LOCAL_DIRS": str(self.root / "local"),
                "SPARK_IDENT_STRING": "test", "SPARK_LOCAL_IP": HOST}

    def start(self) -> None:
        (self.root / "daemon-conf").mkdir(parents=True, exist_ok=True)
        self._daemon("org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(self.master_port),
                     "--webui-port", str(self.master_ui_port))
        self._daemon("org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", str(free_port()),
                     "--webui-port", str(free_port()), "--cores", "2", "--memory", "1g", self.url)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._alive_workers() < 1:
            assert time.monotonic() < deadline, f"no worker registered within {START_TIMEOUT_S} s:\n{self.logs()}"
            time.sleep(0.3)

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in sorted((self.root / "pids").glob("*.pid"))]

    def executors(self) -> list[Proc]:
        """Executor JVMs the worker runs now."""
        return [p for pid in self.pids() for p in tree(pid) if EXECUTOR_CLASS in cmdline(p.pid)]

    def stop(self) -> list[str]:
        """SIGTERM the daemons (the worker then stops its executors), SIGKILL whatever of them is left after
        a grace period; returns the command lines of any that survived even that."""
        family = [p for pid in self.pids() for p in tree(pid)]
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if not wait_gone(family, 15):
            for p in family:
                if p.pid in processes():
                    kill_tree(p.pid)
            wait_gone(family, 10)
        live = processes()
        return [cmdline(p.pid) for p in family if p.pid in live]

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted((self.root / "logs").glob("*")))

    def _daemon(self, cls: str, *args: str) -> None:
        # A session of its own: the daemons (and the executors they start) are never in the test's process group.
        run(spark_home() / "sbin" / "spark-daemon.sh", "start", cls, "1", *args, env=self.env(),
            start_new_session=True)

    def _alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.master_ui_port}/json/", timeout=2) as answer:  # noqa: S310 - loopback
                return int(json.load(answer).get("aliveworkers", 0))
        except OSError:
            return 0


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def wait_gone(procs: list[Proc], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(p.pid in processes() for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Standalone]:
    running = Standalone(tmp_path / "spark", free_port(), free_port())
    try:
        started = time.monotonic()
        running.start()
        print(f"\nstandalone master and worker up in {time.monotonic() - started:.0f} s")
        yield running
    finally:
        survivors = running.stop()
        assert survivors == [], f"Spark processes survived the cluster's stop: {survivors}"


def driver_setup(root: Path, archive: Path) -> tuple[dict[str, str], Path]:
    """README's settings for the driver: spark-defaults.conf shipping the archive, PYSPARK_PYTHON inside it,
    and `./environment` in the driver's working directory too (Spark starts the Python data source's
    driver-side workers with the same PYSPARK_PYTHON); there it is the driver's own venv."""
    conf = root / "conf"
    conf.mkdir(parents=True)
    # The application UI is off only so that it never competes for port 4040 with another Spark here.
    (conf / "spark-defaults.conf").write_text(f"spark.archives {archive}#{ENV_ALIAS}\nspark.ui.enabled false\n")
    (root / ENV_ALIAS).symlink_to(sys.prefix)
    return {"SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": WORKER_PYTHON, "SPARK_LOCAL_IP": HOST}, root


@dataclass(frozen=True)
class WorkerStart:
    """How Spark started one of the executor's Python workers, read from /proc while it ran."""

    pid: int
    executable: str
    cwd: str
    environ: dict[str, str]
    native_libs: list[str]  # pyarrow's shared libraries mapped into the live process

    @classmethod
    def of(cls, pid: int) -> WorkerStart:
        proc = Path(f"/proc/{pid}")
        maps = (proc / "maps").read_text().splitlines()
        environ = (proc / "environ").read_bytes().decode().split("\0")
        return cls(pid, cmdline(pid).split()[0], os.readlink(proc / "cwd"),
                   dict(entry.split("=", 1) for entry in environ if "=" in entry),
                   sorted({line.split()[-1] for line in maps if "/pyarrow/" in line and ".so" in line}))

    def imports(self) -> dict[str, object]:
        """IMPORT_PROBE's answer from an interpreter started exactly as this worker was (same executable
        path, working directory and environment)."""
        probe = subprocess.run([self.executable, "-c", IMPORT_PROBE], cwd=self.cwd, env=self.environ,
                               capture_output=True, text=True, timeout=60, check=False)
        assert probe.returncode == 0, f"{self.executable} in {self.cwd}: {probe.stderr}"
        return dict(json.loads(probe.stdout))


def worker_starts(pid: int) -> list[WorkerStart]:
    """WorkerStart of each Python process under `pid` (a worker that exits meanwhile is left out)."""
    starts = []
    for process in tree(pid):
        if process.name.startswith("python"):
            try:
                starts.append(WorkerStart.of(process.pid))
            except (OSError, IndexError):  # gone meanwhile (no /proc entry, or a zombie without a cmdline)
                continue
    return starts


def task_attempts(executor_dir: Path, state: str) -> set[tuple[int, int, int]]:
    """(stage, task, attempt) of every task attempt the executor's log says it started (state "Running")
    or finished ("Finished")."""
    log = (executor_dir / "stderr").read_text(errors="replace")
    return {(int(stage), int(task), int(attempt)) for said, task, attempt, stage in TASK_LINE.findall(log)
            if said == state}


@dataclass(frozen=True)
class Kill:
    moment: str  # what it looked like, for the test's output
    executor_dir: Path  # the killed executor's work dir (its log, its unpacked archive)
    workers: list[WorkerStart]
    missed: list[Path]  # executors killed before it whose tasks had all finished


def kill_executor_mid_batch(job: subprocess.Popen[str], log_path: Path, cluster: Standalone,
                            client: bigquery.Client, cfg: Config) -> Kill:
    """Once a batch after the first is under way (rows past the first batch in the table, and a task the
    executor's log says it started and has not finished), SIGKILL the executor JVM and its Python workers.
    The executor's log, not the table's count, says a task is running: a count between two batch
    boundaries may also mean every task wrote and the driver is settling the batch."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    missed: list[Path] = []  # executors killed after their tasks had finished: no batch was in flight
    while True:
        assert job.poll() is None, f"job ended before the kill:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"no batch caught in flight:\n{log_path.read_text()}"
        landed = table_rows(client, cfg)
        executors = cluster.executors() if landed > PER_BATCH else []
        assert len(executors) <= 1, f"expected the one executor of the job, found {executors}"
        if executors:
            executor = executors[0]
            executor_dir = Path(os.readlink(f"/proc/{executor.pid}/cwd"))
            # Read before the log, not between it and the kill: on busy cores reading each worker's /proc
            # took long enough for the task seen running to finish before the kill (no task in flight). An
            # executor launched after a missed kill may show its first task running before its Python worker
            # has started: wait for one, whose start the test inspects.
            workers = worker_starts(executor.pid)
            if workers and task_attempts(executor_dir, "Running") - task_attempts(executor_dir, "Finished"):
                victims = kill_tree(executor.pid)
                assert wait_gone(victims, 10), "the executor survived SIGKILL"
                # A task of 1,000 rows takes a few hundred ms: it may finish between the log read and the
                # kill. Then nothing was in flight; the worker launches another executor: try its batch.
                if task_attempts(executor_dir, "Running") - task_attempts(executor_dir, "Finished"):
                    break
                missed.append(executor_dir)
        time.sleep(0.02)
    done = BATCH_DONE.findall(log_path.read_text())
    moment = (f"executor JVM {executor.pid} and {len(victims) - 1} Python processes killed with {landed} rows in "
              f"the table (batch {landed // PER_BATCH} or later under way; last batch logged done: "
              f"{done[-1][0] if done else None}), {table_rows(client, cfg)} right after")
    return Kill(moment + (f"; {len(missed)} earlier kill(s) found no task in flight" if missed else ""),
                executor_dir, workers, missed)


def test_executor_killed_mid_batch_is_replaced_and_no_offset_is_lost(
        cluster: Standalone, executor_archive: Path, job_env: dict[str, str], job_config: Config,
        bq_client: bigquery.Client, tmp_path: Path) -> None:
    started = time.monotonic()
    produce_bookings(job_config, COUNT)
    produced = end_offsets(job_config.source.brokers, job_config.source.topics[0])
    assert sum(produced.values()) == COUNT
    spark_env, driver_dir = driver_setup(tmp_path / "driver", executor_archive)
    env = {**os.environ, **job_env, **spark_env, "SPARK_MASTER": cluster.url,
           "SPARK_MAX_OFFSETS_PER_TRIGGER": str(PER_BATCH), "SPARK_TRIGGER_INTERVAL_MS": "0",
           "FIREHOSE_LOG_LEVEL": "INFO"}
    print(f"cluster test: {COUNT} messages, {PER_BATCH} per batch, master {cluster.url}")

    logs = [tmp_path / "run-0.log"]
    job = start_job(env, logs[0], "--available-now", cwd=driver_dir)
    try:
        kill = kill_executor_mid_batch(job, logs[0], cluster, bq_client, job_config)
        print(f"  {kill.moment}")
        job.wait(timeout=JOB_TIMEOUT_S)
        if job.returncode != 0:  # Spark gave up on the batch: a restart on the same checkpoint must finish it
            print(f"  the job failed after the kill (exit {job.returncode}); restarting it")
            logs.append(tmp_path / "run-1.log")
            job = start_job(env, logs[1], "--available-now", cwd=driver_dir)
            job.wait(timeout=JOB_TIMEOUT_S)
    finally:
        if job.poll() is None:
            kill_tree(job.pid)
            job.wait(timeout=30)
    assert job.returncode == 0, logs[-1].read_text()
    ran = time.monotonic() - started

    # Recovery as Spark does it: the tasks running on the killed executor (started in its log, never
    # finished) are attempted again on the executor the worker launched in its place.
    in_flight = task_attempts(kill.executor_dir, "Running") - task_attempts(kill.executor_dir, "Finished")
    successors = [d for d in kill.executor_dir.parent.iterdir()
                  if d.is_dir() and d != kill.executor_dir and d not in kill.missed]
    retried = {attempt for d in successors for attempt in task_attempts(d, "Finished")}
    print(f"  tasks in flight on the killed executor (stage, task, attempt): {sorted(in_flight)}; executors "
          f"launched after it: {len(successors)}; runs: {len(logs)}")
    assert in_flight, f"no task was running on the killed executor:\n{(kill.executor_dir / 'stderr').read_text()}"
    if len(logs) == 1:  # recovered within the run (a restart is a new application with its own executors)
        assert successors, f"the worker launched no executor after the kill:\n{cluster.logs()}"
        for stage, task, attempt in in_flight:
            assert any((s, t) == (stage, task) and a > attempt for s, t, a in retried), (stage, task, attempt)

    # The shipped code, not the driver's: the workers ran from the archive unpacked in their executor's dir.
    workers = kill.workers
    assert workers, "the executor had no Python worker to inspect"
    driver_venv = Path(sys.prefix).resolve()
    for worker in workers:
        assert worker.cwd.startswith(str(cluster.work_dir)), worker.cwd
        assert worker.executable == WORKER_PYTHON
        assert all(lib.startswith(str(Path(worker.cwd, ENV_ALIAS))) for lib in worker.native_libs), worker.native_libs
    assert any(worker.native_libs for worker in workers), "no worker had pyarrow loaded"
    # The daemon's forks share one start-up; probe each distinct one.
    starts = {(w.executable, w.cwd, tuple(sorted(w.environ.items()))): w for w in workers}
    for worker in starts.values():
        unpacked = str(Path(worker.cwd, ENV_ALIAS))
        imports = worker.imports()
        for module in ("firehose_bq", "pyarrow", "bigquery", "prefix"):
            assert str(imports[module]).startswith(unpacked), (module, imports)
        # Only the cluster's Spark (its SPARK_HOME: pyspark.zip, py4j) may come from the driver's venv here.
        entries = [Path(entry).resolve() for entry in imports["path"] if entry]  # type: ignore[union-attr]
        leaked = [e for e in entries if e.is_relative_to(driver_venv) and not e.is_relative_to(spark_home())]
        assert leaked == [], f"the driver's venv is on an executor's sys.path: {leaked}"
        print(f"  executor worker {worker.pid}: firehose_bq from {imports['firehose_bq']}")

    landed = landed_offsets(bq_client, job_config, produced)
    print(f"  {landed.distinct} distinct offsets of {COUNT}, missing {len(landed.missing)}, duplicate rows "
          f"{landed.duplicates}; producing and the job(s) took {ran:.0f} s")
    assert landed.missing == [], f"{len(landed.missing)} offsets never reached the table, e.g. {landed.missing[:5]}"
    assert landed.unexpected == []
    assert landed.distinct == COUNT
