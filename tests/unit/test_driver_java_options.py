"""SPARK_DRIVER_JAVA_OPTIONS goes to the driver as spark.driver.defaultJavaOptions unless the configuration
spark-submit reads already sets that key (spark.spark_configures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from firehose_bq import spark as spark_module
from firehose_bq.config import SparkConfig
from firehose_bq.spark import DRIVER_DEFAULT_JAVA_OPTIONS, JVM_JSON_LOGGING, driver_java_options, spark_configures

KEY = DRIVER_DEFAULT_JAVA_OPTIONS


def test_nothing_configured(tmp_path: Path) -> None:
    assert not spark_configures(KEY, {"SPARK_CONF_DIR": str(tmp_path)})  # no spark-defaults.conf there
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dx=1\n"
                                                  "# spark.driver.defaultJavaOptions in a comment\n"
                                                  "spark.driver.defaultJavaOptionsX -Dy=1\n")
    assert not spark_configures(KEY, {"SPARK_CONF_DIR": str(tmp_path), "PYSPARK_SUBMIT_ARGS": "pyspark-shell"})


def test_spark_defaults_in_the_conf_dir(tmp_path: Path) -> None:
    for line in (f"{KEY} -Xss4m", f"  {KEY}=-Xss4m", f"{KEY}:-Xss4m", f"{KEY}\t-Xss4m", KEY):
        (tmp_path / "spark-defaults.conf").write_text(f"spark.master local[2]\n{line}\n")
        assert spark_configures(KEY, {"SPARK_CONF_DIR": str(tmp_path)}), line


def test_spark_home_conf_when_no_conf_dir(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(f"{KEY} -Xss4m\n")
    assert spark_configures(KEY, {"SPARK_HOME": str(tmp_path)})
    assert not spark_configures(KEY, {"SPARK_HOME": str(tmp_path), "SPARK_CONF_DIR": str(tmp_path / "elsewhere")})


def test_submit_args_and_the_properties_file_they_name(tmp_path: Path) -> None:
    empty = {"SPARK_CONF_DIR": str(tmp_path)}
    assert spark_configures(KEY, {**empty, "PYSPARK_SUBMIT_ARGS": f"--conf {KEY}=-Xss4m pyspark-shell"})
    props = tmp_path / "job.properties"
    props.write_text(f"{KEY}=-Xss4m\n")
    assert spark_configures(KEY, {**empty, "PYSPARK_SUBMIT_ARGS": f"--properties-file {props} pyspark-shell"})
    assert not spark_configures(KEY, {**empty, "PYSPARK_SUBMIT_ARGS": f"--properties-file {tmp_path}/none pyspark-shell"})


def test_the_default_is_the_first_jit_tier() -> None:
    assert SparkConfig(checkpoint_location="x").driver_java_options == "-XX:TieredStopAtLevel=1"


def test_json_logs_give_the_jvm_the_json_log_configuration(tmp_path: Path) -> None:
    # Under LOG_FORMAT=json a log shipper gets Spark's own lines (a failed task's Java trace) as JSON too.
    cfg, quiet = SparkConfig(checkpoint_location="x"), {"SPARK_CONF_DIR": str(tmp_path)}
    assert driver_java_options(cfg, False, quiet) == "-XX:TieredStopAtLevel=1"
    options = driver_java_options(cfg, True, quiet)
    first, prop = options.split(" ")
    assert first == "-XX:TieredStopAtLevel=1" and prop == f"-Dlog4j2.configurationFile={JVM_JSON_LOGGING.as_uri()}"
    assert JVM_JSON_LOGGING.is_file() and "JsonTemplateLayout" in JVM_JSON_LOGGING.read_text()
    bare = SparkConfig(checkpoint_location="x", driver_java_options="")
    assert driver_java_options(bare, True, quiet) == prop


def test_a_spaced_install_path_stays_one_java_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark splits the options at spaces: the file goes as a URI, whose spaces are escaped.
    monkeypatch.setattr(spark_module, "JVM_JSON_LOGGING", tmp_path / "my venv" / "log4j2-json.properties")
    options = driver_java_options(SparkConfig(checkpoint_location="x", driver_java_options=""), True,
                                  {"SPARK_CONF_DIR": str(tmp_path)})
    assert " " not in options and "my%20venv" in options


@pytest.mark.parametrize("name", ["log4j2.properties", "log4j2.xml", "log4j2.yaml"])
def test_a_users_log4j_configuration_is_kept(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("rootLogger.level = info\n")
    assert driver_java_options(SparkConfig(checkpoint_location="x"), True,
                               {"SPARK_CONF_DIR": str(tmp_path)}) == "-XX:TieredStopAtLevel=1"


def test_a_log4j_property_in_the_submit_args_is_kept(tmp_path: Path) -> None:
    environ = {"SPARK_CONF_DIR": str(tmp_path),
               "PYSPARK_SUBMIT_ARGS": "--driver-java-options -Dlog4j2.configurationFile=/etc/mine.xml pyspark-shell"}
    assert "log4j2-json" not in driver_java_options(SparkConfig(checkpoint_location="x"), True, environ)


@pytest.mark.parametrize(("where", "prop"), [
    *((where, prop) for where in ("submit args", "spark-defaults.conf", "SPARK_DRIVER_JAVA_OPTIONS")
      for prop in ("log4j2.configurationFile", "log4j.configurationFile")),
    ("environment", "LOG4J_CONFIGURATION_FILE"),
])
def test_a_users_log4j_configuration_named_anywhere_is_kept(tmp_path: Path, where: str, prop: str) -> None:
    # Ours would win over each of these in the JVM (checked with Spark 4's log4j2): after theirs in the same
    # options, or under log4j2's own name against log4j 1's, which Spark's docs use in extraJavaOptions.
    option = f"-D{prop}=file:///etc/mine.properties"
    environ = {"SPARK_CONF_DIR": str(tmp_path)}
    cfg = SparkConfig(checkpoint_location="x")
    if where == "submit args":
        environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options {option} pyspark-shell"
    elif where == "spark-defaults.conf":
        (tmp_path / "spark-defaults.conf").write_text(f"spark.driver.extraJavaOptions  -Xss4m {option}\n")
    elif where == "SPARK_DRIVER_JAVA_OPTIONS":
        cfg = SparkConfig(checkpoint_location="x", driver_java_options=f"-Xss4m {option}")
    else:
        environ[prop] = "/etc/mine.properties"
    assert "log4j2-json" not in driver_java_options(cfg, True, environ)


def test_a_log4j_configuration_of_the_executors_leaves_the_driver_json(tmp_path: Path) -> None:
    # On a cluster the executors' log4j is configured apart (spark.executor.extraJavaOptions); the driver's
    # lines under LOG_FORMAT=json are still the job's to shape.
    option = "-Dlog4j.configurationFile=file:///etc/executors.properties"
    (tmp_path / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions  {option}\n")
    environ = {"SPARK_CONF_DIR": str(tmp_path),
               "PYSPARK_SUBMIT_ARGS": f'--conf "spark.executor.extraJavaOptions=-Xss4m {option}" pyspark-shell'}
    assert "log4j2-json" in driver_java_options(SparkConfig(checkpoint_location="x"), True, environ)
