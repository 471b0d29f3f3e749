"""The command line's contract for bad settings: one line per variable, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from firehose_bq import config as config_module
from tests.unit.test_config import MINIMAL

REPO = Path(__file__).resolve().parents[2]


def firehose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCE_", "SINK_", "INPUT_", "SCHEMA_",
                                                                       "SPARK_"))}
    return subprocess.run([sys.executable, "-m", "firehose_bq.cli", *args], env={**base, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_missing_variable_is_one_clear_line_and_exit_2() -> None:
    env = dict(MINIMAL)
    del env["SINK_BIGQUERY_DATASET_NAME"]
    done = firehose("run", "--available-now", env=env)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("config error: SINK_BIGQUERY_DATASET_NAME: required but not set (Dataset; created when "
                           "missing.")
    assert "Traceback" not in done.stderr


def test_invalid_variable_is_one_clear_line_and_exit_2() -> None:
    done = firehose("run", env={**MINIMAL, "SPARK_TRIGGER_INTERVAL_MS": "soon"})
    assert done.returncode == 2
    assert done.stderr.strip() == "config error: SPARK_TRIGGER_INTERVAL_MS: expected an integer, got 'soon'"


def test_missing_env_file_is_a_config_error() -> None:
    done = firehose("config", "check", "--env-file", "nope.env", env=MINIMAL)
    assert done.returncode == 2
    assert done.stderr.strip() == "config error: --env-file nope.env: no such file"


def test_env_file_fills_in_and_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "job.env"
    path.write_text("\n".join(f"{k}={v}" for k, v in MINIMAL.items()) + "\nSINK_BIGQUERY_TABLE_NAME=from_file\n")
    done = firehose("config", "check", "--env-file", str(path), env={"SINK_BIGQUERY_TABLE_NAME": "from_env"})
    assert done.returncode == 0, done.stderr
    assert '"table": "from_env"' in done.stdout


def test_bad_firehose_log_level_is_a_config_error() -> None:
    # README: a bad setting prints one `config error:` line and exits 2; FIREHOSE_LOG_LEVEL is one (it used to
    # reach logging unchecked: a traceback, exit 1).
    done = firehose("config", "check", env={**MINIMAL, "FIREHOSE_LOG_LEVEL": "verbose"})
    assert done.returncode == 2
    assert done.stderr.strip() == ("config error: FIREHOSE_LOG_LEVEL: expected one of DEBUG, INFO, WARNING, ERROR, "
                                   "got 'verbose'")


def test_firehose_log_level_ignores_case() -> None:
    done = firehose("config", "check", env={**MINIMAL, "FIREHOSE_LOG_LEVEL": "debug"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_log_level_is_taken_after_the_command_too() -> None:
    # `firehose-bq run --log-level DEBUG` is how most commands take their options; it was a usage error.
    done = firehose("config", "check", "--log-level", "DEBUG", env={**MINIMAL, "SINK_BIGQUERY_TABEL": "x"})
    assert done.returncode == 0, done.stderr
    done = firehose("--log-level", "ERROR", "config", "check", env={**MINIMAL, "SINK_BIGQUERY_TABEL": "x"})
    assert done.returncode == 0 and "SINK_BIGQUERY_TABEL" not in done.stderr  # the warning is below ERROR
    done = firehose("config", "check", "--log-level", "ERROR", env={**MINIMAL, "SINK_BIGQUERY_TABEL": "x"})
    assert done.returncode == 0 and "SINK_BIGQUERY_TABEL" not in done.stderr


def test_help_states_the_exit_codes() -> None:
    done = firehose("--help", env=MINIMAL)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "Exit codes: 0 done, 1 the job or a command failed (the reason is printed), 2 bad configuration or usage, " \
           "130 interrupted" in text


def test_a_misspelled_setting_is_warned_about_with_the_name_it_resembles() -> None:
    done = firehose("config", "check", env={**MINIMAL, "SINK_BIGQUERY_TABEL_NAME": "x", "DLQ_SINK_ENABLED": "true",
                                             "SINK_BIGQUERY_FOO": "y"})
    assert done.returncode == 0, done.stderr
    warnings = [line.split(" WARNING firehose_bq: ", 1)[1] for line in done.stderr.splitlines()]
    assert warnings == [
        "DLQ_SINK_ENABLED is set but no setting reads it (typo? did you mean DLQ_SINK_ENABLE?)",
        "SINK_BIGQUERY_FOO is set but no setting reads it (typo?)",
        "SINK_BIGQUERY_TABEL_NAME is set but no setting reads it (typo? did you mean SINK_BIGQUERY_TABLE_NAME?)"]


def test_a_partition_key_with_partitioning_off_starts_with_a_warning() -> None:
    done = firehose("config", "check", env={**MINIMAL, "SINK_BIGQUERY_TABLE_PARTITION_KEY": "message_timestamp"})
    assert done.returncode == 0, done.stderr
    assert ("WARNING firehose_bq: SINK_BIGQUERY_TABLE_PARTITION_KEY is set but SINK_BIGQUERY_TABLE_PARTITIONING_ENABLE "
            "is not true") in done.stderr


def test_the_load_quota_warning_is_for_a_run_its_trigger_paces() -> None:
    # `run --available-now` and `replay-dlq` run their batches back to back whatever the trigger says: a
    # warning naming "a load job every 10 s" there is wrong. A streaming `run` and `config check` say it.
    # (Each command stops soon after: the descriptor file or the replay's bound does not exist.)
    env = {**MINIMAL, "SINK_BIGQUERY_WRITE_METHOD": "file_loads", "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS": "10000"}
    warning = "SINK_BIGQUERY_FILE_LOADS_TRIGGER_MS=10000 means a load job per table every 10 s"
    for args in (("run",), ("config", "check")):
        done = firehose(*args, env=env)
        assert warning in done.stderr, (args, done.stderr)
    for args in (("run", "--available-now"), ("replay-dlq", "--max-messages", "0"), ("table",)):
        done = firehose(*args, env=env)
        assert done.returncode != 0
        assert warning not in done.stderr, (args, done.stderr)


def test_firehose_dlq_producer_variables_are_named_as_unread_not_as_typos() -> None:
    # A Firehose env file carries its DLQ producer's tuning (often at Firehose's defaults) and Java store
    # passwords. "typo? did you mean DLQ_KAFKA_SSL_KEY_PASSWORD?" for the keystore's password sent the operator
    # to another secret; the tuning is not read, and the warning says so and why.
    firehose_env = {"DLQ_KAFKA_RETRIES": "2147483647", "DLQ_KAFKA_LINGER_MS": "0",
                    "DLQ_KAFKA_VALUE_SERIALIZER": "org.apache.kafka.common.serialization.ByteArraySerializer",
                    "DLQ_KAFKA_SSL_KEYSTORE_PASSWORD": "store-pa$s-5c1d", "DLQ_KAFKA_ACKS": "-1"}
    done = firehose("config", "check", env={**MINIMAL, **firehose_env})
    assert done.returncode == 0, done.stderr
    warnings = [line.split(" WARNING firehose_bq: ", 1)[1] for line in done.stderr.splitlines()]
    assert not [w for w in warnings if "typo" in w], warnings
    assert sorted(w.split(" ", 1)[0] for w in warnings) == sorted(set(firehose_env) - {"DLQ_KAFKA_ACKS"})
    assert all(" is set but is " in w and "not read" in w for w in warnings), warnings
    assert "5c1d" not in done.stderr and '"kafka_acks": "-1"' in done.stdout


def test_firehose_java_store_variables_of_the_source_are_named_as_unread_and_masked() -> None:
    # A Firehose env file for a TLS cluster carries Java store settings; this job takes PEM files. The
    # keystore's password drew "typo? did you mean ..._SSL_KEY_PASSWORD?", another secret.
    firehose_env = {"SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_PASSWORD": "store-pa$s-7e2f",
                    "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_PASSWORD": "trust-pa$s-7e2f",
                    "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_TYPE": "JKS"}
    done = firehose("config", "check", env={**MINIMAL, **firehose_env})
    assert done.returncode == 0, done.stderr
    warnings = [line.split(" WARNING firehose_bq: ", 1)[1] for line in done.stderr.splitlines()]
    assert sorted(w.split(" ", 1)[0] for w in warnings) == sorted(firehose_env)
    assert all("not read: this job takes PEM files" in w and "typo" not in w for w in warnings), warnings
    assert "7e2f" not in done.stdout + done.stderr
    secret = config_module.secret_settings()
    assert "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_PASSWORD" in secret and "DLQ_KAFKA_SSL_TRUSTSTORE_PASSWORD" in secret


def test_replay_dlq_checks_the_dlq_security_variables_with_the_jobs_dlq_off() -> None:
    # The replay reads the DLQ topic on DLQ_KAFKA_BROKERS with the source's security whether or not the job's
    # own DLQ is on; a Firehose env file saying otherwise for the DLQ was accepted, and the replay then failed
    # to connect (or timed out) with nothing naming the variable.
    env = {**MINIMAL, "SOURCE_KAFKA_BROKERS": "127.0.0.1:1", "DLQ_KAFKA_SECURITY_PROTOCOL": "SSL"}
    done = firehose("replay-dlq", "--available-now", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith("config error: DLQ_KAFKA_SECURITY_PROTOCOL: differs from "
                                          "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL"), done.stderr
    assert firehose("config", "check", env=env).returncode == 0  # the job's DLQ is off: not its concern


def test_replay_dlq_warns_about_dlq_security_variables_its_protocol_ignores_with_the_jobs_dlq_off() -> None:
    # The replay reads the DLQ topic with the source's security whether or not the job's own DLQ is on, and
    # compares the DLQ_KAFKA_* security variables then: one its protocol ignores (SSL uses no SASL) was named
    # only where the job's own DLQ was on Kafka. (The protocol differs from the source's: exit 2 at once.)
    env = {**MINIMAL, "SOURCE_KAFKA_BROKERS": "127.0.0.1:1", "DLQ_KAFKA_SECURITY_PROTOCOL": "SSL",
           "DLQ_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}
    warning = ("DLQ_KAFKA_SASL_MECHANISM is set but has no effect: DLQ_KAFKA_SECURITY_PROTOCOL is SSL, which uses "
               "no SASL")
    for dlq in ({}, {"DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "LOG"}):
        done = firehose("replay-dlq", "--available-now", env={**env, **dlq})
        assert done.returncode == 2, done.stderr
        assert done.stderr.count(warning) == 1, done.stderr
        assert "config error: DLQ_KAFKA_SECURITY_PROTOCOL: differs from" in done.stderr
        assert warning not in firehose("config", "check", env={**env, **dlq}).stderr  # the job's DLQ: not on Kafka
