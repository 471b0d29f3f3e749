"""P2b: Kafka → Spark → BigQuery emulator, end to end, per write method, against the emulator's own
ingest rate for the same converted rows sent straight through that method's API from one process, in
the same run. Target ≥ 0.7×: the pipeline should lose little to its own overhead.

Table-driven: each write method names its direct baseline in DIRECT."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from google.cloud import bigquery

from bench.localstack import local_stack, produce_fast
from firehose_bq import descriptors, sample
from firehose_bq.bigquery.client import call_options, make_client
from firehose_bq.bigquery.file_loads import encode_row
from firehose_bq.bigquery.storage_write import StorageWriteWriter, make_write_client
from firehose_bq.config import WRITE_METHODS, BigQueryConfig, Config, SparkConfig
from firehose_bq.convert import JSON, STORAGE, ConvertedBatch, KafkaRecords, RowConverter, ValueEncoding
from firehose_bq.pipeline import Pipeline, kafka_records
from firehose_bq.sink_schema import SinkSpec
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KafkaMetadataClient, read_range
from firehose_bq.source.kafka_source import READ_BATCH_ROWS
from firehose_bq.spark import spark_session

MESSAGES = 20_000
PARTITIONS = 2
TOPIC = "p2b"


def direct_insert_all(cfg: BigQueryConfig, batches: list[ConvertedBatch]) -> None:
    """tabledata.insertAll with the rows and insertIds the pipeline sends, in its request size."""
    client = make_client(cfg)
    call = call_options(cfg)
    size = cfg.insert_all_batch_size
    try:
        for batch in batches:
            for i in range(0, len(batch.rows), size):
                errors = client.insert_rows_json(cfg.table_ref, batch.rows[i:i + size],
                                                 row_ids=batch.insert_ids[i:i + size], **call)
                if errors:
                    raise RuntimeError(f"insertAll rejected rows: {errors[:1]}")
    finally:
        client.close()


def direct_storage_write(cfg: BigQueryConfig, batches: list[ConvertedBatch]) -> None:
    """AppendRows into the table's default stream: the rows as proto messages, in 9 MB requests."""
    writer = StorageWriteWriter(make_client(cfg), make_write_client(cfg), cfg)
    try:
        for batch in batches:
            rejected = writer.write(batch, EMPTY)
            if rejected:
                raise RuntimeError(f"Storage Write rejected rows: {rejected[:1]}")
    finally:
        writer.close()


def direct_file_load(cfg: BigQueryConfig, batches: list[ConvertedBatch]) -> None:
    """One load job of the rows as one newline-delimited JSON file, as the driver's load runs it."""
    client = make_client(cfg)
    data = io.BytesIO(b"".join(encode_row(row) for batch in batches for row in batch.rows))
    try:
        job = client.load_table_from_file(data, cfg.table_ref, job_config=bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
            schema=client.get_table(cfg.table_ref).schema))
        job.result()
    finally:
        client.close()


# Write method → its direct baseline and the value encoding its rows take.
DIRECT: dict[str, tuple[Callable[[BigQueryConfig, list[ConvertedBatch]], None], ValueEncoding]] = {
    "insertall": (direct_insert_all, JSON),
    "storage_write": (direct_storage_write, STORAGE),
    "file_loads": (direct_file_load, JSON),
}
# Rows that need no Kafka coordinates (the direct baselines write rows only).
EMPTY = KafkaRecords([], [], [], [], [])


def converted_topic(cfg: Config, spec: SinkSpec, encoding: ValueEncoding) -> list[ConvertedBatch]:
    """The topic as the pipeline's tasks convert it (same converter, same Arrow batches); not timed."""
    key_class = spec.descriptors.message_class(spec.key_class) if spec.key_class else None
    converter = RowConverter(spec.descriptors.message_class(spec.proto_class), spec.metadata, spec.options,
                             key_class, encoding=encoding)
    wanted = set(spec.metadata.columns) if spec.metadata.enabled else set()
    ends = KafkaMetadataClient(cfg.source.brokers, "bench-p2b").end_offsets((TOPIC,))[TOPIC]
    batches = []
    for partition, end in ends.items():
        for batch in read_range(cfg.source.brokers, TOPIC, partition, 0, end, stall_timeout_ms=60_000,
                                batch_rows=READ_BATCH_ROWS, client=CONFLUENT_KAFKA):
            kafka = kafka_records(batch, keys=key_class is not None, wanted=wanted)
            batches.append(converter.convert(kafka, load_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    return batches


def run(messages: int = MESSAGES) -> dict[str, float]:
    results: dict[str, float] = {}
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC, "SINK_BIGQUERY_DATASET_NAME": "p2b",
               "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1"}

        def config(method: str, table: str) -> Config:
            return Config.from_env({**env, "SINK_BIGQUERY_WRITE_METHOD": method, "SINK_BIGQUERY_TABLE_NAME": table,
                                    "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{table}",
                                    "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{table}"})

        cfg = config("insertall", "warm")
        produce_fast(cfg, TOPIC, messages, PARTITIONS)
        spark = spark_session(SparkConfig(checkpoint_location="unused", master="local[2]"),
                              {"spark.ui.enabled": "false"})
        # Warm-up: a session's first micro-batch pays Spark's start-up costs, which are not throughput.
        warm = Config.from_env({**env, "SOURCE_KAFKA_TOPIC": f"{TOPIC}-warm", "SINK_BIGQUERY_TABLE_NAME": "warm",
                                "SPARK_CHECKPOINT_LOCATION": f"{state}/warm"})
        cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(sample.EXAMPLE_MESSAGE)
        sample.ensure_topic(cfg.source.brokers, f"{TOPIC}-warm", PARTITIONS)
        sample.produce(cfg.source.brokers, f"{TOPIC}-warm", sample.booking_messages(cls), 1000, progress=False)
        Pipeline(warm, spark).run(available_now=True)

        print(f"P2b end to end into the BigQuery emulator ({messages} example bookings, {PARTITIONS} partitions, "
              "local[2]; direct = one process sending the same converted rows)")
        for method in WRITE_METHODS:
            pipeline = Pipeline(config(method, method), spark)
            direct, encoding = DIRECT[method]
            direct_cfg = config(method, f"{method}_direct")
            batches = converted_topic(direct_cfg, Pipeline(direct_cfg, spark).prepare(), encoding)  # creates the table
            started = time.perf_counter()
            direct(direct_cfg.bigquery, batches)
            direct_rate = messages / (time.perf_counter() - started)
            summary = pipeline.run(available_now=True)
            assert summary.totals.rows_written == messages, summary.render()
            pipeline_rate = messages / summary.seconds
            results[f"p2b_{method}"] = pipeline_rate / direct_rate
            print(f"  {method:<14} pipeline {pipeline_rate:>9,.0f} rows/s   direct API {direct_rate:>9,.0f} rows/s   "
                  f"ratio {pipeline_rate / direct_rate:.2f}x (target ≥ 0.7x)")
        spark.stop()
    return results


if __name__ == "__main__":
    run()
