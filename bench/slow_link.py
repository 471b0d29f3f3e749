"""Routing over a link with BigQuery's latency: the whole job (`firehose-bq run --available-now`, 60k records,
2 partitions, 6 micro-batches of 10k) into 200 tables by a header, with the BigQuery emulator's REST and
gRPC ports reached through a TCP relay that delays every chunk by half the round trip each way (default
50 ms, about a request to BigQuery from a nearby region). On the local emulator a request is the emulator's
own work on the same two cores; on BigQuery it is mostly waiting, which is what the routed task's
concurrent writes (SINK_BIGQUERY_CONCURRENT_TABLE_WRITES) and its workers' kept table checks
(SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS) are for. Each is measured on and off, side by side.
`python -m bench.slow_link [round-trip ms] [routing|insertall]`: `insertall` runs the same records into one
table by insertAll instead (one micro-batch), one request at a time against
SINK_BIGQUERY_INSERT_ALL_CONCURRENT_REQUESTS' default."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from bench.job import run_job
from bench.localstack import local_stack, produce_fast
from bench.routing import landed
from bench.routing_wide import shared_evenly
from firehose_bq.bigquery.client import make_client
from firehose_bq.config import Config

MESSAGES = 60_000
PARTITIONS = 2
TABLES = 200
TOPIC = "slow"
VARIANTS = {  # name: settings
    "one table at a time, checks per task": {"SINK_BIGQUERY_CONCURRENT_TABLE_WRITES": "1",
                                             "SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS": "0"},
    "one table at a time, kept checks": {"SINK_BIGQUERY_CONCURRENT_TABLE_WRITES": "1"},
    "8 tables at once, kept checks (the defaults)": {},
}
INSERT_ALL_VARIANTS = {  # one table, insertall
    "one request at a time": {"SINK_BIGQUERY_INSERT_ALL_CONCURRENT_REQUESTS": "1"},
    "4 requests at once (the default)": {},
}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, one_way_s: float) -> None:
    """Everything `reader` sends, to `writer`, each chunk `one_way_s` after it arrived (in order, unthrottled)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while (item := await queue.get())[1]:
            await asyncio.sleep(max(0.0, item[0] - time.monotonic()))
            writer.write(item[1])
            await writer.drain()
        writer.close()

    delivering = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + one_way_s, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, b""))
    await delivering


@contextmanager
def slow_link(target_host: str, target_port: int, rtt_ms: float) -> Iterator[int]:
    """A relay on 127.0.0.1 to the target, adding `rtt_ms` to every round trip; yields its port."""
    loop = asyncio.new_event_loop()
    ready: list[int] = []

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(target_host, target_port)
        one_way = rtt_ms / 2000
        await asyncio.gather(_pipe(client_r, server_w, one_way), _pipe(server_r, client_w, one_way),
                             return_exceptions=True)

    async def serve() -> asyncio.Server:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(server.sockets[0].getsockname()[1])
        return server

    server = loop.run_until_complete(serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield ready[0]
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def run(rtt_ms: float = 50.0, case: str = "routing") -> None:
    """`case`: routing (VARIANTS) or insertall (INSERT_ALL_VARIANTS)."""
    routed = case == "routing"
    with local_stack() as (stack_env, state):
        env = {**stack_env, "SOURCE_KAFKA_TOPIC": TOPIC}
        cfg = Config.from_env(env)
        produce_fast(cfg, TOPIC, MESSAGES, PARTITIONS, headers=lambda i: [("s", str(i % TABLES).encode())])
        rest = urlsplit(cfg.bigquery.api_endpoint)
        grpc_host, _, grpc_port = cfg.bigquery.storage_api_endpoint.rpartition(":")
        client = make_client(cfg.bigquery)
        if routed:
            print(f"Routing over a {rtt_ms:.0f} ms link: {MESSAGES} example bookings, {PARTITIONS} partitions, "
                  f"6 micro-batches of 10k, into {TABLES} tables by a header, storage_write")
            job_env = {"SINK_BIGQUERY_TABLE_NAME": "bookings_${header.s}", "SPARK_MAX_OFFSETS_PER_TRIGGER": "10000",
                       "SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK": str(TABLES)}
        else:
            print(f"insertAll over a {rtt_ms:.0f} ms link: {MESSAGES} example bookings, {PARTITIONS} partitions, one "
                  "micro-batch, into one table")
            job_env = {"SINK_BIGQUERY_TABLE_NAME": "bookings", "SINK_BIGQUERY_WRITE_METHOD": "insertall"}
        with slow_link(rest.hostname or "127.0.0.1", rest.port or 80, rtt_ms) as rest_port, \
                slow_link(grpc_host, int(grpc_port), rtt_ms) as grpc_port_slow:
            for n, (variant, settings) in enumerate((VARIANTS if routed else INSERT_ALL_VARIANTS).items()):
                dataset = f"slow_{n}"
                job = run_job({**env, **job_env, **settings,
                               "SINK_BIGQUERY_API_ENDPOINT": f"http://127.0.0.1:{rest_port}",
                               "SINK_BIGQUERY_STORAGE_API_ENDPOINT": f"127.0.0.1:{grpc_port_slow}",
                               "SINK_BIGQUERY_DATASET_NAME": dataset, "FIREHOSE_LOG_LEVEL": "INFO",
                               "SPARK_CHECKPOINT_LOCATION": f"{state}/ck-{n}",
                               "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"bench-slow-{n}"}, f"slow-{n}")
                rows = landed(client, cfg.bigquery.project_id, dataset)
                ok = shared_evenly(job.written, rows, MESSAGES, TABLES if routed else 1)
                print(f"  {variant:<46} job {job.seconds:6.1f} s  {MESSAGES / job.seconds:>7,.0f} msg/s  ok={ok}",
                      flush=True)
                assert ok, (job, len(rows), sum(rows.values()))
        client.close()


if __name__ == "__main__":
    run(float(sys.argv[1]) if len(sys.argv) > 1 else 50.0, sys.argv[2] if len(sys.argv) > 2 else "routing")
