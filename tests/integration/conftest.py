"""One real local stack (broker + BigQuery emulator) and one SparkSession per test session.

The stack runs on free ports with its own state directory, so tests never touch a stack the
developer has running. Each test gets its own topic and dataset names.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from google.cloud import bigquery

from firehose_bq.bigquery.client import make_client
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.devstack.stack import Stack, isolated_env, owned_stack
from firehose_bq.devstack.stack_config import StackConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DESCRIPTORS = REPO / "descriptors" / "example.desc"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cfg = StackConfig.from_env({**os.environ, **isolated_env(tmp_path_factory.mktemp("stack"))})
    with owned_stack(cfg) as running:
        yield running


@pytest.fixture(scope="session")
def stack_env(stack: Stack) -> dict[str, str]:
    return stack.env()


@pytest.fixture(scope="session")
def spark(stack: Stack):  # noqa: ANN201 - pyspark types are optional imports
    from firehose_bq.config import SparkConfig
    from firehose_bq.spark import spark_session

    session = spark_session(
        SparkConfig(checkpoint_location="unused", master="local[2]"),
        {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def bq_client(stack_env: dict[str, str]) -> bigquery.Client:
    return make_client(BigQueryConfig(
        project_id=stack_env["SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID"], dataset="unused", table="unused",
        api_endpoint=stack_env["SINK_BIGQUERY_API_ENDPOINT"],
    ))


@pytest.fixture
def bq_dataset(bq_client: bigquery.Client) -> Iterator[str]:
    name = f"it_{uuid.uuid4().hex[:10]}"
    bq_client.create_dataset(name)
    try:
        yield name
    finally:
        bq_client.delete_dataset(name, delete_contents=True, not_found_ok=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_decoders` run once per decoder: the native ones and the Python reference ones."""
    if "decoder" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_decoders"):
        metafunc.parametrize("decoder", ["native", "python"], indirect=True)


@pytest.fixture
def decoder(request: pytest.FixtureRequest) -> str:
    """INPUT_SCHEMA_PROTO_DECODER of the test's job: `auto` (the default) unless the test is `both_decoders`."""
    return getattr(request, "param", "auto")


@pytest.fixture
def job_env(stack_env: dict[str, str], tmp_path: Path, decoder: str) -> dict[str, str]:
    """A complete job environment on a fresh topic, dataset and checkpoint."""
    suffix = uuid.uuid4().hex[:8]
    return {
        **stack_env,
        "INPUT_SCHEMA_PROTO_DECODER": decoder,
        "SOURCE_KAFKA_TOPIC": f"bookings-{suffix}",
        "SOURCE_KAFKA_CONSUMER_GROUP_ID": f"it-{suffix}",
        "INPUT_SCHEMA_PROTO_CLASS": "firehose.example.v1.Booking",
        "SCHEMA_REGISTRY_STENCIL_URLS": str(EXAMPLE_DESCRIPTORS),
        "SINK_BIGQUERY_DATASET_NAME": f"it_{suffix}",
        "SINK_BIGQUERY_TABLE_NAME": "bookings",
        "SPARK_CHECKPOINT_LOCATION": str(tmp_path / "checkpoint"),
        "SPARK_MASTER": "local[2]",
    }


@pytest.fixture
def job_config(job_env: dict[str, str], bq_client: bigquery.Client) -> Iterator[Config]:
    cfg = Config.from_env(job_env)
    try:
        yield cfg
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@dataclass
class FakeRegistry:
    """What the server answers (path → body) and the requests it saw (path, headers)."""

    url: str
    routes: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def publish_versions(self, path: str, versions: dict[int, bytes]) -> None:
        # Stencil's layout: `<path>/versions` lists them, `<path>/versions/<n>` serves each one.
        self.routes.update({f"{path}/versions/{n}": blob for n, blob in versions.items()})
        self.routes[f"{path}/versions"] = json.dumps({"versions": sorted(versions)}).encode()

    def register_confluent(self, subject: str, version: int, schema_id: int, text: str) -> None:
        """A Confluent registry's routes for `subject`'s new latest `version`: the schema by id, the version
        (by number and as `latest`) and the list of versions, as the job asks for them."""
        schema = {"schema": text, "schemaType": "PROTOBUF", "references": []}
        versions = f"/subjects/{subject}/versions"
        self.routes[f"/schemas/ids/{schema_id}"] = json.dumps(schema).encode()
        entry = json.dumps({**schema, "subject": subject, "version": version, "id": schema_id}).encode()
        self.routes[f"{versions}/{version}?deleted=true"] = self.routes[f"{versions}/latest"] = entry
        known = json.loads(self.routes.get(f"{versions}?deleted=true", b"[]"))
        self.routes[f"{versions}?deleted=true"] = json.dumps(sorted({*known, version})).encode()

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


@pytest.fixture
def registry() -> Iterator[tuple[FakeRegistry, ThreadingHTTPServer]]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            fake.requests.append((self.path, dict(self.headers)))
            body = fake.routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body if body is not None else b'{"error_code": 40403, "message": "not found"}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake = FakeRegistry(f"http://127.0.0.1:{server.server_address[1]}")
    # A short poll interval makes shutdown() quick; the default half second is most of this file's run time.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    yield fake, server
    server.shutdown()
    server.server_close()
