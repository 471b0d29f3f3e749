"""Log lines as text or JSON, with their context fields, and secrets kept out of both."""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from firehose_bq import logs
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import ConfigError, ErrorType, RowError
from firehose_bq.logs import JsonFormatter, TextFormatter
from firehose_bq.redact import Redactor
from tests.unit.batch.sources import source_batch
from tests.unit.batch.test_core import FakePlan, handling, spec, values
from tests.unit.test_config import MINIMAL

REPO = Path(__file__).resolve().parents[2]
PASSWORD, QUERY_TOKEN, HEADER_TOKEN = "url-pass-5e3c", "query-token-77d1", "header-token-9f0a"


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("firehose_bq.pipeline", logging.WARNING, __file__, 1, message, args, None)
    rec.__dict__.update(extra)
    return rec


def test_json_line_has_the_text_lines_content_and_the_known_context() -> None:
    fmt = JsonFormatter(Redactor())
    line = json.loads(fmt.format(record("batch %d: %d rows", 7, 500, partition=2, error_type=ErrorType.SINK_4XX_ERROR)))
    assert line["level"] == "WARNING" and line["logger"] == "firehose_bq.pipeline"
    assert line["message"] == "batch 7: 500 rows"
    assert (line["partition"], line["error_type"]) == (2, "SINK_4XX_ERROR")
    assert line["time"].endswith("+00:00") and "T" in line["time"]
    assert "batch_id" not in line and "table" not in line  # only what is known
    text = TextFormatter(Redactor()).format(record("batch %d: %d rows", 7, 500))
    assert text.endswith(" WARNING firehose_bq.pipeline: batch 7: 500 rows")


def test_context_block_and_record_extras_both_reach_the_line_and_the_record_wins() -> None:
    fmt = JsonFormatter(Redactor())
    with logs.log_context(batch_id=3, topic="orders"):
        with logs.log_context(partition=1):
            inner = json.loads(fmt.format(record("x", topic="orders-v2")))
        outer = json.loads(fmt.format(record("y")))
    after = json.loads(fmt.format(record("z")))
    assert (inner["batch_id"], inner["partition"], inner["topic"]) == (3, 1, "orders-v2")
    assert "partition" not in outer and outer["topic"] == "orders"
    assert "batch_id" not in after


def test_exception_and_secrets_in_a_json_line_are_masked() -> None:
    fmt = JsonFormatter(Redactor.of([f"Authorization: Bearer {HEADER_TOKEN}"]))
    try:
        raise ValueError(f"GET https://u:{PASSWORD}@h/x?token={QUERY_TOKEN} sent {HEADER_TOKEN}")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", (f"https://h/?k={QUERY_TOKEN}",),
                                sys.exc_info())
    out = fmt.format(rec)
    line = json.loads(out)
    assert "ValueError: GET https://***@h/x?token=*** sent ***" in line["exception"]
    assert line["message"] == "failed: https://h/?k=***"
    assert not any(s in out for s in (PASSWORD, QUERY_TOKEN, HEADER_TOKEN))


def test_configure_switches_the_format_and_adds_process_fields(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        say = logs.configure("INFO", {"LOG_FORMAT": "json"})
        assert logs.logs_json()  # the Spark driver's JVM is told to log JSON too
        logs.add_fields(table="p.d.t")
        logs.add_fields(topic="orders")
        logging.getLogger("firehose_bq.test").info("hello %s", "world")
        say("error: it broke")
        lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
        assert [(x["message"], x["table"], x["topic"]) for x in lines] == [
            ("hello world", "p.d.t", "orders"), ("error: it broke", "p.d.t", "orders")]
        say = logs.configure("INFO", {})  # replaces its own handler: one line per event, as text
        assert not logs.logs_json()
        logging.getLogger("firehose_bq.test").info("again")
        say("error: plain")
        err = capsys.readouterr().err.splitlines()
        assert err[0].endswith("INFO firehose_bq.test: again") and err[1] == "error: plain"
        with pytest.raises(ConfigError, match="LOG_FORMAT: expected one of text, json"):
            logs.configure("INFO", {"LOG_FORMAT": "yaml"})
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)


@pytest.fixture
def registry() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A registry that answers 404 and remembers the headers it was sent."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(dict(self.headers))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def failing_start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCE_", "SINK_", "INPUT_", "SCHEMA_",
                                                                       "SPARK_", "LOG_"))}
    done = subprocess.run([sys.executable, "-m", "firehose_bq.cli", "--log-level", "DEBUG", "run"],
                          env={**base, **MINIMAL, **env}, cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_failing_start_shows_no_url_credentials_and_no_header(
        log_format: str, registry: tuple[str, list[dict[str, str]]]) -> None:
    address, seen = registry
    done = failing_start({"LOG_FORMAT": log_format,
                          "SCHEMA_REGISTRY_STENCIL_URLS": f"http://{address}/set.desc?token={QUERY_TOKEN}&version=3",
                          "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS": f"Authorization: Bearer {HEADER_TOKEN}"})
    assert seen[-1]["Authorization"] == f"Bearer {HEADER_TOKEN}"  # the header was sent, and never shown
    output = done.stdout + done.stderr
    assert f"http://{address}/set.desc?token=***&version=***" in output
    assert QUERY_TOKEN not in output and HEADER_TOKEN not in output
    if log_format == "json":
        lines = [json.loads(line) for line in done.stderr.splitlines()]
        assert lines[-1]["level"] == "ERROR" and lines[-1]["message"].startswith("error: cannot load descriptors")
        assert lines[-1]["table"] == "proj.ds.tbl"

    # user:password in a Stencil URL is sent as basic auth, and shown as ***@.
    done = failing_start({"LOG_FORMAT": log_format,
                          "SCHEMA_REGISTRY_STENCIL_URLS": f"http://registry-user:{PASSWORD}@{address}/set.desc"})
    assert seen[-1]["Authorization"] == "Basic " + base64.b64encode(f"registry-user:{PASSWORD}".encode()).decode()
    assert f"http://***@{address}/set.desc" in done.stderr and PASSWORD not in done.stdout + done.stderr

    # A Confluent registry: its URL's credentials and its basic-auth password, the same.
    done = failing_start({"LOG_FORMAT": log_format, "SCHEMA_REGISTRY_STENCIL_URLS": "",
                          "SCHEMA_REGISTRY_CONFLUENT_URL": f"http://u:{PASSWORD}@{address}",
                          "SCHEMA_REGISTRY_CONFLUENT_BASIC_AUTH_USER_INFO": f"svc:{HEADER_TOKEN}"})
    assert seen[-1]["Authorization"] == "Basic " + base64.b64encode(f"svc:{HEADER_TOKEN}".encode()).decode()
    assert f"http://***@{address}" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr and HEADER_TOKEN not in done.stdout + done.stderr


@dataclass
class LeakyWriter:
    """Rejects every row with a message that carries secrets, as a careless error text might."""

    written: tuple[()] = ()  # FakePlan reports how many rows its writer wrote

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        return [RowError(n, ErrorType.SINK_4XX_ERROR, f"invalid; sent Bearer {HEADER_TOKEN} to "
                                                      f"https://u:{PASSWORD}@bq.test/x") for n in range(rows.num_rows)]

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ServedReader:
    """A RangeReader that serves the given source batches for any range."""

    batches: tuple[pa.RecordBatch, ...]

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return iter(self.batches)


def test_a_spark_task_logs_like_the_driver_in_a_fresh_worker_process(test_descriptors: Descriptors,
                                                                     tmp_path: Path) -> None:
    """A Python worker runs the task in a process where nothing configured logging: the settings travel
    with the task, so its lines (the policy's, the DLQ's) are JSON, masked, with the task's context."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:  # the driver, as the CLI sets it up
        logs.configure("INFO", {"LOG_FORMAT": "json",
                                "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS": f"Authorization: Bearer {HEADER_TOKEN}"},
                       ("SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS",))
        logs.add_fields(table="p.d.t")
        shipped = logs.for_workers(batch_id=7)
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    assert shipped is not None and HEADER_TOKEN not in repr(shipped)
    batch = source_batch(values(test_descriptors, "a", "b"), topic="orders", partition=3)
    task = tmp_path / "task.pickle"
    ranges = [pa.RecordBatch.from_pydict({"topic": ["orders"], "partition": [3], "start_offset": [0],
                                          "end_offset": [2]})]
    task.write_bytes(pickle.dumps((spec(test_descriptors), FakePlan(LeakyWriter()), handling(), shipped,
                                   ServedReader((batch,)), None, ranges)))
    worker = ("import pickle, sys\nfrom firehose_bq.batch.task import run_task\n"
              "print(list(run_task(*pickle.load(open(sys.argv[1], 'rb'))))[0]['result'][0].as_py())")
    done = subprocess.run([sys.executable, "-c", worker, str(task)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr

    assert json.loads(done.stdout)["stats"]["errors_by_type"] == {"SINK_4XX_ERROR": 2}
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line JSON
    assert {line["message"].split(" ")[0] for line in lines} == {"2", "dead"}  # the policy's line, the DLQ's two
    for line in lines:
        assert (line["batch_id"], line["topic"], line["partition"], line["table"], line["error_type"]) == (
            7, "orders", 3, "p.d.t", "SINK_4XX_ERROR")
    assert HEADER_TOKEN not in done.stderr and PASSWORD not in done.stderr and "https://***@bq.test/x" in done.stderr


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_line_of_a_process_without_logging_is_in_the_jobs_format_and_leaves_logging_alone(
        log_format: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The fork server and the workers' daemon: their forks are Spark's processes, which start with logging
    untouched, so they write the job's records without a handler."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        raise ValueError(f"from https://user:{PASSWORD}@registry.example/x")
    except ValueError:
        logs.say_unconfigured("firehose_bq.fork_server", logging.ERROR, "a request failed", {"LOG_FORMAT": log_format},
                              exc_info=True)
    assert (root.handlers, root.level) == (handlers, level)
    err = capsys.readouterr().err
    assert PASSWORD not in err and "ValueError" in err
    if log_format == "json":
        (line,) = err.splitlines()
        entry = json.loads(line)
        assert set(entry) == {"time", "level", "logger", "message", "exception"}
        assert (entry["level"], entry["logger"], entry["message"]) == ("ERROR", "firehose_bq.fork_server",
                                                                       "a request failed")
    else:
        assert err.startswith("a request failed\nTraceback (most recent call last):")
