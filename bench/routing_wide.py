"""Routing to many tables: the whole job (`firehose-bq run --available-now`, 60k records, 2 partitions) over
one topic whose records carry headers s1, s10, s50, s200 (the record's index modulo 1, 10, 50, 200), into
`bookings_${header.sN}`, for each table count and write method: where a cost per destination table shows.
Each job has its own dataset, so the tables are created on the fly; the rows landed are counted after
(each table must hold exactly its share). One run of each; the rates are the run summaries'.
`python -m bench.routing_wide storage_write insertall:1,200 file_loads` (default: every count). The job takes
this process's environment under the bench's own settings: `SPARK_MAX_OFFSETS_PER_TRIGGER=10000` before the
command gives 6 micro-batches, where the costs per table and micro-batch show (bench/slow_link.py adds
BigQuery's latency to them)."""

from __future__ import annotations

import sys
import time

from bench.job import run_job
from bench.localstack import local_stack, produce_fast
from bench.routing import landed
from firehose_bq.bigquery.client import make_client
from firehose_bq.config import Config

MESSAGES = 60_000
PARTITIONS = 2
COUNTS = (1, 10, 50, 200)
TOPIC = "wide"


def shared_evenly(written: int, rows: dict[str, int], messages: int, tables: int) -> bool:
    """Every message written once (`written`, the job's count; `rows`, each table's), each of `tables` its share."""
    return (written == messages and sum(rows.values()) == messages and len(rows) == tables
            and all(v == messages // tables for v in rows.values()))


def run(plan: list[tuple[str, int]], messages: int = MESSAGES) -> None:
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC}
        cfg = Config.from_env(env)
        produce_fast(cfg, TOPIC, messages, PARTITIONS,
                     headers=lambda i: [(f"s{n}", str(i % n).encode()) for n in COUNTS])
        client = make_client(cfg.bigquery)
        for method, n in plan:
            name = f"wide-{method}-{n}"
            dataset = name.replace("-", "_")
            started = time.perf_counter()
            job = run_job({**env, "SINK_BIGQUERY_DATASET_NAME": dataset,
                           "SINK_BIGQUERY_TABLE_NAME": f"bookings_${{header.s{n}}}",
                           "SINK_BIGQUERY_WRITE_METHOD": method, "FIREHOSE_LOG_LEVEL": "INFO",
                           # Past the default 100, 200 tables' records would fail as ROUTING_ERROR.
                           "SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK": str(max(COUNTS)),
                           "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{name}",
                           "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-{name}"}, name)
            rows = landed(client, cfg.bigquery.project_id, dataset)
            ok = shared_evenly(job.written, rows, messages, n)
            print(f"{method:<14} {n:>4} tables  job {job.seconds:6.1f} s  {messages / job.seconds:>8,.0f} msg/s  "
                  f"wall {job.wall:6.1f} s  landed {sum(rows.values())} in {len(rows)}  ok={ok}  "
                  f"(+check {time.perf_counter() - started - job.wall:.1f} s)", flush=True)
            assert ok, (job, rows)  # every row once, each table its share
        client.close()


if __name__ == "__main__":
    # Arguments: method[:count,count...] ..., e.g. `storage_write insertall:1,200` (default: every count).
    run([(m, int(n)) for arg in sys.argv[1:] for m, _, ns in [arg.partition(":")]
         for n in (ns.split(",") if ns else COUNTS)])
