"""The driver JVM's class-data archive (the JDK's class-data sharing, for application classes).

A fresh driver JVM reads, inflates and verifies thousands of Spark's classes from its jars before the job
reads a record: ≈ 3 s of every start on 2 cores, and most of a cold query's planning. The JDK can instead map
them, already parsed and verified, from an archive dumped by an earlier JVM (`-XX:ArchiveClassesAtExit`,
mapped with `-XX:SharedArchiveFile`). `build` dumps one from a training run (`train`: a small streaming
query through a Python data source on local Spark: the classes a job's driver loads) and the job maps it
whenever one was built for its JDK and Spark (`find`); a job never builds one.

Why using it is safe: the JVM checks an archive against its own build and class path and, when they differ,
starts without it as before (silently: `-Xlog:cds=off`, as its stdout is the job's). A truncated archive
crashes it instead, so an archive is renamed into place only once whole and checked, and used only when its
size is the one recorded beside it; a JVM that does not start with it is started again without it
(spark.py)."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from firehose_bq.config import SparkConfig
from firehose_bq.errors import FirehoseError

log = logging.getLogger(__name__)

# SPARK_CLASS_ARCHIVE_DIR's default: inside this Python environment, which holds the Spark jars an archive is
# made from (pip's pyspark), so it goes when they go.
AUTO = "auto"
PREFIX = "spark-"
SUFFIX = ".jsa"
# A JVM that cannot use the archive says why on its stdout: the job's own (its run summary, JSON logs).
QUIET = ("-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# JVM options with which the user chooses class-data sharing themselves: then the job adds no archive.
USER_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "SharedClassListFile")
# The training run, dump included (≈ 15-20 s to write ≈ 170 MB here), and the check of its archive.
BUILD_TIMEOUT_S = 600.0
CHECK_TIMEOUT_S = 60.0


def directory(setting: str) -> Path | None:
    """Where archives go (SPARK_CLASS_ARCHIVE_DIR); None: none is used."""
    if not setting.strip():
        return None
    if setting.strip() == AUTO:
        return Path(sys.prefix) / "var" / "cache" / "firehose-bq"
    return Path(setting).expanduser()


def spark_home(environ: Mapping[str, str]) -> Path:
    """The Spark installation the driver runs from: SPARK_HOME, else pip's pyspark (which is one)."""
    if environ.get("SPARK_HOME"):
        return Path(environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def identity(java: Path, home: Path) -> str:
    """What an archive is good for: this JDK (its release and its JVM library) and Spark's jars (names, sizes,
    times), as a short digest. The JVM checks more (its full class path); this only keeps apart archives that
    could never match."""
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
    for library in sorted(jdk.glob("lib/*/libjvm.so")):
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

    def set_aside(self) -> None:
        """Stop using the archive (a JVM did not start with it): its manifest goes, `jvm-archive` builds anew."""
        try:
            self.manifest.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not set the class archive %s aside: %s", self.path, exc)

    def java_options(self) -> str:
        # Quoted if need be: Spark splits the driver's options at spaces, honouring quotes.
        return " ".join([shlex.quote(f"-XX:SharedArchiveFile={self.path}"), *QUIET])


def archive_for(setting: str, java: Path, home: Path) -> Archive | None:
    """The archive for this JDK and Spark under SPARK_CLASS_ARCHIVE_DIR (`setting`), built or not; None when
    no archive is to be used."""
    where = directory(setting)
    return None if where is None else Archive(where / f"{PREFIX}{identity(java, home)}{SUFFIX}")


def find(setting: str, java: Path, home: Path) -> Archive | None:
    """The archive a driver JVM can map, if one was built for this JDK and Spark."""
    try:
        archive = archive_for(setting, java, home)
    except OSError as exc:  # a jar or the JDK unreadable: Spark will say more when it starts
        log.debug("no JVM class archive: %s", exc)
        return None
    return archive if archive is not None and archive.usable() else None


def chooses_sharing(java_options: str) -> bool:
    """Whether the user's JVM options choose class-data sharing themselves (then the job maps no archive)."""
    return any(option in java_options for option in USER_OPTIONS)


def build(cfg: SparkConfig, java: Path, environ: Mapping[str, str], *, force: bool = False,
          timeout_s: float = BUILD_TIMEOUT_S) -> tuple[Archive, bool]:
    """Build the archive for this JDK and Spark unless it is built already (`force`: again); returns it and
    whether it was built now. The training runs in a process of its own, whose JVM (with the job's JVM
    options, `cfg`) dumps the archive as it exits; `environ` is its environment."""
    home = spark_home(environ)
    archive = archive_for(cfg.class_archive_dir, java, home)
    if archive is None:
        raise FirehoseError("SPARK_CLASS_ARCHIVE_DIR is empty: no JVM class archive is to be used, so none is built")
    if chooses_sharing(cfg.driver_java_options):
        raise FirehoseError(f"SPARK_DRIVER_JAVA_OPTIONS chooses class-data sharing itself "
                            f"({cfg.driver_java_options}): the job maps no archive of ours, so none is built")
    if archive.usable() and not force:
        return archive, False
    try:
        archive.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FirehoseError(f"cannot create {archive.path.parent} for the JVM class archive: {exc} (set "
                            f"SPARK_CLASS_ARCHIVE_DIR to a directory this user can write)") from exc
    partial = archive.path.with_name(f".{archive.path.name}.{uuid.uuid4().hex}.tmp")
    try:
        _train(partial, cfg.driver_java_options, environ, timeout_s)
        _check(java, partial)
        size = partial.stat().st_size
        os.replace(partial, archive.path)
        _write_manifest(archive, {"bytes": size, "java": str(java.resolve()), "spark_home": str(home),
                                  "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    except OSError as exc:
        raise FirehoseError(f"building the JVM class archive {archive.path} failed: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    _drop_superseded(archive, home)
    return archive, True


def _train(partial: Path, java_options: str, environ: Mapping[str, str], timeout_s: float) -> None:
    """Run `train` in a new process whose driver JVM (the job's `java_options`, and the dump) writes the
    classes it loaded into `partial` as it exits."""
    dump = " ".join([shlex.quote(f"-XX:ArchiveClassesAtExit={partial}"), *QUIET[1:]])
    options = f"{java_options} {dump}".strip()
    # Its own session maps no archive: a JVM cannot map one and dump another on top of it.
    env = {**environ, "SPARK_DRIVER_JAVA_OPTIONS": options, "SPARK_CLASS_ARCHIVE_DIR": ""}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FirehoseError(f"the training run for the JVM class archive did not end within {timeout_s:.0f} s") from exc
    if done.returncode != 0 or not partial.is_file():
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise FirehoseError(f"the training run for the JVM class archive failed (exit {done.returncode}, "
                            f"{'an archive' if partial.is_file() else 'no archive'} written):\n{output}")


def _check(java: Path, partial: Path) -> None:
    """A JVM starts with the archive (one it would refuse, it skips; one it cannot map, it dies of)."""
    done = subprocess.run([str(java), f"-XX:SharedArchiveFile={partial}", "-Xshare:auto", "-Xlog:disable",
                           "-version"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise FirehoseError(f"a JVM does not start with the new class archive (exit {done.returncode}): "
                            f"{done.stderr.strip()[-1000:]}")


def _write_manifest(archive: Archive, values: dict[str, Any]) -> None:
    with tempfile.NamedTemporaryFile("w", dir=archive.path.parent, prefix=".manifest-", delete=False) as out:
        json.dump(values, out)
    try:
        os.chmod(out.name, 0o644)  # readable where the archive is (the JVM writes that one read-only for all)
        os.replace(out.name, archive.manifest)
    finally:
        Path(out.name).unlink(missing_ok=True)


def _drop_superseded(archive: Archive, home: Path) -> None:
    """Earlier archives for this Spark installation (another JDK, other jars): no JVM can map them any more.
    Those of other installations sharing the directory stay."""
    for other in archive.path.parent.glob(f"{PREFIX}*{SUFFIX}"):
        stale = Archive(other)
        recorded = stale.recorded()
        if other != archive.path and recorded is not None and recorded.get("spark_home") == str(home):
            try:
                stale.manifest.unlink(missing_ok=True)
                other.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove the superseded JVM class archive %s: %s", other, exc)


def train(environ: Mapping[str, str]) -> None:
    """What the archive is made of: a driver JVM that runs what a job's does, on a small scale. A streaming
    query (available-now) reads a Python data source, and each micro-batch runs its tasks as the pipeline
    does (an RDD over the planned ranges, and the scan's `mapInArrow` fallback). Local mode: a cluster's own
    classes load from the jars as before."""
    from pyspark.sql import SparkSession

    from firehose_bq.settings import load_section
    from firehose_bq.spark import stop_session, spark_session

    with tempfile.TemporaryDirectory(prefix="firehose-jvm-archive-") as scratch:
        problems: list[str] = []
        cfg = load_section(SparkConfig, {**environ, "SPARK_CHECKPOINT_LOCATION": f"{scratch}/checkpoint",
                                         "SPARK_MASTER": "local[2]"}, problems)
        if problems:
            raise FirehoseError("; ".join(problems))
        spark: SparkSession = spark_session(cfg)
        spark.dataSource.register(_TrainingSource)
        query = (spark.readStream.format(_TrainingSource.name()).load().writeStream.foreachBatch(_training_batch)
                 .option("checkpointLocation", cfg.checkpoint_location).trigger(availableNow=True).start())
        query.awaitTermination()
        stop_session(spark)
        _end_jvm(spark)


def _end_jvm(spark: Any) -> None:
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
    from firehose_bq.pipeline import planned_partitions

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
