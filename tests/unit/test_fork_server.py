"""The source runner's fork server (fork_server.py) with the hand-over in the runner's sitecustomize: real
processes, Spark's real runner module, and this test standing in for the JVM end of the runner's socket
(PySpark's Unix-socket variant: PYTHON_WORKER_FACTORY_SOCK_PATH, no secret)."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from firehose_bq import fork_server, worker_daemon
from firehose_bq.spark import WORKER_STARTUP

PYTHON = os.path.realpath(sys.executable)


def _wait(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[fork_server.ForkServer]:
    started = fork_server.start(os.environ)
    assert started is not None
    _wait(lambda: os.path.exists(started.socket_path))
    yield started
    started.close()
    started.process.wait(timeout=20)


class FakeJvm:
    """The JVM's end of a runner's connection: where the runner connects and writes its pid."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "jvm.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.listener.settimeout(20)

    def start_runner(self, fork_socket: str | None, *args: str,
                     ignored: tuple[int, ...] = (), extra_env: dict[str, str] | None = None,
                     preexec: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_WORKER_FACTORY_PORT",
                                                                  "PYTHON_WORKER_FACTORY_SECRET")}
        env.update({"PYTHONPATH": str(WORKER_STARTUP), "PYTHON_WORKER_FACTORY_SOCK_PATH": self.path, **(extra_env or {})})
        env.pop(fork_server.SOCKET_ENV, None)
        if fork_socket is not None:
            env[fork_server.SOCKET_ENV] = fork_socket
        def ignore() -> None:  # what the JVM's children inherit (PySpark starts the JVM ignoring SIGINT)
            for signum in ignored:
                signal.signal(signum, signal.SIG_IGN)
            if preexec is not None:
                preexec()

        return subprocess.Popen([sys.executable, "-m", *(args or (fork_server.RUNNER_MODULE,))], env=env,
                                stdin=subprocess.PIPE if args else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=ignore if ignored or preexec else None)

    def run_refused(self, fork_socket: str, server_env: Mapping[str, str]) -> tuple[int, bytes]:
        """Start a runner the server refuses (another hash seed than `server_env`'s): it starts as Spark
        starts it, and fails at its first read; (its exit code, its stderr)."""
        seed = "1" if server_env.get("PYTHONHASHSEED") == "0" else "0"
        # The C library's settings as the server's: Spark gives its processes the same (spark.add_worker_env).
        libc = {k: server_env[k] for k in fork_server.LIBC_START_ENV if k in server_env}
        proxy = self.start_runner(fork_socket, extra_env={**libc, "PYTHONHASHSEED": seed})
        conn, pid = self.accept()
        assert pid == proxy.pid
        conn.close()
        _, err = proxy.communicate(timeout=30)
        return proxy.returncode, err

    def accept(self) -> tuple[socket.socket, int]:
        conn, _ = self.listener.accept()
        conn.settimeout(20)
        data = b""
        while len(data) < 4:
            data += conn.recv(4 - len(data))
        return conn, struct.unpack("!i", data)[0]


def test_the_runner_is_forked_from_the_server_and_its_failure_reaches_spark_as_its_own(
        server: fork_server.ForkServer, tmp_path: Path) -> None:
    jvm = FakeJvm(tmp_path)
    results = []
    for fork_socket in (server.socket_path, None):
        proxy = jvm.start_runner(fork_socket)
        conn, pid = jvm.accept()
        if fork_socket is not None:
            assert pid != proxy.pid and _parent(pid) == server.process.pid
        else:
            assert pid == proxy.pid
        conn.close()  # the runner's first read (Spark's Python version) fails
        _, err = proxy.communicate(timeout=30)
        results.append((proxy.returncode, err.decode().strip().splitlines()[-1]))
    forked, own = results
    assert forked == own and forked[0] != 0, results


def test_spark_stopping_the_runner_stops_the_forked_runner(server: fork_server.ForkServer,
                                                           tmp_path: Path) -> None:
    jvm = FakeJvm(tmp_path)
    proxy = jvm.start_runner(server.socket_path)
    conn, pid = jvm.accept()
    assert pid != proxy.pid
    proxy.send_signal(signal.SIGTERM)  # Process.destroy()
    proxy.wait(timeout=20)
    assert proxy.returncode == -signal.SIGTERM  # as a runner Spark started would end
    _wait(lambda: not _alive(pid))
    conn.close()


def test_a_killed_proxy_takes_its_runner_with_it(server: fork_server.ForkServer, tmp_path: Path) -> None:
    jvm = FakeJvm(tmp_path)
    proxy = jvm.start_runner(server.socket_path)
    conn, pid = jvm.accept()
    proxy.kill()
    proxy.wait(timeout=20)
    _wait(lambda: not _alive(pid))
    conn.close()


def test_a_process_with_a_sitecustomize_of_its_own_on_its_path_starts_as_spark_starts_it(
        server: fork_server.ForkServer, tmp_path: Path) -> None:
    """A fork would skip the user's sitecustomize (the proxy hands over before it runs): no hand-over."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "ran"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    jvm = FakeJvm(tmp_path)
    proxy = jvm.start_runner(server.socket_path, extra_env={"PYTHONPATH": f"{WORKER_STARTUP}{os.pathsep}{theirs}"})
    conn, pid = jvm.accept()
    assert pid == proxy.pid and marker.exists()
    conn.close()
    proxy.communicate(timeout=30)


def test_without_a_listening_server_the_runner_starts_as_spark_starts_it(tmp_path: Path) -> None:
    jvm = FakeJvm(tmp_path)
    proxy = jvm.start_runner(str(tmp_path / "nobody-listens.sock"))
    conn, pid = jvm.accept()
    assert pid == proxy.pid
    conn.close()
    proxy.communicate(timeout=30)


def test_a_runner_started_with_another_hash_seed_starts_as_spark_starts_it(server: fork_server.ForkServer,
                                                                           tmp_path: Path) -> None:
    """A fork's str hashes are its server's: one that should hash with another seed must not be forked."""
    code, err = FakeJvm(tmp_path).run_refused(server.socket_path, os.environ)
    assert code != 0, err  # the runner's first read failed, as in the test above


def test_a_runner_started_tracing_its_memory_starts_as_spark_starts_it(server: fork_server.ForkServer,
                                                                       tmp_path: Path) -> None:
    """spark.executorEnv.PYTHONTRACEMALLOC (debugging the workers' memory): a fork would never trace, and
    tracemalloc.take_snapshot() in it fails (the module must be tracing)."""
    jvm = FakeJvm(tmp_path)
    proxy = jvm.start_runner(server.socket_path, extra_env={"PYTHONTRACEMALLOC": "5"})
    conn, pid = jvm.accept()
    assert pid == proxy.pid
    conn.close()
    proxy.communicate(timeout=30)


def test_the_server_starts_as_the_python_processes_spark_starts() -> None:
    """PySpark's context gives its Python processes PYTHONHASHSEED (the driver's, else "0") and Spark's
    PythonWorkerFactory PYTHONUNBUFFERED=YES: the server's forks must hash and buffer as they would."""
    from firehose_bq.spark import WORKER_MALLOC_ENV, fork_server_env

    env = fork_server_env({"PATH": "/bin", "PYTHONUNBUFFERED": "1"})
    assert env == {**WORKER_MALLOC_ENV, "PATH": "/bin", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES",
                   "LOG_FORMAT": "text"}
    assert fork_server_env({"PYTHONHASHSEED": "7"})["PYTHONHASHSEED"] == "7"
    # (And WORKER_MALLOC_ENV, which spark.add_worker_env gives the workers as fork_server_env the server.)
    spark_env = {**WORKER_MALLOC_ENV, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES"}
    assert fork_server.refusal({**REQUEST, "env": spark_env}, 3, PYTHON, "/x/pyspark/__init__.py",
                               fork_server.started_with(env)) is None


@pytest.mark.parametrize("json_logs", [True, False])
def test_the_servers_refusal_is_a_line_in_the_jobs_log_format(tmp_path: Path, json_logs: bool) -> None:
    """Under LOG_FORMAT=json (here only in the driver's env file: the environment says text) the server's
    lines are the job's JSON records, though it configures no logging (its forks must start without)."""
    from firehose_bq.spark import fork_server_env

    env = fork_server_env({**os.environ, "LOG_FORMAT": "text"}, json_logs)
    with open(tmp_path / "stderr", "w+b") as err:
        started = _server_writing_to(err.fileno(), env)
        FakeJvm(tmp_path).run_refused(started.socket_path, env)
        started.close()
        assert started.process.wait(timeout=20) == 0
        err.seek(0)
        (line,) = err.read().decode().splitlines()
    if json_logs:
        record = json.loads(line)
        assert (record["level"], record["logger"]) == ("WARNING", "firehose_bq.fork_server"), record
        assert "not forking (Python started with other PYTHONHASHSEED" in record["message"]
    else:
        assert line.startswith("firehose-bq fork server: not forking (Python started with other PYTHONHASHSEED")


def test_a_request_the_server_cannot_read_leaves_no_copy_of_the_processs_stdio_behind(
        server: fork_server.ForkServer) -> None:
    """A request past MAX_REQUEST (an environment of megabytes, JSON-escaped), cut short or timed out: the
    process starts as usual, and the server must not keep the descriptors that came with it. A write end
    of the process's stdout held by the server is an end of file the JVM never reads."""
    read_end, write_end = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(server.socket_path)
            conn.sendmsg([fork_server.LENGTH.pack(fork_server.MAX_REQUEST + 1)],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [write_end] * 3).tobytes())])
            os.close(write_end)
            conn.settimeout(20)
            assert conn.recv(8) == b""  # refused: the stand-in starts the process itself
        readable, _, _ = select.select([read_end], [], [], 10)
        assert readable and os.read(read_end, 1) == b"", "the server still holds the process's stdout"
    finally:
        os.close(read_end)


def test_a_server_whose_stderr_is_gone_still_serves(tmp_path: Path) -> None:
    """The driver's stderr may be a pipe whose reader went away (`firehose-bq run 2>&1 | tee log`, tee killed):
    the driver's logging drops what it cannot write. The server's line about a refusal must not end the
    server either: every process it forked (the source runner, the daemons) dies with it."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    started = _server_writing_to(write_end, os.environ)
    os.close(write_end)
    try:
        jvm = FakeJvm(tmp_path)
        jvm.run_refused(started.socket_path, os.environ)
        assert started.process.poll() is None, "the server ended on its refusal's line"
        forked = jvm.start_runner(started.socket_path)
        conn, pid = jvm.accept()
        assert pid != forked.pid and _parent(pid) == started.process.pid
        conn.close()
        forked.communicate(timeout=30)
    finally:
        started.close()
        started.process.wait(timeout=20)


def _server_writing_to(stderr: int, env: Mapping[str, str]) -> fork_server.ForkServer:
    """A server started as fork_server.start starts it, but with its stderr on `stderr`; listening."""
    directory = tempfile.mkdtemp(prefix="firehose-bq-fork-")
    process = subprocess.Popen([sys.executable, "-m", fork_server.__name__, directory], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=stderr, env=dict(env))
    started = fork_server.ForkServer(process, directory)
    _wait(lambda: os.path.exists(started.socket_path))
    return started


def test_the_server_ends_with_its_driver_and_removes_its_socket() -> None:
    started = fork_server.start(os.environ)
    assert started is not None
    _wait(lambda: os.path.exists(started.socket_path))
    started.process.stdin.close()  # type: ignore[union-attr]  # the driver exits
    assert started.process.wait(timeout=20) == 0
    assert not os.path.exists(started.directory)


def _children(pid: int) -> set[int]:
    return {int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()}


@pytest.mark.parametrize("daemon", [fork_server.PYSPARK_DAEMON, worker_daemon.__name__])
def test_a_daemon_is_forked_and_serves_the_jvm_on_its_stdio_as_its_own(server: fork_server.ForkServer,
                                                                       tmp_path: Path, daemon: str) -> None:
    jvm = FakeJvm(tmp_path)
    ends = []
    for fork_socket in (server.socket_path, None):
        before = _children(server.process.pid)
        proxy = jvm.start_runner(fork_socket, daemon, "pyspark.worker")
        port = struct.unpack("!i", proxy.stdout.read(4))[0]  # type: ignore[union-attr]  # the daemon's first word
        forked = _children(server.process.pid) - before
        assert port > 0 and len(forked) == (1 if fork_socket else 0), (port, forked)
        assert all(Path(f"/proc/{pid}/comm").read_text().strip() == fork_server.process_name(daemon)
                   for pid in forked)
        proxy.stdin.close()  # type: ignore[union-attr]  # the JVM ends: the daemon shuts down
        proxy.wait(timeout=30)
        ends.append(proxy.returncode)
        for pid in forked:
            _wait(lambda: not _alive(pid))  # noqa: B023
    assert ends[0] == ends[1], ends


def _signal_state(pid: int) -> dict[str, int]:
    """Which signals the process ignores, blocks and catches (/proc/<pid>/status). Caught: the standard
    signals only (glibc catches its own real-time ones, 32 and 33, once a process has threads)."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("SigIgn", "SigBlk", "SigCgt")))
    state = {k: int(v, 16) for k, v in fields.items()}
    state["SigCgt"] &= (1 << 31) - 1
    return state


@pytest.mark.parametrize("daemon", [fork_server.PYSPARK_DAEMON, worker_daemon.__name__])
def test_a_forked_daemon_ignores_the_signals_its_process_inherited_ignored(server: fork_server.ForkServer,
                                                                           tmp_path: Path, daemon: str) -> None:
    """PySpark starts the JVM with SIGINT ignored and the Python processes the JVM starts inherit that (Python
    installs no KeyboardInterrupt handler then): a Ctrl-C is the driver's, which stops after the running
    micro-batch. A daemon's ending on it would take that batch's workers with it (its shutdown SIGHUPs them)."""
    jvm = FakeJvm(tmp_path)
    states, ends = [], []
    for fork_socket in (server.socket_path, None):
        before = _children(server.process.pid)
        proxy = jvm.start_runner(fork_socket, daemon, "pyspark.worker", ignored=(signal.SIGINT,))
        assert struct.unpack("!i", proxy.stdout.read(4))[0] > 0  # type: ignore[union-attr]  # serving
        forked = _children(server.process.pid) - before
        (running,) = forked or {proxy.pid}
        # The daemon sets its own handlers (SIGTERM's the last) just after it wrote its port.
        _wait(lambda: _signal_state(running)["SigCgt"] & 1 << (signal.SIGTERM - 1))  # noqa: B023
        states.append(_signal_state(running))
        proxy.send_signal(signal.SIGINT)  # the terminal's Ctrl-C
        time.sleep(0.5)
        assert proxy.poll() is None and _alive(running), proxy.stderr.read().decode()  # type: ignore[union-attr]
        proxy.stdin.close()  # type: ignore[union-attr]
        proxy.wait(timeout=30)
        ends.append(proxy.returncode)
    assert states[0] == states[1], states
    assert ends[0] == ends[1], ends


def test_a_forked_runner_has_the_signal_dispositions_and_mask_of_its_process(server: fork_server.ForkServer,
                                                                             tmp_path: Path) -> None:
    jvm = FakeJvm(tmp_path)
    states = []
    for fork_socket in (server.socket_path, None):
        proxy = jvm.start_runner(fork_socket, ignored=(signal.SIGINT, signal.SIGQUIT))
        conn, pid = jvm.accept()
        states.append(_signal_state(pid))
        proxy.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proxy.poll() is None and _alive(pid)
        conn.close()
        proxy.communicate(timeout=30)
    assert states[0] == states[1], states


def _limits(pid: int) -> str:
    return Path(f"/proc/{pid}/limits").read_text()


def test_a_forked_runner_has_the_resource_limits_and_umask_of_its_process(server: fork_server.ForkServer,
                                                                          tmp_path: Path) -> None:
    """The JVM raises its open files' soft limit to the hard one and the processes it starts inherit it;
    a fork has the limits and umask of the process it becomes, not the server's (its driver's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(64, soft // 2)

    def differ() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        os.umask(0o077)

    jvm = FakeJvm(tmp_path)
    seen = []
    for fork_socket in (server.socket_path, None):
        proxy = jvm.start_runner(fork_socket, preexec=differ)
        conn, pid = jvm.accept()
        assert (pid != proxy.pid) == (fork_socket is not None)
        umask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("Umask"))
        seen.append((_limits(pid), umask))
        conn.close()
        proxy.communicate(timeout=30)
    assert seen[0] == seen[1], seen
    assert f"{wanted}" in seen[1][0] and "0077" in seen[1][1]


def test_the_commands_forked_are_the_modules_spark_and_the_job_start() -> None:
    from firehose_bq.worker_startup import sitecustomize

    assert sitecustomize.FORKED == {fork_server.RUNNER_MODULE: 0, fork_server.PYSPARK_DAEMON: 1,
                                    worker_daemon.__name__: 1}
    assert sitecustomize.forkable(["-m", fork_server.PYSPARK_DAEMON, "pyspark.sql.worker.plan_data_source_read"])
    assert not sitecustomize.forkable(["-m", fork_server.PYSPARK_DAEMON])
    assert not sitecustomize.forkable(["-m", fork_server.PYSPARK_DAEMON, "os; import x"])
    assert not sitecustomize.forkable(["-m", fork_server.RUNNER_MODULE, "extra"])
    assert not sitecustomize.forkable(["-c", "import pyspark.daemon"])


REQUEST = {"argv": [PYTHON, "-m", fork_server.RUNNER_MODULE], "env": {}, "cwd": "/", "python": PYTHON,
           "signals": {"ignored": [13], "blocked": []}, "limits": {}, "umask": 0o022,
           "pyspark": "/x/pyspark/__init__.py", "path": ["/x"]}


@pytest.mark.parametrize(("change", "descriptors", "reason"), [
    ({}, 3, None),
    ({}, 2, "2 descriptors"),
    ({"argv": [PYTHON, "-m", "pyspark.daemon"]}, 3, "not a process this server forks"),
    ({"argv": [PYTHON, "-c", "import os"]}, 3, "not a process this server forks"),
    ({"argv": [PYTHON, "-m", "pyspark.daemon", 7]}, 3, "not a process this server forks"),
    ({"python": "/usr/bin/python3.9"}, 3, "another Python"),
    ({"pyspark": "/opt/spark/python/lib/pyspark.zip/pyspark/__init__.py"}, 3, "another pyspark"),
    ({"env": None}, 3, "no environment"),
    ({"signals": None}, 3, "no signal dispositions"),
    ({"signals": {"ignored": ["SIGINT"], "blocked": []}}, 3, "no signal dispositions"),
    ({"limits": None}, 3, "no resource limits"),
    ({"umask": "022"}, 3, "no resource limits or umask"),
    ({"path": None}, 3, "no import path"),
    ({"path": ["/x", 3]}, 3, "no import path"),
    ({"limits": {str(int(resource.RLIMIT_NOFILE)): [64, resource.RLIM_INFINITY]}}, 3, None)
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] == resource.RLIM_INFINITY else
    ({"limits": {str(int(resource.RLIMIT_NOFILE)): [64, resource.RLIM_INFINITY]}}, 3, "hard resource limits"),
    ({"env": {"PYTHONHASHSEED": "0"}}, 3, "other PYTHONHASHSEED"),
    ({"env": {"PYTHONUNBUFFERED": "YES"}}, 3, "other PYTHONUNBUFFERED"),
    ({"env": {"PYTHONUNBUFFERED": ""}}, 3, None),  # empty: not set, as Python reads it
    ({"env": {"PYSPARK_ENABLE_NAMEDTUPLE_PATCH": "1"}}, 3, "other PYSPARK_ENABLE_NAMEDTUPLE_PATCH"),
    # Python reads these only as it starts too (python --help-env, -X's): a fork would keep the server's.
    ({"env": {"PYTHONTRACEMALLOC": "5"}}, 3, "other PYTHONTRACEMALLOC"),
    ({"env": {"PYTHONINTMAXSTRDIGITS": "0"}}, 3, "other PYTHONINTMAXSTRDIGITS"),
    ({"env": {"PYTHONPYCACHEPREFIX": "/tmp/pyc"}}, 3, "other PYTHONPYCACHEPREFIX"),
    ({"env": {"PYTHONHOME": "/opt/py"}}, 3, "other PYTHONHOME"),
    ({"env": {"PYTHONVERBOSE": "2"}}, 3, "other PYTHONVERBOSE"),
    ({"env": {"PYTHONDONTWRITEBYTECODE": "x"}}, 3, "other PYTHONDONTWRITEBYTECODE"),
    ({"env": {"PYTHONPROFILEIMPORTTIME": "1"}}, 3, "other PYTHONPROFILEIMPORTTIME"),
    ({"env": {"PYTHONNODEBUGRANGES": "1"}}, 3, "other PYTHONNODEBUGRANGES"),
    ({"env": {"PYTHONWARNDEFAULTENCODING": "1"}}, 3, "other PYTHONWARNDEFAULTENCODING"),
    ({"env": {"PYTHONCOERCECLOCALE": "0"}}, 3, "other PYTHONCOERCECLOCALE"),
    # Read by the C library and the dynamic loader as the process starts: spark.executorEnv.MALLOC_ARENA_MAX
    # or LD_PRELOAD=libjemalloc.so would not reach a fork, which keeps the server's.
    ({"env": {"MALLOC_ARENA_MAX": "2"}}, 3, "other MALLOC_ARENA_MAX"),
    ({"env": {"MALLOC_MMAP_THRESHOLD_": "65536"}}, 3, "other MALLOC_MMAP_THRESHOLD_"),
    ({"env": {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}}, 3, "other LD_PRELOAD"),
    ({"env": {"LD_LIBRARY_PATH": "/opt/native/lib"}}, 3, "other LD_LIBRARY_PATH"),
    ({"env": {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}}, 3, "other GLIBC_TUNABLES"),
])
def test_only_known_commands_of_the_same_python_and_pyspark_are_forked(change: dict[str, object], descriptors: int,
                                                                  reason: str | None) -> None:
    found = fork_server.refusal({**REQUEST, **change}, descriptors, PYTHON, "/x/pyspark/__init__.py",
                                fork_server.started_with({}))
    assert found == reason if reason is None else reason in (found or "")


def test_the_server_reads_the_archives_spark_puts_on_its_processes_path_before_the_first_request() -> None:
    # PythonUtils.sparkPythonPath for a pip install: pyspark's python/lib zips and the spark-core jar.
    names = [os.path.basename(path) for path in fork_server.spark_archives()]
    assert any(n.startswith("spark-core_") and n.endswith(".jar") for n in names), names
    assert any(n.startswith("py4j-") and n.endswith(".zip") for n in names), names
    assert all(os.path.isabs(path) for path in fork_server.spark_archives())


def _worker_answer(port: int, secret: str) -> str:
    """Connect to a pyspark.daemon at `port` as Spark's PythonWorkerFactory does; the worker's one answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        infile, outfile = sock.makefile("rb"), sock.makefile("wb")
        assert infile.read(4)  # the worker's pid: the daemon forked it
        outfile.write(struct.pack("!i", len(secret)) + secret.encode())
        outfile.flush()
        assert infile.read(struct.unpack("!i", infile.read(4))[0]) == b"ok"
        return infile.read(struct.unpack("!i", infile.read(4))[0]).decode()


def test_a_forked_daemons_workers_see_local_time_in_the_time_zone_of_their_process(
        server: fork_server.ForkServer, tmp_path: Path) -> None:
    """spark.executorEnv.TZ, or a driver whose TZ changed after the server started: a Python process Spark
    starts reads TZ as it imports `time`; a fork's C library kept the server's, so its local time (a UDF's
    datetime.fromtimestamp, a naive datetime's conversion by PySpark) was the server's."""
    probe = tmp_path / "probe"
    probe.mkdir()
    # The daemon imports its worker module from the process's path when its name starts with "pyspark".
    (probe / "pyspark_tz_probe.py").write_text(
        "import time\n"
        "from pyspark.serializers import write_with_length\n"
        "def main(infile, outfile):\n"
        "    write_with_length(time.strftime('%z %Z', time.localtime(0)).encode(), outfile)\n"
        "    outfile.flush()\n")
    zone = "FHB-5:45" if time.strftime("%z", time.localtime(0)) != "+0545" else "FHB+3"  # not the server's
    env = {"PYTHONPATH": f"{WORKER_STARTUP}{os.pathsep}{probe}", "TZ": zone, "PYTHON_WORKER_FACTORY_SECRET": "s"}
    jvm = FakeJvm(tmp_path)
    seen = []
    for fork_socket in (server.socket_path, None):
        before = _children(server.process.pid)
        proxy = jvm.start_runner(fork_socket, fork_server.PYSPARK_DAEMON, "pyspark_tz_probe", extra_env=env)
        port = struct.unpack("!i", proxy.stdout.read(4))[0]  # type: ignore[union-attr]
        assert len(_children(server.process.pid) - before) == (1 if fork_socket else 0)
        seen.append(_worker_answer(port, "s"))
        proxy.stdin.close()  # type: ignore[union-attr]
        proxy.wait(timeout=30)
    assert seen[0] == seen[1], seen
    assert seen[1] == ("+0545 FHB" if zone == "FHB-5:45" else "-0300 FHB"), seen
