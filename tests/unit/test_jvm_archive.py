"""The driver JVM's class archive: which one fits, when it is used, and how a build puts it in place (the
training run itself is faked here; tests/integration/test_jvm_archive.py runs it)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from firehose_bq import jvm_archive
from firehose_bq.config import SparkConfig
from firehose_bq.errors import FirehoseError
from firehose_bq.spark import class_archive, driver_java_options


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


def test_a_set_aside_archive_is_no_longer_used(installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = str(tmp_path / "archives")
    archive = jvm_archive.archive_for(where, java, home)
    assert archive is not None
    place(archive, 10)
    archive.set_aside()
    assert jvm_archive.find(where, java, home) is None


def test_its_options_come_last_quoted_and_silence_the_jvm_s_refusal(tmp_path: Path) -> None:
    archive = jvm_archive.Archive(tmp_path / "with space" / "spark-x.jsa")
    options = driver_java_options(SparkConfig(checkpoint_location="x"), False, {}, archive)
    words = shlex.split(options)  # as Spark splits them, quotes honoured
    assert words[0] == "-XX:TieredStopAtLevel=1"
    assert words[1:] == [f"-XX:SharedArchiveFile={archive.path}", "-Xshare:auto", "-Xlog:cds=off",
                         "-Xlog:cds+dynamic=off"]
    assert driver_java_options(SparkConfig(checkpoint_location="x"), False, {}) == "-XX:TieredStopAtLevel=1"


@pytest.mark.parametrize("option", ["-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:ArchiveClassesAtExit=/a.jsa"])
def test_a_user_who_chooses_class_sharing_gets_no_archive_of_ours(option: str, monkeypatch: pytest.MonkeyPatch,
                                                                   installation: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    java, home = installation
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    monkeypatch.setenv("SPARK_HOME", str(home))
    where = str(tmp_path / "archives")
    archive = jvm_archive.archive_for(where, java, home)
    assert archive is not None
    place(archive, 10)
    assert class_archive(SparkConfig(checkpoint_location="x", class_archive_dir=where)) == archive
    chosen = SparkConfig(checkpoint_location="x", class_archive_dir=where, driver_java_options=option)
    assert class_archive(chosen) is None


def spark_cfg(where: str, java_options: str = "-XX:TieredStopAtLevel=1") -> SparkConfig:
    return SparkConfig(checkpoint_location="x", class_archive_dir=where, driver_java_options=java_options)


def fake_training(monkeypatch: pytest.MonkeyPatch, write: bytes | None, check_ok: bool = True) -> list[dict[str, str]]:
    """The training run writes `write` (None: nothing, and fails); the check passes or fails."""
    runs: list[dict[str, str]] = []

    def train(partial: Path, java_options: str, environ: dict[str, str], timeout_s: float) -> None:
        runs.append(dict(environ))
        if write is None:
            raise FirehoseError("the training run for the JVM class archive failed (exit 1)")
        partial.write_bytes(write)

    def check(java: Path, partial: Path) -> None:
        if not check_ok:
            raise FirehoseError("a JVM does not start with the new class archive (exit 134)")

    monkeypatch.setattr(jvm_archive, "_train", train)
    monkeypatch.setattr(jvm_archive, "_check", check)
    return runs


def test_a_build_puts_the_archive_in_place_then_its_manifest_and_is_not_repeated(
        monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = str(tmp_path / "archives")
    runs = fake_training(monkeypatch, b"classes")
    archive, built = jvm_archive.build(spark_cfg(where), java, {"SPARK_HOME": str(home)})
    assert built and archive.path.read_bytes() == b"classes"
    recorded = archive.recorded()
    assert recorded is not None and recorded["bytes"] == 7 and recorded["spark_home"] == str(home)
    assert oct(archive.manifest.stat().st_mode & 0o777) == "0o644"
    assert jvm_archive.find(where, java, home) == archive
    assert jvm_archive.build(spark_cfg(where), java, {"SPARK_HOME": str(home)}) == (archive, False)
    assert len(runs) == 1
    assert jvm_archive.build(spark_cfg(where), java, {"SPARK_HOME": str(home)}, force=True) == (archive, True)
    assert sorted(p.name for p in archive.path.parent.iterdir()) == sorted([archive.manifest.name, archive.path.name])


def test_a_failed_build_leaves_nothing_behind_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                           installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = tmp_path / "archives"
    fake_training(monkeypatch, None)
    with pytest.raises(FirehoseError, match="training run"):
        jvm_archive.build(spark_cfg(str(where)), java, {"SPARK_HOME": str(home)})
    assert list(where.iterdir()) == []
    fake_training(monkeypatch, b"damaged", check_ok=False)
    with pytest.raises(FirehoseError, match="does not start"):
        jvm_archive.build(spark_cfg(str(where)), java, {"SPARK_HOME": str(home)})
    assert list(where.iterdir()) == []
    assert jvm_archive.find(str(where), java, home) is None
    with pytest.raises(FirehoseError, match="SPARK_CLASS_ARCHIVE_DIR is empty"):
        jvm_archive.build(spark_cfg(""), java, {"SPARK_HOME": str(home)})
    with pytest.raises(FirehoseError, match="chooses class-data sharing itself"):
        jvm_archive.build(spark_cfg(str(where), "-Xshare:off"), java, {"SPARK_HOME": str(home)})


def test_a_new_build_drops_the_superseded_archives_of_its_spark_only(
        monkeypatch: pytest.MonkeyPatch, installation: tuple[Path, Path], tmp_path: Path) -> None:
    java, home = installation
    where = tmp_path / "archives"
    old_here = jvm_archive.Archive(where / "spark-0ld.jsa")
    place(old_here, 5, home=home)
    other_spark = jvm_archive.Archive(where / "spark-0ther.jsa")
    place(other_spark, 5, home=tmp_path / "another-spark")
    fake_training(monkeypatch, b"classes")
    archive, _ = jvm_archive.build(spark_cfg(str(where)), java, {"SPARK_HOME": str(home)})
    assert sorted(p.name for p in where.iterdir()) == sorted(
        [archive.path.name, archive.manifest.name, other_spark.path.name, other_spark.manifest.name])


def test_the_training_s_own_jvm_dumps_and_maps_nothing(monkeypatch: pytest.MonkeyPatch,
                                                        installation: tuple[Path, Path], tmp_path: Path) -> None:
    """Its JVM options: the user's, then the dump into the partial file; and no archive of ours to map."""
    java, home = installation
    seen: list[dict[str, str]] = []

    class Done:
        returncode = 0
        stdout = stderr = ""

    def run(command: list[str], env: dict[str, str], **kwargs: object) -> Done:
        seen.append(env)
        partial = shlex.split(env["SPARK_DRIVER_JAVA_OPTIONS"])[1].split("=", 1)[1]
        Path(partial).write_bytes(b"x")
        return Done()

    monkeypatch.setattr(jvm_archive.subprocess, "run", run)
    partial = tmp_path / "dir with space" / ".spark-x.jsa.tmp"
    partial.parent.mkdir()
    jvm_archive._train(partial, "-Xss4m", {"SPARK_DRIVER_JAVA_OPTIONS": "ignored", "PATH": os.environ["PATH"]}, 5)
    words = shlex.split(seen[0]["SPARK_DRIVER_JAVA_OPTIONS"])
    assert words[:2] == ["-Xss4m", f"-XX:ArchiveClassesAtExit={partial}"]
    assert "-Xlog:cds=off" in words and seen[0]["SPARK_CLASS_ARCHIVE_DIR"] == ""
