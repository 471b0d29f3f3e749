"""The local stack: a Kafka-protocol broker, the BigQuery emulator and a Cloud Storage emulator on 127.0.0.1.

`up` starts what is not running (so a second `up` is harmless) and waits until each service
answers; `down` stops exactly the processes `up` recorded, by PID, after checking that each PID is
still the process that was started (a reused PID is never killed); `status` reports each.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.devstack.tools import BROKER, EMULATOR, GCS_EMULATOR, Tool, default_tools_dir, ensure_installed
from firehose_bq.errors import StackError

HOST = "127.0.0.1"
LAUNCHER = Path(__file__).with_name("bqemulator_launcher.py")
# noida-db saves its data on SIGTERM (about 2 s); give every service a little more before SIGKILL.
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 15
# gcp-storage-emulator keeps each object's bytes as a plain file at <data>/.cloudstorage/<bucket>/<name>
# (its STORAGE_DIR); the BigQuery emulator's load jobs read `gs://bucket/name` from there.
GCS_DATA_DIR = "gcs-data"
GCS_OBJECTS_DIR = ".cloudstorage"


@dataclass(frozen=True)
class Service:
    name: str
    tool: Tool
    port: int
    address: str
    command: Callable[[Path, Path], list[str]]  # (the tool's venv, the stack's state dir) → argv
    healthy: Callable[[], bool]


def services(cfg: StackConfig) -> tuple[Service, ...]:
    """The stack's services, in start order."""
    return (
        Service("kafka", BROKER, cfg.kafka_port, f"{HOST}:{cfg.kafka_port}",
                functools.partial(_kafka_command, cfg), functools.partial(kafka_answers, cfg.kafka_port)),
        Service("bigquery", EMULATOR, cfg.bigquery_port, f"http://{HOST}:{cfg.bigquery_port}",
                functools.partial(_bigquery_command, cfg), functools.partial(_bigquery_answers, cfg)),
        Service("gcs", GCS_EMULATOR, cfg.gcs_port, gcs_endpoint(cfg),
                functools.partial(_gcs_command, cfg), functools.partial(_gcs_answers, cfg)),
    )


def _kafka_command(cfg: StackConfig, venv: Path, state: Path) -> list[str]:
    data = state / "kafka-data"
    data.mkdir(parents=True, exist_ok=True)
    return [str(venv / "bin" / "noida-db"), "start", "--only", "kafka", "--host", HOST,
            "--kafka-port", str(cfg.kafka_port), "--data-dir", str(data)]


def _bigquery_command(cfg: StackConfig, venv: Path, state: Path) -> list[str]:
    persist = ["--data-dir", str(state / "bigquery-data")] if cfg.bigquery_persistent else []
    return [str(venv / "bin" / "python"), str(LAUNCHER), "--host", HOST, "--port", str(cfg.bigquery_port),
            "--grpc-port", str(cfg.bigquery_grpc_port), "--project", cfg.project_id,
            "--gcs-local-root", str(state / GCS_DATA_DIR / GCS_OBJECTS_DIR), *persist]


def _gcs_command(cfg: StackConfig, venv: Path, state: Path) -> list[str]:
    # On disk, like the broker: objects survive a restart, and load jobs on the BigQuery emulator read them.
    return [str(venv / "bin" / "gcp-storage-emulator"), "--data-dir", str(state / GCS_DATA_DIR), "start",
            "--host", HOST, "--port", str(cfg.gcs_port), "--default-bucket", cfg.gcs_bucket]


def gcs_endpoint(cfg: StackConfig) -> str:
    return f"http://{HOST}:{cfg.gcs_port}"


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    address: str
    log: Path


class Stack:
    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.state = Path(cfg.state_dir).absolute()
        self.tools = Path(cfg.tools_dir) if cfg.tools_dir else default_tools_dir()
        self.services = services(cfg)

    # --- commands --------------------------------------------------------------------------------------

    def up(self, report: Callable[[str], None] = print) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "logs").mkdir(exist_ok=True)
        started: list[tuple[Service, subprocess.Popen[bytes]]] = []
        try:
            for service in self.services:
                pid = self._running_pid(service)
                if pid is not None:
                    report(f"{service.name}: already running (pid {pid}) on {service.address}")
                    continue
                self._check_port_free(service)
                venv = ensure_installed(service.tool, self.tools)
                command = service.command(venv, self.state)
                with open(self._log(service), "ab") as log:
                    process = subprocess.Popen(  # noqa: S603 - our own pinned tools, fixed arguments
                        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        cwd=self.state, start_new_session=True,
                    )
                # The command we launched, not /proc's view: right after fork it may still be our own.
                self._pid_file(service).write_text(json.dumps({"pid": process.pid, "cmd": " ".join(command)}))
                started.append((service, process))
            for service, process in started:
                self._wait_healthy(service, process)
                report(f"{service.name}: started (pid {process.pid}) on {service.address}")
        except StackError:
            # Leave no half-started stack behind: stop what this call started.
            for service, process in started:
                _terminate_group(process.pid)
                self._pid_file(service).unlink(missing_ok=True)
            raise

    def down(self, report: Callable[[str], None] = print) -> None:
        for service in self.services:
            pid = self._running_pid(service)
            if pid is None:
                report(f"{service.name}: not running")
            else:
                _terminate_group(pid)
                report(f"{service.name}: stopped (pid {pid})")
            self._pid_file(service).unlink(missing_ok=True)

    def stop_service(self, name: str) -> None:
        """Stop one service (e.g. `bigquery`, to test an outage); `up()` starts it again."""
        service = next(s for s in self.services if s.name == name)
        pid = self._running_pid(service)
        if pid is not None:
            _terminate_group(pid)
        self._pid_file(service).unlink(missing_ok=True)

    def status(self) -> list[ServiceStatus]:
        result = []
        for service in self.services:
            pid = self._running_pid(service)
            result.append(ServiceStatus(service.name, pid, pid is not None, pid is not None and service.healthy(),
                                        service.address, self._log(service)))
        return result

    def env(self) -> dict[str, str]:
        """Variables that point a job, a test or a client at this stack."""
        return {
            "SOURCE_KAFKA_BROKERS": f"{HOST}:{self.cfg.kafka_port}",
            "SINK_BIGQUERY_API_ENDPOINT": f"http://{HOST}:{self.cfg.bigquery_port}",
            "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": self.cfg.project_id,
            "FIREHOSE_STACK_BIGQUERY_GRPC_ENDPOINT": f"{HOST}:{self.cfg.bigquery_grpc_port}",
            "SINK_BIGQUERY_STORAGE_API_ENDPOINT": f"{HOST}:{self.cfg.bigquery_grpc_port}",
            "DLQ_GCS_API_ENDPOINT": gcs_endpoint(self.cfg),
            "SINK_BIGQUERY_FILE_LOADS_STAGING_GCS_API_ENDPOINT": gcs_endpoint(self.cfg),
            # google-cloud-storage's own variable, for other clients (scripts, notebooks) pointed at this stack.
            "STORAGE_EMULATOR_HOST": gcs_endpoint(self.cfg),
            "FIREHOSE_STACK_GCS_BUCKET": self.cfg.gcs_bucket,
        }

    # --- helpers ---------------------------------------------------------------------------------------

    def _pid_file(self, service: Service) -> Path:
        return self.state / f"{service.name}.pid"

    def _log(self, service: Service) -> Path:
        return self.state / "logs" / f"{service.name}.log"

    def _running_pid(self, service: Service) -> int | None:
        """The recorded PID if that very process still runs; a stale PID file is removed."""
        path = self._pid_file(service)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        pid = int(record["pid"])
        # A script runs as `interpreter script args`: the launched command is the end of the line.
        cmdline = _cmdline(pid)
        if cmdline and cmdline.endswith(str(record.get("cmd"))) and _alive(pid):
            return pid
        path.unlink(missing_ok=True)
        return None

    def _check_port_free(self, service: Service) -> None:
        with socket.socket() as probe:
            if probe.connect_ex((HOST, service.port)) == 0:
                raise StackError(
                    f"{service.name}: port {service.port} on {HOST} is taken by a process this stack did not "
                    f"start; stop it or choose another port (FIREHOSE_STACK_{service.name.upper()}_PORT)"
                )

    def _wait_healthy(self, service: Service, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"{service.name} exited with code {process.returncode} while starting; "
                                 f"log {self._log(service)}:\n{_tail(self._log(service))}")
            if service.healthy():
                return
            time.sleep(0.2)
        raise StackError(f"{service.name} did not answer on {service.address} within "
                         f"{self.cfg.start_timeout_s} s; log {self._log(service)}:\n{_tail(self._log(service))}")


@contextmanager
def owned_stack(cfg: StackConfig) -> Iterator[Stack]:
    """A stack for as long as the block runs (a test session's, a benchmark's): started, and stopped at the
    end, also when the process is stopped with SIGTERM (a CI time-out, `kill`)."""
    stack = Stack(cfg)
    with interrupted_by_sigterm():
        try:
            # Inside: a SIGTERM while the services start leaves those that started already to `down`.
            stack.up(report=lambda line: None)
            yield stack
        finally:
            stack.down(report=lambda line: None)


@contextmanager
def interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the block, as Ctrl-C would. Python's default for SIGTERM ends the
    process without running `finally` blocks, so a killed test session left its broker and emulators
    running, with their ports and state directories. Once only: a second SIGTERM ends the process as
    usual. A no-op outside the main thread, where Python cannot set signal handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def isolated_env(state_dir: Path | str) -> dict[str, str]:
    """Settings for a stack of its own (state and free ports) beside any other: tests, benchmarks."""
    return {"FIREHOSE_STACK_DIR": str(state_dir), "FIREHOSE_STACK_KAFKA_PORT": str(free_port()),
            "FIREHOSE_STACK_BIGQUERY_PORT": str(free_port()), "FIREHOSE_STACK_BIGQUERY_GRPC_PORT": str(free_port()),
            "FIREHOSE_STACK_GCS_PORT": str(free_port())}


def kafka_answers(port: int) -> bool:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{port}", request_timeout_ms=2000)
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


def _bigquery_answers(cfg: StackConfig) -> bool:
    return _http_ok(f"http://{HOST}:{cfg.bigquery_port}/bigquery/v2/projects/{cfg.project_id}/datasets")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _gcs_answers(cfg: StackConfig) -> bool:
    # The bucket, not just the server: `stack up` promises FIREHOSE_STACK_GCS_BUCKET exists.
    return _http_ok(f"{gcs_endpoint(cfg)}/storage/v1/b/{cfg.gcs_bucket}")


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) has no command line left.
    return _cmdline(pid) not in (None, "")


def _terminate_group(pid: int) -> None:
    """SIGTERM the service's process group, then SIGKILL what is left after the grace period."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        _reap(pid)
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def _reap(pid: int) -> None:
    # When `up` and `down` run in one process (tests), the service is our child: collect its exit.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:])
