"""Writes after a ``tabledata.list`` succeed (DuckDB 2.0's "unfinished result").

In BigQuery, reading a table never blocks writing it. Under DuckDB 2.0, insertAll, load jobs and
Storage Write, which register Arrow data on the shared connection, failed with "connection has an
unfinished result" (HTTP 500, retried by clients for minutes) after a ``tabledata.list`` or any other
``fetchone`` that bqemulator leaves one fetch short.

Shown by tests/integration/test_emulator_gaps.py::test_writes_after_a_partial_list_rows.
"""

from typing import Any

from ._targets import PatchTargetMissingError, dotted, module, replace, require


class _SettlingConnection:
    """The engine's DuckDB connection, with ``register`` made safe after an abandoned result.

    DuckDB 2.0 refuses ``register`` while the connection holds a result that was
    not fetched to the end, and bqemulator leaves such results behind: every
    ``engine.execute(...).fetchone()`` (``tabledata.list``'s row count, among
    others) stops one fetch short. Every DuckDB call runs synchronously on the
    server's one event loop, so a result still pending when ``register`` is
    called belongs to a request step that has already finished; aborting it
    loses nothing. Everything else is passed through unchanged.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def register(self, name: str, obj: Any) -> Any:
        self._conn.abort()
        return self._conn.register(name, obj)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._conn, attr)


def apply() -> list[str]:
    """Make ``DuckDBEngine.connection`` hand out a connection whose ``register`` settles first."""
    engine_mod = module("bqemulator.storage.engine")
    engine_cls = require(engine_mod, "DuckDBEngine")
    original = require(engine_cls, "connection")
    if not isinstance(original, property) or original.fget is None:
        raise PatchTargetMissingError(f"{dotted(engine_cls)}.connection is no longer a property")
    raw = original.fget

    def connection(self: Any) -> Any:
        return _SettlingConnection(raw(self))

    return [replace(engine_cls, "connection", property(connection, doc=original.__doc__))]
