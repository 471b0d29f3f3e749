"""The contract of a write path: Arrow rows in, the rows BigQuery rejected out.

A writer runs inside a task (a Spark task, or the replay): it takes one batch of table rows at a time
and returns the rows that BigQuery rejected as RowErrors, indexed by position in that batch (per-row
failures are data). A call that fails as a whole raises SinkError. Whoever opened the writer closes it
when the task ends, whatever happened. Which writer a job uses is its write mode's choice (modes.py).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from firehose_bq.errors import RowError


class RowWriter(Protocol):
    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        """Write every row of `rows` (the table's columns in `arrow_schema` types); `insert_ids` are
        the rows' insertIds (None: send none). Return the rows BigQuery rejected."""

    def close(self) -> None:
        """Release clients and streams; called once per task."""
