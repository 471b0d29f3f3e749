"""Concurrent requests each get a connection of their own to the one database.

BigQuery serves any number of concurrent requests. bqemulator runs every request, REST handlers in
worker threads and Storage Write appends in gRPC threads alike, on ONE DuckDB connection, which refuses a
call while another is running ("Resource In Use Error: connection is busy with another call"): a query
made while a task appends fails with HTTP 400, and an execute that lands between another thread's execute
and its fetch would even hand that thread someone else's result. Every thread now uses its own cursor of
the engine's connection (DuckDB's way to share one database between threads: tables, settings and
functions are shared; what a thread registers, such as an Arrow view, stays its own, which is how the
emulator uses it, within one call).

Shown by tests/integration/test_emulator_gaps.py::test_queries_run_while_rows_are_appended.
"""

import threading
from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """`DuckDBEngine.connection` returns the calling thread's own cursor of the engine's connection."""
    engine_module = module("bqemulator.storage.engine")
    engine_class = require(engine_module, "DuckDBEngine")
    shared = require(engine_class, "connection")
    local = threading.local()

    def connection(self: Any) -> Any:
        base = shared.fget(self)  # raises the emulator's own error when the engine is not started
        cursors = local.__dict__.setdefault("cursors", {})
        cursor = cursors.get(id(base))
        if cursor is None:
            cursor = cursors[id(base)] = base.cursor()
        return cursor

    return [replace(engine_class, "connection", property(connection))]
