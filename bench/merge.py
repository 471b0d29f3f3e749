"""Merge-flush cost: one MERGE of 100k intermediate rows vs a plain INSERT … SELECT of the same rows.

Both run on the same emulator (a local stack started for the run) over the same intermediate table,
whose rows are the sample bookings decoded and reshaped by the production code (20k keys, ~10%
tombstones) and appended with Storage Write (the staging is not timed). Timed: the MERGE of the batch into
an empty table (all INSERT branches after dedup), the same MERGE again (all UPDATE/DELETE branches: a
replayed batch), and an INSERT … SELECT of every non-tombstone row into another empty table.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from google.cloud import bigquery
from google.protobuf import message_factory

from firehose_bq import descriptors, sample
from firehose_bq.bigquery.client import make_client
from firehose_bq.config import Config, read_env_file
from firehose_bq.batch.rows import RowBuilder
from firehose_bq.bigquery.client import Clients
from firehose_bq.bigquery.storage_write import StorageWriteWriter
from firehose_bq.decode import make_value_decoder
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.schema import MetadataColumns
from firehose_bq.sink_schema import plan_table
from firehose_bq.upsert import tables
from firehose_bq.upsert.sql import MergePlan, TableRef, quote
from firehose_bq.source.batches import ARROW_SCHEMA
from firehose_bq.upsert.writer import intermediate_rows

REPO = Path(__file__).resolve().parents[1]
ROWS = 100_000
KEYS = 20_000
KEY_FIELD = "booking_key"
BATCH = 1


def staged_rows(cfg: Config, n: int) -> pa.RecordBatch:
    """n changelog records (keys drawn from KEYS, ~10% tombstones) as the upsert mode's tasks stage them:
    decoded by the row builder a task uses, reshaped by upsert.writer.intermediate_rows."""
    loaded = descriptors.load(cfg.input_schema.stencil_urls)
    cls = loaded.message_class(cfg.input_schema.proto_class)
    key_class = message_factory.GetMessageClass(cls.DESCRIPTOR.file.message_types_by_name["BookingKey"])
    rng = random.Random(11)
    keys = [key_class(order_number=f"K-{rng.randrange(KEYS):05d}").SerializeToString() for _ in range(n)]
    values = [None if rng.random() < 0.1 else sample.booking(j % 5000, cls).SerializeToString() for j in range(n)]
    source = pa.RecordBatch.from_pydict(
        {"key": keys, "value": values, "topic": ["bench"] * n, "partition": [0] * n, "offset": range(n),
         "timestamp": [1_767_225_600_000_000 + 1000 * j for j in range(n)], "timestamp_type": [0] * n,
         "headers": [[]] * n, "leader_epoch": [0] * n}, schema=ARROW_SCHEMA)
    builder = RowBuilder(make_value_decoder(cls, 1), MetadataColumns(),
                         make_value_decoder(key_class, 2), changelog=True)
    rows = builder.build(source, 1_795_392_000_000_000)
    assert not rows.failures, rows.failures[:1]
    return intermediate_rows(rows, source, BATCH)


def timed(client: bigquery.Client, sql: str) -> float:
    started = time.monotonic()
    client.query(sql).result()
    return time.monotonic() - started


def run(rows: int = ROWS) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(StackConfig.from_env(isolated_env(state)))
        stack.up(report=lambda line: None)
        try:
            env = {**read_env_file(REPO / "config" / "local.env"), **stack.env(),
                   "SINK_BIGQUERY_TABLE_NAME": "merge_bench", "SINK_BIGQUERY_UPSERT_ENABLED": "true",
                   "SINK_BIGQUERY_DELETE_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": KEY_FIELD,
                   "INPUT_SCHEMA_PROTO_KEY_CLASS": "firehose.example.v1.BookingKey"}
            cfg = Config.from_env(env)
            bq = cfg.bigquery
            client = make_client(bq)
            client.create_dataset(bq.dataset, exists_ok=True)
            planned = plan_table(cfg, descriptors.load(cfg.input_schema.stencil_urls)).table
            schema = tables.destination_schema(planned.schema, KEY_FIELD)
            dest = TableRef(bq.project_id, bq.dataset, bq.table)
            plain = TableRef(bq.project_id, bq.dataset, f"{bq.table}_plain")
            inter = TableRef(bq.project_id, bq.dataset, tables.intermediate_name(bq.table, "tmp"))
            for ref in (dest, plain):
                client.create_table(bigquery.Table(ref.api, schema=schema))
            client.create_table(tables.intermediate_table(inter, schema, KEY_FIELD))
            staging = dataclasses.replace(bq, table=inter.table)
            with Clients() as clients:
                writer = StorageWriteWriter(clients.bigquery_client(staging), clients.write_client(staging), staging)
                try:
                    assert not writer.write(staged_rows(cfg, rows), None)
                finally:
                    writer.close()
            key, values = tables.split_key(schema, KEY_FIELD)
            plan = MergePlan(dest, inter, KEY_FIELD, tuple(key.fields), tuple(v.name for v in values), True, True)

            merge_new = timed(client, plan.merge(BATCH))
            merge_again = timed(client, plan.merge(BATCH))
            columns = ", ".join(quote(c) for c in (KEY_FIELD, *plan.value_columns))
            selected = ", ".join(["key", *(f"value.{quote(c)}" for c in plan.value_columns)])
            insert = timed(client, f"INSERT INTO {plain.sql} ({columns}) SELECT {selected} FROM {inter.sql} "
                                   f"WHERE {quote('batchNumber')} = {BATCH} AND value IS NOT NULL")
            merged = next(iter(client.query(f"SELECT COUNT(*) AS n FROM {dest.sql}").result())).n
            inserted = next(iter(client.query(f"SELECT COUNT(*) AS n FROM {plain.sql}").result())).n
        finally:
            stack.down(report=lambda line: None)
    print(f"Merge flush, {rows} intermediate rows ({KEYS} keys, ~10% tombstones), on the emulator")
    print(f"  MERGE into an empty table        {merge_new:7.2f} s  → {merged} rows (latest per live key)")
    print(f"  same MERGE again (update/delete) {merge_again:7.2f} s")
    print(f"  plain INSERT … SELECT            {insert:7.2f} s  → {inserted} rows (no dedup)")
    print(f"  MERGE / INSERT … SELECT: {merge_new / insert:.1f}x")
    return {"merge_s": merge_new, "merge_again_s": merge_again, "insert_select_s": insert}


if __name__ == "__main__":
    sys.exit(run(int(sys.argv[1]) if len(sys.argv) > 1 else ROWS) and 0)
