"""The checkpoint file manager a query starts with (spark.choose_checkpoint_manager): the local one for a
checkpoint on the local disk, Spark's default elsewhere, the user's own always; a query restarted from a
checkpoint it wrote goes on where it stopped; and the query's id is read back through Hadoop's file
system (spark.checkpoint_query_id), as it would be from gs:// or HDFS."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def manager_conf(spark):  # noqa: ANN001, ANN201
    """The session's manager setting, restored after the test (the session is shared)."""
    from firehose_bq.spark import CHECKPOINT_MANAGER_CONF

    before = spark.conf.get(CHECKPOINT_MANAGER_CONF, None)
    yield CHECKPOINT_MANAGER_CONF
    if before is None:
        spark.conf.unset(CHECKPOINT_MANAGER_CONF)
    else:
        spark.conf.set(CHECKPOINT_MANAGER_CONF, before)


def test_local_checkpoint_gets_the_local_manager_and_a_restart_resumes(spark, manager_conf, tmp_path) -> None:  # noqa: ANN001
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from firehose_bq.spark import LOCAL_CHECKPOINT_MANAGER, checkpoint_query_id, choose_checkpoint_manager

    class Counter(DataSource):
        """Offsets 0..N: each query reads what is new since its checkpoint."""

        @classmethod
        def name(cls) -> str:
            return "checkpoint-counter"

        def schema(self) -> str:
            return "n INT"

        def streamReader(self, schema):  # noqa: ANN001, ANN202
            return CounterReader(int(self.options["end"]))

    class CounterReader(DataSourceStreamReader):
        def __init__(self, end: int) -> None:
            self.end = end

        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self) -> dict:
            return {"n": self.end}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition((start["n"], end["n"]))] if start["n"] < end["n"] else []

        def read(self, partition):  # noqa: ANN001, ANN201
            start, end = partition.value
            for n in range(start, end):
                yield (n,)

        def commit(self, end: dict) -> None:
            pass

    spark.dataSource.register(Counter)
    checkpoint = str(tmp_path / "ck")

    ids: list[str] = []

    def run(end: int) -> list[int]:
        choose_checkpoint_manager(spark, checkpoint)
        seen: list[int] = []
        query = (spark.readStream.format("checkpoint-counter").option("end", str(end)).load().writeStream
                 .foreachBatch(lambda df, _: seen.extend(r.n for r in df.collect()))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        ids.append(query.id)
        return sorted(seen)

    assert run(3) == [0, 1, 2]
    assert spark.conf.get(manager_conf) == LOCAL_CHECKPOINT_MANAGER
    assert (tmp_path / "ck" / "offsets" / "0").exists() and (tmp_path / "ck" / "commits" / "0").exists()
    assert run(5) == [3, 4]  # the restarted query read the first one's offsets and commits
    assert run(5) == []
    # The id load and MERGE job ids count batches in: the query's, the same across restarts.
    assert checkpoint_query_id(spark, checkpoint) == checkpoint_query_id(spark, f"file://{checkpoint}") == ids[0]
    assert len(set(ids)) == 1


def test_a_checkpoint_without_metadata_has_no_query_id(spark, tmp_path) -> None:  # noqa: ANN001
    from firehose_bq.errors import FirehoseError
    from firehose_bq.spark import checkpoint_query_id

    # Never the location in its place: a new checkpoint at the same path would take an old run's jobs
    # (batch ids start at 0 again) for its own and commit batches without writing them.
    with pytest.raises(FirehoseError, match="cannot read the streaming query's id"):
        checkpoint_query_id(spark, str(tmp_path / "none"))
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "metadata").write_text("not json\n")
    with pytest.raises(FirehoseError, match="cannot read the streaming query's id"):
        checkpoint_query_id(spark, str(tmp_path / "garbled"))


def test_other_file_systems_keep_sparks_default(spark, manager_conf) -> None:  # noqa: ANN001
    from firehose_bq.spark import LOCAL_CHECKPOINT_MANAGER, choose_checkpoint_manager

    spark.conf.set(manager_conf, LOCAL_CHECKPOINT_MANAGER)  # as a previous query with a local checkpoint left it
    choose_checkpoint_manager(spark, "gs://some-bucket/checkpoints/job")  # no GCS connector here: not local
    assert spark.conf.get(manager_conf, None) is None


def test_a_manager_the_user_chose_is_kept(spark, manager_conf, tmp_path) -> None:  # noqa: ANN001
    from firehose_bq.spark import choose_checkpoint_manager

    theirs = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    spark.conf.set(manager_conf, theirs)
    choose_checkpoint_manager(spark, str(tmp_path / "ck"))
    assert spark.conf.get(manager_conf) == theirs
