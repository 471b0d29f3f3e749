"""P1: protobuf bytes → the table's Arrow rows, against a bare ParseFromString loop over the same messages.

Side by side in one run: the value decoders (bytes → the table's Arrow struct: the native decoder the job
uses, and the Python reference decoder it falls back to), and the whole row building of a Spark task
(batch/rows.py's RowBuilder with the decoders the task builds: value and Kafka key decoded, metadata
columns added, the table's record batch and insertIds taken, as `modes.table_rows` hands them to a writer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from google.protobuf import message_factory

from firehose_bq import descriptors, sample
from firehose_bq.batch.rows import RowBuilder, insert_ids
from firehose_bq.decode import ValueDecoder, make_value_decoder
from firehose_bq.modes import table_rows
from firehose_bq.schema import MetadataColumns
from firehose_bq.source.batches import ARROW_SCHEMA

REPO = Path(__file__).resolve().parents[1]
MESSAGES = 50_000
ROUNDS = 5
BATCH = 10_000  # the source's READ_BATCH_ROWS: one decode() call per Arrow batch
TIMESTAMP_US = 1_767_225_600_123_000


def best_times(works: list[Callable[[], None]]) -> list[float]:
    """CPU seconds of the fastest of ROUNDS runs of each work, the works taking turns in each round.

    CPU time of this process, not wall time: on a machine shared with other jobs wall time mostly
    measures how often the scheduler ran something else; taking turns gives both sides the same
    machine state (caches, clock).
    """
    best = [float("inf")] * len(works)
    for _ in range(ROUNDS):
        for i, work in enumerate(works):
            started = time.process_time()
            work()
            best[i] = min(best[i], time.process_time() - started)
    return best


def source_batch(records: list[tuple[bytes, bytes, object]], first_offset: int) -> pa.RecordBatch:
    """Keyed records of one partition as the source yields them (batches.ARROW_SCHEMA)."""
    n = len(records)
    columns = {"key": [k for k, _, _ in records], "value": [v for _, v, _ in records], "topic": ["bookings"] * n,
               "partition": [0] * n, "offset": range(first_offset, first_offset + n), "timestamp": [TIMESTAMP_US] * n,
               "timestamp_type": [0] * n, "headers": [[]] * n, "leader_epoch": [0] * n}
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def run(messages: int = MESSAGES) -> dict[str, float]:
    cls = descriptors.load([str(REPO / "descriptors" / "example.desc")]).message_class(sample.EXAMPLE_MESSAGE)
    make = sample.booking_messages(cls)
    records = [make(i) for i in range(messages)]
    values = [v for _, v, _ in records]
    sources = [source_batch(records[start:start + BATCH], start) for start in range(0, messages, BATCH)]
    key_class = message_factory.GetMessageClass(cls.DESCRIPTOR.file.message_types_by_name["BookingKey"])
    parse = cls.FromString

    def decoder(prefer: str) -> ValueDecoder:  # as batch.core.row_builder makes them: unknown-field detection on
        return make_value_decoder(cls, 1, detect_unknown_fields=True, prefer=prefer)

    key_decoder = make_value_decoder(key_class, 2, detect_unknown_fields=True, prefer="native")  # as the job's
    builder = RowBuilder(decoder("native"), MetadataColumns(), key_decoder)

    def parse_only() -> None:
        for value in values:
            parse(value)

    def decode(chosen: ValueDecoder) -> Callable[[], None]:
        def work() -> None:
            for source in sources:  # each batch's values dropped before the next, as once written
                chosen.decode(source["value"])
        return work

    def build_rows() -> None:
        for source in sources:
            table_rows(builder.build(source, TIMESTAMP_US), insert_ids(source))

    parse_rate, native_rate, reference_rate, rows_rate = (
        messages / seconds for seconds in best_times([parse_only, decode(decoder("native")),
                                                      decode(decoder("python")), build_rows]))
    size = sum(map(len, values)) / messages
    print(f"P1 decode ({messages} example bookings in batches of {BATCH}, {size:.0f} bytes each, 19 fields, into the "
          f"table's Arrow struct, unknown-field detection on, CPU time, best of {ROUNDS}, side by side)")
    print(f"  ParseFromString loop          {parse_rate:>12,.0f} msg/s  {1e6 / parse_rate:6.2f} µs/msg")
    print(f"  native decoder                {native_rate:>12,.0f} msg/s  {1e6 / native_rate:6.2f} µs/msg  "
          f"{native_rate / parse_rate:.2f}x   (target ≥ 0.8x)")
    print(f"  reference decoder (Python)    {reference_rate:>12,.0f} msg/s  {1e6 / reference_rate:6.2f} µs/msg  "
          f"{reference_rate / parse_rate:.2f}x")
    print("  a task's rows (native: value + key decoded, 5 metadata columns, table batch + insertIds)")
    print(f"                                {rows_rate:>12,.0f} msg/s  {1e6 / rows_rate:6.2f} µs/msg  "
          f"{rows_rate / parse_rate:.2f}x")
    return {"p1_native_ratio": native_rate / parse_rate, "p1_reference_ratio": reference_rate / parse_rate,
            "p1_rows_ratio": rows_rate / parse_rate}


if __name__ == "__main__":
    import sys

    run(int(sys.argv[1]) if len(sys.argv) > 1 else MESSAGES)
