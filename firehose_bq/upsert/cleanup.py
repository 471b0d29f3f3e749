"""`firehose-bq upsert cleanup`: intermediate tables that crashed runs left behind.

A crashed run's intermediate table holds only rows whose offsets were never committed (they are
replayed into the next run's own table), so dropping it loses nothing. A running job's table looks
the same from outside; it is told apart by recent use: each merge flush runs DML on it, which moves
its last-modified time. Tables touched within `min_idle` are listed but kept.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from firehose_bq.bigquery.client import call_options, make_client
from firehose_bq.config import Config
from firehose_bq.upsert.tables import list_intermediate


def cleanup(cfg: Config, *, drop: bool, min_idle: timedelta, report: Callable[[str], None] = print) -> int:
    """List (and with `drop`, drop) the destination's idle intermediate tables; return how many are idle."""
    bq = cfg.bigquery
    call = call_options(bq)
    now = datetime.now(UTC)
    idle = 0
    with make_client(bq) as client:
        for table in list_intermediate(client, bq.project_id, bq.dataset, bq.table,
                                       cfg.upsert.intermediate_table_suffix):
            touched = max((t for t in (table.created, table.modified) if t is not None), default=None)
            age = now - touched if touched else None
            rows = "?" if table.rows is None else table.rows
            if age is not None and age < min_idle:
                report(f"{table.table}: in use? touched {age.total_seconds():.0f} s ago, {rows} rows: kept")
                continue
            idle += 1
            if drop:
                client.delete_table(f"{bq.project_id}.{bq.dataset}.{table.table}", not_found_ok=True, **call)
                report(f"{table.table}: {rows} rows: dropped")
            else:
                report(f"{table.table}: {rows} rows, idle: would drop (run with --drop)")
    if not idle:
        report(f"no idle intermediate tables of {bq.table_ref}")
    return idle
