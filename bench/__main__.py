"""`make bench`: every benchmark, one after the other, the refresh latency last; then a summary of the
figures issues F and G ask for, each against its target."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from bench import capped_fetch, conversion, job, json_input, memory, merge, pipeline, refresh, routing, sink


@dataclass(frozen=True)
class Figure:
    label: str
    key: str  # in the benchmarks' results
    unit: str
    target: str
    met: Callable[[float], bool] | None  # None: reported, no target


FIGURES = [
    Figure("P1 native decode / ParseFromString", "p1_native_ratio", "x", "≥ 0.8x", lambda v: v >= 0.8),
    Figure("P1 reference decode / ParseFromString", "p1_reference_ratio", "x", "", None),
    Figure("P1 a task's rows (native) / ParseFromString", "p1_rows_ratio", "x", "", None),
    Figure("P7 JSON → Arrow rows / json.loads", "p7_ratio", "x", "≥ 0.5x", lambda v: v >= 0.5),
    Figure("P2a Spark, no sink (confluent, native) / plain", "p2a_confluent-kafka_native", "x", "≥ 1.0x",
           lambda v: v >= 1.0),
    Figure(f"P2a at {pipeline.LARGE // 1000}k messages (default levers) / plain", "p2a_large", "x", "", None),
    Figure(f"P2a over {pipeline.WIDE_PARTITIONS} partitions / plain", "p2a_wide", "x", "", None),
    Figure(f"P2a over {pipeline.WIDE_PARTITIONS} partitions, a task per partition / plain",
           "p2a_wide_task_per_partition", "x", "", None),
    Figure("P2a … kafka-python reader, python decoder", "p2a_kafka-python_python", "x", "", None),
    Figure("P2a … confluent-kafka reader, python decoder", "p2a_confluent-kafka_python", "x", "", None),
    Figure("P2a … kafka-python reader, native decoder", "p2a_kafka-python_native", "x", "", None),
    Figure("Task reader, broker capping fetches (Tansu)", "capped_fetch_msg_s", " msg/s", "", None),
    Figure("… / with librdkafka's default fetch backoff", "capped_fetch_ratio", "x", "", None),
    Figure("P2b storage_write end to end / direct", "p2b_storage_write", "x", "≥ 0.7x", lambda v: v >= 0.7),
    Figure("P2b insertall end to end / direct", "p2b_insertall", "x", "≥ 0.7x", lambda v: v >= 0.7),
    Figure("P2b file_loads end to end / direct", "p2b_file_loads", "x", "≥ 0.7x", lambda v: v >= 0.7),
    Figure("P2b file_loads, gs:// staging, end to end / direct", "p2b_file_loads_gcs", "x", "", None),
    Figure("Storage Write / insertAll, end to end", "storage_write_vs_insertall", "x", "≥ 5x", lambda v: v >= 5),
    Figure("P2c whole job / plain confluent-kafka", "p2c", "x", "≥ 0.1x", lambda v: v >= 0.1),
    Figure("Routing: 1 table", "routing_1_msg_s", " msg/s", "", None),
    Figure(f"Routing: {routing.TABLES} tables", f"routing_{routing.TABLES}_msg_s", " msg/s", "", None),
    Figure(f"Routing: {routing.TABLES} tables / 1 table", "routing_ratio", "x", "", None),
    Figure("P4 peak PSS, 1M backlog", "p4_peak_pss_gib", " GiB", "< 1.5 GiB", lambda v: v < 1.5),
    Figure("P4 peak RSS (sum), 1M backlog", "p4_peak_rss_gib", " GiB", "", None),
    Figure("Merge flush, 100k rows", "merge_s", " s", "", None),
    Figure("Refresh latency (median)", "refresh_latency_s", " s", "", None),
]


def summary(results: dict[str, float], minutes: float) -> None:
    print(f"SUMMARY (one run, {minutes:.0f} min)")
    print(f"  {'figure':<48} {'value':>14}  {'target':<10} result")
    for f in FIGURES:
        value = results.get(f.key)
        shown = "—" if value is None else (f"{value:,.0f}{f.unit}" if f.unit == " msg/s" else f"{value:.2f}{f.unit}")
        verdict = "" if f.met is None or value is None else ("met" if f.met(value) else "NOT met")
        print(f"  {f.label:<48} {shown:>14}  {f.target:<10} {verdict}")


if __name__ == "__main__":
    started = time.monotonic()
    results: dict[str, float] = {}
    for bench in (conversion, json_input, pipeline, capped_fetch, sink, job, routing, memory, merge, refresh):
        try:
            results.update(bench.run())
        except Exception:  # one broken benchmark must not cost the figures of the others
            traceback.print_exc()
            print(f"{bench.__name__} FAILED: its figures are missing below")
        print(flush=True)
    summary(results, (time.monotonic() - started) / 60)
