"""The Kafka security settings reach the real clients: against the local (plaintext) broker, SSL must make every
client fail to connect, with an error naming the brokers, and PLAINTEXT (the default) must read as before."""

from __future__ import annotations

import dataclasses

import pytest
from kafka import KafkaProducer

from firehose_bq.config import Config
from firehose_bq.dlq.writers import KafkaDlqWriter
from firehose_bq.errors import SourceError
from firehose_bq.modes import handling_of
from firehose_bq.source.kafka_client import CONFLUENT_KAFKA, KAFKA_PYTHON, RangeReader
from firehose_bq.source.kafka_security import KafkaSecurityConfig
from tests.integration.test_cli_processes import firehose

pytestmark = pytest.mark.integration

SSL = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL"}


def test_ssl_against_a_plaintext_broker_stops_the_start_naming_the_broker(job_env: dict[str, str]) -> None:
    done = firehose("run", "--available-now", env={**job_env, **SSL}, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"Kafka at {job_env['SOURCE_KAFKA_BROKERS']}: metadata of" in done.stderr, output
    assert f"ssl://{job_env['SOURCE_KAFKA_BROKERS']}" in done.stderr  # librdkafka's line: it spoke TLS
    assert "Traceback" not in output and "org.apache.spark" not in output


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
            list(RangeReader(brokers, client, 3000, security=ssl).read(topic, 0, 0, 3))
        assert isinstance(failed.value, SourceError) or brokers in str(failed.value), failed.value
    dlq = handling_of(Config.from_env({**job_env, **SSL, "DLQ_SINK_ENABLE": "true"})).dlq
    assert dlq.kafka_security.protocol == "SSL"
    with pytest.raises(Exception, match="Unable to bootstrap"):  # noqa: PT011 - kafka-python's own error type
        KafkaDlqWriter(dlq)
    KafkaDlqWriter(dataclasses.replace(dlq, kafka_security=KafkaSecurityConfig())).close()  # PLAINTEXT connects

