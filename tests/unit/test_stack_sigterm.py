"""A stack owned by a process (a test session's, a benchmark's) stops with it, also when the process is stopped
with SIGTERM: devstack.stack.owned_stack and interrupted_by_sigterm. The signals go to child processes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from firehose_bq.devstack import stack as stack_mod

# Waits in a block under interrupted_by_sigterm; its `finally` writes argv[1] (after argv[2] seconds).
CHILD = """
import sys, time
from firehose_bq.devstack.stack import interrupted_by_sigterm
try:
    with interrupted_by_sigterm():
        try:
            print("ready", flush=True)
            time.sleep(30)
        finally:
            print("cleaning", flush=True)
            time.sleep(float(sys.argv[2]))
            open(sys.argv[1], "w").write("cleaned")
except KeyboardInterrupt as exc:
    print(exc, flush=True)
    sys.exit(3)
"""


def _started(marker: Path, cleanup_s: float) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), str(cleanup_s)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_sigterm_runs_the_blocks_cleanup(tmp_path: Path) -> None:
    child = _started(tmp_path / "marker", 0)
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=20)
    assert child.returncode == 3, out
    assert "stopped by signal 15" in out
    assert (tmp_path / "marker").read_text() == "cleaned"


def test_a_second_sigterm_ends_the_process_as_usual(tmp_path: Path) -> None:
    child = _started(tmp_path / "marker", 30)
    child.send_signal(signal.SIGTERM)
    assert child.stdout is not None and child.stdout.readline() == "cleaning\n"
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=20)
    assert child.returncode == -signal.SIGTERM
    assert not (tmp_path / "marker").exists()


def test_the_previous_handler_is_back_after_the_block() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stack_mod.interrupted_by_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_owned_stack_stops_when_the_block_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class FakeStack:
        def __init__(self, cfg: object) -> None:
            calls.append("made")

        def up(self, report: object = None) -> None:
            calls.append("up")

        def down(self, report: object = None) -> None:
            calls.append("down")

    monkeypatch.setattr(stack_mod, "Stack", FakeStack)
    with pytest.raises(KeyboardInterrupt):
        with stack_mod.owned_stack(object()):  # type: ignore[arg-type]
            raise KeyboardInterrupt
    assert calls == ["made", "up", "down"]


def test_an_owned_stack_interrupted_while_it_starts_stops_what_started(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class StartingStack:
        def __init__(self, cfg: object) -> None:
            pass

        def up(self, report: object = None) -> None:
            calls.append("broker up")
            raise KeyboardInterrupt  # SIGTERM before the emulators started

        def down(self, report: object = None) -> None:
            calls.append("down")

    monkeypatch.setattr(stack_mod, "Stack", StartingStack)
    with pytest.raises(KeyboardInterrupt):
        with stack_mod.owned_stack(object()):  # type: ignore[arg-type]
            calls.append("block")
    assert calls == ["broker up", "down"]
