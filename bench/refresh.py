"""Refresh latency: a descriptor version published on an HTTP registry → its new column usable in the table.

Runs the production path (DescriptorCache's background refresh → listener → SinkSchema evolving the
table) against a local stack started for the run, with a small HTTP server as the registry.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import descriptor_pb2

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import Config, read_env_file
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.sink_schema import SinkSchema
from firehose_bq.registry.cache import DescriptorCache

REPO = Path(__file__).resolve().parents[1]
TTL_MS = 1000
VERSIONS = 5


def with_field(blob: bytes, name: str) -> bytes:
    """The set with one more string field in the nested Location message (Booking.pickup/dropoff)."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(blob)
    location = next(m for f in fds.file for m in f.message_type if m.name == "Location")
    location.field.add(name=name, json_name=name, number=max(f.number for f in location.field) + 1,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return fds.SerializeToString()


def serve(routes: dict[str, bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    return server


def run() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(StackConfig.from_env(isolated_env(state)))
        stack.up(report=lambda line: None)
        routes: dict[str, bytes] = {"/example.desc": (REPO / "descriptors" / "example.desc").read_bytes()}
        server = serve(routes)
        try:
            env = {**read_env_file(REPO / "config" / "local.env"), **stack.env(),
                   "SCHEMA_REGISTRY_STENCIL_URLS": f"http://127.0.0.1:{server.server_address[1]}/example.desc",
                   "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": str(TTL_MS), "SINK_BIGQUERY_TABLE_NAME": "refresh_bench"}
            cfg = Config.from_env(env)
            cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
            schema = SinkSchema(cfg, cache.get)
            cache.add_listener(schema.on_descriptors_changed)
            schema.current()
            client = make_client(cfg.bigquery)
            latencies = []
            phases = random.Random(7)
            for version in range(VERSIONS):
                name = f"added_{version}"
                # Publish at a random point of the refresh interval, as a real publish would happen.
                time.sleep(phases.uniform(0, TTL_MS / 1000))
                routes["/example.desc"] = with_field(routes["/example.desc"], name)
                published = time.monotonic()
                while name not in {s.name for f in client.get_table(cfg.bigquery.table_ref).schema
                                   if f.name == "pickup" for s in f.fields}:
                    time.sleep(0.02)
                latencies.append(time.monotonic() - published)
            cache.stop()
        finally:
            server.shutdown()
            stack.down(report=lambda line: None)
    median = statistics.median(latencies)
    print(f"Refresh latency (cache TTL {TTL_MS} ms, {VERSIONS} versions, each adding a nested field)")
    print(f"  published on the registry → column usable in the table: median {median:.2f} s "
          f"(min {min(latencies):.2f}, max {max(latencies):.2f}); published at random points of the interval, "
          f"so the wait for the next refresh tick is 0–{TTL_MS / 1000:.1f} s of it")
    return {"refresh_latency_s": median}
