"""Writer-level throughput into the BigQuery emulator: one 100k-row batch of example bookings written
through each write path's writer, against the writers of the last commit before Arrow (proto rows for
the Storage Write API, insertAll from dicts), in one process, the methods taking turns.

Wall time is what a write takes (the emulator, a separate process on the same cores, does most of the
work); CPU is this process's own share, i.e. what the writer costs a Spark task. Rows are built before
timing: Arrow for the new writers, the old converter's dicts for the old ones.

    flock /tmp/firehose-heavy.lock .venv/bin/python -m bench.writers
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import time
import types
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from google.cloud import bigquery

from bench.localstack import local_stack
from firehose_bq import descriptors, sample
from firehose_bq.arrow_schema import TIMESTAMP, arrow_schema
from firehose_bq.bigquery import file_loads
from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.bigquery.storage_write import StorageWriteWriter, make_write_client
from firehose_bq.blobstore import LocalBlobStore
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.convert import JSON, STORAGE, ConvertedBatch, KafkaRecords, RowConverter, ValueEncoding
from firehose_bq.decode.reference import ReferenceDecoder
from firehose_bq.schema import MetadataColumns, table_schema

REPO = Path(__file__).resolve().parents[1]
ROWS = 100_000
ROUNDS = 2
# The last commit whose writers took dicts (proto rows for Storage Write): the baseline, read from git.
BASELINE = "3f79b90"
TOPIC, PARTITION, TIMESTAMP_MS = "bookings", 0, 1_767_225_600_123
LOAD_TIME = "2026-01-01T00:00:00.999000Z"


def baseline(module: str) -> types.ModuleType:
    """`module` (a firehose_bq module path) as it was at BASELINE, loaded under a name of its own."""
    path = module.replace(".", "/") + ".py"
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{BASELINE}:{path}"], capture_output=True, text=True,
                            check=True).stdout
    name = f"baseline_{module.rsplit('.', 1)[-1]}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # dataclasses look their module up while building the class
    exec(compile(source, f"{BASELINE}:{path}", "exec"), loaded.__dict__)  # noqa: S102 - the project's own code
    return loaded


def booking_rows(count: int) -> tuple[pa.RecordBatch, pa.StringArray, KafkaRecords, list[Any]]:
    """The example bookings 0..count-1 as the table's Arrow batch and insert ids, and as the Kafka records
    the old converter reads; plus the table's schema."""
    cls = descriptors.load([str(REPO / "descriptors" / "example.desc")]).message_class(sample.EXAMPLE_MESSAGE)
    make = sample.booking_messages(cls)
    values = [make(i)[1] for i in range(count)]
    schema = table_schema(cls.DESCRIPTOR, MetadataColumns())
    decoded = ReferenceDecoder(cls).decode(pa.array(values, pa.binary()))
    assert not decoded.failures
    loaded_at = datetime.fromisoformat(LOAD_TIME)
    metadata = {
        "message_topic": pa.array([TOPIC] * count),
        "message_partition": pa.array([PARTITION] * count, pa.int64()),
        "message_offset": pa.array(range(count), pa.int64()),
        "message_timestamp": pa.array([TIMESTAMP_MS * 1000] * count, pa.int64()).cast(TIMESTAMP),
        "load_time": pa.array([loaded_at] * count, TIMESTAMP),
    }
    rows = pa.RecordBatch.from_arrays([*decoded.values.flatten(), *metadata.values()], schema=arrow_schema(schema))
    ids = pa.array([f"{TOPIC}_{PARTITION}_{i}" for i in range(count)])
    records = KafkaRecords([TOPIC] * count, [PARTITION] * count, list(range(count)), [TIMESTAMP_MS] * count, values)
    return rows, ids, records, schema


def converted(records: KafkaRecords, encoding: ValueEncoding) -> ConvertedBatch:
    cls = descriptors.load([str(REPO / "descriptors" / "example.desc")]).message_class(sample.EXAMPLE_MESSAGE)
    return RowConverter(cls, MetadataColumns(), encoding=encoding).convert(records, LOAD_TIME)


def write_once(writer: Any, *batch: Any) -> list[Any]:
    """One write() of `batch` (the new writers' rows and ids, or the old ones' converted batch and
    records), the writer closed after it."""
    try:
        return writer.write(*batch)
    finally:
        writer.close()


def run(count: int = ROWS) -> dict[str, float]:
    rows, ids, records, schema = booking_rows(count)
    old_storage, old_insert = baseline("firehose_bq.bigquery.storage_write"), baseline("firehose_bq.bigquery.insert_all")
    as_proto, as_json = converted(records, STORAGE), converted(records, JSON)
    results: dict[str, float] = {}
    with local_stack() as (env, state):
        base = Config.from_env({**env, "SINK_BIGQUERY_DATASET_NAME": "writers", "SINK_BIGQUERY_TABLE_NAME": "unused",
                                "SPARK_CHECKPOINT_LOCATION": str(state / "ck")}).bigquery
        client = make_client(base)
        client.create_dataset(base.dataset)
        tables = iter(range(1_000))

        def fresh(method: str) -> BigQueryConfig:
            cfg = dataclasses.replace(base, table=f"{method}_{next(tables)}")
            client.create_table(bigquery.Table(cfg.table_ref, schema=schema))
            return cfg

        def parquet_load(cfg: BigQueryConfig) -> list[Any]:
            store = LocalBlobStore(state / "stage")
            writer = file_loads.StagingWriter(make_client(cfg), cfg, store, "batch-0/")
            failures = write_once(writer, rows, ids)
            with make_client(cfg) as loader_client:
                file_loads.FileLoader(loader_client, cfg, store, "bench").load(0, [writer.staged])
            return failures

        methods: dict[str, Callable[[BigQueryConfig], list[Any]]] = {
            "storage_write arrow_rows (new)": lambda cfg: write_once(
                StorageWriteWriter(make_client(cfg), make_write_client(cfg), cfg), rows, ids),
            "storage_write proto_rows (old)": lambda cfg: write_once(
                old_storage.StorageWriteWriter(make_client(cfg), make_write_client(cfg), cfg), as_proto, records),
            "insertall from Arrow (new)": lambda cfg: write_once(InsertAllWriter(make_client(cfg), cfg), rows, ids),
            "insertall from dicts (old)": lambda cfg: write_once(old_insert.InsertAllWriter(make_client(cfg), cfg),
                                                                 as_json, records),
            "file_loads Parquet (new)": parquet_load,
        }
        best: dict[str, tuple[float, float]] = {}
        for _ in range(ROUNDS):
            for name, write in methods.items():
                cfg = fresh(name.split()[0])
                wall, cpu = time.perf_counter(), time.process_time()
                failures = write(cfg)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert failures == [], f"{name}: {failures[:1]}"
                [landed] = client.query(f"SELECT COUNT(*) AS n FROM `{cfg.table_ref}`").result()
                assert landed.n == count, f"{name}: {landed.n} of {count} rows landed"
                best[name] = min(best.get(name, (wall, cpu)), (wall, cpu))
        client.close()
    print(f"Writers into the BigQuery emulator: {count:,} example bookings ({rows.num_columns} columns) in one "
          f"write() call, best of {ROUNDS} rounds taken in turns")
    arrow_wall = best["storage_write arrow_rows (new)"][0]
    for name, (wall, cpu) in best.items():
        results[name] = count / wall
        print(f"  {name:<32} {count / wall:>9,.0f} rows/s   wall {wall:6.2f} s   this process's CPU {cpu:6.2f} s   "
              f"{arrow_wall / wall:5.2f}x of arrow_rows")
    return results


if __name__ == "__main__":
    run()
