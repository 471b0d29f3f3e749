"""P1: protobuf bytes → rows, against a bare ParseFromString loop over the same messages.

Two measures, side by side in one run: the value decoders (bytes → the table's Arrow struct: the native
decoder, and the Python reference decoder) and the row converter (bytes → BigQuery row dicts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from firehose_bq import descriptors, sample
from firehose_bq.convert import KafkaRecords, RowConverter
from firehose_bq.decode import ValueDecoder
from firehose_bq.decode.native import NativeDecoder
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.schema import MetadataColumns

REPO = Path(__file__).resolve().parents[1]
MESSAGES = 50_000
ROUNDS = 5
BATCH = 10_000  # the source's READ_BATCH_ROWS: one convert() call per Arrow batch


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


def run() -> dict[str, float]:
    cls = descriptors.load([str(REPO / "descriptors" / "example.desc")]).message_class(sample.EXAMPLE_MESSAGE)
    values = [sample.booking(i, cls).SerializeToString() for i in range(MESSAGES)]
    # Converted in batches of the source's size, as the pipeline's tasks convert them.
    batches = [KafkaRecords(["t"] * len(chunk), [0] * len(chunk), list(range(start, start + len(chunk))),
                            [0] * len(chunk), chunk)
               for start in range(0, MESSAGES, BATCH) for chunk in [values[start:start + BATCH]]]
    converter = RowConverter(cls, MetadataColumns())
    # What pipeline.write_partition builds: unknown-field detection on, which costs two re-serializations.
    as_pipeline = RowConverter(cls, MetadataColumns(), detect_unknown_fields=True)
    parse = cls.FromString
    arrow_batches = [pa.array(values[start:start + BATCH], pa.binary()) for start in range(0, MESSAGES, BATCH)]

    def parse_only() -> None:
        for value in values:
            parse(value)

    def decode(decoder: ValueDecoder) -> Callable[[], None]:
        def work() -> None:
            for batch in arrow_batches:  # unknown-field detection on, as the pipeline decodes
                decoder.decode(batch)
        return work

    def convert(converter: RowConverter) -> Callable[[], None]:
        def work() -> None:
            for batch in batches:  # each batch's rows dropped before the next, as once written
                converter.convert(batch, load_time="2026-01-01T00:00:00.000000Z")
        return work

    parse_rate, native_rate, reference_rate, convert_rate, pipeline_rate = (
        MESSAGES / seconds for seconds in best_times([parse_only, decode(NativeDecoder(cls)), decode(ReferenceDecoder(cls)),
                                                      convert(converter), convert(as_pipeline)]))
    size = sum(map(len, values)) / MESSAGES
    print(f"P1 decode ({MESSAGES} example bookings in batches of {BATCH}, {size:.0f} bytes each, 19 fields, into the "
          f"table's Arrow struct, unknown-field detection on, CPU time, best of {ROUNDS}, side by side)")
    print(f"  ParseFromString loop          {parse_rate:>12,.0f} msg/s  {1e6 / parse_rate:6.2f} µs/msg")
    print(f"  native decoder                {native_rate:>12,.0f} msg/s  {1e6 / native_rate:6.2f} µs/msg  "
          f"{native_rate / parse_rate:.2f}x   (target ≥ 0.8x)")
    print(f"  reference decoder (Python)    {reference_rate:>12,.0f} msg/s  {1e6 / reference_rate:6.2f} µs/msg  "
          f"{reference_rate / parse_rate:.2f}x")
    print()
    print(f"P1 conversion ({MESSAGES} example bookings in batches of {BATCH}, {size:.0f} bytes each, 19 fields, "
          f"CPU time, best of {ROUNDS})")
    print(f"  ParseFromString loop          {parse_rate:>12,.0f} msg/s  {1e6 / parse_rate:6.2f} µs/msg")
    print(f"  bytes → BigQuery row dicts    {convert_rate:>12,.0f} msg/s  {1e6 / convert_rate:6.2f} µs/msg")
    print(f"  ratio                         {convert_rate / parse_rate:>12.2f}x   (target ≥ 0.5x)")
    print(f"  … + unknown-field detection   {pipeline_rate:>12,.0f} msg/s  {1e6 / pipeline_rate:6.2f} µs/msg  "
          f"{pipeline_rate / parse_rate:.2f}x   (as the pipeline runs it)")
    return {"p1_ratio": convert_rate / parse_rate, "p1_native_ratio": native_rate / parse_rate,
            "p1_reference_ratio": reference_rate / parse_rate}


if __name__ == "__main__":
    run()
