"""P2b: Kafka → Spark → BigQuery emulator, end to end, per write method, against the emulator's own
ingest rate for the same rows sent straight through that method's writer from one process, in the same
run. Target ≥ 0.7×: the pipeline should lose little to its own overhead. The same run also gives the
Storage Write path end to end against insertAll end to end (target ≥ 5×).

Table-driven: each write method names its direct baseline in DIRECT. The rows of the direct side are
decoded before timing, by the same decoders the pipeline's tasks use (batch/rows.py). File loads run twice:
staged in a local directory (the default, from which the driver combines the tasks' files and uploads
them with the job) and in `gs://` (the stack's Cloud Storage emulator, as on a cluster: the job reads the
objects), both sides alike."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable

from bench.localstack import local_stack, produce_fast
from firehose_bq import descriptors, sample
from firehose_bq.batch.core import row_builder
from firehose_bq.batch.rows import Writable, insert_ids
from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.client import Clients, make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.bigquery.storage_write import StorageWriteWriter
from firehose_bq.bigquery.writers import RowWriter
from firehose_bq.blobstore import LocalBlobStore
from firehose_bq.config import Config, SparkConfig
from firehose_bq.modes import table_rows
from firehose_bq.pipeline import Pipeline
from firehose_bq.sink_schema import SinkSpec
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KafkaMetadataClient, RangeReader
from firehose_bq.spark import spark_session

MESSAGES = 100_000  # at 20k the fixed cost of a query (≈ 1–1.5 s) was most of what the ratio measured
PARTITIONS = 2
TOPIC = "p2b"
METHODS = ("insertall", "storage_write", "file_loads")
GCS_FILE_LOADS = "file_loads_gcs"  # file_loads staged in gs://, printed and reported under this name


def write_all(writer: RowWriter, batches: list[Writable], what: str) -> None:
    """Every batch through `writer` (closed after), as a task's writer gets them; a rejected row is an error."""
    try:
        for batch in batches:
            if rejected := writer.write(batch.rows, batch.insert_ids):
                raise RuntimeError(f"{what} rejected rows: {rejected[:1]}")
    finally:
        writer.close()


def direct_insert_all(config: Config, batches: list[Writable]) -> None:
    """tabledata.insertAll of the rows and insertIds the pipeline sends, through its writer."""
    cfg = config.bigquery
    with Clients() as clients:
        write_all(InsertAllWriter(clients.bigquery_client(cfg), cfg), batches, "insertAll")


def direct_storage_write(config: Config, batches: list[Writable]) -> None:
    """AppendRows of the rows as Arrow record batches into the table's default stream."""
    cfg = config.bigquery
    with Clients() as clients:
        writer = StorageWriteWriter(clients.bigquery_client(cfg), clients.write_client(cfg), cfg)
        write_all(writer, batches, "Storage Write")


def direct_file_load(config: Config, batches: list[Writable]) -> None:
    """The rows staged as Parquet by one writer where the job stages (its staging area, or a scratch directory
    for the default) and loaded in one job, as the driver's load runs it."""
    cfg = config.bigquery
    with tempfile.TemporaryDirectory() as root, Clients() as clients:
        area = file_loads.staging_area(config, prefix=f"direct-{uuid.uuid4().hex[:8]}/")
        store = area.store() if cfg.file_loads_staging_uri else LocalBlobStore(root)
        writer = file_loads.StagingWriter(clients.bigquery_client(cfg), cfg, store, area.batch(0))
        write_all(writer, batches, "staging")
        with make_client(cfg) as client:
            # A plan of its own (the job id comes from it): a round's load must not find an earlier one's.
            file_loads.FileLoader(client, cfg, store, "bench-direct").load(0, [writer.staged], [uuid.uuid4().hex])
        if cfg.file_loads_staging_uri:
            file_loads.discard(store, area.prefix)


DIRECT: dict[str, Callable[[Config, list[Writable]], None]] = {
    "insertall": direct_insert_all,
    "storage_write": direct_storage_write,
    "file_loads": direct_file_load,
}


def decoded_topic(cfg: Config, spec: SinkSpec) -> list[Writable]:
    """The topic as the pipeline's tasks decode it (same reader batches, same decoders); not timed."""
    builder = row_builder(spec, False, spec.proto_class)
    ends = KafkaMetadataClient(cfg.source.brokers, "bench-p2b").end_offsets((TOPIC,))[TOPIC]
    reader = RangeReader(cfg.source.brokers, CONFLUENT_KAFKA, stall_timeout_ms=60_000)  # as the tasks read
    batches = []
    for partition, end in ends.items():
        for source in reader.read(TOPIC, partition, 0, end):
            batches.append(table_rows(builder.build(source, time.time_ns() // 1000), insert_ids(source)))
    return batches


def run(messages: int = MESSAGES) -> dict[str, float]:
    results: dict[str, float] = {}
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC, "SINK_BIGQUERY_DATASET_NAME": "p2b",
               "SPARK_MAX_OFFSETS_PER_TRIGGER": "-1", "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "0"}

        def config(method: str, table: str) -> Config:
            staging = ({"SINK_BIGQUERY_FILE_LOADS_STAGING_URI": f"gs://{stack_env['FIREHOSE_STACK_GCS_BUCKET']}/p2b"}
                       if method == GCS_FILE_LOADS else {})
            return Config.from_env({**env, **staging, "SINK_BIGQUERY_WRITE_METHOD": method.removesuffix("_gcs"),
                                    "SINK_BIGQUERY_TABLE_NAME": table,
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
              "local[2]; direct = one process sending the same decoded rows through the same writer; writer CPU = that "
              "process's own CPU per row, what the writer costs a task)")
        end_to_end: dict[str, float] = {}
        for method in (*METHODS, GCS_FILE_LOADS):
            pipeline = Pipeline(config(method, method), spark)
            direct_cfg = config(method, f"{method}_direct")
            batches = decoded_topic(direct_cfg, Pipeline(direct_cfg, spark).prepare())  # creates the table
            started, cpu = time.perf_counter(), time.process_time()
            DIRECT[direct_cfg.bigquery.write_method](direct_cfg, batches)
            direct_rate = messages / (time.perf_counter() - started)
            writer_us = (time.process_time() - cpu) / messages * 1e6  # the writer's own cost, as a task pays it
            summary = pipeline.run(available_now=True)
            assert summary.totals.rows_written == messages, summary.render()
            end_to_end[method] = messages / summary.seconds
            results[f"p2b_{method}"] = end_to_end[method] / direct_rate
            print(f"  {method:<15} pipeline {end_to_end[method]:>9,.0f} rows/s   direct {direct_rate:>9,.0f} rows/s"
                  f"   ratio {results[f'p2b_{method}']:.2f}x (target ≥ 0.7x)   writer CPU {writer_us:.1f} µs/row")
        results["storage_write_vs_insertall"] = end_to_end["storage_write"] / end_to_end["insertall"]
        print(f"  Storage Write end to end vs insertAll end to end: {results['storage_write_vs_insertall']:.1f}x "
              "(target ≥ 5x)")
        spark.stop()
    return results


if __name__ == "__main__":
    import sys

    run(int(sys.argv[1]) if len(sys.argv) > 1 else MESSAGES)
