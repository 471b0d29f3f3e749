"""The contract of a write path: Arrow rows in, the rows that could not be written out.

A writer runs inside a task (a Spark task, or the DLQ replay). It takes one Arrow batch of rows at a
time, in the table's Arrow types (`arrow_schema.py`), and returns the rows that could not be written as
RowErrors whose `index` is the row's position in that batch (per-row failures are data). A call that
fails as a whole raises SinkError. Whoever opened the writer closes it once, whatever happened. Which
writer a job uses is its write mode's choice (modes.py).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from firehose_bq.errors import RowError


class RowWriter(Protocol):
    def write(self, rows: pa.RecordBatch, insert_ids: pa.StringArray | None) -> list[RowError]:
        """Write every row of `rows`; return those that failed, ordered by position.

        `insert_ids`: one per row (`topic_partition_offset`), or None to send none."""

    def close(self) -> None:
        """Release clients, streams and files; called once per task."""
