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


TOKEN = "tok-never-shown-29"
# A run that stops: the summary's `stopped because` line is the error's message, which may quote a URL
# with credentials or a secret setting's value. Spark, the source check and the registry are faked: what is
# tested is what the command prints.
STOPS = f"""
import sys, types
from firehose_bq import cli, pipeline, sink_schema, spark
from firehose_bq.errors import FirehoseError
from firehose_bq.metrics import RunSummary

class Stops:
    def __init__(self, *args, **kwargs):
        self.summary, self.schema = RunSummary(), types.SimpleNamespace(on_descriptors_changed=None)

    def run(self, **kwargs):
        self.summary.failure = "https://user:{PASSWORD}@sr.example/x refused Bearer {TOKEN}"
        raise FirehoseError(self.summary.failure)

class Cache:
    get = refresh_now = stats = add_listener = stop = lambda *args: None
    def start(self):
        return self

cli._check_source = lambda cfg: None
spark.spark_session = lambda cfg, **options: object()
spark.refuse_speculation = spark.start_workers = lambda session: None
spark.stop_session = lambda session, workers: None
sink_schema.descriptor_cache = lambda cfg: Cache()
pipeline.Pipeline = Stops
sys.exit(cli.main(["run", "--available-now"]))
"""


def test_the_summary_of_a_run_that_stops_is_masked_like_its_error_line() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCE_", "SINK_", "INPUT_", "SCHEMA_",
                                                                       "SPARK_", "LOG_"))}
    env = {**base, **MINIMAL, "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS": f"Authorization: Bearer {TOKEN}"}
    done = subprocess.run([sys.executable, "-c", STOPS], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert PASSWORD not in done.stdout + done.stderr and TOKEN not in done.stdout + done.stderr
    assert "stopped because    https://***@sr.example/x refused ***" in done.stdout.splitlines()
