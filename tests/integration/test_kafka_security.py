"""The Kafka security settings reach the real clients: against the local (plaintext) broker, SSL must make every
client fail to connect, with an error naming the brokers, and PLAINTEXT (the default) must read as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.dlq.writers import KafkaDlqWriter
from firehose_bq.errors import SourceError
from firehose_bq.modes import handling_of
from firehose_bq.pipeline import Pipeline
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KAFKA_PYTHON, RangeReader
from firehose_bq.source.kafka_security import KafkaSecurityConfig
from tests.integration.test_cli_processes import firehose
from tests.integration.test_end_to_end import produce_bookings, read_table
from tests.unit.test_kafka_security import KEY_PASSWORD, pem_keystore

pytestmark = pytest.mark.integration

SSL = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL"}
# The plaintext broker never answers a TLS (or broken SCRAM) client: each request that waits for it fails after
# this, not the default 30 s (what is checked is the error, not how long a broker gets to answer).
REQUEST_TIMEOUT_MS = 3000


SCRAM = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
         "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "SCRAM-SHA-512",
         "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG":
             'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="pw-3b9d";'}


# The local broker is plaintext, and completes SASL PLAIN with any credentials but breaks SCRAM (its first
# message has no nonce): either setting, if it reached librdkafka, must stop the start.
@pytest.mark.parametrize(("env", "says"), [(SSL, "ssl://{brokers}"),
                                           (SCRAM, "sasl_plaintext://{brokers}/bootstrap: SASL authentication error")])
def test_a_protocol_the_broker_refuses_stops_the_start_naming_the_broker(job_env: dict[str, str], env: dict[str, str],
                                                                          says: str) -> None:
    done = firehose("run", "--available-now", timeout=120,
                    env={**job_env, **env, "SOURCE_KAFKA_REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS)})
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    brokers = job_env["SOURCE_KAFKA_BROKERS"]
    assert f"Kafka at {brokers}: metadata of" in done.stderr, output
    assert says.format(brokers=brokers) in done.stderr, output  # librdkafka's own line: what it tried
    assert "Traceback" not in output and "org.apache.spark" not in output and "pw-3b9d" not in output


def test_the_readers_and_the_dlq_producer_use_the_protocol(job_env: dict[str, str], job_config: Config) -> None:
    topic = job_config.source.topics[0]
    producer = KafkaProducer(bootstrap_servers=job_config.source.brokers)
    for i in range(3):
        producer.send(topic, value=b"v%d" % i, partition=0)
    producer.flush(30)
    producer.close()
    brokers = job_config.source.brokers
    for client in (CONFLUENT_KAFKA, KAFKA_PYTHON):  # the default (PLAINTEXT) reads as before
        plain = RangeReader(brokers, client, 10_000, security=job_config.kafka_security)
        assert sum(b.num_rows for b in plain.read(topic, 0, 0, 3)) == 3
    ssl = KafkaSecurityConfig(protocol="SSL")
    for client in (CONFLUENT_KAFKA, KAFKA_PYTHON):
        with pytest.raises(Exception) as failed:  # noqa: PT011 - each library fails in its own words
            list(RangeReader(brokers, client, 3000, security=ssl, request_timeout_ms=REQUEST_TIMEOUT_MS)
                 .read(topic, 0, 0, 3))
        assert isinstance(failed.value, SourceError) or brokers in str(failed.value), failed.value
    dlq = handling_of(Config.from_env({**job_env, **SSL, "DLQ_SINK_ENABLE": "true"})).dlq
    assert dlq.kafka_security.protocol == "SSL"
    with pytest.raises(Exception, match="Unable to bootstrap"):  # noqa: PT011 - kafka-python's own error type
        KafkaDlqWriter(dlq)
    KafkaDlqWriter(dataclasses.replace(dlq, kafka_security=KafkaSecurityConfig())).close()  # PLAINTEXT connects



def test_the_spark_source_plans_with_the_settings_and_never_shows_the_password(
        spark, job_env: dict[str, str], job_config: Config, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    # Past the command line's broker check: the query's own planning process (a Python worker Spark starts)
    # must get the settings from the data source options, and whatever Spark reports must not carry them.
    password = "spark-side-pw-4d1e"
    secured = Config.from_env({**job_env, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
                               # The plaintext broker never answers a TLS client, which the planner takes for a
                               # broker that is down and waits out for this long (kafka_source._end_offsets).
                               "SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS": "1000",
                               "SOURCE_KAFKA_REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
                               "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "PLAIN",
                               "SOURCE_KAFKA_SASL_USERNAME": "svc", "SOURCE_KAFKA_SASL_PASSWORD": password,
                               "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": pem_keystore(tmp_path),
                               "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD": KEY_PASSWORD})
    produce_bookings(job_config, 5)
    pipeline = Pipeline(secured, spark)
    plan = pipeline.source()._jdf.queryExecution().toString()  # what Spark prints for the query's plan
    assert "sasl_password" in plan and "ssl_key_password" in plan, plan
    assert password not in plan and KEY_PASSWORD not in plan, plan
    with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark wraps the source's SourceError
        pipeline.run(available_now=True)
    text = str(failed.value)
    assert f"Kafka at {job_env['SOURCE_KAFKA_BROKERS']}" in text, text[:2000]
    assert password not in text and password not in caplog.text
    assert KEY_PASSWORD not in text and KEY_PASSWORD not in caplog.text


def test_a_sasl_plaintext_job_reads_and_writes_with_both_libraries(spark, job_env: dict[str, str], job_config: Config,
                                                                   bq_client) -> None:
    # The local broker completes a SASL PLAIN handshake whatever the credentials (it checks none), so this
    # proves the SASL options work in each library end to end (planner on librdkafka, readers on
    # kafka-python), not that a real cluster accepts these credentials.
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="pw-0c7a";'
    secured = Config.from_env({**job_env, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                               "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "PLAIN",
                               "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": jaas,
                               "SOURCE_KAFKA_CLIENT": "kafka-python"})
    produce_bookings(job_config, 20)
    assert Pipeline(secured, spark).run(available_now=True).totals.messages == 20
    assert len(read_table(bq_client, job_config)) == 20
