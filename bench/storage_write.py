"""Write paths into the emulator: the Storage Write writer against insertAll, on the same sample rows.

Both writers get the same converted sample bookings (each in its own encoding: STORAGE for the
Storage Write API, JSON for insertAll) and write them into fresh tables of the same schema on a
local stack started for the run. Only the write is timed; conversion is measured in bench.conversion.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

from google.cloud import bigquery

from firehose_bq import descriptors, sample
from firehose_bq.bigquery.client import make_client
from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.bigquery.storage_write import StorageWriteWriter, make_write_client
from firehose_bq.config import BigQueryConfig, StackConfig
from firehose_bq.convert import JSON, STORAGE, KafkaRecords, RowConverter, ValueEncoding
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.schema import MetadataColumns, table_schema

REPO = Path(__file__).resolve().parents[1]
ROWS = 20_000
LOAD_TIME = "2026-11-23T00:00:00.000000Z"


def _records(cls: type, count: int) -> KafkaRecords:
    values = [sample.booking(i, cls).SerializeToString() for i in range(count)]
    return KafkaRecords(["bookings"] * count, [0] * count, list(range(count)),
                        [sample.BASE_EPOCH_S * 1000 + i for i in range(count)], values)


def _timed_write(cfg: BigQueryConfig, client: bigquery.Client, cls: type, records: KafkaRecords,
                 encoding: ValueEncoding) -> float:
    """Rows/s of one writer over all `records`, written as one batch into a fresh table."""
    client.create_table(bigquery.Table(cfg.table_ref, schema=table_schema(cls.DESCRIPTOR, MetadataColumns())))
    batch = RowConverter(cls, MetadataColumns(), encoding=encoding).convert(records, LOAD_TIME)
    writer = (StorageWriteWriter(make_client(cfg), make_write_client(cfg), cfg) if encoding is STORAGE
              else InsertAllWriter(make_client(cfg), cfg))
    try:
        started = time.perf_counter()
        failures = writer.write(batch, records)
        elapsed = time.perf_counter() - started
    finally:
        writer.close()
    landed = next(iter(client.query(f"SELECT COUNT(*) AS n FROM `{cfg.table_ref}`").result())).n
    if failures or landed != len(batch.rows):
        raise RuntimeError(f"{cfg.table}: {len(failures)} failures, {landed} of {len(batch.rows)} rows landed")
    return len(batch.rows) / elapsed


def run(rows: int = ROWS) -> dict[str, float]:
    cls = descriptors.load((str(REPO / "descriptors" / "example.desc"),)).message_class(sample.EXAMPLE_MESSAGE)
    records = _records(cls, rows)
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(StackConfig.from_env(isolated_env(state)))
        stack.up(report=lambda line: None)
        try:
            env = stack.env()
            dataset = f"bench_{uuid.uuid4().hex[:8]}"

            def config(table: str) -> BigQueryConfig:
                return BigQueryConfig(project_id=env["SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID"], dataset=dataset,
                                      table=table, api_endpoint=env["SINK_BIGQUERY_API_ENDPOINT"],
                                      storage_api_endpoint=env["SINK_BIGQUERY_STORAGE_API_ENDPOINT"])

            client = make_client(config("unused"))
            client.create_dataset(dataset)
            storage = _timed_write(config("storage_write"), client, cls, records, STORAGE)
            insert_all = _timed_write(config("insert_all"), client, cls, records, JSON)
            client.close()
        finally:
            stack.down(report=lambda line: None)
    print(f"write paths into the emulator, {rows} sample rows in one batch")
    print(f"  Storage Write (default stream, 9 MB requests): {storage:8.0f} rows/s")
    print(f"  insertAll (insert_rows_json, 500-row requests): {insert_all:8.0f} rows/s")
    print(f"  ratio Storage Write / insertAll: {storage / insert_all:.2f}")
    return {"storage_write_rows_per_s": storage, "insert_all_rows_per_s": insert_all}


if __name__ == "__main__":
    run()
