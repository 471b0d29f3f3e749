"""P2a: Kafka → Spark → decode (no write) against one plain process doing consume + ParseFromString of the
same topic with confluent-kafka. Target ≥ 1.0×: two cores of Spark should at least match one plain
process. Runs on a local stack started for the run.

The plain side is the bare client loop (no code of this project), so it stays the same yardstick
whatever the project's reader does. The Spark side is the real job (`Pipeline`, the batch core in each
task: decode, route, shape into table rows) with the write mode swapped for one that writes nothing. It
runs with each of the job's two speed levers on and off, in the same session, taking turns over ROUNDS
rounds, each round against its own plain run:
- reader (SOURCE_KAFKA_CLIENT): kafka-python (a Python object per record) or confluent-kafka (Arrow
  columns straight from librdkafka's messages);
- decoder (INPUT_SCHEMA_PROTO_DECODER): python (the reference decoder) or native (the C decoder)."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from bench.localstack import local_stack, produce_fast
from bench.proctree import cmdline, tree
from firehose_bq import descriptors, fork_server, sample
from firehose_bq.config import Config, SparkConfig
from firehose_bq.pipeline import Pipeline
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KAFKA_PYTHON, KafkaMetadataClient
from firehose_bq.source.kafka_client import READ_BATCH_ROWS
from firehose_bq.spark import spark_session

MESSAGES = 100_000
PARTITIONS = 2
ROUNDS = 3
TOPIC = "p2a"
# Also measured once, default levers only: a backlog large enough that a query's fixed cost (a new
# source-runner process, planning: ≈ 0.5 s, more than the plain process needs for 100k) no longer
# decides the ratio. The broker stalls past ~500k messages per partition.
LARGE = 400_000
# Also measured once: the same 100k messages spread over as many partitions as topics in production often
# have, read in at most as many tasks as cores (the default, SPARK_MAX_TASKS_PER_BATCH=0) and one task per
# partition (-1), side by side.
WIDE_PARTITIONS = 64


@dataclass(frozen=True)
class Run:
    """One pass over the topic: wall seconds, and CPU seconds of every process that took part (on a
    machine shared with other jobs, wall time also measures them; CPU time much less)."""

    messages: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def timed(messages: int, work: Callable[[], object], processes: Callable[[], float] = lambda: 0.0) -> Run:
    """`work()` over `messages` timed; `processes()` gives the CPU seconds so far of the processes besides
    this one."""
    before_cpu, before_others, started = _own_cpu(), processes(), time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    return Run(messages, seconds, _own_cpu() - before_cpu + processes() - before_others)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, librdkafka's included
    return usage.ru_utime + usage.ru_stime


def plain_run(brokers: str, topic: str, client: str, parse: Callable[[bytes], object]) -> Run:
    """One process: read every partition in turn with the bare `client`, ParseFromString each value."""
    ends = KafkaMetadataClient(brokers, "bench-plain").end_offsets((topic,))[topic]
    read = plain_confluent if client == CONFLUENT_KAFKA else _plain_kafka_python
    return timed(sum(ends.values()),
                 lambda: [read(brokers, topic, partition, end, parse) for partition, end in ends.items()])


def plain_run_together(brokers: str, topic: str, parse: Callable[[bytes], object]) -> Run:
    """One process, one confluent-kafka consumer assigned every partition at once, as a plain consumer reads a
    topic of many partitions (`plain_run` reads them one at a time, each read ending in a wait for more)."""
    import confluent_kafka as ck

    ends = KafkaMetadataClient(brokers, "bench-plain").end_offsets((topic,))[topic]

    def read() -> None:
        consumer = _plain_consumer(brokers)
        consumer.assign([ck.TopicPartition(topic, partition, 0) for partition, end in ends.items() if end])
        left = sum(ends.values())
        while left:
            for m in consumer.consume(num_messages=READ_BATCH_ROWS, timeout=0.1):
                if m.error() is None:
                    parse(m.value())
                    left -= 1
        consumer.close()

    return timed(sum(ends.values()), read)


def _plain_consumer(brokers: str) -> Any:
    """The bare confluent-kafka consumer both plain runs read with."""
    import confluent_kafka as ck

    return ck.Consumer({"bootstrap.servers": brokers, "group.id": "bench-plain", "enable.auto.commit": False,
                        "fetch.wait.max.ms": 50})


def plain_confluent(brokers: str, topic: str, partition: int, end: int, parse: Callable[[bytes], object]) -> None:
    import confluent_kafka as ck

    consumer = _plain_consumer(brokers)
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
    client: str = CONFLUENT_KAFKA
    decoder: str = "native"

    def label(self) -> str:
        return f"{self.client:<16} {self.decoder:<8}"


# Each lever alone, then both: the first is the job as it was before either, the last its default.
CONFIGURATIONS = [Levers(KAFKA_PYTHON, "python"), Levers(CONFLUENT_KAFKA, "python"), Levers(KAFKA_PYTHON, "native"),
                  Levers(CONFLUENT_KAFKA, "native")]


def spark_run(spark: SparkSession, env: dict[str, str], levers: Levers, name: str, state: str,
              messages: int = MESSAGES) -> Run:
    """One `--available-now` query over the topic, from a fresh checkpoint. Its CPU time is this
    process's and that of Spark's JVM and everything the JVM started (source runners, Python workers)."""
    cfg = Config.from_env({**env, "SOURCE_KAFKA_CLIENT": levers.client, "INPUT_SCHEMA_PROTO_DECODER": levers.decoder,
                           "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1",
                           "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{name}",
                           "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{name}"})
    roots = spark_roots(spark)
    pipeline = Pipeline(cfg, spark, write=False)
    pipeline.prepare()  # the table and descriptors, as a long-running job has them once
    run = timed(messages, lambda: pipeline.run(available_now=True),
                lambda: sum(p.cpu_seconds for root in roots for p in tree(root)))
    assert pipeline.summary.totals.messages == messages, pipeline.summary.totals.messages
    return run


def spark_roots(spark: SparkSession) -> list[int]:
    """The processes whose trees do Spark's work for this process: its JVM, and the fork server that
    Spark's Python processes on the driver are forked from (fork_server.py), a child of this process."""
    me = os.getpid()
    servers = [p.pid for p in tree(me) if p.ppid == me and fork_server.__name__ in cmdline(p.pid)]
    return [spark.sparkContext._gateway.proc.pid, *servers]  # type: ignore[union-attr]


def _spread(values: list[float], form: str) -> str:
    return f"{format(statistics.median(values), form)} ({' '.join(format(v, form) for v in values)})"


def run(rounds: int = ROUNDS, messages: int = MESSAGES) -> dict[str, float]:
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC}
        cfg = Config.from_env(env)
        cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE)
        parse = cls.FromString
        produce_fast(cfg, TOPIC, messages, PARTITIONS)
        spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[2]"),
                              {"spark.ui.enabled": "false"})
        # Warm-up: the first micro-batch with each set-up pays Spark's start-up costs, which are not throughput.
        warm_env = {**env, "SOURCE_KAFKA_TOPIC": "p2a-warm"}
        sample.ensure_topic(cfg.source.brokers, "p2a-warm", PARTITIONS)
        sample.produce(cfg.source.brokers, "p2a-warm", sample.booking_messages(cls), 1000, progress=False)
        for i, chosen in enumerate(CONFIGURATIONS):
            spark_run(spark, warm_env, chosen, f"warm-{i}", state, messages=1000)

        plain: list[Run] = []
        runs: dict[Levers, list[Run]] = {chosen: [] for chosen in CONFIGURATIONS}
        for r in range(rounds):
            plain.append(plain_run(cfg.source.brokers, TOPIC, CONFLUENT_KAFKA, parse))
            for i, chosen in enumerate(CONFIGURATIONS):
                runs[chosen].append(spark_run(spark, env, chosen, f"r{r}-{i}", state, messages))
        python_plain = plain_run(cfg.source.brokers, TOPIC, KAFKA_PYTHON, parse)
        large_env = {**env, "SOURCE_KAFKA_TOPIC": f"{TOPIC}-large"}
        produce_fast(Config.from_env(large_env), f"{TOPIC}-large", LARGE, PARTITIONS)
        large_plain = plain_run(cfg.source.brokers, f"{TOPIC}-large", CONFLUENT_KAFKA, parse)
        large = spark_run(spark, large_env, Levers(), "large", state, LARGE)
        wide_env = {**env, "SOURCE_KAFKA_TOPIC": f"{TOPIC}-wide"}
        produce_fast(Config.from_env(wide_env), f"{TOPIC}-wide", messages, WIDE_PARTITIONS)
        wide_plain = plain_run_together(cfg.source.brokers, f"{TOPIC}-wide", parse)
        wide = {tasks: spark_run(spark, {**wide_env, "SPARK_MAX_TASKS_PER_BATCH": tasks}, Levers(), f"wide{tasks}",
                                 state, messages)
                for tasks in ("0", "-1")}
        spark.stop()
    ratios = {chosen: [s.rate / p.rate for s, p in zip(done, plain, strict=True)] for chosen, done in runs.items()}
    print(f"P2a pipeline without a sink ({messages} example bookings, {PARTITIONS} partitions, local[2]); "
          f"plain = one process, bare client loop; medians of {rounds} rounds (each round's values)")
    print(f"  plain confluent-kafka consume+parse {_spread([p.rate for p in plain], ',.0f')} msg/s, "
          f"CPU {_spread([p.cpu_seconds for p in plain], '.2f')} s   "
          f"(plain kafka-python: {python_plain.rate:,.0f} msg/s)")
    print(f"    {'reader':<16} {'decoder':<8} Spark read+decode: ratio to plain confluent-kafka in the same round "
          "(target ≥ 1.0x), msg/s, CPU s of every process")
    for chosen, done in runs.items():
        default = "   (the default)" if chosen == Levers() else ""
        print(f"    {chosen.label()} {_spread(ratios[chosen], '.2f')}x  "
              f"{statistics.median([s.rate for s in done]):>7,.0f} msg/s  "
              f"CPU {_spread([s.cpu_seconds for s in done], '.2f')} s{default}")
    print(f"  {LARGE} messages, default levers, one round: Spark {large.rate:,.0f} msg/s vs plain "
          f"{large_plain.rate:,.0f} msg/s = {large.rate / large_plain.rate:.2f}x  "
          f"(CPU {large.cpu_seconds:.2f} vs {large_plain.cpu_seconds:.2f} s)")
    print(f"  {messages} messages over {WIDE_PARTITIONS} partitions, default levers, one round: plain (one consumer "
          f"assigned every partition) {wide_plain.rate:,.0f} msg/s; Spark, tasks at most the cores (the default) "
          f"{wide['0'].rate:,.0f} msg/s "
          f"= {wide['0'].rate / wide_plain.rate:.2f}x, one task per partition {wide['-1'].rate:,.0f} msg/s "
          f"= {wide['-1'].rate / wide_plain.rate:.2f}x")
    return {**{f"p2a_{chosen.client}_{chosen.decoder}": statistics.median(ratios[chosen])
               for chosen in CONFIGURATIONS},
            "p2a_large": large.rate / large_plain.rate,
            "p2a_wide": wide["0"].rate / wide_plain.rate,
            "p2a_wide_task_per_partition": wide["-1"].rate / wide_plain.rate}


if __name__ == "__main__":
    import sys

    run(*(int(a) for a in sys.argv[1:3]))
