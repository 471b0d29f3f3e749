"""Spark's Python worker daemon for the job (`spark.python.daemon.module`): PySpark's own daemon, started
with the modules its workers will import already imported.

Spark starts one daemon per pool of Python workers and forks every worker from it. PySpark's daemon
imports only pyspark before forking, so each fresh worker imports the batch core on its own: the
BigQuery clients, gRPC, pyarrow, the decoders, ~0.6 CPU-s and ~130 MB each, paid again by every worker a
job starts, on its first micro-batch's critical path (and by every executor of a cluster). Imported
once here, a fork starts with them, and its workers share those pages with the daemon instead of each
holding a copy.

PySpark imports the worker module only after the fork because a module that starts a thread at import
(pyarrow: jemalloc's background thread; numpy: OpenBLAS's pool) leaves the forked child with locks held
by threads it does not have. So the daemon first turns both off (unless the user set them: a value the
user set wins), imports, and checks: with any thread but its own still running, it replaces itself
with PySpark's daemon (exec, so nothing imported here survives), and workers start as they always did.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import importlib.machinery
import os
import sys
import traceback
import zipimport
from collections.abc import Iterator, Sequence
from typing import Any

# What makes pyarrow and numpy import without starting threads. pyarrow's default allocator is mimalloc
# and the job does no linear algebra, so neither costs the job anything.
SINGLE_THREADED_ENV = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "OPENBLAS_NUM_THREADS": "1"}
# What the source's processes import: Spark's data source modules and the source itself (its planning
# runs in processes of their own; its read(), which hands each task its offset range where the job cannot
# take them from the micro-batch's plan (pipeline.py `_run_tasks`), in the workers).
SOURCE_MODULES = ("pyspark.sql.worker.plan_data_source_read", "firehose_bq.source.kafka_source")
# What a streaming task imports: the batch core (batch/task.py imports it and everything it uses), and the
# modules the write paths, the Kafka reader and the native decoders import on first use. Not Parquet:
# only the file-loads tasks stage files, and they import it themselves.
TASK_MODULES = ("firehose_bq.batch.task", "firehose_bq.decode.native", "firehose_bq.decode.reference",
                "firehose_bq.source.batches", "confluent_kafka", "firehose_bq.bigquery.storage_write",
                "firehose_bq.bigquery.insert_all", "google.cloud.bigquery_storage_v1.services.big_query_write.transports",
                # Imported on first use, inside a task: requests reads ~/.netrc on every request, gRPC wraps its
                # first channel, pyarrow checks for numpy's masked arrays on a first `pa.array(ndarray)`.
                "netrc", "grpc._interceptor", "numpy.ma")
# The C decoders, imported on first use (decode/native.py): a missing build is not a reason to fall back
# to PySpark's daemon, the tasks then take the reference decoders as they would anyway.
OPTIONAL_TASK_MODULES = ("firehose_bq.decode._native", "firehose_bq.decode._json")
PYSPARK_WORKER = "pyspark.worker"
# What the workers' modules import only because it is installed, and no worker uses: pandas (the driver
# needs it: PySpark's mapInArrow checks its version). google-cloud-bigquery and its Storage clients import
# it for their DataFrame methods, and pyarrow on its first `pa.array()` of a list: 0.2-0.35 CPU-s and ~40 MB of
# the daemon's start, paid while the daemon holds the JVM's lock on starting Python processes (so the
# query's planning waits for it). Refused while the daemon imports, those libraries take it as absent and
# keep that view in every worker: a worker cannot convert Arrow to pandas (`to_pandas()`) or call the
# BigQuery client's DataFrame methods, which no task does. Imported later, it imports as usual.
NOT_PRELOADED = ("pandas",)


def modules_for(worker_module: str) -> tuple[str, ...]:
    """The modules to import before forking workers that run `worker_module` (Spark's argument to the
    daemon). The workers run the source's read() and the tasks. Spark 4.3 forks its planning processes
    (`pyspark.sql.worker.*`, which run the source's driver-side code) from PySpark's own daemon, whatever
    spark.python.daemon.module says; should a later release use this one, they get the source alone."""
    if worker_module != PYSPARK_WORKER:
        return (worker_module, *SOURCE_MODULES)
    return (worker_module, *SOURCE_MODULES, *TASK_MODULES, *OPTIONAL_TASK_MODULES)


def thread_count() -> int:
    """Threads of this process, Python's or not (a C library's thread is invisible to `threading`)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown (no procfs): treated as unsafe


def preload(modules: Sequence[str]) -> str | None:
    """Import `modules`; why forking after it would be unsafe, or None when it is safe."""
    for key, value in SINGLE_THREADED_ENV.items():
        os.environ.setdefault(key, value)
    try:
        # The daemon's stdout is its channel to the JVM (it writes its port there): nothing else may go to it.
        with contextlib.redirect_stdout(sys.stderr), _refused(NOT_PRELOADED):
            for name in modules:
                with contextlib.suppress(ImportError) if name in OPTIONAL_TASK_MODULES else contextlib.nullcontext():
                    __import__(name)
    except Exception:  # noqa: BLE001 - an import that fails here fails in the worker too, with Spark's report
        return "importing the workers' modules failed:\n" + traceback.format_exc()
    cache_import_paths(sys.path)
    threads = thread_count()
    if threads != 1:
        return f"{threads or 'an unknown number of'} threads run after importing the workers' modules"
    # The imported objects stay as they are for the daemon's lifetime; out of the collector's reach, a
    # collection in a worker does not write to (and so copy) the pages it shares with the daemon.
    gc.freeze()
    return None


class _Refuse(importlib.abc.MetaPathFinder):
    """An import finder that has the packages `names` (and their submodules) not found."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (the worker daemon does not preload it)",
                                      name=fullname)


@contextlib.contextmanager
def _refused(names: Sequence[str]) -> Iterator[None]:
    finder = _Refuse(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def cache_import_paths(path: Sequence[str]) -> None:
    """Have Python look at every absolute entry of `path` once, here, so that the processes forked from this
    one start with its view of them. Spark puts archives on its Python processes' path (PySpark's pip
    build: its spark-core jar, 6,000 entries and no Python; py4j's zip) ahead of the standard library, and
    the first import that misses the modules loaded so far reads each archive's table of contents, in
    Python: ≈ 0.15 s in every fresh worker's first task, until now. Archives get an importer that reads
    them again only once they change (`UnchangedArchiveImporter`). Relative entries are left alone: they
    mean the directory the process imports from, which a fork may not share; so are missing ones, which
    would be cached as holding nothing even once they exist."""
    for entry in path:
        if os.path.isabs(entry) and entry not in sys.path_importer_cache and os.path.exists(entry):
            importlib.machinery.PathFinder.find_spec("_firehose_bq_no_such_module", [entry])
            if type(sys.path_importer_cache.get(entry)) is zipimport.zipimporter:
                # Built from the table of contents just read (zipimport keeps it per archive): no second read.
                sys.path_importer_cache[entry] = UnchangedArchiveImporter(entry)


def _signature(path: str) -> tuple[int, int, int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


class UnchangedArchiveImporter(zipimport.zipimporter):
    """A zip archive's importer whose `invalidate_caches` reads the archive's table of contents again only if
    the file changed since it was read (as a directory's finder looks at its modification time).

    Every process Spark starts calls `importlib.invalidate_caches()` once, as it adds Spark's files
    directory to its path (pyspark.worker_util.setup_spark_files), and the stock importer then re-reads its
    archive at once: 30-90 ms per process here, for the spark-core jar and pyspark.zip, in each query's
    source runner as the query starts and in each fresh worker's first task."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._read_as = _signature(self.archive)

    def invalidate_caches(self) -> None:
        now = _signature(self.archive)
        if now is None or now != self._read_as:
            super().invalidate_caches()
            self._read_as = now


def no_rows(items: Iterator[Any]) -> Iterator[Any]:
    """What the job that starts the workers (spark.start_workers) runs in each of them: it reads its input
    to the end (Spark reuses a worker only once it has) and answers nothing. It lives here because a
    worker imports the module of a function it is sent, and this one is imported already."""
    for _ in items:
        pass
    yield from ()


def _say(message: str) -> None:
    """A line on stderr in the job's LOG_FORMAT, without configuring logging (the workers Spark forks from
    PySpark's daemon start with it untouched); plain if the package's logging cannot even import."""
    try:
        import logging

        from firehose_bq import logs

        logs.say_unconfigured("firehose_bq.worker_daemon", logging.WARNING, message, os.environ)
    except Exception:  # noqa: BLE001 - the daemon must still hand over to PySpark's
        print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> None:
    worker_module = argv[1] if len(argv) > 1 else PYSPARK_WORKER
    unsafe = preload(modules_for(worker_module))
    if unsafe is not None:
        _say(f"firehose-bq worker daemon: starting PySpark's own daemon instead ({unsafe})")
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *argv[1:]])
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main(sys.argv)
