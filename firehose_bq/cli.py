"""`firehose-bq`: run the sink, manage the local stack, produce sample data, look at the table.

Settings come from the environment; `--env-file` files fill in what the environment does not set
(later files win over earlier ones), and `--stack` points at the running local stack. Exit codes:
0 done, 1 the job or a command failed (the reason is printed), 2 bad configuration or usage, 130
interrupted (a second SIGTERM or Ctrl-C).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType

from firehose_bq import config as config_module
from firehose_bq import logs
from firehose_bq.config import Config, read_env_file, spark_settings
from firehose_bq.errors import ConfigError, FirehoseError, worker_error

log = logging.getLogger("firehose_bq")
EXIT_CODES = ("Exit codes: 0 done, 1 the job or a command failed (the reason is printed), 2 bad configuration or "
              "usage, 130 interrupted")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


# How long a failed run waits for Spark's JVM to be seen ended before it reports the failure as it met it.
JVM_EXIT_WAIT_S = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    say: logs.Say = logs.say_plain
    secrets = config_module.secret_settings()
    try:
        if args.log_level not in LOG_LEVELS:  # argparse checks --log-level, not a default taken from the environment
            raise ConfigError([f"FIREHOSE_LOG_LEVEL: expected one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}"])
        say = logs.configure(args.log_level, os.environ, secrets)
        environ = _environment(args)
        say = logs.configure(args.log_level, environ, secrets)  # LOG_FORMAT or a secret may come from a file
        return int(args.handler(args, environ) or 0)
    except ConfigError as exc:
        for problem in exc.problems:
            say(f"config error: {problem}")
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): not an error; stop writing quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _service_errors() as exc:
        # A service answered badly or not at all (BigQuery, Kafka, credentials, a file): say which.
        say(f"error: {type(exc).__name__}: {str(exc).strip() or 'no detail'}")
        return 1
    except FirehoseError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:
        # A bug, or a library's error no branch above knows (Spark's Py4JJavaError): its traceback through
        # logging (masked; one JSON line under LOG_FORMAT=json), then the reason as the last line.
        log.error("unexpected failure", exc_info=True)
        say(f"error: {type(exc).__name__}: {worker_error(exc)}")
        return 1


def _service_errors() -> tuple[type[BaseException], ...]:
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from kafka.errors import KafkaError

    return (GoogleAPIError, GoogleAuthError, KafkaError, OSError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="firehose-bq", description=__doc__.splitlines()[0],
        epilog=f"Settings come from environment variables (`firehose-bq config reference` lists them). {EXIT_CODES}.")
    level = os.environ.get("FIREHOSE_LOG_LEVEL", "INFO")
    parser.add_argument("--log-level", default=level.upper() if level.upper() in LOG_LEVELS else level,
                        choices=LOG_LEVELS)
    common = argparse.ArgumentParser(add_help=False)
    # Also after the command, where its other options go; SUPPRESS: unset there, the one above stands.
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS,
                        help="DEBUG, INFO (default: FIREHOSE_LOG_LEVEL, else INFO), WARNING or ERROR")
    common.add_argument("--env-file", action="append", default=[], type=Path, metavar="FILE",
                        help="NAME=value file for settings the environment does not set (repeatable)")
    common.add_argument("--stack", action="store_true",
                        help="point at the running local stack (what `stack status --env` prints)")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    run = commands.add_parser("run", parents=[common], help="run the sink")
    run.add_argument("--available-now", action="store_true",
                     help="process what is in the topic now, then exit 0 (default: stream until stopped)")
    run.set_defaults(handler=_run)

    replay = commands.add_parser("replay-dlq", parents=[common],
                                 help="send dead letters through the sink again (after fixing their cause)")
    bound = replay.add_mutually_exclusive_group(required=True)
    bound.add_argument("--available-now", action="store_true", help="replay what the DLQ holds now, then exit")
    bound.add_argument("--max-messages", type=int, metavar="N", help="replay at most N dead letters, then exit")
    replay.add_argument("--from-blob", metavar="LOCATION",
                        help="read the BLOB writer's files under LOCATION, a directory or gs://bucket/prefix "
                             "(default: the DLQ_KAFKA_TOPIC topic)")
    replay.add_argument("--topic", metavar="TOPIC",
                        help="read this topic instead of DLQ_KAFKA_TOPIC, e.g. the routing fallback topic "
                             "(SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC, on SOURCE_KAFKA_BROKERS) once routes exist")
    replay.add_argument("--group", metavar="ID",
                        help="consumer group that remembers the replay's progress in the topic (default: "
                             "SOURCE_KAFKA_CONSUMER_GROUP_ID + `-dlq-replay`, or + `-replay-TOPIC` with --topic)")
    replay.set_defaults(handler=_replay_dlq)

    stack = commands.add_parser("stack", parents=[common], help="local broker + BigQuery emulator")
    stack.add_argument("action", choices=("up", "down", "status"))
    stack.add_argument("--env", action="store_true", help="with status: print NAME=value lines for a job")
    stack.set_defaults(handler=_stack)

    sample = commands.add_parser("sample", parents=[common], help="produce example data: bookings, or the routing or JSON example (chosen by the configuration)")
    sample.add_argument("action", choices=("produce",))
    sample.add_argument("--count", type=int, default=10_000)
    sample.add_argument("--start", type=int, default=0, help="number of the first booking")
    sample.add_argument("--partitions", type=int, default=3, help="partitions when the topic is created")
    sample.set_defaults(handler=_sample)

    table = commands.add_parser("table", parents=[common], help="look at the destination table")
    table.add_argument("action", choices=("preview",))
    table.add_argument("--rows", type=int, default=3)
    table.set_defaults(handler=_table)

    schema = commands.add_parser("schema", parents=[common], help="the BigQuery schema the descriptors map to")
    schema.add_argument("action", choices=("show", "diff", "apply"),
                        help="show: the mapped schema; diff: what apply would change on the live table; "
                             "apply: create or evolve the dataset and table now")
    schema.add_argument("--format", choices=("tree", "json"), default="tree",
                        help="with show: a readable tree, or exactly the JSON `bq show --schema` prints")
    schema.set_defaults(handler=_schema)

    doctor = commands.add_parser("doctor", parents=[common], help="check that this machine can run the job (Java for Spark)")
    doctor.set_defaults(handler=_doctor)

    archive = commands.add_parser("jvm-archive", parents=[common],
                                  help="build the driver JVM's class-data archive, for a start ≈ 3 s faster "
                                       "(once per JDK and Spark installation; ≈ 35 s)")
    archive.add_argument("--force", action="store_true", help="build it again even if it is built")
    archive.set_defaults(handler=_jvm_archive)

    upsert = commands.add_parser("upsert", parents=[common], help="upsert/delete intermediate tables")
    upsert.add_argument("action", choices=("cleanup",),
                        help="cleanup: list the intermediate tables crashed runs left behind (--drop: drop them)")
    upsert.add_argument("--drop", action="store_true", help="drop the idle tables instead of listing them")
    upsert.add_argument("--min-idle-minutes", type=float, default=60.0,
                        help="keep tables touched more recently than this (a running job's)")
    upsert.set_defaults(handler=_upsert)

    cfg = commands.add_parser("config", parents=[common], help="check settings or print their reference")
    cfg.add_argument("action", choices=("check", "reference", "stack-reference"),
                     help="check: validate and print the job's settings; reference / stack-reference: the "
                          "markdown table of every job / local-stack setting")
    cfg.set_defaults(handler=_config)
    return parser


def _environment(args: argparse.Namespace) -> dict[str, str]:
    merged: dict[str, str] = {}
    for path in args.env_file:
        if not path.is_file():
            raise ConfigError([f"--env-file {path}: no such file"])
        merged.update(read_env_file(path))
    if args.stack:
        devstack = _devstack()
        merged.update(devstack.Stack(devstack.StackConfig.from_env({**merged, **os.environ})).env())
    merged.update(os.environ)
    return merged


def _devstack() -> ModuleType:
    """The local development stack, which comes with a source checkout and is not in the installed wheel."""
    try:
        from firehose_bq.devstack import stack
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("firehose_bq.devstack"):
            raise
        raise FirehoseError(
            "the local development stack (`firehose-bq stack`, `--stack`, `config stack-reference`) is not part "
            "of the installed package: it starts emulators for development and tests, and comes with a source "
            "checkout (`make up`, `make run`, `make test` there). A deployed job points at real Kafka and "
            "BigQuery through its settings instead.") from None
    return stack


def _load_config(environ: Mapping[str, str], streaming: bool = False) -> Config:
    """The configuration, its warnings logged; `streaming`: for a run paced by its trigger (`run` without
    --available-now; `config check`, which checks the job as it streams), which adds the trigger's."""
    cfg = Config.from_env(environ)
    topics = cfg.source.topics
    logs.add_fields(table=cfg.bigquery.table_ref, **({"topic": topics[0]} if len(topics) == 1 else {}))
    for name in config_module.unknown_variables(environ):
        near = config_module.resembling_setting(name)
        log.warning("%s is set but no setting reads it (typo?%s)", name, f" did you mean {near}?" if near else "")
    unread = config_module.firehose_unread(environ)
    for warning in [*unread, *cfg.dlq_security_ignored(environ), *cfg.switched_off(),
                    *(cfg.load_quota_warnings() if streaming else [])]:
        log.warning("%s", warning)
    return cfg


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    cfg = _load_config(environ, streaming=not args.available_now)  # before importing Spark: fails in milliseconds

    from firehose_bq.pipeline import Pipeline
    from firehose_bq.sink_schema import descriptor_cache
    from firehose_bq.spark import jvm_ended, refuse_speculation, spark_session, start_workers, stop_session
    from firehose_bq.telemetry import Telemetry

    # The descriptors and the source before Spark: an unreachable registry or broker fails in seconds,
    # not after the JVM starts. (JSON input has no descriptors: the table is its schema.)
    cache = descriptor_cache(cfg).start() if cfg.input_schema.data_type == "PROTOBUF" else None
    telemetry = Telemetry(cfg.metrics, cfg.spark.app_name).start()
    spark, workers = None, None
    try:
        _check_source(cfg)
        spark = spark_session(cfg.spark, json_logs=logs.logs_json())
        refuse_speculation(spark)
        workers = start_workers(spark)
        if cache is None:
            pipeline = Pipeline(cfg, spark, telemetry=telemetry)
        else:
            pipeline = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now,
                                telemetry=telemetry, registry_stats=cache.stats)
            cache.add_listener(pipeline.schema.on_descriptors_changed)
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            if stop.is_set():
                raise KeyboardInterrupt  # second signal: stop now, the batch will be replayed
            log.info("%s received: stopping after the current micro-batch", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            summary = pipeline.run(available_now=args.available_now, stop=stop)
        except FirehoseError:
            print(logs.masked(pipeline.summary.render()))
            raise
        print(logs.masked(summary.render()))
        return 0
    except Exception as exc:
        ended = jvm_ended(spark, wait_s=JVM_EXIT_WAIT_S if _lost_connection(exc) else 0) if spark is not None else None
        if ended is None:
            raise
        # Whatever the driver met next (a refused py4j connection) says nothing of why: the JVM is gone.
        raise FirehoseError(f"Spark's JVM (the driver's java process) ended unexpectedly with status {ended} "
                            "(killed? out of memory?); the running batch's offsets were not committed, a restart "
                            "reads it again") from exc
    finally:
        if cache is not None:
            cache.stop()
        if spark is not None and jvm_ended(spark) is None:  # a dead JVM cannot be stopped, only waited for
            stop_session(spark, workers)
        telemetry.close()


def _lost_connection(exc: BaseException) -> bool:
    """Whether `exc` or what it was raised from is a lost connection (py4j's to the JVM among them)."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        if isinstance(seen, (ConnectionError, EOFError)) or type(seen).__name__ == "Py4JNetworkError":
            return True
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return False


def _check_source(cfg: Config) -> None:
    """The brokers answer and every topic exists, before Spark starts: otherwise the first to find out is
    the query's source process, after the JVM's start, and Spark reports it under pages of its own traces."""
    from firehose_bq.source.kafka_client import KafkaMetadataClient

    client = KafkaMetadataClient(cfg.source.brokers, cfg.source.consumer_group_id, security=cfg.kafka_security,
                                 request_timeout_ms=cfg.source.request_timeout_ms)
    try:
        client.partitions(cfg.source.topics)
    finally:
        client.close()
    _check_outputs(cfg)


def _check_outputs(cfg: Config) -> None:
    """The DLQ and route fallback topics can be written (they exist, or the brokers create them as the first
    write would): otherwise the first bad or unrouted record, maybe hours in, stops the job after every retry."""
    from firehose_bq.source.kafka_client import KafkaMetadataClient

    static = cfg.router.is_static
    for env, topic, brokers in cfg.kafka_outputs():
        if static and env == "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC":
            continue  # one table for every record: none lacks a route, so nothing is ever written there
        client = KafkaMetadataClient(brokers, cfg.source.consumer_group_id, security=cfg.kafka_security,
                                     auto_create=True, request_timeout_ms=cfg.source.request_timeout_ms)
        try:
            client.require_writable(env, topic)
        finally:
            client.close()


def _replay_dlq(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from firehose_bq.blobstore import open_blob_store
    from firehose_bq.dlq.blob_source import BlobDlqSource
    from firehose_bq.dlq.replay import DlqSource, KafkaDlqSource, replay
    from firehose_bq.source.kafka_security import dlq_security_ignored, dlq_security_problems

    cfg = _load_config(environ)
    if args.max_messages is not None and args.max_messages < 1:
        raise ConfigError(["--max-messages: must be at least 1"])
    _check_outputs(cfg)  # a letter that fails again goes to the DLQ (from a BLOB replay, maybe its first write)
    source: DlqSource
    if args.from_blob:
        try:
            store = open_blob_store(args.from_blob, cfg.dlq.gcs_options())
        except ValueError as exc:
            raise ConfigError([f"--from-blob: {exc}"]) from None
        source = BlobDlqSource(store, args.max_messages)
    else:
        dlq = cfg.dlq.with_brokers(cfg.source.brokers, cfg.kafka_security)
        topic = args.topic or dlq.kafka_topic
        fallback = topic == cfg.bigquery.route_fallback_topic
        brokers = cfg.source.brokers if fallback else dlq.kafka_brokers
        if not fallback:
            # Reading the DLQ's brokers with the source's security: Firehose's DLQ_KAFKA_* security variables
            # must agree, even where the job's own DLQ is off (and the start did not check them); those the
            # protocol ignores are named as for a job's DLQ on Kafka (which the start warned about already).
            if not cfg.dlq_on_kafka:
                for warning in dlq_security_ignored(environ, cfg.kafka_security, dlq_kafka=True):
                    log.warning("%s", warning)
            if problems := dlq_security_problems(environ, cfg.kafka_security, dlq_kafka=True):
                raise ConfigError(problems)
        group = args.group or (f"{cfg.source.consumer_group_id}-replay-{topic}" if args.topic
                               else f"{cfg.source.consumer_group_id}-dlq-replay")
        source = KafkaDlqSource(brokers, topic, group, args.max_messages, cfg.source.isolation_level,
                                cfg.kafka_security)
    from firehose_bq.telemetry import Telemetry

    telemetry = Telemetry(cfg.metrics, f"{cfg.spark.app_name}-dlq-replay").start()
    try:
        summary = replay(cfg, source, progress=sys.stderr.isatty() or bool(os.environ.get("FIREHOSE_PROGRESS")),
                         telemetry=telemetry)
    finally:
        source.close()
        telemetry.close()
    print(logs.masked(summary.render()))  # counts only today; masked as every summary is
    return 0


def _stack(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    devstack = _devstack()
    stack = devstack.Stack(devstack.StackConfig.from_env(environ))
    if args.action == "up":
        stack.up()
    elif args.action == "down":
        stack.down()
    elif args.env:
        for name, value in stack.env().items():
            print(f"{name}={value}")
    else:
        statuses = stack.status()
        for s in statuses:
            state = ("running, healthy" if s.healthy else "running, NOT answering") if s.running else "stopped"
            pid = f" pid {s.pid}" if s.pid else ""
            print(f"{s.name:<9} {state}{pid}  {s.address}  log: {s.log}")
        return 0 if all(s.healthy for s in statuses) else 1
    return 0


def _sample(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from firehose_bq import sample
    from firehose_bq.sink_schema import load_descriptors

    cfg = _load_config(environ)
    if cfg.registry.confluent_url:
        raise FirehoseError("sample produce writes plain protobuf values; it does not frame them for a "
                            "Confluent registry")
    # What the configuration reads: JSON documents, routed events, or bookings.
    if cfg.input_schema.data_type == "JSON":
        kind, messages = "JSON documents", sample.json_messages()
    elif cfg.input_schema.class_header:
        pool = load_descriptors(cfg)
        classes = {short: pool.message_class(f"firehose.example.v1.{short}") for short in sample.EVENT_TYPES.values()}
        kind, messages = "events", sample.event_messages(classes)
    else:
        cls = load_descriptors(cfg).message_class(cfg.input_schema.proto_class)
        if cls.DESCRIPTOR.full_name != sample.EXAMPLE_MESSAGE:
            raise FirehoseError(f"sample data is for {sample.EXAMPLE_MESSAGE}, but INPUT_SCHEMA_PROTO_CLASS is "
                                f"{cls.DESCRIPTOR.full_name}")
        kind, messages = "bookings", sample.booking_messages(cls)
    topic = cfg.source.topics[0]
    if sample.ensure_topic(cfg.source.brokers, topic, args.partitions, cfg.kafka_security):
        print(f"created topic {topic} with {args.partitions} partitions")
    sent = sample.produce(cfg.source.brokers, topic, messages, args.count, start=args.start,
                          progress=sys.stderr.isatty() or bool(os.environ.get("FIREHOSE_PROGRESS")),
                          security=cfg.kafka_security)
    print(f"produced {sent} {kind} to {topic}")
    return 0


def _table(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from firehose_bq.bigquery.client import call_options, make_client

    cfg = _load_config(environ).bigquery
    client = make_client(cfg)
    call = call_options(cfg)
    table = client.get_table(cfg.table_ref, **call)
    total = next(iter(client.query(f"SELECT COUNT(*) AS n FROM `{cfg.table_ref}`", **call).result())).n
    print(f"{cfg.table_ref}: {total} rows, {len(table.schema)} columns")
    for row in client.list_rows(table, max_results=args.rows, **call):
        print(json.dumps(dict(row.items()), default=_json_value))
    return 0


def _schema(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from google.api_core.exceptions import NotFound

    from firehose_bq.bigquery.client import call_options, make_client
    from firehose_bq.bigquery.tables import merge_schema, schema_changes
    from firehose_bq.sink_schema import apply_plan, load_descriptors, plan_table
    from firehose_bq.schema import schema_json

    cfg = _load_config(environ)
    plan = plan_table(cfg, load_descriptors(cfg))
    if args.action == "show":
        fields = list(plan.table.schema)
        print(json.dumps(schema_json(fields), indent=2) if args.format == "json" else _tree(fields))
        return 0
    client = make_client(cfg.bigquery)
    if args.action == "apply":
        table = apply_plan(client, cfg, plan)
        print(f"{cfg.bigquery.table_ref}: {len(table.schema)} columns, up to date")
        return 0
    try:
        live = client.get_table(cfg.bigquery.table_ref, **call_options(cfg.bigquery))
    except NotFound:
        print(f"{cfg.bigquery.table_ref} does not exist; apply would create it with {len(plan.table.schema)} columns")
        return 0
    changes = schema_changes(live.schema, merge_schema(live.schema, plan.table.schema))
    wanted = {f.name.lower() for f in plan.table.schema}
    kept = [f.name for f in live.schema if f.name.lower() not in wanted]
    for line in changes:
        print(line)
    for name in kept:
        print(f"keep {name} (in the table, not in the proto: never dropped)")
    if not changes:
        print(f"{cfg.bigquery.table_ref} is up to date")
    return 0


def _tree(fields: Sequence[object], depth: int = 0) -> str:
    lines = []
    for f in fields:
        name = "  " * depth + f.name  # type: ignore[attr-defined]
        lines.append(f"{name:<40} {f.field_type:<10} {f.mode}")  # type: ignore[attr-defined]
        if f.fields:  # type: ignore[attr-defined]
            lines.append(_tree(f.fields, depth + 1))  # type: ignore[attr-defined]
    return "\n".join(lines)


def _doctor(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from firehose_bq.spark import class_archive, java_version, own_class_sharing

    print(f"java {java_version()} and python {sys.version.split()[0]}: ready for Spark")
    cfg = spark_settings(environ)
    archive = class_archive(cfg, environ)
    if archive is not None:
        print(f"JVM class archive: {archive.path} ({archive.path.stat().st_size / 2**20:.0f} MiB)")
    elif (own := own_class_sharing(cfg, environ)) is not None:
        print(f"JVM class archive: none used, as {own}")
    elif cfg.class_archive_dir.strip():
        print("JVM class archive: none for this JDK and Spark; `firehose-bq jvm-archive` builds one (≈ 35 s), "
              "after which the job's JVM starts ≈ 3 s faster")
    return 0


def _jvm_archive(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from firehose_bq import jvm_archive
    from firehose_bq.spark import java_path, own_class_sharing, spark_home

    cfg = spark_settings(environ)
    own = own_class_sharing(cfg, environ)
    if own is not None:
        raise FirehoseError(f"no JVM class archive is built: the job would map none, as {own}")
    started = time.monotonic()
    archive, built = jvm_archive.build(cfg.class_archive_dir, java_path(), spark_home(environ), environ,
                                       cfg.driver_java_options, force=args.force)
    size = archive.path.stat().st_size / 2**20
    if built:
        print(f"built the JVM class archive {archive.path} ({size:.0f} MiB) in {time.monotonic() - started:.0f} s")
    else:
        print(f"the JVM class archive is built already: {archive.path} ({size:.0f} MiB); --force builds it again")
    return 0


def _json_value(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _upsert(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from datetime import timedelta

    from firehose_bq.upsert.cleanup import cleanup

    cleanup(_load_config(environ), drop=args.drop, min_idle=timedelta(minutes=args.min_idle_minutes))
    return 0


def _config(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.action.endswith("reference"):
        sections = (_devstack().StackConfig,) if args.action == "stack-reference" else None
        print(config_module.reference_markdown(sections))
        return 0
    cfg = _load_config(environ, streaming=True)
    print(json.dumps(cfg.public_dict(), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
