"""Source batches as the Kafka source yields them, for tests."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from firehose_bq.source.batches import ARROW_SCHEMA


def source_batch(values: Sequence[bytes | None], *, keys: Sequence[bytes | None] | None = None,
                 offsets: Sequence[int] | None = None, timestamps_ms: Sequence[int | None] | None = None,
                 headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
                 timestamp_types: Sequence[int | None] | None = None,
                 leader_epochs: Sequence[int | None] | None = None, topic: str = "t",
                 partition: int = 0) -> pa.RecordBatch:
    n = len(values)
    columns = {
        "key": list(keys) if keys is not None else [None] * n,
        "value": list(values),
        "topic": [topic] * n,
        "partition": [partition] * n,
        "offset": list(offsets) if offsets is not None else list(range(n)),
        "timestamp": [None if t is None else t * 1000 for t in (timestamps_ms or [1_000] * n)],
        "timestamp_type": list(timestamp_types) if timestamp_types is not None else [0] * n,
        "headers": [None if h is None else [{"key": k, "value": v} for k, v in h] for h in (headers or [[]] * n)],
        "leader_epoch": list(leader_epochs) if leader_epochs is not None else [0] * n,
    }
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)
