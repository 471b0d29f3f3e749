"""The driver JVM's class archive: which one fits, when it is used, and how a build puts it in place (the
training run itself is faked here; tests/integration/test_jvm_archive.py runs it)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from firehose_bq import jvm_archive
from firehose_bq.config import SparkConfig
from firehose_bq.errors import FirehoseError
from firehose_bq.spark import class_archive, driver_java_options, own_class_sharing


@pytest.fixture
def installation(tmp_path: Path) -> tuple[Path, Path]:
    """A JDK (its java, release file and JVM library) and a Spark home with two jars."""
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "lib" / "server").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\n")
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (jdk / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (home / "jars" / name).write_bytes(name.encode())
    return jdk / "bin" / "java", home


def test_the_directory_is_the_environment_s_own_by_default_and_none_when_empty() -> None:
    assert jvm_archive.directory("auto") == Path(sys.prefix) / "var" / "cache" / "firehose-bq"
    assert jvm_archive.directory("") is None and jvm_archive.directory("  ") is None
    assert jvm_archive.directory("~/archives") == Path.home() / "archives"
    assert SparkConfig(checkpoint_location="x").class_archive_dir == "auto"


def test_an_archive_belongs_to_one_jdk_and_one_set_of_spark_jars(installation: tuple[Path, Path]) -> None:
    java, home = installation
    first = jvm_archive.identity(java, home)
    assert jvm_archive.identity(java, home) == first
    jar = home / "jars" / "spark-sql.jar"
    jar.write_bytes(b"a newer spark-sql")
    changed_jar = jvm_archive.identity(java, home)
    (java.parent.parent / "release").write_text('JAVA_VERSION="17.0.16"\n')
    changed_jdk = jvm_archive.identity(java, home)
    (home / "jars" / "extra.jar").write_bytes(b"x")
    added_jar = jvm_archive.identity(java, home)
    assert len({first, changed_jar, changed_jdk, added_jar}) == 4


def place(archive: jvm_archive.Archive, size: int, recorded: int | None = None, home: Path | None = None) -> None:
    archive.path.parent.mkdir(parents=True, exist_ok=True)
    archive.path.write_bytes(b"\0" * size)
    archive.manifest.write_text(json.dumps({"bytes": size if recorded is None else recorded,
                                            "spark_home": str(home)}))


def test_only_a_whole_archive_with_its_manifest_is_used(installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = str(tmp_path / "archives")
    assert jvm_archive.find(where, java, home) is None  # none built
    archive = jvm_archive.archive_for(where, java, home)
    assert archive is not None
    place(archive, 1000, recorded=2000)  # shorter than it was built: a truncated copy would crash the JVM
    assert jvm_archive.find(where, java, home) is None
    place(archive, 2000)
    assert jvm_archive.find(where, java, home) == archive
    archive.manifest.write_text("{not json")
    assert jvm_archive.find(where, java, home) is None
    archive.manifest.unlink()
    assert jvm_archive.find(where, java, home) is None  # being put in place (the manifest comes last)
    assert jvm_archive.find("", java, home) is None
    (home / "jars" / "spark-core.jar").write_bytes(b"upgraded")
    place(archive, 2000)
    assert jvm_archive.find(where, java, home) is None  # built for the old jars


def test_a_removed_archive_is_gone_with_its_manifest(installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = str(tmp_path / "archives")
    archive = jvm_archive.archive_for(where, java, home)
    assert archive is not None
    place(archive, 10)
    archive.remove()
    assert not archive.path.exists() and not archive.manifest.exists()
    assert jvm_archive.find(where, java, home) is None


def test_its_options_come_last_quoted_and_silence_the_jvm_s_refusal(tmp_path: Path) -> None:
    archive = jvm_archive.Archive(tmp_path / "with space" / "spark-x.jsa")
    options = driver_java_options(SparkConfig(checkpoint_location="x"), False, {}, archive)
    words = shlex.split(options)  # as Spark splits them, quotes honoured
    assert words[0] == "-XX:TieredStopAtLevel=1"
    assert words[1:] == [f"-XX:SharedArchiveFile={archive.path}", "-Xshare:auto", "-Xlog:cds=off",
                         "-Xlog:cds+dynamic=off"]
    assert driver_java_options(SparkConfig(checkpoint_location="x"), False, {}) == "-XX:TieredStopAtLevel=1"


def fake_java(tmp_path: Path, script: str) -> Path:
    """A `java` that runs `script` (sh), in a JDK layout."""
    java = tmp_path / "fake-jdk" / "bin" / "java"
    java.parent.mkdir(parents=True, exist_ok=True)
    java.write_text(f"#!/bin/sh\n{script}\n")
    java.chmod(0o755)
    return java


def test_the_check_says_why_a_jvm_does_not_start_and_leaves_no_crash_report(tmp_path: Path) -> None:
    # What JDK 17 prints mapping a truncated archive (then it aborts).
    crash = fake_java(tmp_path, 'echo "#"; echo "# A fatal error has been detected by the Java Runtime Environment:"; '
                                'echo "#"; echo "#  SIGBUS (0x7) at pc=0x00007f9b, pid=5941, tid=5942"; '
                                'touch hs_err_pid1.log; exit 134')
    archive = jvm_archive.Archive(tmp_path / "a.jsa")
    assert jvm_archive.check(crash, archive) == "exit 134: SIGBUS (0x7) at pc=0x00007f9b, pid=5941, tid=5942"
    assert list(tmp_path.glob("hs_err*")) == []  # it ran in a scratch directory
    seen = tmp_path / "arguments"
    fine = fake_java(tmp_path, f'echo "$@" > {seen}; exit 0')
    assert jvm_archive.check(fine, archive) is None
    # The options a job's JVM gets.
    assert seen.read_text().startswith(f"-XX:SharedArchiveFile={archive.path} -Xshare:auto -Xlog:cds=off "
                                       "-Xlog:cds+dynamic=off -XX:ErrorFile=")
    assert jvm_archive.check(tmp_path / "no-java", archive).startswith("FileNotFoundError")


@pytest.fixture
def job_spark(monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], tmp_path: Path) -> Path:
    """JAVA_HOME and SPARK_HOME at the fake installation, Spark's configuration in an empty directory; the
    archives' directory."""
    java, home = installation
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    return tmp_path / "archives"


@pytest.mark.parametrize("option", ["-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:ArchiveClassesAtExit=/a.jsa"])
def test_a_user_who_chooses_class_sharing_gets_no_archive_of_ours(option: str, monkeypatch: pytest.MonkeyPatch,
                                                                   installation: tuple[Path, Path],
                                                                   job_spark: Path, tmp_path: Path) -> None:
    java, home = installation
    monkeypatch.setattr(jvm_archive, "check", lambda java, archive: None)
    archive = jvm_archive.archive_for(str(job_spark), java, home)
    assert archive is not None
    place(archive, 10)
    cfg = SparkConfig(checkpoint_location="x", class_archive_dir=str(job_spark))
    assert class_archive(cfg, os.environ) == archive and own_class_sharing(cfg, os.environ) is None
    chosen = SparkConfig(checkpoint_location="x", class_archive_dir=str(job_spark), driver_java_options=option)
    assert class_archive(chosen, os.environ) is None
    assert own_class_sharing(chosen, os.environ) == f"the driver's JVM options choose class-data sharing themselves " \
                                                    f"({option.split(':')[1].split('=')[0] if option.startswith('-XX') else '-Xshare'})"
    # The same in Spark's own configuration, which goes on the JVM's command line beside the job's options.
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--driver-java-options {option} pyspark-shell")
    assert class_archive(cfg, os.environ) is None
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions {option}\n")
    assert class_archive(cfg, os.environ) == archive  # the executors' JVMs: not the driver's
    (tmp_path / "conf" / "spark-defaults.conf").write_text(f"spark.driver.extraJavaOptions {option}\n")
    assert class_archive(cfg, os.environ) is None
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions -Xss4m\n")
    assert "replaces the job's JVM options" in (own_class_sharing(cfg, os.environ) or "")
    assert class_archive(cfg, os.environ) is None


def test_an_archive_a_jvm_does_not_start_with_is_removed_and_the_job_starts_without(
        monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], job_spark: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    java, home = installation
    archive = jvm_archive.archive_for(str(job_spark), java, home)
    assert archive is not None
    place(archive, 10)
    monkeypatch.setattr(jvm_archive, "check", lambda java, archive: "exit 134: SIGBUS")
    cfg = SparkConfig(checkpoint_location="x", class_archive_dir=str(job_spark))
    assert class_archive(cfg, os.environ) is None
    assert not archive.path.exists() and not archive.manifest.exists()
    assert f"a JVM does not start with the class archive {archive.path} (exit 134: SIGBUS)" in caplog.text


def fake_training(monkeypatch: pytest.MonkeyPatch, write: bytes | None, refused: str | None = None) -> list[str]:
    """The training run writes `write` (None: nothing, and fails); the check refuses it or not. Returns the JVM
    options each training run was given."""
    runs: list[str] = []

    def train(partial: Path, java_options: str, environ: dict[str, str], timeout_s: float) -> None:
        runs.append(java_options)
        if write is None:
            raise FirehoseError("the training run for the JVM class archive failed (exit 1)")
        partial.write_bytes(write)

    monkeypatch.setattr(jvm_archive, "_train", train)
    monkeypatch.setattr(jvm_archive, "check", lambda java, archive: refused)
    return runs


def build(where: Path | str, java: Path, home: Path, force: bool = False) -> tuple[jvm_archive.Archive, bool]:
    return jvm_archive.build(str(where), java, home, {}, "-XX:TieredStopAtLevel=1", force=force)


def test_a_build_puts_the_archive_in_place_then_its_manifest_and_is_not_repeated(
        monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = tmp_path / "archives"
    runs = fake_training(monkeypatch, b"classes")
    archive, built = build(where, java, home)
    assert built and archive.path.read_bytes() == b"classes" and runs == ["-XX:TieredStopAtLevel=1"]
    recorded = archive.recorded()
    assert recorded is not None and recorded["bytes"] == 7 and recorded["spark_home"] == str(home)
    assert oct(archive.manifest.stat().st_mode & 0o777) == "0o644"
    assert jvm_archive.find(str(where), java, home) == archive
    assert build(where, java, home) == (archive, False)
    assert len(runs) == 1
    assert build(where, java, home, force=True) == (archive, True)
    assert sorted(p.name for p in where.iterdir()) == sorted([archive.manifest.name, archive.path.name])


def test_a_failed_build_leaves_nothing_behind_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                           installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = tmp_path / "archives"
    fake_training(monkeypatch, None)
    with pytest.raises(FirehoseError, match="training run"):
        build(where, java, home)
    assert list(where.iterdir()) == []
    fake_training(monkeypatch, b"damaged", refused="exit 134: SIGBUS")
    with pytest.raises(FirehoseError, match=r"does not start with the new class archive \(exit 134: SIGBUS\)"):
        build(where, java, home)
    assert list(where.iterdir()) == []
    assert jvm_archive.find(str(where), java, home) is None
    with pytest.raises(FirehoseError, match="SPARK_CLASS_ARCHIVE_DIR is empty"):
        build("", java, home)


def test_a_build_drops_superseded_archives_of_its_spark_and_partials_of_killed_builds(
        monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = tmp_path / "archives"
    old_here = jvm_archive.Archive(where / "spark-0ld.jsa")
    place(old_here, 5, home=home)
    other_spark = jvm_archive.Archive(where / "spark-0ther.jsa")
    place(other_spark, 5, home=tmp_path / "another-spark")
    killed = where / ".spark-x.jsa.0123.tmp"
    killed.write_bytes(b"half")
    os.utime(killed, (1, 1))
    running = where / ".spark-x.jsa.4567.tmp"  # another build's, being written
    running.write_bytes(b"half")
    fake_training(monkeypatch, b"classes")
    archive, _ = build(where, java, home)
    assert sorted(p.name for p in where.iterdir()) == sorted(
        [archive.path.name, archive.manifest.name, other_spark.path.name, other_spark.manifest.name, running.name])


class FakeTraining:
    """subprocess.Popen for `_train`: records its command and environment; `wait` ends as told."""

    def __init__(self, ends: list[object], partial: Path | None = None, output: str = "") -> None:
        self.ends, self.partial, self.output = ends, partial, output
        self.env: dict[str, str] = {}
        self.returncode: int | None = None
        self.pid = 4242

    def __call__(self, command: list[str], env: dict[str, str], stdout: Any, **kwargs: object) -> FakeTraining:
        assert kwargs["start_new_session"] is True
        self.env = env
        stdout.write(self.output)
        return self

    def wait(self, timeout: float | None = None) -> int:
        end = self.ends.pop(0)
        if isinstance(end, BaseException):
            raise end
        if self.partial is not None:
            self.partial.write_bytes(b"dump")
        self.returncode = int(end)  # type: ignore[call-overload]
        return self.returncode


def test_the_training_s_jvm_dumps_with_the_job_s_options_and_maps_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    partial = tmp_path / "dir with space" / ".spark-x.jsa.1.tmp"
    partial.parent.mkdir()
    training = FakeTraining([0], partial)
    monkeypatch.setattr(jvm_archive.subprocess, "Popen", training)
    jvm_archive._train(partial, "-Xss4m", {"SPARK_DRIVER_JAVA_OPTIONS": "ignored", "SPARK_CLASS_ARCHIVE_DIR": "auto"}, 5)
    words = shlex.split(training.env["SPARK_DRIVER_JAVA_OPTIONS"])
    assert words == ["-Xss4m", f"-XX:ArchiveClassesAtExit={partial}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    assert training.env["SPARK_CLASS_ARCHIVE_DIR"] == ""


@pytest.mark.parametrize("stop", [subprocess.TimeoutExpired("training", 5), KeyboardInterrupt()],
                         ids=["timeout", "ctrl-c"])
def test_a_training_stopped_early_is_killed_whole_so_its_jvm_dumps_nothing(
        stop: BaseException, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    training = FakeTraining([stop, -9])
    monkeypatch.setattr(jvm_archive.subprocess, "Popen", training)
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(jvm_archive.os, "killpg", lambda pid, sig: killed.append((pid, sig)))
    expected = FirehoseError if isinstance(stop, subprocess.TimeoutExpired) else KeyboardInterrupt
    with pytest.raises(expected):
        jvm_archive._train(tmp_path / ".spark-x.jsa.1.tmp", "", {}, 5)
    assert killed == [(4242, signal.SIGKILL)]


def test_a_class_path_directory_that_stops_the_dump_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output = "Error: non-empty directory '/opt/spark/conf'\nError occurred during initialization of VM\n" \
             "Cannot have non-empty directory in paths\n"
    monkeypatch.setattr(jvm_archive.subprocess, "Popen", FakeTraining([1], output=output))
    with pytest.raises(FirehoseError, match="Spark's conf directory"):
        jvm_archive._train(tmp_path / ".spark-x.jsa.1.tmp", "", {}, 5)
