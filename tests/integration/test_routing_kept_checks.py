"""A routed job's kept table checks (sink_schema.CheckedTables) against tables changed under the running job:
dropped and re-created by hand with fewer columns or another type, a dataset deleted, new descriptors. Every
record ends in its table or the DLQ, once; none is dropped and the job does not stop in a loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry
from tests.integration.test_dead_letters import read_topic

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos"


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.3)


class Job:
    def __init__(self, cfg: Config, spark, cache: DescriptorCache, bq: bigquery.Client) -> None:
        self.cfg, self.cache, self.bq = cfg, cache, bq
        self.pipeline = Pipeline(cfg, spark, descriptor_source=cache.get)
        cache.add_listener(self.pipeline.schema.on_descriptors_changed)
        self.producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
        self.sent = 0

    def send(self, site: str, count: int, **fields: object) -> list[str]:
        cls = self.cache.get().message_class("shard.Reading")
        ids = []
        for _ in range(count):
            rid = f"r{self.sent}"
            self.sent += 1
            ids.append(rid)
            self.producer.send(self.cfg.source.topics[0], cls(id=rid, value=self.sent, note={"text": site}, **fields)
                               .SerializeToString(), headers=[("site", site.encode())])
        self.producer.flush()
        return ids

    def table(self, site: str) -> str:
        return f"{self.cfg.bigquery.project_id}.{self.cfg.bigquery.dataset}.readings_{site}"

    def rows(self, site: str) -> list[dict]:
        try:
            return [dict(r.items()) for r in self.bq.query(f"SELECT * FROM `{self.table(site)}`").result()]
        except Exception:  # noqa: BLE001 - a table gone counts as no rows
            return []

    def letters(self) -> list:
        try:
            return read_topic(self.cfg.source.brokers, self.cfg.dlq.kafka_topic)
        except Exception:  # noqa: BLE001
            return []


@contextmanager
def running(spark, job_env: dict[str, str], fake: FakeRegistry, bq: bigquery.Client, tmp_path: Path,
            **settings: str) -> Iterator[Job]:
    blobs = {v: compile_protos(tmp_path / f"{v}.desc", PROTOS / v).read_bytes() for v in ("shard_v1", "shard_v2")}
    fake.routes["/shard.desc"] = blobs["shard_v1"]
    fake.routes["/shard_v2.desc"] = blobs["shard_v2"]
    dlq = f"dlq-{job_env['SOURCE_KAFKA_TOPIC']}"
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "shard.Reading",
                           "SINK_BIGQUERY_TABLE_NAME": "readings_${header.site}",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/shard.desc",
                           "SCHEMA_REGISTRY_STENCIL_CACHE_TTL_MS": "1000",
                           "SPARK_TRIGGER_INTERVAL_MS": "500", "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "KAFKA",
                           "DLQ_KAFKA_TOPIC": dlq, **settings})
    ensure_topic(cfg.source.brokers, cfg.source.topics[0], 2)
    ensure_topic(cfg.source.brokers, dlq, 1)
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    job = Job(cfg, spark, cache, bq)
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            job.pipeline.run(available_now=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    job.failures = failures  # type: ignore[attr-defined]
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        yield job
    finally:
        stop.set()
        runner.join(120)
        cache.stop()
        job.producer.close()
        bq.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def full(rows: list[dict]) -> bool:
    """Every row holds its values (none stored without them)."""
    return all(r.get("value") is not None and r.get("note") and r.get("message_offset") is not None for r in rows)


@pytest.mark.parametrize("method", ["storage_write", "insertall"])
def test_tables_changed_under_a_running_routed_job(spark, job_env: dict[str, str], registry, bq_client: bigquery.Client,
                                                    tmp_path: Path, method: str) -> None:
    """Between micro-batches of one run, while the workers' kept checks stand: a table dropped and created again
    by hand with fewer columns, a table deleted, a column added by hand, then the dataset deleted, then new
    descriptors published. Every record lands once, or (insertAll into the shrunk table) is dead-lettered
    saying why; the job never stops."""
    fake, _ = registry
    with running(spark, job_env, fake, bq_client, tmp_path, SINK_BIGQUERY_WRITE_METHOD=method) as job:
        first = {s: job.send(s, 10) for s in "abc"}
        eventually(lambda: all(len(job.rows(s)) == 10 for s in "abc"), 120, "the first rows")
        bq_client.delete_table(job.table("a"))
        bq_client.create_table(bigquery.Table(job.table("a"), [bigquery.SchemaField("id", "STRING")]))
        bq_client.delete_table(job.table("b"))
        c = bq_client.get_table(job.table("c"))
        c.schema = [*c.schema, bigquery.SchemaField("extra", "STRING")]
        bq_client.update_table(c, ["schema"])
        second = {s: job.send(s, 10) for s in "abc"}

        def settled() -> bool:
            return len(job.rows("a")) + len(job.letters()) == 10 and len(job.rows("b")) == 10 \
                and len(job.rows("c")) == 20
        eventually(settled, 60, "the second rows")
        assert sorted(r["id"] for r in job.rows("b")) == sorted(second["b"]) and full(job.rows("b"))
        assert sorted(r["id"] for r in job.rows("c")) == sorted(first["c"] + second["c"]) and full(job.rows("c"))
        if method == "storage_write":
            # The write found the columns gone, checked the table again (evolving it back) and wrote every value.
            assert sorted(r["id"] for r in job.rows("a")) == sorted(second["a"]) and full(job.rows("a"))
            assert not job.letters()
        else:
            # insertAll names the fields the table lacks per row: the rows a worker wrote from its kept check
            # are dead letters saying so (replayable); a worker that checked the table evolved it for the rest.
            letters = job.letters()
            assert all("no such field" in x.error.message for x in letters)
            cls = job.cache.get().message_class("shard.Reading")
            assert sorted([r["id"] for r in job.rows("a")] + [cls.FromString(x.value).id for x in letters]) \
                == sorted(second["a"]) and full(job.rows("a"))

        bq_client.delete_dataset(job.cfg.bigquery.dataset, delete_contents=True)
        third = {s: job.send(s, 10) for s in "ac"}
        eventually(lambda: all(len(job.rows(s)) == 10 for s in "ac"), 60, "rows after the dataset was deleted")
        assert all(sorted(r["id"] for r in job.rows(s)) == sorted(third[s]) and full(job.rows(s)) for s in "ac")

        # New descriptors: the new field's column appears in each routed table that gets such records.
        fake.routes["/shard.desc"] = fake.routes["/shard_v2.desc"]
        eventually(lambda: "celsius" in job.cache.get().message_class("shard.Reading").DESCRIPTOR.fields_by_name,
                   30, "the new descriptors")
        fourth = {s: job.send(s, 5, celsius=21.5) for s in "ab"}
        # (b's table went with the dataset: these rows create it again, from the new descriptors.)
        eventually(lambda: len(job.rows("a")) == 15 and len(job.rows("b")) == 5, 60, "the v2 rows")
        for s in "ab":
            assert sorted(r["id"] for r in job.rows(s) if r.get("celsius") == 21.5) == sorted(fourth[s])
        assert not job.failures, job.failures
