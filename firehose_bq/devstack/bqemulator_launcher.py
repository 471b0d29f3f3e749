#!/usr/bin/env python3
"""Run the ``bqemulator`` BigQuery emulator with the patches the firehose tests need.

This is a standalone script. It runs under the emulator's own virtualenv,
not the project's, so it imports only the standard library, ``bqemulator``
(and its dependencies) and the ``bqemulator_patches`` package beside it, which
Python finds because a script's own directory comes first on ``sys.path``.
Never import ``firehose_bq`` here.

Usage::

    python bqemulator_launcher.py --host 127.0.0.1 --port 9050 --grpc-port 9060 \
        [--data-dir DIR] [--project PROJECT] [--gcs-local-root DIR]

Without ``--data-dir`` the emulator keeps everything in memory. With it, the
emulator's persistent mode stores ``bqemulator.duckdb`` in that directory.

bqemulator 1.4.0 as shipped differs from BigQuery in ways the sink's tests
notice. Each difference is closed by one module of ``bqemulator_patches``
(its docstring says which BigQuery behaviour it restores and which test shows
the gap), applied in the order below before the server starts.

Each patch checks that what it patches still exists. If one is missing (say, a
different bqemulator version), the launcher exits with status 3 and names it,
because an emulator that is silently unpatched gives misleading test results.
After the patches, the server runs in the foreground until SIGTERM or SIGINT,
then stops and exits 0. A failure during start-up exits 1.
"""

import argparse
import asyncio
import logging
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from bqemulator_patches import (
    abandoned_results,
    append_rows_stream,
    ddl_alter_table,
    insert_all,
    json_column_numbers,
    json_load_bytes,
    load_job_atomic,
    load_job_id_taken,
    load_job_partitioning,
    multipart_upload,
    nested_field_names,
    offline_extensions,
    parquet_load_by_name,
    parquet_load_json_columns,
    schema_update_storage,
    schema_update_validation,
    storage_write_records,
    storage_write_row_errors,
    storage_write_time_text,
    thread_connections,
    upload_job_id,
)
from bqemulator_patches._targets import PatchTargetMissingError, module, require

LOG = logging.getLogger("bqemulator_launcher")

EXIT_PATCH_TARGET_MISSING = 3
EXIT_STARTUP_FAILED = 1

# The version these patches were written against. Another version may still
# work. Every target is checked by name, so a real mismatch fails loudly.
TESTED_BQEMULATOR_VERSION = "1.4.0"


def apply_patches(args: argparse.Namespace) -> None:
    # Order matters where one patch builds on another (e.g. storage reconciliation looks
    # bq_schema_to_duckdb_columns up at call time, so the keyword quoting applies to it).
    patches: list[tuple[str, Callable[[], list[str]]]] = [
        ("extra a connection per thread (concurrent requests)", thread_connections.apply),
        (
            "gap1 optional DuckDB extensions",
            lambda: offline_extensions.apply(allow_download=args.allow_extension_download),
        ),
        (
            "gap2 insertAll validation + insertErrors + insertId dedup",
            lambda: insert_all.apply(
                insert_id_ttl_seconds=args.insert_id_ttl, snapshot_each_insert=args.insert_all_snapshots
            ),
        ),
        ("gap3 schema-change validation", schema_update_validation.apply),
        ("gap3 schema change alters storage", schema_update_storage.apply),
        ("gap3 DDL ALTER TABLE syncs metadata", ddl_alter_table.apply),
        ("gap4 multipart media part of any Content-Type", multipart_upload.apply),
        ("gap5 Storage Write into RECORD columns", storage_write_records.apply),
        ("gap6 AppendRows connection remembers its stream", append_rows_stream.apply),
        (
            "extra Storage Write row_errors, BY NAME appends",
            lambda: storage_write_row_errors.apply(snapshot_each_append=args.insert_all_snapshots),
        ),
        ("extra Storage Write Arrow rows take TIME as text", storage_write_time_text.apply),
        ("extra quote nested field names", nested_field_names.apply),
        ("extra load job keeps partitioning", load_job_partitioning.apply),
        ("extra register after an abandoned result", abandoned_results.apply),
        ("extra uploaded load job keeps its job id", upload_job_id.apply),
        ("extra JSON load decodes BYTES from base64", json_load_bytes.apply),
        ("extra Parquet load matches columns by name", parquet_load_by_name.apply),
        ("extra a JSON column refuses numbers beyond FLOAT64", json_column_numbers.apply),
        ("extra a load job with a taken job id answers 409", load_job_id_taken.apply),
        # Before load_job_atomic: a refused file then rolls back the job's transaction like any other.
        ("extra a Parquet load into a table with JSON columns fails", parquet_load_json_columns.apply),
        ("extra a load job loads all its files or none", load_job_atomic.apply),
    ]
    for label, apply in patches:
        targets = apply()
        LOG.info("patch applied: %s -> %s", label, ", ".join(targets))


def build_settings(args: argparse.Namespace) -> Any:
    config = module("bqemulator.config")
    settings_cls = require(config, "Settings")
    persistence = require(config, "PersistenceMode")
    overrides: dict[str, Any] = {
        # REST and gRPC both bind to the host given, and nowhere else.
        "rest_host": args.host,
        "rest_port": args.port,
        "grpc_host": args.host,
        "grpc_port": args.grpc_port,
        "persistence_mode": persistence.PERSISTENT if args.data_dir else persistence.EPHEMERAL,
        "log_level": args.log_level,
    }
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.project:
        overrides["default_project_id"] = args.project
    if args.gcs_local_root:
        # bqemulator's own setting: a load job reads `gs://bucket/name` from DIR/bucket/name.
        overrides["gcs_local_root"] = args.gcs_local_root
    return settings_cls(**overrides)


async def serve(settings: Any) -> None:
    """Run bqemulator's own ``EmulatorServer`` until SIGTERM or SIGINT."""
    server_mod = module("bqemulator.server")
    server = require(server_mod, "EmulatorServer")(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers go in before start() so that a signal during start-up still shuts down cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    await server.start()
    try:
        LOG.info(
            "bqemulator ready in %.2fs: rest=%s grpc=%s",
            time.monotonic() - started,
            server.rest_url,
            server.grpc_endpoint,
        )
        await stop.wait()
        LOG.info("signal received, stopping bqemulator")
    finally:
        await server.stop()
    LOG.info("bqemulator stopped")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address for REST and gRPC (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, required=True, help="REST port (0 = any free port)")
    parser.add_argument(
        "--grpc-port", type=int, required=True, help="gRPC (Storage API) port (0 = any free port)"
    )
    parser.add_argument("--data-dir", default=None, help="persist DuckDB state here; default is in-memory")
    parser.add_argument("--project", default=None, help="default project id for requests that omit it")
    parser.add_argument(
        "--gcs-local-root",
        default=None,
        help="read a load job's gs://bucket/name source URIs from DIR/bucket/name: the local Cloud Storage "
        "emulator's on-disk objects (default: gs:// URIs are refused)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["trace", "debug", "info", "warning", "error", "critical"],
        help="bqemulator's own log level (default warning); the launcher logs at INFO",
    )
    parser.add_argument(
        "--insert-id-ttl",
        type=float,
        default=60.0,
        help="seconds an insertId is remembered for dedup (BigQuery: at least 60)",
    )
    parser.add_argument(
        "--insert-all-snapshots",
        action="store_true",
        help="copy the table into a time-travel snapshot after every insertAll and Storage Write append, "
        "as bqemulator does "
        "(costs memory and time that grow with the table)",
    )
    parser.add_argument(
        "--allow-extension-download",
        action="store_true",
        help="try to INSTALL missing DuckDB extensions (needs network)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A handler of our own: bqemulator's start() calls logging.basicConfig(force=True),
    # which would remove a root handler and set the root level to its own.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s bqemulator_launcher %(levelname)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    # bqemulator 1.4.0 fetches Arrow through DuckDB's DB-API cursor, and
    # DuckDB 2.x warns about it on every query. That is noise in a test log.
    warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)
    try:
        import bqemulator
    except ImportError as exc:
        LOG.error("bqemulator is not importable from %s: %s", sys.executable, exc)
        return EXIT_PATCH_TARGET_MISSING
    version = getattr(bqemulator, "__version__", "unknown")
    if version != TESTED_BQEMULATOR_VERSION:
        LOG.warning("bqemulator %s found, patches were written for %s", version, TESTED_BQEMULATOR_VERSION)
    try:
        settings = build_settings(args)
        # Set up bqemulator's structlog before the patches import its modules;
        # some of them log at import time.
        logging_mod = module("bqemulator.observability.logging_")
        require(logging_mod, "configure_logging")(level=settings.log_level, fmt=settings.log_format)
        apply_patches(args)
    except PatchTargetMissingError as exc:
        LOG.error("cannot patch bqemulator %s: %s", version, exc)
        return EXIT_PATCH_TARGET_MISSING
    try:
        asyncio.run(serve(settings))
    except Exception:
        LOG.exception("bqemulator failed")
        return EXIT_STARTUP_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
