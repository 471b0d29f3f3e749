"""A routed job's kept table checks (sink_schema.CheckedTables) against tables changed under the running job:
dropped and created again by hand with fewer columns or another type, deleted, their dataset deleted, new
descriptors; and two hundred tables, one of which refuses every row, stopped and restarted. Every
record ends in its table or the DLQ, once; none is dropped and the job does not stop in a loop."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from firehose_bq.sink_schema import load_descriptors
from tests.conftest import compile_protos
from tests.integration.conftest import FakeRegistry
from tests.integration.test_dead_letters import read_topic
from tests.integration.test_schema_refresh import eventually

pytestmark = pytest.mark.integration

PROTOS = Path(__file__).parent / "protos"


class Job:
    """A routed job (`readings_${header.site}`, user proto shard.Reading) running in a thread of the test."""

    def __init__(self, cfg: Config, spark, cache: DescriptorCache, bq: bigquery.Client) -> None:
        self.cfg, self.cache, self.bq = cfg, cache, bq
        self.pipeline = Pipeline(cfg, spark, descriptor_source=cache.get)
        cache.add_listener(self.pipeline.schema.on_descriptors_changed)
        self.producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
        self.sent = 0
        self.failures: list[BaseException] = []  # what stopped the running job, if anything did

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
        except NotFound:  # the table is gone (deleted by the test, not created again yet)
            return []

    def letters(self) -> list[DeadLetter]:
        return read_topic(self.cfg.source.brokers, self.cfg.dlq.kafka_topic)


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

    def run() -> None:
        try:
            job.pipeline.run(available_now=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - the test asserts there is none
            job.failures.append(exc)

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


@pytest.mark.parametrize("method", ["storage_write", "insertall", "file_loads"])
def test_tables_changed_under_a_running_routed_job(spark, job_env: dict[str, str], registry, bq_client: bigquery.Client,
                                                    tmp_path: Path, method: str) -> None:
    """Between micro-batches of one run, while the workers' kept checks stand: a table dropped and created again
    by hand with fewer columns, a table deleted, a column added by hand, then the dataset deleted, then new
    descriptors published. Every record lands once, whole; the job never stops."""
    fake, _ = registry
    with running(spark, job_env, fake, bq_client, tmp_path, SINK_BIGQUERY_WRITE_METHOD=method,
                 SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0") as job:
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
            return len(job.rows("a")) == 10 and len(job.rows("b")) == 10 and len(job.rows("c")) == 20
        eventually(settled, 60, "the second rows")
        assert sorted(r["id"] for r in job.rows("b")) == sorted(second["b"]) and full(job.rows("b"))
        assert sorted(r["id"] for r in job.rows("c")) == sorted(first["c"] + second["c"]) and full(job.rows("c"))
        # Storage Write and insertAll: the write found the columns gone (BigQuery's SCHEMA_MISMATCH_EXTRA_FIELDS,
        # "no such field"), checked the table again, evolving it back, and wrote every value. File loads: the
        # task checks its tables itself, every micro-batch.
        assert sorted(r["id"] for r in job.rows("a")) == sorted(second["a"]) and full(job.rows("a"))
        assert not job.letters()

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


def test_many_tables_one_refusing_every_row_stops_then_dead_letters_and_nothing_lands_twice(
        spark, job_env: dict[str, str], registry, bq_client: bigquery.Client, tmp_path: Path) -> None:
    """200 routed tables, a bad record each, and one table whose every write fails for good (created again by
    hand with another type for a column). With the DLQ off the micro-batch stops the job, its
    offsets not committed, after the other tables' rows went in; the restart with the DLQ on writes the batch
    again: insertAll's insertIds keep every row once, and the refused rows and the bad records are dead letters."""
    fake, _ = registry
    blob = compile_protos(tmp_path / "shard.desc", PROTOS / "shard_v1").read_bytes()
    fake.routes["/shard.desc"] = blob
    dlq = f"dlq-{job_env['SOURCE_KAFKA_TOPIC']}"
    env = {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "shard.Reading", "SINK_BIGQUERY_TABLE_NAME": "readings_${header.site}",
           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/shard.desc", "SINK_BIGQUERY_WRITE_METHOD": "insertall",
           "SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK": "300", "DLQ_WRITER_TYPE": "KAFKA", "DLQ_KAFKA_TOPIC": dlq}
    cfg = Config.from_env(env)
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 2)
    ensure_topic(cfg.source.brokers, dlq, 1)
    cls = load_descriptors(cfg).message_class("shard.Reading")
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    sites = [f"s{i:03d}" for i in range(200)]

    def send(first: int, per_site: int, bad: bool) -> None:
        for n in range(first, first + per_site):
            for site in sites:
                producer.send(topic, cls(id=f"{site}-{n}", value=n, note={"text": site}).SerializeToString(),
                              headers=[("site", site.encode())])
        if bad:
            for site in sites:
                producer.send(topic, b"\xff\xff not a Reading", headers=[("site", site.encode())])
        producer.flush()

    project_dataset = f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}"
    try:
        send(0, 1, bad=False)
        assert Pipeline(cfg, spark).run(available_now=True).totals.rows_written == 200
        refusing = f"{project_dataset}.readings_s007"
        schema = bq_client.get_table(refusing).schema
        bq_client.delete_table(refusing)
        bq_client.create_table(bigquery.Table(refusing, [bigquery.SchemaField(f.name, "DATE") if f.name == "value" else f
                                                         for f in schema]))
        send(1, 2, bad=True)
        with pytest.raises(Exception) as stopped:
            Pipeline(cfg, spark).run(available_now=True)
        # The bad records and the refused table's rows; the other tables' rows went in (written again below).
        assert "202 message(s) could not be written" in str(stopped.value)
        restarted = Config.from_env({**env, "SOURCE_KAFKA_TOPIC": topic, "SINK_BIGQUERY_DATASET_NAME": cfg.bigquery.dataset,
                                     "SOURCE_KAFKA_CONSUMER_GROUP_ID": cfg.source.consumer_group_id,
                                     "SPARK_CHECKPOINT_LOCATION": cfg.spark.checkpoint_location, "DLQ_SINK_ENABLE": "true"})
        summary = Pipeline(restarted, spark).run(available_now=True)
        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (600, 398, 202, 0)
        counts = Counter()
        for site in sites:
            for r in bq_client.query(f"SELECT id FROM `{project_dataset}.readings_{site}`").result():
                counts[r[0]] += 1
        assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1][:10]
        # Every row once, but s007's: its first went with the table dropped, this batch's two are dead letters.
        assert len(counts) == 200 * 3 - 3 and not any(k.startswith("s007-") for k in counts)
        letters = read_topic(cfg.source.brokers, dlq)
        assert len(letters) == 202
        refused = [x for x in letters if dict(x.headers)["site"] == b"s007" and x.value != b"\xff\xff not a Reading"]
        assert len(refused) == 2 and all(x.error.error_type is ErrorType.ROUTING_ERROR and
                                         "value: type DATE in the table" in x.error.message for x in refused)
    finally:
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


# insertAll only, whose insertIds make the check exact: Storage Write's default stream is at least once (README),
# and the kill drills of test_fault.py and test_upsert_kill.py cover its restarts; 28 s more of the suite.
@pytest.mark.parametrize("method", ["insertall"])
def test_a_routed_run_killed_mid_batch_and_restarted_loses_nothing(
        job_env: dict[str, str], registry, bq_client: bigquery.Client, tmp_path: Path, method: str) -> None:
    """`firehose-bq run` over 30 routed tables, SIGKILLed during its second micro-batch's concurrent writes, then
    run again: every record is in its table; with insertAll once (its insertIds), with Storage Write at least once
    (the default stream has no insertIds: README)."""
    import os
    import signal

    from tests.integration.test_cli_processes import firehose
    from tests.integration.test_upsert_kill import start_job, wait_for

    fake, _ = registry
    fake.routes["/shard.desc"] = compile_protos(tmp_path / "shard.desc", PROTOS / "shard_v1").read_bytes()
    env = {**job_env, "INPUT_SCHEMA_PROTO_CLASS": "shard.Reading", "SINK_BIGQUERY_TABLE_NAME": "readings_${header.site}",
           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/shard.desc", "SINK_BIGQUERY_WRITE_METHOD": method,
           "SPARK_MAX_OFFSETS_PER_TRIGGER": "3000", "FIREHOSE_LOG_LEVEL": "INFO"}
    cfg = Config.from_env(env)
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 2)
    cls = load_descriptors(cfg).message_class("shard.Reading")
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, linger_ms=50)
    sites = [f"s{i:02d}" for i in range(30)]
    for n in range(300):
        for site in sites:
            producer.send(topic, cls(id=f"{site}-{n}", value=n, note={"text": site}).SerializeToString(),
                          headers=[("site", site.encode())])
    producer.flush()
    producer.close()
    try:
        log_path = tmp_path / "killed.log"
        job = start_job(env, log_path)
        try:
            reached = wait_for(job, log_path, " rows written", 1)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=60)
        assert reached, log_path.read_text()[-3000:]
        final = firehose("run", "--available-now", env=env, timeout=600)
        assert final.returncode == 0, final.stderr[-3000:]
        counts: Counter[str] = Counter()
        for site in sites:
            table = f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.readings_{site}"
            counts.update(r[0] for r in bq_client.query(f"SELECT id FROM `{table}`").result())
        assert set(counts) == {f"{site}-{n}" for site in sites for n in range(300)}
        if method == "insertall":
            assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1][:10]
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_a_table_created_again_with_another_type_under_a_kept_check_dead_letters_its_records(
        spark, job_env: dict[str, str], registry, bq_client: bigquery.Client, tmp_path: Path) -> None:
    """Storage Write into a routed table created again by hand with another type for a column, the workers'
    checks of it kept from the run before: BigQuery refuses the appends, no row alone, which stopped the job (the
    table at fault) until a restart checked the table. The task now checks it first: its records are dead letters
    saying which column conflicts, the other table's rows land, the run goes on."""
    fake, _ = registry
    fake.routes["/shard.desc"] = compile_protos(tmp_path / "shard.desc", PROTOS / "shard_v1").read_bytes()
    dlq = f"dlq-{job_env['SOURCE_KAFKA_TOPIC']}"
    cfg = Config.from_env({**job_env, "INPUT_SCHEMA_PROTO_CLASS": "shard.Reading",
                           "SINK_BIGQUERY_TABLE_NAME": "readings_${header.site}",
                           "SCHEMA_REGISTRY_STENCIL_URLS": f"{fake.url}/shard.desc", "DLQ_SINK_ENABLE": "true",
                           "DLQ_WRITER_TYPE": "KAFKA", "DLQ_KAFKA_TOPIC": dlq})
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 1)
    ensure_topic(cfg.source.brokers, dlq, 1)
    cls = load_descriptors(cfg).message_class("shard.Reading")
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)

    def send(first: int) -> None:
        for n in range(first, first + 5):
            for site in ("x", "y"):
                producer.send(topic, cls(id=f"{site}-{n}", value=n, note={"text": site}).SerializeToString(),
                              headers=[("site", site.encode())])
        producer.flush()

    try:
        send(0)
        assert Pipeline(cfg, spark).run(available_now=True).totals.rows_written == 10
        table = f"{cfg.bigquery.project_id}.{cfg.bigquery.dataset}.readings_x"
        schema = bq_client.get_table(table).schema
        bq_client.delete_table(table)
        bq_client.create_table(bigquery.Table(table, [bigquery.SchemaField("id", "INT64") if f.name == "id" else f
                                                      for f in schema]))
        send(5)
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.failure is None
        assert (summary.totals.rows_written, summary.totals.dead_lettered) == (5, 5)
        letters = read_topic(cfg.source.brokers, dlq)
        assert len(letters) == 5 and all(x.error.error_type is ErrorType.ROUTING_ERROR and
                                         "field id: type INTEGER in the table" in x.error.message for x in letters)
    finally:
        producer.close()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
