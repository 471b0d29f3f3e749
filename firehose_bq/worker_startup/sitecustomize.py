"""Imported by Python at start-up in Spark's Python worker processes, and only there: `spark.py` puts
this directory on their PYTHONPATH (spark.executorEnv.PYTHONPATH). It must never fail, and it changes
nothing unless the one case below is certain.

Spark puts $SPARK_HOME/python/lib/pyspark.zip first on every worker's PYTHONPATH. Python keeps no
bytecode for modules imported from a zip, so each new worker process compiles pyspark from source
again: 0.4-0.9 s here, paid by every streaming query, since Spark starts a fresh source-runner
process per query for a Python data source. When that zip is the one shipped *inside* the pyspark
package this interpreter has installed (a `pip install pyspark` SPARK_HOME, as in local mode or a
cluster whose executors run from the same install or venv), both are the same release from one
wheel, so the zip moves to the end of sys.path and pyspark is imported from the installed, compiled
files instead. A Spark distribution with its own SPARK_HOME (/opt/spark, YARN, Kubernetes images)
ships a zip elsewhere, which may differ from what pip installed: it stays first, as Spark intends;
so it does when anything else on the path (another zip, a source tree) would supply pyspark instead.

Then, in the processes Spark starts on the driver that the job's fork server takes over (FORKED: the
source runner, the planning and the workers' daemons; firehose_bq/fork_server.py says why), this process
hands itself over to the server and stays only as the forked child's stand-in (`hand_over`). Where there
is no server (an executor of a cluster, SPARK_PYTHON_FORK_SERVER=false) or it cannot take over, the
process starts as Spark started it.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def prefer_installed_pyspark(path: list[str]) -> None:
    """Move Spark's pyspark.zip to the end of `path` when the pyspark that is then imported instead is an
    installed package that ships that very zip."""
    for entry in [e for e in path if os.path.basename(e) == "pyspark.zip"]:
        rest = [e for e in path if e != entry]
        # Exactly what the import system would find without the zip (another zip, a source tree, ...).
        spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
        if spec is None or spec.origin is None:
            continue
        shipped = os.path.join(os.path.dirname(spec.origin), "python", "lib", "pyspark.zip")
        if os.path.realpath(entry) == os.path.realpath(shipped):
            path[:] = [*rest, entry]


# What the driver's fork server (firehose_bq/fork_server.py, which says why) listens on, and the commands it
# takes over: `python -m <module>` with as many arguments (module names) as FORKED says. Kept here, not
# imported: this module must stay cheap for every process.
FORK_SERVER_SOCKET_ENV = "FIREHOSE_BQ_FORK_SERVER_SOCKET"
FORKED = {"pyspark.sql.streaming.python_streaming_source_runner": 0, "pyspark.daemon": 1,
          "firehose_bq.worker_daemon": 1}
_FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def forkable(args: list[str]) -> bool:
    """Whether `python <args>` is a command the fork server forks."""
    if len(args) < 2 or args[0] != "-m" or args[1] not in FORKED or len(args) - 2 != FORKED[args[1]]:
        return False
    return all(all(part.isidentifier() for part in arg.split(".")) for arg in args[2:])


def hand_over() -> None:
    """In a process Spark started that the driver's fork server forks (FORKED): have the server fork it with
    this process's environment and stdio, then pass it Spark's signals and exit with its status (never
    returns). Returns, for Spark's own start, whenever the server cannot take over."""
    path = os.environ.get(FORK_SERVER_SOCKET_ENV)
    args = list(getattr(sys, "orig_argv", ())[1:])
    if not path or not forkable(args) or _next_sitecustomize() is not None:
        return  # another sitecustomize (the user's, on their PYTHONPATH) must run: the fork would skip it
    import json
    import signal
    import socket
    import struct
    from array import array

    def exactly(conn: socket.socket, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    spec = importlib.machinery.PathFinder.find_spec("pyspark", sys.path)
    request = json.dumps({
        "argv": list(sys.orig_argv), "env": dict(os.environ), "cwd": os.getcwd(),
        "python": os.path.realpath(sys.executable),
        "pyspark": os.path.realpath(spec.origin) if spec is not None and spec.origin else None,
        "signals": signal_state(), "limits": limits(), "umask": _umask(),
        "path": sys.path,  # the workers' PYTHONPATH as Spark gave it (user entries after ours)
    }).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.sendmsg([struct.pack("!I", len(request)), request],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [0, 1, 2]).tobytes())])
        answer = exactly(conn, 8)
    except OSError:
        answer = None
    pid = struct.unpack("!q", answer)[0] if answer is not None else 0
    if pid <= 0:
        conn.close()
        return
    # From here on the child is the process: this one only stands for it, and never runs a second one.
    try:
        if FORKED[args[1]]:
            # A daemon Spark starts leads a process group of its own (PySpark's daemon moves there first):
            # so does its stand-in, out of reach of the terminal's Ctrl-C, Ctrl-\ and hang-up.
            os.setpgid(0, 0)
        for name in _FORWARDED:
            # One this process ignores (the JVM's children inherit SIGINT ignored) reaches neither: the
            # child ignores it too (signal_state).
            if signal.getsignal(getattr(signal, name)) != signal.SIG_IGN:
                signal.signal(getattr(signal, name), lambda signum, _frame: _signal(pid, signum))
        status = exactly(conn, 4)
    except BaseException:  # noqa: BLE001
        status = None
    if status is None:  # the server died: the child must not outlive its stand-in
        _signal(pid, signal.SIGKILL)
        os._exit(1)
    code = os.waitstatus_to_exitcode(struct.unpack("!i", status)[0])
    if code < 0:  # killed by a signal: die of it too, as Spark would have seen it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def signal_state() -> dict[str, list[int]]:
    """The signals this process ignores and blocks, as it inherited them from whoever started it (and
    Python's start-up set them: SIGPIPE ignored; SIGINT a KeyboardInterrupt unless it was ignored). The
    forked child takes them on (fork_server.inherit_signals) instead of the server's."""
    import signal

    ignored = []
    for signum in signal.valid_signals():
        try:
            if signal.getsignal(signum) == signal.SIG_IGN:
                ignored.append(int(signum))
        except (OSError, ValueError):
            pass
    return {"ignored": ignored, "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}


def limits() -> dict[str, list[int]]:
    """This process's resource limits (soft, hard) by number: what the JVM had (it raises its open files'
    soft limit to the hard one, and its children inherit that), for the forked child to take on."""
    import resource

    return {str(int(getattr(resource, name))): list(resource.getrlimit(getattr(resource, name)))
            for name in dir(resource) if name.startswith("RLIMIT_")}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _next_sitecustomize() -> importlib.machinery.ModuleSpec | None:
    """The `sitecustomize` this module shadows (a distribution's or the user's), if there is one."""
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    return spec if spec is not None and spec.loader is not None else None


def _run_next_sitecustomize() -> None:
    """This module shadows any other `sitecustomize`: run that one too."""
    import importlib.util

    spec = _next_sitecustomize()
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # run by Python's start-up, not imported by a test
    try:
        prefer_installed_pyspark(sys.path)
    except Exception:  # noqa: BLE001 - start-up must go on exactly as Spark set it up
        pass
    try:
        hand_over()
    except Exception:  # noqa: BLE001 - as above: Spark's own start
        pass
    _run_next_sitecustomize()
