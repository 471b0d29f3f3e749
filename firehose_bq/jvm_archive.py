"""The driver JVM's class-data archive (the JDK's class-data sharing, for application classes).

A fresh driver JVM reads, inflates and verifies thousands of Spark's classes from its jars before the job
reads a record: ≈ 3 s of every start on 2 cores, and most of a cold query's planning. The JDK can instead map
them, already parsed and verified, from an archive dumped by an earlier JVM (`-XX:ArchiveClassesAtExit`,
mapped with `-XX:SharedArchiveFile`). `build` dumps one from a training run (`train`: a small streaming
query through a Python data source on local Spark: the classes a job's driver loads) and the job maps it
whenever one was built for its JDK and Spark (`find`, spark.class_archive); a job never builds one.

Why using it is safe: the JVM checks an archive against its own build and class path and, when they differ,
starts without it as before (silently: `-Xlog:cds=off`, as its stdout is the job's). A truncated archive
kills it instead (its crash report on that stdout), so an archive is renamed into place only once on disk and
checked (`check`: a JVM starts with it), its size recorded beside it only then, and a job maps it only when
that size matches and a JVM starts with it (checked again at every start, ≈ 0.1 s, in a scratch directory)."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from firehose_bq.blobstore import atomic_write
from firehose_bq.errors import FirehoseError

log = logging.getLogger(__name__)

# SPARK_CLASS_ARCHIVE_DIR's default: inside this Python environment, which holds the Spark jars an archive is
# made from (pip's pyspark), so it goes when they go.
AUTO = "auto"
PREFIX = "spark-"
SUFFIX = ".jsa"
PARTIAL_SUFFIX = ".tmp"
# A JVM that cannot use the archive says why on its stdout: the job's own (its run summary, JSON logs).
SILENT = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# JVM options with which the user chooses class-data sharing themselves: then the job adds no archive.
SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "SharedClassListFile")
# What the JDK says when the class path holds a non-empty directory, with which it dumps no archive.
NON_EMPTY_DIRECTORY = "non-empty directory"
# The training run, dump included (≈ 15-20 s to write ≈ 170 MB here), and the check of an archive.
BUILD_TIMEOUT_S = 600.0
CHECK_TIMEOUT_S = 60.0


def directory(setting: str) -> Path | None:
    """Where archives go (SPARK_CLASS_ARCHIVE_DIR); None: none is used."""
    if not setting.strip():
        return None
    if setting.strip() == AUTO:
        return Path(sys.prefix) / "var" / "cache" / "firehose-bq"
    return Path(setting).expanduser()


def identity(java: Path, home: Path) -> str:
    """What an archive is good for: this JDK (its release, its JVM library and the JDK's own archive, on
    which ours is layered) and Spark's jars (names, sizes, times), as a short digest. The JVM checks more
    (its whole class path); this only keeps apart archives that could never match."""
    digest = hashlib.sha256()
    jdk = java.resolve().parent.parent
    for part in _jdk_files(jdk):
        digest.update(part.encode())
    for jar in sorted((home / "jars").glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def _jdk_files(jdk: Path) -> Iterator[str]:
    yield f"{jdk}\n"
    release = jdk / "release"
    yield release.read_text(errors="replace") if release.is_file() else ""
    for library in sorted([*jdk.glob("lib/*/libjvm.so"), *jdk.glob("lib/*/classes*.jsa")]):
        stat = library.stat()
        yield f"{library.relative_to(jdk)}:{stat.st_size}:{stat.st_mtime_ns}\n"


@dataclass(frozen=True)
class Archive:
    path: Path

    @property
    def manifest(self) -> Path:
        """Written once the archive is in place: its size (a shorter file is a truncated one, which the JVM
        does not survive), for which JDK and Spark, and when."""
        return self.path.with_suffix(".json")

    def recorded(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def usable(self) -> bool:
        recorded = self.recorded()
        try:
            return recorded is not None and recorded.get("bytes") == self.path.stat().st_size
        except OSError:
            return False

    def remove(self) -> None:
        """Remove the archive (a JVM does not start with it) and its manifest: `jvm-archive` builds anew."""
        for path in (self.manifest, self.path):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove %s: %s", path, exc)

    def java_options(self) -> str:
        # Quoted if need be: Spark splits the driver's options at spaces, honouring quotes.
        return " ".join([shlex.quote(f"-XX:SharedArchiveFile={self.path}"), "-Xshare:auto", *SILENT])


def archive_for(setting: str, java: Path, home: Path) -> Archive | None:
    """The archive for this JDK and Spark under SPARK_CLASS_ARCHIVE_DIR (`setting`), built or not; None when
    no archive is to be used."""
    where = directory(setting)
    return None if where is None else Archive(where / f"{PREFIX}{identity(java, home)}{SUFFIX}")


def find(setting: str, java: Path, home: Path) -> Archive | None:
    """The archive built for this JDK and Spark (whole, as recorded), if there is one."""
    try:
        archive = archive_for(setting, java, home)
    except OSError as exc:  # a jar or the JDK unreadable: Spark will say more when it starts
        log.debug("no JVM class archive: %s", exc)
        return None
    return archive if archive is not None and archive.usable() else None


def check(java: Path, archive: Archive) -> str | None:
    """Why a JVM does not start with `archive` (the options a job's JVM gets), or None when it does. (One it
    would refuse, it starts without; one it cannot map, it dies of.) Run in a scratch directory, where a
    crash report goes."""
    with tempfile.TemporaryDirectory(prefix="firehose-jvm-archive-check-") as scratch:
        try:
            done = subprocess.run([str(java), *shlex.split(archive.java_options()),
                                   f"-XX:ErrorFile={scratch}/hs_err_pid%p.log", "-version"], cwd=scratch,
                                  capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        lines = [line for line in done.stdout.splitlines() if line.startswith("#  ") and line.strip("# ")]
        return f"exit {done.returncode}" + (f": {lines[0].strip('# ')}" if lines else "")
    return None


def build(setting: str, java: Path, home: Path, environ: Mapping[str, str], java_options: str, *,
          force: bool = False, timeout_s: float = BUILD_TIMEOUT_S) -> tuple[Archive, bool]:
    """Build the archive for this JDK and the Spark at `home` unless it is built already (`force`: again);
    returns it and whether it was built now. The training runs in a process of its own (`environ`), whose
    JVM (the job's `java_options`, and the dump) writes the archive as it exits."""
    archive = archive_for(setting, java, home)
    if archive is None:
        raise FirehoseError("SPARK_CLASS_ARCHIVE_DIR is empty: no JVM class archive is to be used, so none is built")
    if archive.usable() and not force:
        return archive, False
    try:
        archive.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FirehoseError(f"cannot create {archive.path.parent} for the JVM class archive: {exc} (set "
                            f"SPARK_CLASS_ARCHIVE_DIR to a directory this user can write)") from exc
    _drop_partials(archive.path.parent, timeout_s)
    partial = archive.path.with_name(f".{archive.path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        _train(partial, java_options, environ, timeout_s)
        with open(partial, "rb") as dumped:
            os.fsync(dumped.fileno())  # on disk before its rename and its manifest say it is whole
        refused = check(java, Archive(partial))
        if refused is not None:
            raise FirehoseError(f"a JVM does not start with the new class archive ({refused})")
        size = partial.stat().st_size
        os.replace(partial, archive.path)
        with atomic_write(archive.manifest) as out:
            os.fchmod(out.fileno(), 0o644)  # readable where the archive is (the JVM writes that read-only for all)
            out.write(json.dumps({"bytes": size, "java": str(java.resolve()), "spark_home": str(home),
                                  "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                                  }).encode())
    except OSError as exc:
        raise FirehoseError(f"building the JVM class archive {archive.path} failed: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    _drop_superseded(archive, home)
    return archive, True


def _train(partial: Path, java_options: str, environ: Mapping[str, str], timeout_s: float) -> None:
    """Run `train` in a new process whose driver JVM writes the classes it loaded into `partial` as it exits.
    Its own session (a process group): stopped early (a timeout, Ctrl-C), the whole group is killed, the JVM
    included, which would otherwise go on to dump into a file nobody removes."""
    options = " ".join([java_options, shlex.quote(f"-XX:ArchiveClassesAtExit={partial}"), *SILENT]).strip()
    # Its own session maps no archive: a JVM cannot map one and dump another on top of it.
    env = {**environ, "SPARK_DRIVER_JAVA_OPTIONS": options, "SPARK_CLASS_ARCHIVE_DIR": ""}
    with tempfile.TemporaryFile("w+") as output:
        child = subprocess.Popen([sys.executable, "-m", __name__], env=env, stdout=output, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise FirehoseError(f"the training run for the JVM class archive did not end within {timeout_s:.0f} s") \
                from None
        finally:
            if child.returncode is None:
                os.killpg(child.pid, signal.SIGKILL)  # a killed JVM dumps nothing
                child.wait()
        output.seek(0)
        text = output.read()
    if code != 0 or not partial.is_file():
        if NON_EMPTY_DIRECTORY in text:
            raise FirehoseError("the JDK dumps no class archive while the driver's class path holds a non-empty "
                                "directory: Spark's conf directory (SPARK_CONF_DIR, else SPARK_HOME/conf) or "
                                "HADOOP_CONF_DIR, YARN_CONF_DIR. pip's pyspark has none; with a Spark distribution "
                                "the job would not map one either (the JVM checks its class path)")
        raise FirehoseError(f"the training run for the JVM class archive failed (exit {code}, "
                            f"{'an archive' if partial.is_file() else 'no archive'} written):\n{text.strip()[-3000:]}")


def _drop_partials(where: Path, timeout_s: float) -> None:
    """Partial archives older than a build can take: left by a build that was killed outright."""
    for partial in where.glob(f".{PREFIX}*{SUFFIX}.*{PARTIAL_SUFFIX}"):
        try:
            if time.time() - partial.stat().st_mtime > timeout_s:
                partial.unlink()
        except OSError:
            continue  # another build's, gone meanwhile, or not ours to remove


def _drop_superseded(archive: Archive, home: Path) -> None:
    """Earlier archives for this Spark installation (another JDK, other jars): no JVM can map them any more.
    Those of other installations sharing the directory stay."""
    for other in archive.path.parent.glob(f"{PREFIX}*{SUFFIX}"):
        stale = Archive(other)
        recorded = stale.recorded()
        if other != archive.path and recorded is not None and recorded.get("spark_home") == str(home):
            stale.remove()


def train(environ: Mapping[str, str]) -> None:
    """What the archive is made of: a driver JVM that runs what a job's does, on a small scale. A streaming
    query (available-now) reads a Python data source, and each micro-batch runs its tasks as the pipeline
    does (an RDD over the planned ranges, and the scan's `mapInArrow` fallback). Local mode: a cluster's own
    classes load from the jars as before."""
    import dataclasses

    from pyspark.sql import SparkSession

    from firehose_bq.config import spark_settings
    from firehose_bq.spark import stop_session, spark_session

    with tempfile.TemporaryDirectory(prefix="firehose-jvm-archive-") as scratch:
        cfg = dataclasses.replace(spark_settings(environ), checkpoint_location=f"{scratch}/checkpoint",
                                  master="local[2]")
        spark: SparkSession = spark_session(cfg)
        spark.dataSource.register(_TrainingSource)
        query = (spark.readStream.format(_TrainingSource.name()).load().writeStream.foreachBatch(_training_batch)
                 .option("checkpointLocation", cfg.checkpoint_location).trigger(availableNow=True).start())
        query.awaitTermination()
        stop_session(spark)
        _end_jvm()


def _end_jvm() -> None:
    """End the driver JVM now and wait for it: it dumps the archive as it exits, which it otherwise does after
    this process is gone (it exits when its standard input closes)."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None or process.stdin is None:
        raise FirehoseError("cannot end the driver JVM of the training run: pyspark did not start it here")
    process.stdin.close()
    if process.wait(BUILD_TIMEOUT_S) != 0:
        raise FirehoseError(f"the training run's JVM exited with {process.returncode}")


def _training_batch(df: Any, batch_id: int) -> None:
    from firehose_bq.spark import planned_partitions

    planned = planned_partitions(df) or []
    df.sparkSession.sparkContext.parallelize(range(max(len(planned), 2)), 2).mapPartitions(_count).collect()
    df.mapInArrow(_arrow_counts, "rows long").collect()


def _count(rows: Iterator[int]) -> Iterator[int]:
    yield sum(1 for _ in rows)


def _arrow_counts(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})


class _TrainingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Two offsets: one micro-batch of two partitions with a row each."""

    def initialOffset(self) -> dict[str, int]:
        return {"offset": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"offset": 2}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(i) for i in range(start["offset"], end["offset"])]

    def commit(self, end: dict[str, int]) -> None:
        pass

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, int, int]]:
        yield ("training", partition.value, 0, 1)


class _TrainingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "firehose-jvm-archive-training"

    def schema(self) -> str:
        return "topic string, partition int, start long, end long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _TrainingReader()


if __name__ == "__main__":
    # As the package's module, not __main__'s: Spark's Python processes import the source and the functions.
    from firehose_bq.jvm_archive import train as package_train

    package_train(os.environ)
