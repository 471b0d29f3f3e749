"""`replay-dlq` lands dead letters through every write path, once, on the real local stack.

The reproduction: messages from a newer schema are dead-lettered (unknown fields not allowed), the new
schema is published, the replay runs. Before the batch core was shared, the replay got two of the three
paths wrong: with storage_write every replayed row failed (the converter stayed on JSON encoding), and
with file_loads the rows were staged in the working directory and never loaded while the DLQ position
was committed, so they were lost without a word.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from google.cloud import bigquery
from google.protobuf.timestamp_pb2 import Timestamp
from kafka import KafkaProducer

from firehose_bq import cli
from firehose_bq.config import Config
from firehose_bq.dlq.replay import DLQ_BATCH, KafkaDlqSource, replay
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from tests.integration.conftest import FakeRegistry
from tests.integration.test_dead_letters import DlqJob, read_topic, table_ids

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

PROTOS = Path(__file__).parent / "protos"
CURRENT, NEWER = 6, 4


class StopsBeforeCommittingItsSecondBatch(KafkaDlqSource):
    """A replay killed after its second batch's driver step (a load job, a MERGE), before that batch's commit."""

    commits = 0

    def commit(self, position: dict) -> None:
        self.commits += 1
        if self.commits == 2:
            raise RuntimeError("killed between the driver step and the commit")
        super().commit(position)

    @classmethod
    def run_killed(cls, cfg: Config, dlq_topic: str, group: str) -> None:
        """Run a replay of `dlq_topic` as `group` that is killed there."""
        source = cls(cfg.source.brokers, dlq_topic, group, None)
        try:
            with pytest.raises(RuntimeError, match="killed between"):
                replay(cfg, source)
        finally:
            source.close()


def file_loads_job_of_newer_messages(fake: FakeRegistry, job_env: dict[str, str], tmp_path: Path,
                                     count: int) -> DlqJob:
    """A file-loads DLQ job whose topic holds `count` messages of the newer schema, all on partition 0."""
    job = DlqJob.start(fake, job_env, tmp_path, SINK_BIGQUERY_WRITE_METHOD="file_loads",
                       SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0")
    producer = KafkaProducer(bootstrap_servers=job.cfg.source.brokers)
    for i in range(count):
        producer.send(job.topic, job.v2(id=f"new{i}", amount=i, tags=[f"t{i}"]).SerializeToString(), partition=0)
    producer.flush()
    producer.close()
    return job


@pytest.mark.parametrize("method", ["insertall", "storage_write", "file_loads"])
def test_replay_lands_dead_letters_once_through_each_write_path(
        method: str, spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, _server = registry
    job = DlqJob.start(fake, job_env, tmp_path, SINK_BIGQUERY_WRITE_METHOD=method,
                       SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0")
    env, cfg, topic, dlq_topic, v1, v2 = job.env, job.cfg, job.topic, job.dlq_topic, job.v1, job.v2
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for i in range(CURRENT):
        producer.send(topic, v1(id=f"old{i}", amount=i).SerializeToString(), partition=i % 2)
    for i in range(NEWER):
        producer.send(topic, v2(id=f"new{i}", amount=i, tags=[f"t{i}"]).SerializeToString(), partition=i % 2)
    producer.flush()
    producer.close()
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (CURRENT + NEWER, CURRENT, NEWER, 0)
        assert dict(t.errors_by_type) == {ErrorType.UNKNOWN_FIELDS_ERROR.value: NEWER}
        assert table_ids(bq_client, cfg) == Counter(f"old{i}" for i in range(CURRENT))
        assert len(read_topic(cfg.source.brokers, dlq_topic)) == NEWER

        fake.routes["/dlq.desc"] = job.paths["v2"].read_bytes()  # the fix: the newer schema is published
        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-it", None)
        try:
            first = replay(cfg, source)
        finally:
            source.close()
        assert (first.stats.messages, first.stats.rows_written, first.stats.dead_lettered, first.stats.failed) == (
            NEWER, NEWER, 0, 0)
        expected = Counter([f"old{i}" for i in range(CURRENT)] + [f"new{i}" for i in range(NEWER)])
        assert table_ids(bq_client, cfg) == expected
        rows = {r["id"]: dict(r.items()) for r in bq_client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`")}
        # The row is what the stream would have written: its original coordinates, its new column.
        assert rows["new1"]["tags"] == ["t1"] and rows["new1"]["message_topic"] == topic
        assert rows["new1"]["message_partition"] == 1
        assert not list(Path.cwd().glob("part-*.ndjson"))  # nothing staged outside the staging area

        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert cli.main(["replay-dlq", "--available-now", "--group", "replay-it"]) == 0
        assert table_ids(bq_client, cfg) == expected  # the second replay adds nothing
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@pytest.mark.parametrize("table", ["plain", "with_a_json_column"])
def test_a_file_loads_replay_that_stopped_after_its_load_finishes_that_batch_once(
        table: str, spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client, tmp_path: Path) -> None:
    """A replay stopped between a batch's load job and the commit of its DLQ position (the commit fails,
    as a kill would leave it), on its second batch: the next replay reads from the first batch's commit,
    where that batch is now its first. Its load must still be found done, not run again.

    With a JSON column a user added to the table: BigQuery refuses Parquet loads into it, so every replay
    batch failed, and so did each rerun. The replay stages JSON lines; its pending batch names the format."""
    fake, _server = registry
    letters = 3 * DLQ_BATCH  # a replay reads the DLQ in batches of at most DLQ_BATCH letters
    job = file_loads_job_of_newer_messages(fake, job_env, tmp_path, letters)
    cfg, dlq_topic = job.cfg, job.dlq_topic
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
        assert (summary.totals.dead_lettered, summary.totals.rows_written) == (letters, 0)
        if table == "with_a_json_column":
            live = bq_client.get_table(cfg.bigquery.table_ref)
            live.schema = [*live.schema, bigquery.SchemaField("notes", "JSON")]
            bq_client.update_table(live, ["schema"])
        fake.routes["/dlq.desc"] = job.paths["v2"].read_bytes()

        StopsBeforeCommittingItsSecondBatch.run_killed(cfg, dlq_topic, "replay-crash")
        loaded = sum(table_ids(bq_client, cfg).values())
        assert 0 < loaded < letters  # two batches loaded, the first committed

        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-crash", None)
        try:
            again = replay(cfg, source)
        finally:
            source.close()
        assert again.stats.messages == letters - loaded  # the pending batch was finished, not read again
        assert table_ids(bq_client, cfg) == Counter(f"new{i}" for i in range(letters))  # every letter once
        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-crash", None)
        try:
            assert source.total() == 0  # every position committed
        finally:
            source.close()
        loads = {j.source_format for j in bq_client.list_jobs(max_results=1000) if j.job_type == "load"
                 and j.destination is not None and j.destination.dataset_id == cfg.bigquery.dataset}
        assert loads == {"NEWLINE_DELIMITED_JSON" if table == "with_a_json_column" else "PARQUET"}
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_letters_of_a_batch_the_stream_ran_twice_are_replayed_once(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    """The stream killed after its tasks dead-lettered a batch and before Spark committed it runs that
    batch again on restart, which dead-letters its messages again: the DLQ holds each of them twice, the
    copies a whole batch apart, so in different replay batches. File loads promise nothing twice, yet each
    replay batch loaded its copies: after a SIGKILL of `firehose-bq run` and a replay, every such row was
    in the table twice."""
    fake, _server = registry
    letters = DLQ_BATCH + 100
    job = file_loads_job_of_newer_messages(fake, job_env, tmp_path, letters)
    cfg, dlq_topic = job.cfg, job.dlq_topic
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        for run in range(2):
            summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(
                available_now=True)
            assert (summary.totals.dead_lettered, summary.totals.rows_written) == (letters, 0)
            if run == 0:  # what a kill between the tasks and the commit leaves: the batch planned, not committed
                (Path(cfg.spark.checkpoint_location) / "commits" / "0").unlink()
        assert len(read_topic(cfg.source.brokers, dlq_topic)) == 2 * letters
        fake.routes["/dlq.desc"] = job.paths["v2"].read_bytes()

        source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-twice", None)
        try:
            done = replay(cfg, source)
        finally:
            source.close()
        assert (done.stats.rows_written, done.stats.dead_lettered, done.stats.failed) == (letters, 0, 0)
        assert table_ids(bq_client, cfg) == Counter(f"new{i}" for i in range(letters))
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


@pytest.mark.parametrize("method", ["file_loads", "upsert"])
def test_letters_replayed_again_on_purpose_land_again(
        method: str, spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object],
        bq_client: bigquery.Client, tmp_path: Path) -> None:
    """The rows of a replay are gone (a table restored from a snapshot, a DELETE), and the user replays
    the letters again by resetting the replay group's offsets. The second replay reads the same DLQ
    positions: with them alone as its jobs' identity it found the first replay's load or MERGE done and
    committed every batch without writing a row."""
    fake, _server = registry
    extra = ({"SINK_BIGQUERY_WRITE_METHOD": "file_loads"} if method == "file_loads" else
             {"SINK_BIGQUERY_UPSERT_ENABLED": "true", "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "event_key",
              "INPUT_SCHEMA_PROTO_KEY_CLASS": "google.protobuf.Timestamp"})  # in the set, no repeated field
    job = DlqJob.start(fake, job_env, tmp_path, SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS="0", **extra)
    cfg, dlq_topic = job.cfg, job.dlq_topic
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for i in range(NEWER):
        producer.send(job.topic, job.v2(id=f"new{i}", amount=i, tags=[f"t{i}"]).SerializeToString(),
                      key=Timestamp(seconds=1_000 + i).SerializeToString(), partition=0)
    producer.flush()
    producer.close()
    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()
    try:
        summary = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
        assert (summary.totals.dead_lettered, summary.totals.rows_written) == (NEWER, 0)
        fake.routes["/dlq.desc"] = job.paths["v2"].read_bytes()
        landed = Counter(f"new{i}" for i in range(NEWER))
        for attempt in range(2):
            source = KafkaDlqSource(cfg.source.brokers, dlq_topic, "replay-again", None)
            try:
                done = replay(cfg, source)
            finally:
                source.close()
            assert (done.stats.messages, done.stats.rows_written, done.stats.failed) == (NEWER, NEWER, 0), attempt
            assert table_ids(bq_client, cfg) == landed, attempt
            # The rows are gone, and the replay group starts over (what `kafka-consumer-groups
            # --reset-offsets --to-earliest` does).
            bq_client.query(f"DELETE FROM `{cfg.bigquery.table_ref}` WHERE TRUE").result()
            reset_group(cfg.source.brokers, "replay-again", dlq_topic)
    finally:
        cache.stop()
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def reset_group(brokers: str, group: str, topic: str) -> None:
    """Commit offset 0 of every partition of `topic` for `group`."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=brokers, group_id=group, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.commit({tp: OffsetAndMetadata(0, "", -1) for tp in partitions})
    finally:
        consumer.close()
