"""SPARK_DRIVER_JAVA_OPTIONS goes to the driver as spark.driver.defaultJavaOptions unless the configuration
spark-submit reads already sets that key (spark.spark_configures)."""

from __future__ import annotations

from pathlib import Path

from firehose_bq.config import SparkConfig
from firehose_bq.spark import DRIVER_DEFAULT_JAVA_OPTIONS, spark_configures

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
