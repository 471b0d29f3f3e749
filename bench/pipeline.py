"""P2a: Kafka → Spark → decode + convert (no write) against one plain process doing consume +
ParseFromString of the same topic with the same client. Target ≥ 1.0×: two cores of Spark should at
least match one plain process. Runs on a local stack started for the run.

The plain side is the bare client loop (no code of this project), so it stays the same yardstick
whatever the project's reader does. With confluent-kafka, the Spark side also runs with each of the
source's two levers off, in the same session, taking turns over ROUNDS rounds:
- reader: Arrow columns straight from librdkafka's messages, one batch of prefetch, collector paused
  (on), or the reader before it (off, kept below for this comparison only): a Python object per record;
- imports: Spark's Python processes import pyspark from the installed package (on, firehose_bq/spark.py)
  or compile it from Spark's pyspark.zip in every new process (off)."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from bench.localstack import local_stack
from bench.proctree import tree
from firehose_bq import descriptors, sample
from firehose_bq.config import Config, SparkConfig
from firehose_bq.pipeline import Pipeline
from firehose_bq.source.batches import ARROW_SCHEMA
from firehose_bq.source.kafka_client import (
    CONFLUENT_KAFKA,
    KAFKA_PYTHON,
    KafkaMetadataClient,
    _Progress,
    _skippable,
    confluent_config,
)
from firehose_bq.source.kafka_source import READ_BATCH_ROWS, KafkaDataSource, KafkaRange, KafkaStreamReader
from firehose_bq.spark import spark_session

MESSAGES = 100_000
PARTITIONS = 2
ROUNDS = 3
TOPIC = "p2a"


@dataclass(frozen=True)
class Run:
    """One pass over the topic: wall seconds, and CPU seconds of every process that took part (on a
    machine shared with other jobs, wall time also measures them; CPU time much less)."""

    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return MESSAGES / self.seconds


def timed(work: Callable[[], object], processes: Callable[[], float] = lambda: 0.0) -> Run:
    """`work()` timed; `processes()` gives the CPU seconds so far of the processes besides this one."""
    before_cpu, before_others, started = _own_cpu(), processes(), time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    return Run(seconds, _own_cpu() - before_cpu + processes() - before_others)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, librdkafka's included
    return usage.ru_utime + usage.ru_stime


def plain_run(brokers: str, topic: str, client: str, parse: Callable[[bytes], object]) -> Run:
    """One process: read every partition in turn with the bare `client`, ParseFromString each value."""
    ends = KafkaMetadataClient(brokers, "bench-plain").end_offsets((topic,))[topic]
    read = _plain_confluent if client == CONFLUENT_KAFKA else _plain_kafka_python
    return timed(lambda: [read(brokers, topic, partition, end, parse) for partition, end in ends.items()])


def _plain_confluent(brokers: str, topic: str, partition: int, end: int, parse: Callable[[bytes], object]) -> None:
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": brokers, "group.id": "bench-plain", "enable.auto.commit": False,
                            "fetch.wait.max.ms": 50})
    consumer.assign([ck.TopicPartition(topic, partition, 0)])
    seen = 0
    while seen < end:
        for m in consumer.consume(num_messages=READ_BATCH_ROWS, timeout=0.1):
            if m.error() is None:
                parse(m.value())
                seen = m.offset() + 1
    consumer.close()


def _plain_kafka_python(brokers: str, topic: str, partition: int, end: int, parse: Callable[[bytes], object]) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=brokers, enable_auto_commit=False,
                             max_partition_fetch_bytes=8 * 1024 * 1024)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    seen = 0
    while seen < end:
        for r in consumer.poll(timeout_ms=500, max_records=READ_BATCH_ROWS).get(tp, []):
            parse(r.value)
            seen = r.offset + 1
    consumer.close()


@dataclass(frozen=True)
class Levers:
    arrow_reader: bool = True
    installed_pyspark: bool = True

    def label(self) -> str:
        return (f"{'arrow' if self.arrow_reader else 'per-record':<11} "
                f"{'site-packages' if self.installed_pyspark else 'pyspark.zip':<14}")


CONFIGURATIONS = [Levers(False, False), Levers(True, False), Levers(False, True), Levers(True, True)]


@contextmanager
def levers(spark: SparkSession, chosen: Levers) -> Iterator[None]:
    """Queries started inside run with `chosen`; the product's own set-up is back afterwards.

    Both reach the Python processes through the data source's registration: Spark hands a registered
    source the driver's executor environment as it is then (so without the worker PYTHONPATH that
    spark.py sets, workers import pyspark from Spark's zip), and `mapInArrow` takes it at each call."""
    environment = spark.sparkContext.environment
    saved = environment.get("PYTHONPATH")
    if not chosen.installed_pyspark:
        environment.pop("PYTHONPATH", None)
    spark.dataSource.register(KafkaDataSource if chosen.arrow_reader else PerRecordSource)
    try:
        yield
    finally:
        if saved is not None:
            environment["PYTHONPATH"] = saved
        spark.dataSource.register(KafkaDataSource)


class PerRecordSource(KafkaDataSource):
    """The source with the reader as it was before the Arrow one (same format name, so it replaces it)."""

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PerRecordReader(dict(self.options))


class PerRecordReader(KafkaStreamReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange) and self.client == CONFLUENT_KAFKA
        return per_record_batches(self.brokers, partition.topic, partition.partition, partition.start, partition.end,
                                  self.stall_timeout_ms)


@dataclass(frozen=True)
class _Record:
    key: bytes | None
    value: bytes | None
    offset: int
    timestamp_ms: int | None
    timestamp_type: int | None
    headers: list[tuple[str, bytes | None]]
    leader_epoch: int | None


def per_record_batches(brokers: str, topic: str, partition: int, start: int, end: int,
                       stall_timeout_ms: int) -> Iterator[pa.RecordBatch]:
    """The confluent-kafka reader as it was: each message's fields read one by one into a record object,
    records gathered up to READ_BATCH_ROWS, then a Python list per column; librdkafka's own prefetch."""
    import confluent_kafka as ck

    kinds = {ck.TIMESTAMP_CREATE_TIME: 0, ck.TIMESTAMP_LOG_APPEND_TIME: 1}
    config = confluent_config(brokers, READ_BATCH_ROWS)
    del config["queued.min.messages"]
    consumer = ck.Consumer(config)
    progress = _Progress(topic, partition, start, end, stall_timeout_ms)
    records: list[_Record] = []
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        while not progress.done:
            last = None
            for m in consumer.consume(num_messages=READ_BATCH_ROWS, timeout=0.1):
                if m.error() is not None and _skippable(ck, m.error(), m, topic, partition, start, progress):
                    continue
                last = m.offset()
                if last >= end:
                    break
                kind, ts = m.timestamp()
                epoch = m.leader_epoch()
                records.append(_Record(m.key(), m.value(), last,
                                       ts if kind != ck.TIMESTAMP_NOT_AVAILABLE and ts >= 0 else None, kinds.get(kind),
                                       [(k, v) for k, v in (m.headers() or [])],
                                       epoch if epoch is not None and epoch >= 0 else None))
            position = consumer.position([ck.TopicPartition(topic, partition)])[0].offset
            progress.advance(max(position, last + 1 if last is not None else -1))
            if len(records) >= READ_BATCH_ROWS:
                yield _per_record_batch(records, topic, partition)
                records = []
        if records:
            yield _per_record_batch(records, topic, partition)
    finally:
        consumer.close()


def _per_record_batch(records: list[_Record], topic: str, partition: int) -> pa.RecordBatch:
    columns = [
        [r.key for r in records], [r.value for r in records], [topic] * len(records), [partition] * len(records),
        [r.offset for r in records], [r.timestamp_ms * 1000 if r.timestamp_ms is not None else None for r in records],
        [r.timestamp_type for r in records], [[{"key": k, "value": v} for k, v in r.headers] for r in records],
        [r.leader_epoch for r in records],
    ]
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, ARROW_SCHEMA, strict=True)],
                                      schema=ARROW_SCHEMA)


def spark_run(spark: SparkSession, env: dict[str, str], client: str, name: str, state: str,
              messages: int = MESSAGES) -> Run:
    """One `--available-now` query over the topic, from a fresh checkpoint. Its CPU time is this
    process's and that of Spark's JVM and everything the JVM started (source runners, Python workers)."""
    cfg = Config.from_env({**env, "SOURCE_KAFKA_CLIENT": client, "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1",
                           "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{name}",
                           "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{name}"})
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    pipeline = Pipeline(cfg, spark, write=False)
    pipeline.prepare()  # the table and descriptors, as a long-running job has them once
    run = timed(lambda: pipeline.run(available_now=True), lambda: sum(p.cpu_seconds for p in tree(jvm)))
    assert pipeline.summary.totals.messages == messages, pipeline.summary.totals.messages
    return run


def _spread(values: list[float], form: str) -> str:
    return f"{format(statistics.median(values), form)} ({' '.join(format(v, form) for v in values)})"


def run(rounds: int = ROUNDS) -> dict[str, float]:
    # The per-record reader must reach Spark's Python processes, which need not find this directory.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC}
        cfg = Config.from_env(env)
        parse = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE).FromString
        make = sample.booking_messages(descriptors.load(cfg.input_schema.stencil_urls)
                                       .message_class(sample.EXAMPLE_MESSAGE))
        sample.ensure_topic(cfg.source.brokers, TOPIC, PARTITIONS)
        sample.produce(cfg.source.brokers, TOPIC, make, MESSAGES, progress=False)
        spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[2]"),
                              {"spark.ui.enabled": "false"})
        # Warm-up: the first micro-batch with each set-up pays Spark's start-up costs (and its own Python
        # worker daemon: Spark keeps one per worker environment), which are not throughput.
        warm_env = {**env, "SOURCE_KAFKA_TOPIC": "p2a-warm"}
        sample.produce(cfg.source.brokers, "p2a-warm", make, 1000, progress=False)
        for i, chosen in enumerate(CONFIGURATIONS):
            with levers(spark, chosen):
                spark_run(spark, warm_env, CONFLUENT_KAFKA, f"warm-{i}", state, messages=1000)

        plain: list[Run] = []
        runs: dict[Levers, list[Run]] = {chosen: [] for chosen in CONFIGURATIONS}
        for r in range(rounds):
            plain.append(plain_run(cfg.source.brokers, TOPIC, CONFLUENT_KAFKA, parse))
            for i, chosen in enumerate(CONFIGURATIONS):
                with levers(spark, chosen):
                    runs[chosen].append(spark_run(spark, env, CONFLUENT_KAFKA, f"r{r}-{i}", state))
        ratios = {chosen: [s.rate / p.rate for s, p in zip(done, plain, strict=True)] for chosen, done in runs.items()}
        print(f"P2a pipeline without a sink ({MESSAGES} example bookings, {PARTITIONS} partitions, local[2]); "
              f"plain = one process, bare client loop; medians of {rounds} rounds (each round's values)")
        print(f"  confluent-kafka  plain consume+parse {_spread([p.rate for p in plain], ',.0f')} msg/s, "
              f"CPU {_spread([p.cpu_seconds for p in plain], '.2f')} s")
        print(f"    {'reader':<11} {'pyspark from':<14} Spark read+decode+convert: ratio to plain in the same round "
              "(target ≥ 1.0x), msg/s, CPU s")
        for chosen, done in runs.items():
            default = "   (the default)" if chosen == Levers() else ""
            print(f"    {chosen.label()} {_spread(ratios[chosen], '.2f')}x  "
                  f"{statistics.median([s.rate for s in done]):>7,.0f} msg/s  "
                  f"CPU {_spread([s.cpu_seconds for s in done], '.2f')} s{default}")

        python_plain = plain_run(cfg.source.brokers, TOPIC, KAFKA_PYTHON, parse).rate
        python_spark = spark_run(spark, env, KAFKA_PYTHON, "kafka-python", state).rate
        print(f"  kafka-python     plain consume+parse {python_plain:>9,.0f} msg/s   Spark read+decode+convert "
              f"{python_spark:>9,.0f} msg/s   ratio {python_spark / python_plain:.2f}x (target ≥ 1.0x)")
        spark.stop()
    return {f"p2a_{CONFLUENT_KAFKA}": statistics.median(ratios[Levers()]),
            f"p2a_{KAFKA_PYTHON}": python_spark / python_plain}
