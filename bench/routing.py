"""Routing throughput: the whole job (`firehose-bq run --available-now`, the default write method) over the
same topic, every record to one table, against the records spread over TABLES tables by a header
template (`SINK_BIGQUERY_TABLE_NAME=bookings_${header.shard}`), in the same run.

The topic is produced once, each record carrying a `shard` header (its index modulo TABLES), so both jobs
read the very same records; the one-table job's name has no placeholder, so it ignores the header. Each
job has its own checkpoint, consumer group and dataset, and each round runs both, taking turns. The
rates are the run summaries' (from the streaming query's start to the topic drained), as P2c's; the
rows landed in each dataset are counted afterwards."""

from __future__ import annotations

import statistics
import sys

from google.cloud import bigquery

from bench.job import run_job
from bench.localstack import local_stack, produce_fast
from firehose_bq.bigquery.client import make_client
from firehose_bq.config import Config

MESSAGES = 60_000
PARTITIONS = 2
TABLES = 10
ROUNDS = 2
TOPIC = "routing"
ROUTED_TABLE = "bookings_${header.shard}"


def landed(client: bigquery.Client, project: str, dataset: str) -> dict[str, int]:
    """Rows per table of `dataset`."""
    return {t.table_id: next(iter(client.query(f"SELECT COUNT(*) AS n FROM `{project}.{dataset}.{t.table_id}`")
                                  .result())).n
            for t in client.list_tables(f"{project}.{dataset}")}


def run(messages: int = MESSAGES, rounds: int = ROUNDS) -> dict[str, float]:
    rates: dict[int, list[float]] = {1: [], TABLES: []}
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC}
        cfg = Config.from_env(env)
        produce_fast(cfg, TOPIC, messages, PARTITIONS, headers=lambda i: [("shard", str(i % TABLES).encode())])
        client = make_client(cfg.bigquery)
        for r in range(rounds):
            for tables, table in ((1, "bookings"), (TABLES, ROUTED_TABLE)):
                name = f"routing-{tables}-r{r}"
                dataset = name.replace("-", "_")
                job = run_job({**env, "SINK_BIGQUERY_DATASET_NAME": dataset, "SINK_BIGQUERY_TABLE_NAME": table,
                               "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{name}",
                               "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{name}"}, name)
                counts = landed(client, cfg.bigquery.project_id, dataset)
                assert job.written == messages and sum(counts.values()) == messages and len(counts) == tables, \
                    (job, counts)
                rates[tables].append(messages / job.seconds)
        client.close()
    ratio = [many / one for one, many in zip(rates[1], rates[TABLES], strict=True)]
    print(f"Routing throughput: the whole job (`firehose-bq run --available-now`, "
          f"{cfg.bigquery.effective_write_method}, {messages} example bookings, {PARTITIONS} partitions); "
          f"medians of {rounds} rounds (each round's values)")
    for tables, done in rates.items():
        label = "1 table" if tables == 1 else f"{tables} tables by ${{header.shard}}"
        print(f"  {label:<28} {statistics.median(done):>8,.0f} msg/s  ({' '.join(f'{v:,.0f}' for v in done)})")
    print(f"  {TABLES} tables / 1 table: {statistics.median(ratio):.2f}x ({' '.join(f'{v:.2f}' for v in ratio)})")
    return {"routing_1_msg_s": statistics.median(rates[1]), f"routing_{TABLES}_msg_s": statistics.median(rates[TABLES]),
            "routing_ratio": statistics.median(ratio)}


if __name__ == "__main__":
    run(*(int(a) for a in sys.argv[1:3]))
