"""P2a: Kafka → Spark → decode + convert (no write) against one plain process doing consume +
ParseFromString of the same topic with the same client. Target ≥ 1.0×: two cores of Spark should at
least match one plain process. Runs on a local stack started for the run."""

from __future__ import annotations

import time

from bench.localstack import local_stack
from firehose_bq import descriptors, sample
from firehose_bq.config import Config, SparkConfig
from firehose_bq.pipeline import Pipeline
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KAFKA_PYTHON, KafkaMetadataClient, read_range
from firehose_bq.spark import spark_session

MESSAGES = 100_000
PARTITIONS = 2


def plain_rate(brokers: str, topic: str, client: str, parse: object) -> float:
    """One process: read every partition in turn with `client`, ParseFromString each value."""
    ends = KafkaMetadataClient(brokers, "bench-plain").end_offsets((topic,))[topic]
    started = time.perf_counter()
    for partition, end in ends.items():
        for batch in read_range(brokers, topic, partition, 0, end, stall_timeout_ms=60_000, batch_rows=10_000,
                                client=client):
            for value in batch.column("value").to_pylist():
                parse(value)  # type: ignore[operator]
    return MESSAGES / (time.perf_counter() - started)


def spark_rate(spark: object, env: dict[str, str], client: str, state: str) -> float:
    cfg = Config.from_env({**env, "SOURCE_KAFKA_CLIENT": client, "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1",
                           "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{client}",
                           "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{client}"})
    summary = Pipeline(cfg, spark, write=False).run(available_now=True)  # type: ignore[arg-type]
    assert summary.totals.messages == MESSAGES, summary.totals.messages
    return MESSAGES / summary.seconds


def run() -> dict[str, float]:
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": "p2a"}
        cfg = Config.from_env(env)
        cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE)
        sample.ensure_topic(cfg.source.brokers, "p2a", PARTITIONS)
        sample.produce(cfg.source.brokers, "p2a", sample.booking_messages(cls), MESSAGES, progress=False)
        spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[2]"),
                              {"spark.ui.enabled": "false"})
        # Warm-up: the first micro-batch of a session pays Spark's start-up costs, which are not throughput.
        warm = Config.from_env({**env, "SPARK_MAX_OFFSETS_PER_TRIGGER": "1000",
                                "SPARK_CHECKPOINT_LOCATION": f"{state}/warm", "SOURCE_KAFKA_TOPIC": "p2a-warm"})
        sample.produce(cfg.source.brokers, "p2a-warm", sample.booking_messages(cls), 1000, progress=False)
        Pipeline(warm, spark, write=False).run(available_now=True)
        results = {}
        print(f"P2a pipeline without a sink ({MESSAGES} example bookings, {PARTITIONS} partitions, local[2])")
        for client in (KAFKA_PYTHON, CONFLUENT_KAFKA):
            plain = plain_rate(cfg.source.brokers, "p2a", client, cls.FromString)
            spark_side = spark_rate(spark, env, client, state)
            results[client] = spark_side / plain
            print(f"  {client:<16} plain consume+parse {plain:>9,.0f} msg/s   Spark read+decode+convert "
                  f"{spark_side:>9,.0f} msg/s   ratio {spark_side / plain:.2f}x (target ≥ 1.0x)")
        spark.stop()  # type: ignore[attr-defined]
    return {f"p2a_{k}": v for k, v in results.items()}
