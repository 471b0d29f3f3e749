"""A process and everything it started, read from /proc: for RSS sampling (P4) and for killing a job's
whole tree in the fault test. Spark's Python worker daemon puts itself in a process group of its own,
so the tree is followed by parent PID, not by process group."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgrp: int
    rss_bytes: int
    name: str
    cpu_seconds: float = 0.0  # its own user + system time and that of the children it has reaped


def _read(pid: int) -> Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # exited between listing and reading
    # The command name is in parentheses and may hold spaces: split after its closing one.
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5): ppid is field 4, pgrp 5, utime..cstime 14-17, rss (pages) 24.
    if fields[0] == "Z":
        return None  # a zombie holds no memory and runs nothing
    ticks = sum(int(f) for f in fields[11:15])
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[21]) * PAGE_BYTES, name, ticks / CLOCK_TICKS)


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (Spark's Python workers are forks of one daemon) are split
    between the processes sharing them, so a sum over processes counts each page once, unlike RSS."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # exited meanwhile
    return 0


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" once it has exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def processes() -> dict[int, Proc]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (proc := _read(int(entry.name))) is not None:
            found[proc.pid] = proc
    return found


def tree(root: int) -> list[Proc]:
    """`root` and its live descendants."""
    procs = processes()
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    result, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            result.append(procs[pid])
        todo.extend(children.get(pid, []))
    return result


def kill_tree(root: int) -> list[Proc]:
    """SIGKILL `root`, its descendants and the process groups they lead (so a worker forked meanwhile dies
    too; a group led from outside the tree, such as the caller's own, is left alone); returns the victims."""
    victims = tree(root)
    pids = {p.pid for p in victims}
    for group in {p.pgrp for p in victims} & pids:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in victims:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims
