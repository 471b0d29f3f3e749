"""Spark's Python processes as spark.py sets them up: each streaming query's source runner and the task
workers import pyspark from the installed package, not from Spark's pyspark.zip (see worker_startup/), and the
workers start from the job's daemon with the batch core imported (worker_daemon.py)."""

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


def test_spark_python_processes_forked_by_the_fork_server_hash_with_sparks_seed(spark) -> None:  # noqa: ANN001
    """The source runner and the workers (forks of the job's fork server, fork_server.py, where it runs)
    hash str with the seed PySpark gives its Python processes (PYTHONHASHSEED; PySpark's portable_hash,
    which partitions keyed RDDs, relies on it), not with a seed of the server's own."""
    import os
    import subprocess
    import sys
    import time

    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from firehose_bq import fork_server

    class Hashes(DataSource):
        @classmethod
        def name(cls) -> str:
            return "str-hashes"

        def schema(self) -> str:
            return "runner STRING, worker STRING"

        def streamReader(self, schema):  # noqa: ANN001, ANN202
            return HashesReader()

    def hashed() -> str:
        """This process's hash of a str, and its name (a fork of the server carries its module's)."""
        return f"{hash('firehose')} {open('/proc/self/comm').read().strip()}"

    class HashesReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"at": 0}

        def latestOffset(self) -> dict:  # in the source runner
            return {"at": 1, "runner": hashed()}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(end["runner"])] if start["at"] < end["at"] else []

        def read(self, partition):  # noqa: ANN001, ANN201
            yield (partition.value, hashed())

        def commit(self, end: dict) -> None:
            pass

    forked = fork_server.SOCKET_ENV in spark.sparkContext.environment
    if forked:  # the server listens once it has imported; a runner started before that starts as usual
        deadline = time.monotonic() + 60
        while not os.path.exists(spark.sparkContext.environment[fork_server.SOCKET_ENV]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    spark.dataSource.register(Hashes)
    rows = []
    query = (spark.readStream.format("str-hashes").load().writeStream
             .foreachBatch(lambda df, _: rows.extend(df.collect())).trigger(availableNow=True).start())
    query.awaitTermination(120)
    seed = spark.sparkContext.environment["PYTHONHASHSEED"]
    expected = subprocess.run([sys.executable, "-c", "print(hash('firehose'))"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout.strip()
    assert len(rows) == 1
    (runner_hash, runner_name), (worker_hash, _) = (value.split() for value in rows[0])
    assert (runner_hash, worker_hash) == (expected, expected), (rows, seed)
    if forked:  # the runner is a fork, not a fallback
        assert runner_name == fork_server.process_name(fork_server.RUNNER_MODULE), runner_name


def test_workers_start_from_the_job_daemon_with_the_batch_core_imported(spark) -> None:  # noqa: ANN001
    """The source's read(), mapInArrow tasks and the job's RDD tasks (pipeline.py `_run_tasks`) run in workers
    forked by the job's daemon (worker_daemon.py), which imported the batch core before forking them; all get
    the session's malloc setting (WORKER_MALLOC_ENV), set before the workers start."""
    import os
    import sys

    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from firehose_bq.spark import WORKER_MALLOC_ENV

    (malloc, wanted), = WORKER_MALLOC_ENV.items()

    def worker() -> tuple[str, str, str]:
        """(the daemon module that forked this worker, whether the batch core was imported, the malloc
        setting). A worker is a fork of its daemon: its __main__ is the daemon's, whether Spark started the
        daemon or the job's fork server forked it."""
        daemon = sys.modules["__main__"].__spec__.name  # type: ignore[union-attr]
        return daemon, str("firehose_bq.batch.task" in sys.modules), os.environ.get(malloc, "none")

    class Workers(DataSource):
        @classmethod
        def name(cls) -> str:
            return "which-workers"

        def schema(self) -> str:
            return "daemon STRING, preloaded STRING, malloc STRING"

        def streamReader(self, schema):  # noqa: ANN001, ANN202
            return WorkersReader()

    class WorkersReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"at": 0}

        def latestOffset(self) -> dict:
            return {"at": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if start["at"] < end["at"] else []

        def read(self, partition):  # noqa: ANN001, ANN201
            yield worker()

    def task(batches):  # noqa: ANN001, ANN202
        daemon, preloaded, env = worker()  # before anything of this function's own runs
        for batch in batches:
            yield batch.append_column("task_daemon", pa.array([daemon] * batch.num_rows)).append_column(
                "task_preloaded", pa.array([preloaded] * batch.num_rows)).append_column(
                "task_malloc", pa.array([env] * batch.num_rows))

    def batch(df, _):  # noqa: ANN001, ANN202
        rows.extend(df.mapInArrow(task, schema).collect())
        rows.extend(spark.sparkContext.parallelize([0], 1).mapPartitions(lambda _: [worker()]).collect())

    spark.dataSource.register(Workers)
    rows: list = []
    schema = "daemon STRING, preloaded STRING, malloc STRING, task_daemon STRING, task_preloaded STRING, task_malloc STRING"
    query = (spark.readStream.format("which-workers").load().writeStream.foreachBatch(batch)
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    expected = os.environ.get(malloc, wanted)  # the user's own value wins
    assert len(rows) == 2
    (daemon, preloaded, env, task_daemon, task_preloaded, task_env), (rdd_daemon, rdd_preloaded, rdd_env) = rows
    assert daemon == task_daemon == rdd_daemon == "firehose_bq.worker_daemon", (daemon, task_daemon, rdd_daemon)
    assert (preloaded, env, task_preloaded, task_env, rdd_preloaded, rdd_env) == ("True", expected) * 3


def test_start_workers_leaves_an_idle_worker_per_core_for_the_first_batch(spark, caplog) -> None:  # noqa: ANN001
    """start_workers' job runs (it logs nothing at DEBUG when it does) and leaves Spark's pool with an idle
    worker per core, forked by the job's daemon, which the micro-batch's tasks (an RDD's, as pipeline.py runs
    them; Spark keeps those apart from DataFrame functions' workers) then reuse instead of forking their own
    (the job calls it as soon as its session is made)."""
    import logging
    import os

    from bench.proctree import processes
    from firehose_bq import worker_daemon
    from firehose_bq.spark import start_workers

    with caplog.at_level(logging.DEBUG, logger="firehose_bq.spark"):
        thread = start_workers(spark)
        thread.join(120)
    assert not thread.is_alive()
    assert "did not work" not in caplog.text

    before = {p.pid for p in processes().values()}
    slots = spark.sparkContext.defaultParallelism

    def worker(_):  # noqa: ANN001, ANN202
        import sys

        return [(os.getpid(), sys.modules["__main__"].__spec__.name)]  # type: ignore[union-attr]

    ran = spark.sparkContext.parallelize(range(slots), slots).mapPartitions(worker).collect()
    assert {daemon for _, daemon in ran} == {worker_daemon.__name__}
    assert {pid for pid, _ in ran} <= before, "the tasks forked workers of their own"


def test_the_driver_jvm_runs_with_the_configured_java_options(spark) -> None:  # noqa: ANN001
    """SPARK_DRIVER_JAVA_OPTIONS (its default here) is on the command line of the session's JVM."""
    from bench.proctree import cmdline
    from firehose_bq.config import SparkConfig

    jvm = spark.sparkContext._gateway.proc.pid
    assert SparkConfig(checkpoint_location="x").driver_java_options in cmdline(jvm).split()


def test_what_the_user_configured_spark_with_is_kept(tmp_path) -> None:  # noqa: ANN001
    """spark-defaults.conf is read by Spark's JVM, which the builder's settings override: the session
    keeps a daemon of the user's own, puts their worker PYTHONPATH after the start-up hook, and leaves
    the driver's default JVM options to them when they set those."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from firehose_bq.spark import WORKER_STARTUP

    (tmp_path / "spark-defaults.conf").write_text("spark.python.daemon.module pyspark.daemon\n"
                                                  "spark.executorEnv.PYTHONPATH /opt/their/modules\n"
                                                  "spark.driver.defaultJavaOptions -Dtheirs=1\n")
    code = ("from firehose_bq.config import SparkConfig\nfrom firehose_bq.spark import spark_session\n"
            "from bench.proctree import cmdline\n"
            "spark = spark_session(SparkConfig(checkpoint_location='unused', master='local[1]'), "
            "{'spark.ui.enabled': 'false'})\nconf = spark.sparkContext.getConf()\n"
            "print(conf.get('spark.python.daemon.module'))\nprint(conf.get('spark.executorEnv.PYTHONPATH'))\n"
            "print(cmdline(spark.sparkContext._gateway.proc.pid))\nspark.stop()\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, env={**os.environ, "SPARK_CONF_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    daemon, pythonpath, jvm = done.stdout.split("\n")[:3]
    assert [daemon, pythonpath] == ["pyspark.daemon", f"{WORKER_STARTUP}{os.pathsep}/opt/their/modules"]
    assert "-Dtheirs=1" in jvm.split() and "-XX:TieredStopAtLevel=1" not in jvm, jvm


def test_sessions_one_after_another_share_one_fork_server() -> None:
    """A process that stops its session and starts another (a test run, a bench) has one fork server, not
    one more per session, each holding its imports until the process ends."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os, time\nfrom firehose_bq import fork_server\nfrom firehose_bq.config import SparkConfig\n"
            "from firehose_bq.spark import spark_session\nfrom bench.proctree import cmdline, tree\n"
            "cfg = SparkConfig(checkpoint_location='unused', master='local[1]')\nsockets = []\n"
            "for _ in range(2):\n"
            "    spark = spark_session(cfg, {'spark.ui.enabled': 'false'})\n"
            "    sockets.append(spark.sparkContext.environment.get(fork_server.SOCKET_ENV))\n"
            "    again = spark_session(cfg, {'spark.ui.enabled': 'false'})\n"
            "    sockets.append(again.sparkContext.environment.get(fork_server.SOCKET_ENV))\n"
            "    spark.stop()\n"
            "time.sleep(3)\nme = os.getpid()\n"
            "print(len([p for p in tree(me) if p.ppid == me and fork_server.__name__ in cmdline(p.pid)]))\n"
            "print(len(set(sockets)), None in sockets)\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, env=dict(os.environ),
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    servers, sockets = done.stdout.split("\n")[:2]
    assert (servers, sockets) == ("1", "1 False"), done.stdout
