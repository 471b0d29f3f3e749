"""Gap 1: the emulator starts offline, without DuckDB's ``spatial`` and ``avro`` extensions.

BigQuery has no start-up to speak of; bqemulator's ``DuckDBEngine._load_spatial`` runs ``INSTALL
spatial`` and aborts start-up when the download fails, so on a machine without internet the emulator
never serves. The sink uses no GEOGRAPHY, so a missing extension now costs only GEOGRAPHY support.
``_load_format_extensions`` (avro) already tolerates failure, but every start still waited on a doomed
download (2-3 s of connection attempts), so it gets the same local-only treatment.

Shown by tests/integration/test_emulator_gaps.py::test_gap1_emulator_serves_without_spatial_extension (the emulator answers at all).
"""

import contextlib
from typing import Any

from ._targets import LOG, module, replace, require


def _load_local_extension(conn: Any, name: str, *, allow_download: bool) -> bool:
    """LOAD an extension from the local cache, downloading it only if allowed.

    Offline, a DuckDB ``INSTALL`` fails only after 2-3 s of connection
    attempts, so by default nothing is downloaded.
    """
    try:
        conn.execute(f"LOAD {name}")
        return True
    except Exception:  # noqa: BLE001 - not installed locally; decide below
        pass
    if not allow_download:
        return False
    try:
        conn.execute(f"INSTALL {name}")
        conn.execute(f"LOAD {name}")
        return True
    except Exception as exc:  # noqa: BLE001 - offline or blocked; tolerated
        LOG.warning("DuckDB extension %s unavailable: %s", name, str(exc).splitlines()[0])
        return False


def apply(*, allow_download: bool) -> list[str]:
    """Load DuckDB extensions from the local cache only (unless downloads are allowed)."""
    engine_cls = require(module("bqemulator.storage.engine"), "DuckDBEngine")

    def _disable_autoinstall(conn: Any) -> None:
        # Without this, the first ST_* call would wait on a download before failing.
        # An older DuckDB without the setting has nothing to turn off.
        with contextlib.suppress(Exception):
            conn.execute("SET autoinstall_known_extensions = false")

    def _load_spatial(self: Any) -> None:
        conn = self.connection
        if _load_local_extension(conn, "spatial", allow_download=allow_download):
            return
        LOG.warning("DuckDB 'spatial' extension not available: GEOGRAPHY columns/functions will fail")
        if not allow_download:
            _disable_autoinstall(conn)

    def _load_format_extensions(self: Any) -> None:
        if not _load_local_extension(self.connection, "avro", allow_download=allow_download):
            LOG.info("DuckDB 'avro' extension not available: AVRO load/extract disabled")

    return [
        replace(engine_cls, "_load_spatial", _load_spatial),
        replace(engine_cls, "_load_format_extensions", _load_format_extensions),
    ]
