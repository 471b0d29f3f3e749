"""The worker daemon: what it imports before forking, that doing so leaves it single-threaded with the
installed libraries, and that it steps aside for PySpark's own daemon when it would not be."""

from __future__ import annotations

import importlib
import json
import os
import struct
import subprocess
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from firehose_bq import worker_daemon
from firehose_bq.worker_daemon import OPTIONAL_TASK_MODULES, PYSPARK_WORKER, SOURCE_MODULES, TASK_MODULES, modules_for

REPO = Path(__file__).resolve().parents[2]
# What the daemon must not import for every worker: the driver's modules, kafka-python (the driver's
# metadata client) and Parquet (file loads import it in their own tasks).
NOT_FOR_EVERY_WORKER = ("firehose_bq.pipeline", "firehose_bq.spark", "firehose_bq.cli", "kafka", "pyarrow.parquet")


def daemon_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a daemon gets, without this process's own settings of the variables under test,
    plus `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in worker_daemon.SINGLE_THREADED_ENV}
    return {**clean, **(env or {})}


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=daemon_env(env), capture_output=True,
                          text=True, timeout=120, check=False)


def test_task_workers_get_the_batch_core_and_the_source_planners_only_the_source() -> None:
    assert modules_for(PYSPARK_WORKER) == (PYSPARK_WORKER, *SOURCE_MODULES, *TASK_MODULES, *OPTIONAL_TASK_MODULES)
    planner = "pyspark.sql.worker.plan_data_source_read"
    assert modules_for(planner) == (planner, *SOURCE_MODULES)
    assert "firehose_bq.batch.task" in TASK_MODULES


def test_the_preload_leaves_the_daemon_single_threaded_and_keeps_out_what_workers_do_not_all_need() -> None:
    # The premise of forking after the imports, checked against the libraries installed here: if an
    # upgrade starts a thread at import, this fails (and the daemon falls back to PySpark's own).
    code = ("import sys\nfrom firehose_bq import worker_daemon as d\n"
            "print(d.preload(d.modules_for(d.PYSPARK_WORKER)))\n"
            f"print(' '.join(m for m in {NOT_FOR_EVERY_WORKER!r} if m in sys.modules) or '-')\n"
            f"print(all(m in sys.modules for m in d.modules_for(d.PYSPARK_WORKER)))")
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["None", "-", "True"]


def test_pandas_is_left_out_of_the_preload_and_imports_as_usual_afterwards() -> None:
    # The BigQuery clients and pyarrow import pandas only because it is installed; no worker uses it, and
    # it was 0.2-0.35 CPU-s and ~40 MB of the daemon's start. Refused during the preload only.
    code = ("import sys\nfrom firehose_bq import worker_daemon as d\n"
            "print(d.preload(d.modules_for(d.PYSPARK_WORKER)))\n"
            "print('pandas' in sys.modules, any(isinstance(f, d._Refuse) for f in sys.meta_path))\n"
            "import pyarrow as pa\nprint(pa.array(['a', None]).to_pylist())\n"
            "import pandas\nprint(pandas.DataFrame({'x': [1]}).shape)")
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["None", "False False", "['a', None]", "(1, 1)"]


def test_a_thread_started_at_import_is_reported_as_unsafe() -> None:
    # The user's own OpenBLAS setting wins over the daemon's, and starts numpy's thread pool at import.
    done = run_python("from firehose_bq import worker_daemon as d\nprint(d.preload(['numpy']))",
                      env={"OPENBLAS_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    assert "threads run after importing the workers' modules" in done.stdout


def test_a_missing_native_decoder_build_is_no_reason_to_fall_back() -> None:
    # Without a compiler the C decoders are not built; the tasks then use the reference decoders.
    done = run_python("from firehose_bq import worker_daemon as d\n"
                      "d.OPTIONAL_TASK_MODULES = ('firehose_bq.decode._no_such_build',)\n"
                      "print(d.preload(['firehose_bq.decode._no_such_build', 'netrc']))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_archives_on_the_path_are_read_once_before_forking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark puts its spark-core jar (6,000 entries) ahead of the standard library; every worker read its
    # table of contents again on its first import of a module the daemon had not loaded (≈ 0.15 s).
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("firehose_bq_zipped_probe.py", "VALUE = 7\n")
    directory, relative, missing = tmp_path / "dir", "relative-entry", tmp_path / "not-yet"
    directory.mkdir()
    entries = [str(archive), str(directory), relative, str(missing)]
    try:
        worker_daemon.cache_import_paths(entries)
        assert isinstance(sys.path_importer_cache[str(archive)], worker_daemon.UnchangedArchiveImporter)
        assert str(directory) in sys.path_importer_cache
        assert relative not in sys.path_importer_cache  # it means the importing process's own directory
        assert str(missing) not in sys.path_importer_cache  # it may exist by the time a fork imports

        def read_again(path: object) -> None:
            raise AssertionError(f"{path} read again")

        monkeypatch.setattr(zipimport, "_read_directory", read_again)
        monkeypatch.setattr(sys, "path", [*entries, *sys.path])
        assert importlib.import_module("firehose_bq_zipped_probe").VALUE == 7
    finally:
        sys.modules.pop("firehose_bq_zipped_probe", None)
        for entry in entries:
            sys.path_importer_cache.pop(entry, None)


def test_an_unchanged_archive_is_not_read_again_when_caches_are_invalidated(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # PySpark invalidates the import caches in every process it starts (setup_spark_files); the stock
    # importer then re-reads each archive on the path: 30-90 ms per process for Spark's own.
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("firehose_bq_zipped_first.py", "VALUE = 1\n")
    reads: list[object] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(path: object) -> object:
        reads.append(path)
        return read_directory(path)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    monkeypatch.setattr(sys, "path", [str(archive), *sys.path])
    try:
        worker_daemon.cache_import_paths([str(archive)])
        assert len(reads) == 1
        importlib.invalidate_caches()
        assert importlib.import_module("firehose_bq_zipped_first").VALUE == 1
        assert len(reads) == 1

        # A changed archive is read again, as the stock importer would, and its new modules import.
        with zipfile.ZipFile(archive, "a") as zf:
            zf.writestr("firehose_bq_zipped_second.py", "VALUE = 2\n")
        os.utime(archive, ns=(os.stat(archive).st_atime_ns, os.stat(archive).st_mtime_ns + 1_000_000_000))
        importlib.invalidate_caches()
        assert len(reads) == 2
        assert importlib.import_module("firehose_bq_zipped_second").VALUE == 2
        importlib.invalidate_caches()
        assert len(reads) == 2
    finally:
        for name in ("firehose_bq_zipped_first", "firehose_bq_zipped_second"):
            sys.modules.pop(name, None)
        sys.path_importer_cache.pop(str(archive), None)


def test_a_failing_import_is_reported_not_raised() -> None:
    done = run_python("from firehose_bq import worker_daemon as d\nprint(d.preload(['no_such_module_here']))")
    assert done.returncode == 0, done.stderr
    assert "importing the workers' modules failed" in done.stdout and "no_such_module_here" in done.stdout


def daemon_port(env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start the daemon as Spark does, read the port it announces on stdout, then close its stdin, which
    tells a PySpark daemon to shut down; (port, its stderr)."""
    daemon = subprocess.Popen([sys.executable, "-m", worker_daemon.__name__, PYSPARK_WORKER], cwd=REPO,
                              env=daemon_env(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        assert daemon.stdout is not None and daemon.stdin is not None and daemon.stderr is not None
        announced = daemon.stdout.read(4)
        daemon.stdin.close()
        daemon.wait(timeout=60)
        return struct.unpack(">i", announced)[0], daemon.stderr.read().decode()
    finally:
        daemon.kill()


def test_the_daemon_announces_its_port_on_stdout_as_pysparks_does() -> None:
    port, stderr = daemon_port()
    assert 0 < port < 65536
    assert "instead" not in stderr


def test_when_the_preload_is_unsafe_pysparks_own_daemon_takes_over() -> None:
    port, stderr = daemon_port({"OPENBLAS_NUM_THREADS": "2"})
    assert 0 < port < 65536
    assert "starting PySpark's own daemon instead" in stderr and "threads run" in stderr


def test_the_daemons_line_is_a_json_record_under_the_jobs_json_logs() -> None:
    _, stderr = daemon_port({"OPENBLAS_NUM_THREADS": "2", "LOG_FORMAT": "json"})
    (line,) = [line for line in stderr.splitlines() if "instead" in line]
    record = json.loads(line)
    assert (record["level"], record["logger"]) == ("WARNING", "firehose_bq.worker_daemon"), record
    assert "starting PySpark's own daemon instead" in record["message"] and "threads run" in record["message"]
