"""The driver JVM's class archive for real: `firehose-bq jvm-archive` builds one from its training run, a job's
JVM maps Spark's classes from it, and a damaged one does not stop the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.cloud import bigquery

from firehose_bq.config import Config
from tests.integration.test_end_to_end import produce_bookings, read_table

pytestmark = pytest.mark.integration

# How the JVM's class-loading log names a class mapped from the archive a job built (the JDK's own is the base).
FROM_ARCHIVE = "source: shared objects file (top)"


def firehose(*args: str, env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    # In `cwd`: a JVM that crashes leaves its hs_err file where it runs.
    return subprocess.run([sys.executable, "-m", "firehose_bq.cli", *args], env={**os.environ, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An archive built by the command, as a user builds it, in a directory of the tests' own."""
    where = tmp_path_factory.mktemp("jvm-archive")
    env = {"SPARK_CLASS_ARCHIVE_DIR": str(where)}
    built = firehose("jvm-archive", env=env, cwd=where)
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.stdout.startswith(f"built the JVM class archive {where}/spark-"), built.stdout
    again = firehose("jvm-archive", env=env, cwd=where)
    assert again.returncode == 0 and "is built already" in again.stdout, again.stdout + again.stderr
    return where


def the_archive(where: Path) -> tuple[Path, Path]:
    [archive] = where.glob("spark-*.jsa")
    return archive, archive.with_suffix(".json")


def test_a_job_s_jvm_maps_spark_s_classes_from_the_archive(archive_dir: Path, job_env: dict[str, str],
                                                          job_config: Config, bq_client: bigquery.Client,
                                                          tmp_path: Path) -> None:
    produce_bookings(job_config, 20)
    loaded = tmp_path / "classes.log"
    env = {**job_env, "SPARK_CLASS_ARCHIVE_DIR": str(archive_dir),
           "SPARK_DRIVER_JAVA_OPTIONS": f"-XX:TieredStopAtLevel=1 -Xlog:class+load=info:file={loaded}"}
    done = firehose("run", "--available-now", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_table(bq_client, job_config)) == 20
    lines = loaded.read_text().splitlines()
    mapped = [line for line in lines if FROM_ARCHIVE in line]
    from_jars = [line for line in lines if "source: file:" in line or "source: jar:" in line]
    # Nearly every class the driver loads from Spark's jars comes from the archive instead.
    assert len(mapped) > 5000 and len(mapped) > 5 * len(from_jars), (len(mapped), len(from_jars))
    assert any("org.apache.spark.sql.execution.streaming" in line for line in mapped)
    assert "cds" not in done.stdout + done.stderr  # the JVM says nothing of it


def test_a_damaged_archive_does_not_stop_the_job_and_is_removed(archive_dir: Path, job_env: dict[str, str],
                                                                job_config: Config, bq_client: bigquery.Client,
                                                                tmp_path: Path) -> None:
    """Cut short after it was built and checked, its manifest agreeing: a JVM dies mapping it, its crash report
    on stdout and in an hs_err file. The job finds that out before starting its own JVM, starts it without,
    lands the rows with nothing of the crash in its output or its directory, and removes the archive."""
    archive, manifest = the_archive(archive_dir)
    damaged_dir = tmp_path / "archives"
    damaged_dir.mkdir()
    damaged = damaged_dir / archive.name
    with open(archive, "rb") as whole, open(damaged, "wb") as cut:
        cut.write(whole.read(2 * 2**20))
    recorded = json.loads(manifest.read_text())
    (damaged_dir / manifest.name).write_text(json.dumps({**recorded, "bytes": damaged.stat().st_size}))
    produce_bookings(job_config, 20)
    env = {**job_env, "SPARK_CLASS_ARCHIVE_DIR": str(damaged_dir), "FIREHOSE_LOG_LEVEL": "INFO"}
    done = firehose("run", "--available-now", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_table(bq_client, job_config)) == 20
    assert f"a JVM does not start with the class archive {damaged} (exit" in done.stderr, done.stderr
    assert "fatal error" not in done.stdout + done.stderr
    assert list(tmp_path.rglob("hs_err*")) == []
    assert list(damaged_dir.iterdir()) == []
    doctor = firehose("doctor", env={"SPARK_CLASS_ARCHIVE_DIR": str(damaged_dir)}, cwd=tmp_path)
    assert "none for this JDK and Spark" in doctor.stdout, doctor.stdout + doctor.stderr
