"""An exception no branch of the command line expects (a bug, Spark's Py4JJavaError at start) still ends
the command the documented way: exit 1, a final `error:` line, JSON lines under LOG_FORMAT=json, secrets
masked; never Python's bare traceback on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.unit.test_cli import REPO
from tests.unit.test_config import MINIMAL

PASSWORD = "pw-never-shown-81"
# What a command raising out of Spark looks like: the JVM's exception, its frames, a URL with credentials.
RAISE = f"""
import sys
from firehose_bq import cli

def boom(args, environ):
    raise RuntimeError("An error occurred while calling None.JavaSparkContext.\\n"
                       ": org.apache.spark.SparkException: Could not reach https://user:{PASSWORD}@master.example/x\\n"
                       "\\tat org.apache.spark.SparkContext.<init>(SparkContext.scala:603)")

cli._config = boom
sys.exit(cli.main(["config", "check"]))
"""


def run_raising(log_format: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCE_", "SINK_", "INPUT_", "SCHEMA_",
                                                                       "SPARK_", "LOG_"))}
    return subprocess.run([sys.executable, "-c", RAISE], env={**base, **MINIMAL, "LOG_FORMAT": log_format}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_unexpected_exception_exits_1_with_a_final_error_line_masked(log_format: str) -> None:
    done = run_raising(log_format)
    assert done.returncode == 1, done.stderr
    assert PASSWORD not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    if log_format == "json":
        entries = [json.loads(line) for line in lines]  # every line is one JSON object
        assert entries[-1]["level"] == "ERROR"
        final = entries[-1]["message"]
        assert any("Traceback" in e.get("exception", "") for e in entries)  # the bug's traceback, kept
    else:
        final = lines[-1]
        assert "Traceback" in done.stderr
    assert final.startswith("error: RuntimeError: ") and "Could not reach https://***@master.example/x" in final


WARN = """
import sys, warnings
from firehose_bq import cli

def warns(args, environ):
    # What google-auth says on a machine whose ADC are a user's gcloud login, for one.
    warnings.warn("Your application has authenticated using end user credentials", UserWarning)
    return 0

cli._config = warns
sys.exit(cli.main(["config", "check"]))
"""


def test_a_python_warning_is_a_log_line_in_the_log_format() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCE_", "SINK_", "INPUT_", "SCHEMA_",
                                                                       "SPARK_", "LOG_", "PYTHONWARNINGS"))}
    done = subprocess.run([sys.executable, "-c", WARN], env={**base, **MINIMAL, "LOG_FORMAT": "json"}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [entry] = [json.loads(line) for line in done.stderr.strip().splitlines()]  # one JSON object, not two raw lines
    assert entry["level"] == "WARNING" and "end user credentials" in entry["message"]
