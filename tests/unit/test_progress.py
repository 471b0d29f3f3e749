"""Lag from Spark's progress reports: what the per-batch progress line and the run summary show."""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.listener import SourceProgress

from firehose_bq.pipeline import partition_lag


def source(end: Any, latest: Any) -> SourceProgress:
    return SourceProgress.fromJson({"description": "firehose-kafka", "startOffset": None, "endOffset": end,
                                    "latestOffset": latest, "numInputRows": 10, "inputRowsPerSecond": 1.0,
                                    "processedRowsPerSecond": 1.0})


def test_lag_of_every_partition_of_every_source() -> None:
    first = source({"a": {"0": 100, "1": 50}}, {"a": {"0": 130, "1": 50}})
    second = source({"b": {"0": 7}}, {"b": {"0": 10}})
    assert partition_lag([first, second]) == {("a", 0): 30, ("a", 1): 0, ("b", 0): 3}


def test_a_partition_the_batch_has_not_seen_counts_from_zero() -> None:
    assert partition_lag([source({"a": {"0": 5}}, {"a": {"0": 5, "1": 4}})]) == {("a", 0): 0, ("a", 1): 4}


def test_lag_is_unknown_without_the_latest_offset() -> None:
    assert partition_lag([source({"a": {"0": 5}}, None)]) is None
