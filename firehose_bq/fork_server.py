"""A fork server for the Python processes Spark starts on the driver: each starts with its imports done.

Spark starts Python processes of its own, each a fresh interpreter that imports pyspark, pyarrow, numpy and
what it runs (0.3-0.8 s of CPU each, on the job's critical path):
- per streaming query, the source's runner (`python -m pyspark.sql.streaming.python_streaming_source_runner`:
  the Kafka source's offsets, partitions and commits; never from a daemon). Half of what a warm
  1,000-message query costs from start to end went into its imports;
- once per session, the daemons of the planning processes (`python -m pyspark.daemon
  pyspark.sql.worker.<step>`: looking the data source up, creating it, planning its reads) and the
  workers' daemon (`python -m firehose_bq.worker_daemon pyspark.worker`, which imports the batch core).
  Spark starts them one at a time (`SparkEnv.createPythonWorker` is synchronized), so while one imports,
  the query's planning waits: ≈ 1 s of a fresh job's first batch (README: Performance).

So the driver starts this server first thing, before the JVM; it imports all of that once, while the JVM
starts, and listens on a Unix socket in a private directory. The processes Spark starts still start, but
their `sitecustomize` (worker_startup/sitecustomize.py, on the Python workers' path) hands over before
Python imports anything else: it sends its command line, environment and working directory, with its
stdin, stdout and stderr, to the server, which forks a child that becomes that process: the same
environment, the same descriptors (the JVM's pipes), the same module run as `__main__`. The process Spark
started stays as the child's proxy: it passes on the signals Spark sends it and exits with the child's
status. Either side going away ends the other: a proxy that dies has its child killed, a server that
dies has the proxies kill theirs.

Anything unexpected keeps Spark's own start: no server yet (still importing) or none at all, a connection
refused, a process of another Python or of another pyspark than the server imported, a module that started
a thread while importing (forking would be unsafe: worker_daemon.preload checks). The process then starts
as it always did. Only the commands in worker_startup/sitecustomize.py FORKED are ever run. Executors on other machines have no server:
their daemons start as before.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from firehose_bq import logs, worker_daemon
from firehose_bq.worker_startup import sitecustomize as startup

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
PYSPARK_DAEMON = "pyspark.daemon"
PLANNING_MODULES = ("pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
                    "pyspark.sql.worker.plan_data_source_read")
# Where the processes' sitecustomize finds the server, and the commands it hands over (startup.FORKED).
SOCKET_ENV = startup.FORK_SERVER_SOCKET_ENV
PRELOADED = (RUNNER_MODULE, PYSPARK_DAEMON, *PLANNING_MODULES, *worker_daemon.modules_for(worker_daemon.PYSPARK_WORKER))
SOCKET_NAME = "fork.sock"
# The request: a 4-byte length, then JSON {argv, env, cwd, python, pyspark}, with fds 0-2 attached. The
# answers: the child's pid as 8 bytes (0: refused, start as usual), then its wait status as 4 bytes.
LENGTH = struct.Struct("!I")
PID = struct.Struct("!q")
STATUS = struct.Struct("!i")
MAX_REQUEST = 16 * 1024 * 1024
STDIO = 3
RECEIVE_TIMEOUT_S = 5.0
PR_SET_NAME = 15  # prctl(2)
# What Python reads from the environment only as it starts, so a fork keeps the server's: a process whose
# values differ starts as usual. Spark gives all its Python processes PYTHONUNBUFFERED and PYTHONHASHSEED
# (PySpark's portable_hash relies on it): the driver starts the server with Spark's values (spark.py).
# The flags count as set or not, as Python reads them. All of `python --help-env` and the -X options'
# variables but PYTHONPATH (the fork takes the process's import path), PYTHONSTARTUP (interactive only),
# PYTHONCASEOK (not on Linux) and PYTHONBREAKPOINT (read at each breakpoint()).
START_ENV = ("PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONMALLOC", "PYTHONWARNINGS", "PYTHONOPTIMIZE",
             "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONINTMAXSTRDIGITS", "PYTHONCOERCECLOCALE", "PYTHONPYCACHEPREFIX",
             "PYTHONTRACEMALLOC", "PYTHONVERBOSE", "PYTHONDEBUG")
START_FLAGS = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDEVMODE", "PYTHONDONTWRITEBYTECODE", "PYTHONINSPECT",
               "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONWARNDEFAULTENCODING", "PYTHONNODEBUGRANGES",
               "PYTHONPROFILEIMPORTTIME", "PYTHONMALLOCSTATS")
# What the C library and its dynamic loader read only as a process starts: a fork keeps the server's
# malloc settings and loaded libraries, so a process Spark starts with other ones (spark.executorEnv.*:
# MALLOC_ARENA_MAX, LD_PRELOAD=libjemalloc.so, a native library's LD_LIBRARY_PATH) is not forked. The
# server starts with the workers' own WORKER_MALLOC_ENV (spark.py), which a value the user set wins over.
LIBC_START_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST",
                  "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_PERTURB_", "MALLOC_CHECK_")
# Read by preloaded modules as they import (pyspark.serializers, pyspark.worker_util): a fork has the
# server's view of them, so they must be the same too.
IMPORT_ENV = ("PYSPARK_ENABLE_NAMEDTUPLE_PATCH", "SPARK_TESTING")
# Who the server's lines on stderr come from (run as `python -m`, its __name__ is __main__).
LOGGER = "firehose_bq.fork_server"


@dataclass
class ForkServer:
    """The driver's handle on the server process: its socket path, for the Python processes' environment."""

    process: subprocess.Popen[bytes]
    directory: str
    socket_path: str = field(init=False)

    def __post_init__(self) -> None:
        self.socket_path = os.path.join(self.directory, SOCKET_NAME)

    def close(self) -> None:
        """Stop accepting; processes already forked run on until Spark stops them."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_shared: ForkServer | None = None


def shared(environ: Mapping[str, str]) -> ForkServer | None:
    """This process's server, started (`start`) on first use: one serves every session the process starts
    (a stopped session's and the next one's processes alike), rather than one per session, each running,
    with its imports, until the process ends. The reference also keeps its stdin open: the server's life."""
    global _shared
    if _shared is None or _shared.process.poll() is not None or not os.path.isdir(_shared.directory):
        _shared = start(environ)
    return _shared


def start(environ: Mapping[str, str]) -> ForkServer | None:
    """Start the server in the background (it imports for ≈ 1 s, then listens); None where it cannot run.
    `environ`: its environment, which C libraries read once, at start (glibc's malloc settings).
    It ends when its stdin (this process's pipe) closes and the processes it forked have ended."""
    if not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX") or not hasattr(socket.socket, "sendmsg"):
        return None
    directory = tempfile.mkdtemp(prefix="firehose-bq-fork-")  # 0700: only this user may connect
    process = subprocess.Popen([sys.executable, "-m", __name__, directory], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, env=dict(environ), close_fds=True)
    return ForkServer(process, directory)


def pyspark_origin() -> str | None:
    import pyspark

    return os.path.realpath(pyspark.__file__) if pyspark.__file__ else None


def spark_archives() -> list[str]:
    """The archives Spark puts on the path of the Python processes it starts, as this pyspark installs them
    (PythonUtils.sparkPythonPath: SPARK_HOME's python/lib/pyspark.zip and py4j's zip, and the spark-core
    jar; SPARK_HOME is pyspark's directory for a pip install), looked at here before the first request.
    Should the JVM name them otherwise, the first request that does pays instead (`_accept`)."""
    import pyspark

    homes = {os.path.dirname(os.path.abspath(pyspark.__file__))} if pyspark.__file__ else set()
    if os.environ.get("SPARK_HOME"):
        homes.add(os.path.abspath(os.environ["SPARK_HOME"]))
    return sorted(path for home in homes
                  for path in (*glob.glob(os.path.join(home, "python", "lib", "*.zip")),
                               *glob.glob(os.path.join(home, "jars", "spark-core_*.jar"))))


@dataclass
class _Child:
    pid: int
    conn: socket.socket | None  # the proxy's connection; None once the proxy is gone


class _Server:
    def __init__(self, directory: str, started_env: Mapping[str, str]) -> None:
        self.directory = directory
        path = os.path.join(directory, SOCKET_NAME)
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path + ".tmp")
        self.listener.listen(16)
        os.rename(path + ".tmp", path)  # connectable only once it listens
        self.children: dict[int, _Child] = {}
        self.accepting = True
        self.python = os.path.realpath(sys.executable)
        self.pyspark = pyspark_origin()
        self.started = started_with(started_env)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def serve(self) -> None:
        while self.accepting or self.children:
            for key, _ in self.selector.select():
                what = key.data
                if what == "accept":
                    self._accept()
                elif what == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self._stop_accepting()
                elif what == "wake":
                    os.read(self.wake_r, 4096)
                    self._reap()
                else:  # a proxy's connection: readable means closed (it sends nothing more)
                    self._proxy_gone(what)

    def _stop_accepting(self) -> None:
        self.accepting = False
        self.selector.unregister(sys.stdin.fileno())
        self.selector.unregister(self.listener)
        self.listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(RECEIVE_TIMEOUT_S)  # a proxy that never sends must not hold the server
        fds: list[int] = []
        try:
            request, fds = _receive(conn)
            refusal = self._refusal(request, fds)
            if refusal is not None:
                _say(f"firehose-bq fork server: not forking ({refusal}); the process starts as usual")
                conn.sendall(PID.pack(0))
                conn.close()
                return
            # Once here for every process that imports from these entries, rather than once in each of them.
            worker_daemon.cache_import_paths(request["path"])
            pid = os.fork()
            if pid == 0:
                conn.close()
                self._become(request, fds)  # never returns
        except Exception:  # noqa: BLE001 - a bad request must not end the server; the proxy falls back
            _say("firehose-bq fork server: a request failed; the process starts as usual", logging.ERROR,
                 exc_info=True)
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = _Child(pid, conn)
        self.selector.register(conn, selectors.EVENT_READ, pid)
        try:
            conn.sendall(PID.pack(pid))
        except OSError:
            self._proxy_gone(pid)

    def _refusal(self, request: dict[str, Any], fds: Sequence[int]) -> str | None:
        return refusal(request, len(fds), self.python, self.pyspark, self.started)

    def _become(self, request: dict[str, Any], fds: Sequence[int]) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            inherit_signals(request["signals"])
            for number, (soft, hard) in request["limits"].items():
                resource.setrlimit(int(number), (soft, hard))
            os.umask(request["umask"])
            # Out of the terminal's process group: the terminal's signals reach it only through its stand-in
            # (which forwards what it does not ignore), as they would reach the process Spark started.
            os.setpgid(0, 0)
            self.selector.close()
            self.listener.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for child in self.children.values():
                if child.conn is not None:
                    child.conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd >= STDIO:
                    os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            # Python's local time (time.localtime, datetime's, through localtime_r) is in the zone the C library
            # read from TZ at tzset(), which Python calls once, as it imports `time` (whose timezone and tzname
            # keep what it read): read TZ again, as the process would have at its start. Unlike the start-up
            # settings above, this can be redone, so a TZ other than the server's (spark.executorEnv.TZ) keeps
            # the fork; no preloaded module keeps a local zone of its own (module-level tzinfos are UTC ones).
            time.tzset()
            sys.path[:] = request["path"]  # where the process would import from (the preloads stay as they are)
            os.chdir(request["cwd"])
            import runpy

            module, args = request["argv"][2], request["argv"][3:]
            sys.argv = [module, *args]
            _name_process(process_name(module))
            # Run as `python -m` runs it: a fresh __main__ from the module's code (its imports stay done).
            sys.modules.pop(module, None)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - report as the failed process would, then exit
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code & 0xFF)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None or child.conn is None:
                continue
            self.selector.unregister(child.conn)
            try:
                child.conn.sendall(STATUS.pack(status))
            except OSError:
                pass
            child.conn.close()

    def _proxy_gone(self, pid: int) -> None:
        """The process Spark started went away (Spark killed it): so does the child that stood in for it."""
        child = self.children.get(pid)
        if child is None or child.conn is None:
            return
        self.selector.unregister(child.conn)
        child.conn.close()
        child.conn = None  # reaped by _reap like any other child; its status has nobody to go to
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _say(message: str, level: int = logging.WARNING, exc_info: bool = False) -> None:
    """A line of the server's on stderr, in the job's LOG_FORMAT (spark.fork_server_env) without logging
    configured: every fork would start with it, and Spark's processes start with logging untouched."""
    logs.say_unconfigured(LOGGER, level, message, os.environ, exc_info)


def inherit_signals(state: Mapping[str, Sequence[int]]) -> None:
    """Take on the signal dispositions and mask of the process Spark started (startup.signal_state), as
    that process had them from the JVM, instead of the server's (which ignores SIGINT, catches SIGCHLD,
    and has its driver's). A JVM's children ignore SIGINT: PySpark starts the JVM so, as a Ctrl-C is the
    driver's to handle (it stops after the running micro-batch); a forked daemon that took it as a
    KeyboardInterrupt would end, and take that batch's workers with it."""
    ignored = set(state["ignored"])
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if signum in ignored:
            handler: Any = signal.SIG_IGN
        elif signum == signal.SIGINT:  # what Python's start-up installs where SIGINT is not ignored
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        try:
            signal.signal(signum, handler)
        except (OSError, ValueError):  # the C library's own (32, 33): not Python's to set
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, state["blocked"])


def process_name(module: str) -> str:
    """What `ps -o comm`, top and /proc/<pid>/comm call a forked process (its command line stays the
    server's): the last part of its module, in the kernel's 15 bytes."""
    return module.rpartition(".")[2][:15]


def _name_process(name: str) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name stays the server's
        pass


def started_with(environ: Mapping[str, str]) -> dict[str, str | bool | None]:
    """What of `environ` Python or its C library reads only as it starts, or preloaded modules as they import
    (START_ENV, LIBC_START_ENV, START_FLAGS, IMPORT_ENV)."""
    return {**{name: environ.get(name) for name in (*START_ENV, *LIBC_START_ENV, *IMPORT_ENV)},
            **{name: bool(environ.get(name)) for name in START_FLAGS}}


def refusal(request: Mapping[str, Any], descriptors: int, python: str, pyspark: str | None,
            started: Mapping[str, str | bool | None]) -> str | None:
    """Why a request must not be forked from a server running `python` with `pyspark` imported, started
    with `started` (started_with), or None."""
    if descriptors != STDIO:
        return f"{descriptors} descriptors passed, expected {STDIO}"
    argv = request.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not startup.forkable(argv[1:]):
        return f"not a process this server forks: {request.get('argv')!r}"
    if request.get("python") != python:
        return f"another Python ({request.get('python')}, this server runs {python})"
    if pyspark is None or request.get("pyspark") != pyspark:
        return f"another pyspark ({request.get('pyspark')}, this server imported {pyspark})"
    if not isinstance(request.get("env"), dict) or not isinstance(request.get("cwd"), str):
        return "no environment or working directory"
    differ = sorted(k for k, v in started_with(request["env"]).items() if started.get(k) != v)
    if differ:
        return f"Python started with other {', '.join(differ)} than this server"
    signals = request.get("signals")
    if not isinstance(signals, dict) or not all(
            isinstance(signals.get(k), list) and all(isinstance(n, int) for n in signals[k])
            for k in ("ignored", "blocked")):
        return "no signal dispositions"
    path = request.get("path")
    if not isinstance(path, list) or not all(isinstance(entry, str) for entry in path):
        return "no import path"
    limits, umask = request.get("limits"), request.get("umask")
    if not isinstance(limits, dict) or not isinstance(umask, int) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(n, int) for n in v) for v in limits.values()):
        return "no resource limits or umask"
    above = [number for number, (_, hard) in limits.items() if not _within(hard, resource.getrlimit(int(number))[1])]
    if above:  # a fork cannot raise a hard limit (unprivileged)
        return f"hard resource limits {', '.join(above)} above this server's"
    return None


def _within(limit: int, ceiling: int) -> bool:
    """Whether resource limit `limit` is at most `ceiling` (RLIM_INFINITY above all)."""
    if ceiling == resource.RLIM_INFINITY:
        return True
    return limit != resource.RLIM_INFINITY and limit <= ceiling


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request and the descriptors that came with it; a request that cannot be read closes them (they
    are the process's stdio: a copy kept here would keep its pipes open)."""
    fds = array("i")
    data = b""
    header, ancillary, _, _ = conn.recvmsg(LENGTH.size, socket.CMSG_SPACE(STDIO * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    try:
        if len(header) != LENGTH.size:
            raise ValueError("truncated request")
        (length,) = LENGTH.unpack(header)
        if length > MAX_REQUEST:
            raise ValueError(f"request of {length} bytes")
        while len(data) < length:
            chunk = conn.recv(length - len(data))
            if not chunk:
                raise ValueError("truncated request")
            data += chunk
        return json.loads(data), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def main(argv: Sequence[str]) -> None:
    directory = argv[1]
    # A Ctrl-C goes to the terminal's whole process group: the driver decides how the job stops, and this
    # server ends with it (its stdin closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started_env = dict(os.environ)  # before preloading sets what the workers' daemon sets
    try:
        unsafe = worker_daemon.preload(PRELOADED)
        if unsafe is not None:
            # Spark's processes start as Spark starts them; say why once.
            _say(f"firehose-bq fork server: not serving ({unsafe})")
            return
        server = _Server(directory, started_env)
        worker_daemon.cache_import_paths(spark_archives())
        server.serve()
    except FileNotFoundError:  # the driver removed the directory: it has stopped already
        return
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
