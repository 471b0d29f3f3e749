"""The SparkSession a job runs in, and the one prerequisite Spark cannot check for itself: Java."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, SparkSession

from firehose_bq import fork_server, jvm_archive, logs, worker_daemon
from firehose_bq.config import SparkConfig
from firehose_bq.errors import ConfigError, FirehoseError

log = logging.getLogger(__name__)

MIN_JAVA = 17
JAVA_HINT = "install it with `sudo apt-get install -y openjdk-17-jre-headless` (Debian/Ubuntu) or set JAVA_HOME"
# Spark starts a new Python process for every streaming query's source (and for each worker daemon) and
# puts $SPARK_HOME/python/lib/pyspark.zip first on its PYTHONPATH. Python keeps no bytecode for a zip, so
# each of them compiles pyspark anew: 0.4-0.9 s per query here. This directory goes on the workers'
# PYTHONPATH; its only module, a sitecustomize, moves that zip behind the installed pyspark when, and
# only when, the zip is the one inside that very package (pip's pyspark is SPARK_HOME: local mode, or
# executors running from the same image or venv): one wheel, one release, the same code, now from .pyc.
# Why that is safe everywhere else: a Spark distribution's own zip (/opt/spark, YARN, Kubernetes images)
# stays first; an executor without this path (another machine, a venv shipped as an archive) skips the
# missing entry, as Python does, and starts exactly as before; another sitecustomize still runs after it.
WORKER_STARTUP = Path(__file__).resolve().parent / "worker_startup"
WORKER_PYTHONPATH_CONF = "spark.executorEnv.PYTHONPATH"
# Spark forks every Python worker from a daemon; this one (worker_daemon.py) imports what the workers need
# before it forks them, unless the user chose a daemon of their own.
DAEMON_MODULE_CONF = "spark.python.daemon.module"
# glibc's malloc serves a block of 128 KiB or more with its own mmap, unmapped when freed, but after the
# first such free it raises that threshold to the freed size (up to 32 MiB) and its trim threshold to twice
# that, so later large blocks come from the thread's heap and stay resident once freed. A task opens a
# consumer per range: librdkafka's fetch buffers (MBs each) then pile up in a fresh arena per consumer
# thread, ~55 MB each, ~350 MB per worker draining a backlog. A fixed threshold keeps
# large blocks mmapped (and switches the raising off); setting it goes through the workers' environment,
# read by glibc when the worker daemon starts. Other C libraries ignore it; a value the user set wins.
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)}
# Spark's default checkpoint file manager goes through Hadoop's FileContext. Without Hadoop's native
# library (pip's pyspark has none) its local file system forks a `chmod` for every file and directory it
# creates and a `readlink` for both sides of every rename: ~40 processes per query start and ~20 per
# micro-batch (its offsets and commit files), ~0.1 s of each here. The FileSystem-based manager Spark
# ships writes the same files (checksums included, so either reads the other's checkpoints) and renames
# with one rename(2), atomic on a local disk. Object stores and HDFS keep Spark's default.
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
# A checkpoint file is written to a hidden temporary (`.<name>.<uuid>.tmp`) and then renamed into place; a
# driver killed in between leaves the temporary behind. Spark skips such files when it reads its logs, but
# a query whose offset log holds no batch yet refuses to start while `offsets/` or `commits/` hold any file
# (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): a kill during the first batch's planning failed every restart.
UNFINISHED_WRITE = re.compile(r"^\..+\.tmp(\.crc)?$")
CHECKPOINT_LOGS = ("offsets", "commits")
# Where SPARK_DRIVER_JAVA_OPTIONS goes: Spark puts it before spark.driver.extraJavaOptions on the driver's
# command line, so a user's own options still win.
DRIVER_DEFAULT_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
# Under LOG_FORMAT=json the driver JVM's log4j lines are JSON lines too (see the file), unless the user
# configures log4j: a log4j2 file in Spark's conf directory (on the driver's class path) or the property.
JVM_JSON_LOGGING = Path(__file__).resolve().parent / "log4j2-json.properties"
LOG4J_PROPERTY = "log4j2.configurationFile"
# The user's log4j configuration may also be named by log4j 1's property, which log4j2 still reads (and
# Spark's own docs use), or by log4j2's environment variable; ours, log4j2's own name, would beat both.
LOG4J_LEGACY_PROPERTY = "log4j.configurationFile"
LOG4J_ENV = "LOG4J_CONFIGURATION_FILE"
EXECUTOR_CONF = "spark.executor."
LOG4J_FILES = ("log4j2.properties", "log4j2.xml", "log4j2.json", "log4j2.jsn", "log4j2.yaml", "log4j2.yml")
# The job that starts the workers ahead of the first batch, as stop_session finds it to cancel it, and how
# long a stop waits for it to end (it takes a few seconds on a cold JVM), then for it to end once cancelled.
START_WORKERS_GROUP = "firehose-bq-start-workers"
STOP_WAIT_S = 10.0


def java_path() -> Path:
    """The `java` Spark will use (as spark-class finds it); FirehoseError with an install hint if none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise FirehoseError(f"Spark needs Java {MIN_JAVA} or newer and none was found: {JAVA_HINT}")
    return Path(java)


def java_version() -> int:
    """Major version of the `java` Spark will use; FirehoseError with an install hint if unusable."""
    java = java_path()
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise FirehoseError(f"cannot tell the version of {java}: {out.strip()[:200]}")
    major = int(match.group(1))
    major = int(match.group(2)) if major == 1 and match.group(2) else major  # "1.8" means 8
    if major < MIN_JAVA:
        raise FirehoseError(f"Spark needs Java {MIN_JAVA} or newer, {java} is Java {major}: {JAVA_HINT}")
    return major


def spark_session(cfg: SparkConfig, extra_conf: Mapping[str, str] | None = None,
                  json_logs: bool = False) -> SparkSession:
    """The job's session. `json_logs`: the job logs JSON lines (LOG_FORMAT=json), and so should the JVM."""
    java_version()
    # Python workers must be this interpreter, which has the package and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if cfg.master.startswith("local"):
        # A local job talks to itself: bind to loopback instead of guessing a routable interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(cfg.master)
        .appName(cfg.app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    extra = dict(extra_conf or {})
    # What the user configured Spark with (spark-defaults.conf, PYSPARK_SUBMIT_ARGS) reaches SparkConf only
    # once the JVM runs, and whatever the builder sets overrides it: start the JVM first, then keep theirs.
    # Its JVM options, though, must be on its command line (a JVM already running keeps its own).
    # Started first: its imports overlap the JVM's start (a session of this process that runs already has its own).
    server = None
    if cfg.python_fork_server and SparkContext._active_spark_context is None:
        server = fork_server.shared(fork_server_env(os.environ, json_logs))
    archive = class_archive(cfg, os.environ) if SparkContext._active_spark_context is None else None
    launch = SparkConf(loadDefaults=False)
    java_options = driver_java_options(cfg, json_logs, os.environ, archive)
    if java_options and not spark_configures(DRIVER_DEFAULT_JAVA_OPTIONS, os.environ):
        launch.set(DRIVER_DEFAULT_JAVA_OPTIONS, java_options)
    SparkContext._ensure_initialized(conf=launch)
    defaults = SparkConf()
    # A worker PYTHONPATH of theirs goes after ours; a daemon of their own replaces ours.
    given = extra.pop(WORKER_PYTHONPATH_CONF, None) or defaults.get(WORKER_PYTHONPATH_CONF, None)
    builder = builder.config(WORKER_PYTHONPATH_CONF, worker_pythonpath(given))
    if DAEMON_MODULE_CONF not in extra and defaults.get(DAEMON_MODULE_CONF, None) is None:
        builder = builder.config(DAEMON_MODULE_CONF, worker_daemon.__name__)
    for key, value in extra.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    add_worker_env(spark.sparkContext.environment, WORKER_MALLOC_ENV, os.environ)
    # The job's format may come from an env file, which the processes Spark starts never read: the workers'
    # daemon says in it why it hands over to PySpark's own (without configuring logging, as the server).
    spark.sparkContext.environment[logs.FORMAT_ENV] = _log_format(json_logs)
    if server is not None:
        spark.sparkContext.environment.setdefault(fork_server.SOCKET_ENV, server.socket_path)
    return spark


def fork_server_env(environ: Mapping[str, str], json_logs: bool = False) -> dict[str, str]:
    """The fork server's environment: what is read only at a process's start is as in the Python processes
    Spark starts, which the server's forks become. glibc's malloc settings (WORKER_MALLOC_ENV); Python's
    hash seed, which PySpark's context gives them (PYTHONHASHSEED, "0" unless the driver has one: str
    hashes are then the same in every process, as PySpark's portable_hash requires), and its unbuffered
    stdio, which Spark's PythonWorkerFactory sets for each. And the job's LOG_FORMAT (`json_logs`, which
    may come from an env file), for the lines the server writes."""
    return {**WORKER_MALLOC_ENV, "PYTHONHASHSEED": "0", **environ, "PYTHONUNBUFFERED": "YES",
            logs.FORMAT_ENV: _log_format(json_logs)}


def _log_format(json_logs: bool) -> str:
    """LOG_FORMAT's value for the processes the job starts, which never read its env file."""
    return logs.JSON if json_logs else logs.TEXT


def refuse_speculation(spark: SparkSession) -> None:
    """ConfigError when Spark may run a second attempt of a slow task (`spark.speculation`): both attempts
    write. Storage Write appends keep both copies (no insertIds), and both attempts store their dead
    letters; Spark keeps one attempt's result, not one attempt's side effects."""
    if str(spark.sparkContext.getConf().get("spark.speculation", "false")).strip().lower() == "true":
        raise ConfigError(["spark.speculation=true: a speculative copy of a task writes its rows and dead letters "
                           "a second time (Storage Write keeps both); set spark.speculation=false for this job"])


def choose_checkpoint_manager(spark: SparkSession, location: str) -> None:
    """Before a query starts with its checkpoint at `location`: the local manager when Hadoop resolves
    `location` to the local file system (a path without a scheme is the cluster's default file system,
    HDFS on many), Spark's default otherwise. A manager the user configured is left alone."""
    current = spark.conf.get(CHECKPOINT_MANAGER_CONF, None)
    if current not in (None, LOCAL_CHECKPOINT_MANAGER):
        return
    if _is_local(spark, location):
        spark.conf.set(CHECKPOINT_MANAGER_CONF, LOCAL_CHECKPOINT_MANAGER)
    elif current is not None:
        spark.conf.unset(CHECKPOINT_MANAGER_CONF)  # this session's last query had a local checkpoint


def clear_unfinished_writes(spark: SparkSession, location: str) -> None:
    """Before a query starts with its checkpoint at `location` (no query runs on it then): delete what
    checkpoint writes a killed driver never finished left in its logs (UNFINISHED_WRITE). They hold
    nothing: the write they belong to never took place, and the query writes that file again."""
    try:
        jvm, root, fs = _file_system(spark, location)
        for name in CHECKPOINT_LOGS:
            directory = jvm.org.apache.hadoop.fs.Path(root, name)
            if not fs.exists(directory):
                continue
            for status in fs.listStatus(directory):
                path = status.getPath()
                if UNFINISHED_WRITE.match(str(path.getName())):
                    log.warning("deleting %s: a checkpoint write that never finished (the driver was stopped "
                                "during it)", path.toString())
                    fs.delete(path, False)
    except Exception as exc:  # noqa: BLE001 - nothing to clear, or Spark reports the location's problem itself
        log.debug("looking for unfinished checkpoint writes under %s: %s", location, exc)


def _file_system(spark: SparkSession, location: str) -> tuple[Any, Any, Any]:
    """The session's JVM, `location` as a Hadoop Path, and the FileSystem Hadoop resolves it to."""
    jvm, jsc = spark.sparkContext._jvm, spark.sparkContext._jsc
    assert jvm is not None and jsc is not None
    path = jvm.org.apache.hadoop.fs.Path(location)
    return jvm, path, path.getFileSystem(jsc.hadoopConfiguration())


def checkpoint_query_id(spark: SparkSession, location: str) -> str:
    """The streaming query's persistent id, from the first line of the checkpoint's `metadata` file, on any
    file system Hadoop reaches (a local disk, `gs://`, HDFS). It is part of every load and MERGE job id:
    a new checkpoint at the same path starts its batch ids at 0 again, and must not find the old run's
    jobs and take them for its own. Raises FirehoseError when the file cannot be read (it exists once the
    query has started)."""
    try:
        jvm, path, fs = _file_system(spark, location)
        stream = fs.open(jvm.org.apache.hadoop.fs.Path(path, "metadata"))
        try:
            line = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8")).readLine()
        finally:
            stream.close()
        return str(json.loads(line)["id"])
    except Exception as exc:  # noqa: BLE001 - Py4J's errors, JSON's: one clear reason
        raise FirehoseError(f"cannot read the streaming query's id from {location}/metadata: {exc}") from exc


def _is_local(spark: SparkSession, location: str) -> bool:
    try:
        jvm, _, fs = _file_system(spark, location)
        jvm.java.lang.Class.forName(LOCAL_CHECKPOINT_MANAGER)  # a Spark without it keeps its default
        return str(fs.getScheme()) == "file"
    except Exception as exc:  # noqa: BLE001 - e.g. no file system for the scheme: Spark reports that itself
        log.debug("keeping Spark's checkpoint file manager for %s: %s", location, exc)
        return False


def driver_java_options(cfg: SparkConfig, json_logs: bool, environ: Mapping[str, str],
                        archive: jvm_archive.Archive | None = None) -> str:
    """SPARK_DRIVER_JAVA_OPTIONS, plus the JSON log configuration when the job logs JSON and the user does
    not configure log4j (as a file URI: Spark splits the options at spaces, a path may hold some), plus the
    class archive to map, if any."""
    options = cfg.driver_java_options
    if json_logs and not configures_log4j(environ, options):
        options = f"{options} -D{LOG4J_PROPERTY}={JVM_JSON_LOGGING.as_uri()}".strip()
    if archive is not None:
        options = f"{options} {archive.java_options()}".strip()
    return options


def class_archive(cfg: SparkConfig, environ: Mapping[str, str]) -> jvm_archive.Archive | None:
    """The class archive the driver JVM will map (jvm_archive.py): one built for its JDK and Spark that a JVM
    starts with (checked: a damaged one would kill the driver's JVM, its crash report on the job's stdout),
    unless the user's own JVM options choose otherwise (`own_class_sharing`)."""
    if own_class_sharing(cfg, environ) is not None:
        return None
    java = java_path()
    archive = jvm_archive.find(cfg.class_archive_dir, java, spark_home(environ))
    if archive is None:
        return None
    refused = jvm_archive.check(java, archive)
    if refused is not None:
        log.warning("a JVM does not start with the class archive %s (%s): the job starts without it, and "
                    "removes it; `firehose-bq jvm-archive` builds it again", archive.path, refused)
        archive.remove()
        return None
    return archive


def own_class_sharing(cfg: SparkConfig, environ: Mapping[str, str]) -> str | None:
    """Why the job adds no class archive to the driver's JVM options, if the user's configuration says so:
    their spark.driver.defaultJavaOptions replace the job's, and options choosing class-data sharing
    themselves (here or in Spark's configuration) would clash with it."""
    if spark_configures(DRIVER_DEFAULT_JAVA_OPTIONS, environ):
        return f"{DRIVER_DEFAULT_JAVA_OPTIONS} in your Spark configuration replaces the job's JVM options"
    for entry in driver_option_entries(environ, cfg.driver_java_options):
        chosen = next((option for option in jvm_archive.SHARING_OPTIONS if option in entry), None)
        if chosen is not None:
            return f"the driver's JVM options choose class-data sharing themselves ({chosen})"
    return None


def configures_log4j(environ: Mapping[str, str], java_options: str = "") -> bool:
    """Whether the user configures the driver's log4j: a log4j2 file in Spark's conf directory, LOG4J_ENV, or
    either property anywhere in `java_options` (SPARK_DRIVER_JAVA_OPTIONS, which ours would follow and beat),
    PYSPARK_SUBMIT_ARGS, the properties file it names or spark-defaults.conf (say in
    spark.driver.extraJavaOptions: log4j2 prefers our name to log4j 1's wherever each comes); not in a
    spark.executor.* setting, which configures the executors'."""
    conf_dir = Path(_conf_dir(environ))
    return (bool(environ.get(LOG4J_ENV)) or any((conf_dir / name).is_file() for name in LOG4J_FILES)
            or any(name in entry for entry in driver_option_entries(environ, java_options)
                   for name in (LOG4J_PROPERTY, LOG4J_LEGACY_PROPERTY)))


def driver_option_entries(environ: Mapping[str, str], java_options: str) -> list[str]:
    """Where the user may set the driver JVM's options, as text to search: `java_options`
    (SPARK_DRIVER_JAVA_OPTIONS), PYSPARK_SUBMIT_ARGS' words, the lines of the properties files spark-submit
    reads; not spark.executor.* lines, which set the executors' JVMs (on a cluster)."""
    args, *files = _submit_config_texts(environ)
    try:
        words = shlex.split(args)
    except ValueError:  # an unbalanced quote: spark-submit would refuse it anyway
        words = args.split()
    entries = [java_options, *words, *(line for text in files for line in text.splitlines())]
    return [entry for entry in entries if not entry.lstrip().startswith(EXECUTOR_CONF)]


def _conf_dir(environ: Mapping[str, str]) -> str:
    return environ.get("SPARK_CONF_DIR") or str(spark_home(environ) / "conf")


def spark_configures(key: str, environ: Mapping[str, str]) -> bool:
    """Whether the configuration spark-submit will read sets `key`: PYSPARK_SUBMIT_ARGS, a properties
    file it names, or spark-defaults.conf in SPARK_CONF_DIR (else SPARK_HOME/conf). Read as text: a key
    merely mentioned counts as set, so a value of the user's is never replaced."""
    args, *files = _submit_config_texts(environ)
    pattern = re.compile(rf"^\s*{re.escape(key)}(\s|=|:|$)", re.M)
    return key in args or any(pattern.search(text) for text in files)


def _submit_config_texts(environ: Mapping[str, str]) -> list[str]:
    """What spark-submit reads its configuration from, as text: PYSPARK_SUBMIT_ARGS, then each file (a
    properties file it names, spark-defaults.conf in SPARK_CONF_DIR, else SPARK_HOME/conf) that exists."""
    args = environ.get("PYSPARK_SUBMIT_ARGS", "")
    words = args.split()
    files = [Path(words[i + 1]) for i, w in enumerate(words[:-1]) if w == "--properties-file"]
    files.append(Path(_conf_dir(environ)) / "spark-defaults.conf")
    texts = [args]
    for file in files:
        try:
            texts.append(file.read_text(errors="replace"))
        except OSError:
            continue  # no such file: nothing set there
    return texts


def spark_home(environ: Mapping[str, str]) -> Path:
    """The Spark installation the driver runs from: SPARK_HOME, else the one pyspark finds (pip's pyspark)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(environ.get("SPARK_HOME") or _find_spark_home())


def planned_partitions(df: DataFrame) -> list[Any] | None:
    """The input partitions the streaming source planned for this micro-batch, read from the DataFrame that
    `foreachBatch` was given, without running its scan; None when the plan is not of the shape below.

    PySpark hands `foreachBatch` the micro-batch as a LogicalRDD whose RDD was already planned from the
    source: each of its partitions holds one input partition as the source's runner pickled it. Running
    the scan itself would start a Python worker per task only to hand each task's ranges back through the
    JVM to a second worker (≈ 40–55 ms per micro-batch here). These are Spark's internal classes
    (4.x): another version may lay them out otherwise, hence None and the caller's slower way round."""
    try:
        rdd = df._jdf.queryExecution().logical().rdd()
        while not rdd.dependencies().isEmpty():
            rdd = rdd.dependencies().head().rdd()
        return [pickle.loads(bytes(part.inputPartition().get().pickedPartition())) for part in rdd.partitions()]
    except Exception as exc:  # noqa: BLE001 - any other layout: the caller runs the scan instead
        log.debug("the source's planned partitions are not readable from the micro-batch's plan: %s", exc)
        return None


def task_slots(master: str, conf: Mapping[str, str], default_parallelism: int) -> int:
    """How many tasks the job's executors run at once, as the driver can know it as the query starts (executors
    of a cluster may not have registered yet); 0 when it cannot. Local mode: its threads. A cluster: Spark's
    default parallelism where the user set it, else the cores the configuration asks for (executors ×
    spark.executor.cores, the dynamic allocation's maximum, spark.cores.max) or that have registered; with
    none of those beyond Spark's floor of 2, unknown: rather one task per Kafka partition than a cluster
    held to two tasks for as long as the query runs."""
    if master.startswith("local") or "spark.default.parallelism" in conf:
        return default_parallelism
    known = [default_parallelism] if default_parallelism > 2 else []
    cores = _positive(conf.get("spark.executor.cores"))
    dynamic = conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true"
    executors = _positive(conf.get("spark.dynamicAllocation.maxExecutors" if dynamic else "spark.executor.instances"))
    if cores and executors:
        known.append(cores * executors)
    if cores_max := _positive(conf.get("spark.cores.max")):
        known.append(cores_max)
    return max(known, default=0)


def _positive(value: str | None) -> int:
    try:
        return max(int(value or 0), 0)
    except ValueError:
        return 0


def start_workers(spark: SparkSession) -> threading.Thread:
    """Have Spark start its Python workers now, in the background, rather than when the first micro-batch's
    tasks ask for them: forking the worker daemon and its imports then overlap the query's start (a new
    source process, the first planning) instead of following it. One task per core, in the pool the
    job's tasks use (the same worker environment: call this once the session's is complete), doing
    nothing; Spark keeps idle workers for reuse. Only the wait is saved: should this fail, the tasks start
    their workers as they would have. Stop the session with `stop_session`."""

    def run() -> None:
        try:
            spark.sparkContext.setJobGroup(START_WORKERS_GROUP, "firehose-bq: start the Python workers", True)
            slots = spark.sparkContext.defaultParallelism
            # An RDD's Python tasks, as the job's (pipeline.py `_run_tasks`): Spark keeps the workers of those
            # apart from the DataFrame functions' (another environment, another daemon).
            spark.sparkContext.parallelize(range(slots), slots).mapPartitions(worker_daemon.no_rows).collect()
        except Exception as exc:  # noqa: BLE001 - the job's own tasks report any real problem themselves
            log.debug("starting the Python workers ahead of the first batch did not work: %s", exc)

    thread = threading.Thread(target=run, name="start-python-workers", daemon=True)
    thread.start()
    return thread


def jvm_ended(spark: SparkSession, wait_s: float = 0.0) -> int | None:
    """The exit status of the session's JVM once it has ended (killed, out of memory), else None, waiting up
    to `wait_s` for it: its connections close a moment before it can be reaped. PySpark started it
    (spark-submit, which execs java) and keeps its process as the gateway's `proc`."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is None:
        return None
    try:
        return int(proc.wait(timeout=wait_s))
    except subprocess.TimeoutExpired:
        return None


def stop_session(spark: SparkSession, workers: threading.Thread | None = None, wait_s: float = STOP_WAIT_S) -> None:
    """Stop the session once the job that starts the workers (`workers`) is over. A job that stops early
    (a table it cannot create) gets there while that job still runs, and stopping under it has Spark log
    its tasks' failure as errors that have nothing to do with why the job stopped. It ends within
    seconds, unless it waits for executors that never come (a cluster without capacity): that case is
    cancelled. (Cancelling at once would not do: a job still being planned cannot be cancelled yet.)"""
    if workers is not None:
        workers.join(wait_s)
        if workers.is_alive():
            spark.sparkContext.cancelJobGroup(START_WORKERS_GROUP)
            workers.join(wait_s)
    spark.stop()


def add_worker_env(environment: MutableMapping[str, str], wanted: Mapping[str, str],
                   inherited: Mapping[str, str]) -> None:
    """Put `wanted` into the Python workers' environment, except what the user already set there
    (spark.executorEnv.*) or in the environment the workers inherit."""
    for key, value in wanted.items():
        if key not in environment and key not in inherited:
            environment[key] = value


def worker_pythonpath(given: str | None = None) -> str:
    """PYTHONPATH for Spark's Python workers: the start-up hook first, then what was given. Spark itself
    still puts its pyspark.zip and py4j zip in front of it."""
    rest = [entry for entry in (given or "").split(os.pathsep) if entry and entry != str(WORKER_STARTUP)]
    return os.pathsep.join([str(WORKER_STARTUP), *rest])
