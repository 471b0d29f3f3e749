"""Spark's Python processes as spark.py sets them up: each streaming query's source runner and the task
workers import pyspark from the installed package, not from Spark's pyspark.zip (see worker_startup/)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_spark_python_processes_import_the_installed_pyspark(spark) -> None:  # noqa: ANN001
    """The per-query source runner and the task workers: neither compiles pyspark from Spark's zip."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class WhereFrom(DataSource):
        @classmethod
        def name(cls) -> str:
            return "where-pyspark-comes-from"

        def schema(self) -> str:
            return "runner STRING, worker STRING"

        def streamReader(self, schema):  # noqa: ANN001, ANN202
            return WhereFromReader()

    class WhereFromReader(DataSourceStreamReader):
        # Runs in the source runner: its offsets say where that process found pyspark.
        def initialOffset(self) -> dict:
            return {"at": 0}

        def latestOffset(self) -> dict:
            import pyspark

            return {"at": 1, "runner": pyspark.__file__}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(end["runner"])] if start["at"] < end["at"] else []

        def read(self, partition):  # noqa: ANN001, ANN201
            import pyspark

            yield (partition.value, pyspark.__file__)

        def commit(self, end: dict) -> None:
            pass

    spark.dataSource.register(WhereFrom)
    rows = []
    query = (spark.readStream.format("where-pyspark-comes-from").load().writeStream
             .foreachBatch(lambda df, _: rows.extend(df.collect())).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert len(rows) == 1
    for where in rows[0]:
        assert ".zip" not in where and where.endswith("pyspark/__init__.py"), where


def test_source_readers_run_in_a_worker_pool_of_their_own(spark) -> None:  # noqa: ANN001
    """A source registered through `register_source` reads in workers whose environment names the source
    role, while the job's mapInArrow tasks run in the ordinary pool: the two never share (or swap) a
    worker, so readers do not carry the batch core's imports. The session's environment is left as it was.
    Both pools get the session's malloc setting (WORKER_MALLOC_ENV), set before the workers start."""
    import os

    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from firehose_bq.spark import WORKER_MALLOC_ENV, WORKER_ROLE_ENV, register_source

    (malloc, wanted), = WORKER_MALLOC_ENV.items()

    class Roles(DataSource):
        @classmethod
        def name(cls) -> str:
            return "worker-roles"

        def schema(self) -> str:
            return "reader STRING, reader_malloc STRING"

        def streamReader(self, schema):  # noqa: ANN001, ANN202
            return RolesReader()

    class RolesReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"at": 0}

        def latestOffset(self) -> dict:
            return {"at": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if start["at"] < end["at"] else []

        def read(self, partition):  # noqa: ANN001, ANN201
            yield os.environ.get(WORKER_ROLE_ENV, "none"), os.environ.get(malloc, "none")

        def commit(self, end: dict) -> None:
            pass

    def task_role(batches):  # noqa: ANN001, ANN202
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"reader": batch.column(0), "reader_malloc": batch.column(1),
                                              "task": [os.environ.get(WORKER_ROLE_ENV, "none")] * batch.num_rows,
                                              "task_malloc": [os.environ.get(malloc, "none")] * batch.num_rows})

    register_source(spark, Roles)
    assert WORKER_ROLE_ENV not in spark.sparkContext.environment
    rows = []
    query = (spark.readStream.format("worker-roles").load().writeStream
             .foreachBatch(lambda df, _: rows.extend(df.mapInArrow(
                 task_role, "reader STRING, reader_malloc STRING, task STRING, task_malloc STRING").collect()))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    expected = os.environ.get(malloc, wanted)  # the user's own value wins
    assert [tuple(r) for r in rows] == [("source", expected, "none", expected)]
