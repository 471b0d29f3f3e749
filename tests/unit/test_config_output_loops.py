"""An output topic that is also the job's input is refused at start (found by review).

A dead letter (KAFKA writer) or an unrouted record (SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC) is the
original key, value and headers written to that topic. When the topic is one the job consumes, on the
same brokers, the job reads it back in a later micro-batch, fails or leaves it unrouted the same way,
and writes it again: every bad or unrouted message is re-written once per batch, forever, and the topic
grows without bound while every batch commits. It is refused at start.
"""

from __future__ import annotations

import pytest

from firehose_bq.config import Config
from firehose_bq.errors import ConfigError
from tests.unit.test_config import MINIMAL

LOOPS = {
    "dlq topic is the source topic": {"DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "KAFKA", "DLQ_KAFKA_TOPIC": "t"},
    "dlq topic is one of the source topics, brokers spelled out": {
        "SOURCE_KAFKA_TOPIC": "a,t", "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": "t", "DLQ_KAFKA_BROKERS": "k:9092"},
    "fallback topic is the source topic": {
        "SINK_BIGQUERY_TABLE_NAME": "events_${header.kind}", "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": "t"},
}


@pytest.mark.parametrize("overrides", list(LOOPS.values()), ids=list(LOOPS))
def test_an_output_topic_the_job_also_reads_is_a_start_error(overrides: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="also in SOURCE_KAFKA_TOPIC on the same brokers"):
        Config.from_env({**MINIMAL, **overrides})


def test_a_dlq_topic_of_the_same_name_on_other_brokers_is_fine() -> None:
    Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": "t", "DLQ_KAFKA_BROKERS": "other:9092"})


def test_a_disabled_dlq_or_another_writer_type_naming_the_source_topic_is_fine() -> None:
    Config.from_env({**MINIMAL, "DLQ_KAFKA_TOPIC": "t"})
    Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "LOG", "DLQ_KAFKA_TOPIC": "t"})
