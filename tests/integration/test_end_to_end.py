"""Kafka → Spark → BigQuery on the real local stack: what `make run` does, asserted row by row."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.cloud import bigquery
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from firehose_bq import descriptors, sample
from firehose_bq.config import WRITE_METHODS, Config
from firehose_bq.errors import BatchFailedError, FirehoseError
from firehose_bq.pipeline import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.both_decoders]

COUNT = 600


def expected_row(i: int) -> dict[str, Any]:
    """What BigQuery must hold for booking i, written out from the plain sample values."""
    v = sample.booking_values(i)
    seconds, nanos = v["created_at"]
    return {
        "order_number": v["order_number"],
        "customer_id": v["customer_id"],
        "status": v["status"],
        "amount": v["amount"],
        "discount": v["discount"],
        "is_paid": v["is_paid"],
        "signature": v["signature"],
        "passenger_count": v["passenger_count"],
        "balance_delta": v["balance_delta"],
        "region_code": v["region_code"],
        "pickup": v["pickup"],
        "dropoff": v.get("dropoff"),
        "items": v["items"],
        "tags": v["tags"],
        "attributes": [{"key": k, "value": val} for k, val in sorted(v["attributes"].items())],
        "created_at": datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000),
        "eta": {"seconds": v["eta"][0], "nanos": v["eta"][1]},
        "context": {key: float(val) if isinstance(val, int) else val for key, val in v["context"].items()},
        "status_history": v["status_history"],
    }


def end_offsets(brokers: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=brokers)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {tp.partition: o for tp, o in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


def produce_bookings(cfg: Config, count: int, start: int = 0) -> None:
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 3)
    sample.produce(cfg.source.brokers, topic, sample.booking_messages(cls), count, start=start, progress=False)


def read_table(client: bigquery.Client, cfg: Config) -> list[dict[str, Any]]:
    rows = client.query(f"SELECT * FROM `{cfg.bigquery.table_ref}`").result()
    return [dict(r.items()) for r in rows]


@pytest.fixture(params=["kafka-python", "confluent-kafka"])
def client_config(request: pytest.FixtureRequest, job_env: dict[str, str], bq_client: bigquery.Client):  # noqa: ANN201
    cfg = Config.from_env({**job_env, "SOURCE_KAFKA_CLIENT": request.param})
    yield cfg
    bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_sample_stream_lands_exactly(spark, client_config: Config, bq_client: bigquery.Client) -> None:
    produce_bookings(client_config, COUNT)
    started = datetime.now(UTC)

    summary = Pipeline(client_config, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written, summary.totals.failed) == (COUNT, COUNT, 0)
    assert_sample_landed(bq_client, client_config, COUNT, started, datetime.now(UTC))


def test_second_run_resumes_from_checkpoint(spark, job_config: Config, bq_client: bigquery.Client) -> None:
    produce_bookings(job_config, 100)
    assert Pipeline(job_config, spark).run(available_now=True).totals.messages == 100
    produce_bookings(job_config, 50, start=100)

    again = Pipeline(job_config, spark).run(available_now=True)

    assert again.totals.messages == 50
    assert len(read_table(bq_client, job_config)) == 150


def test_a_driver_killed_while_writing_the_first_offsets_does_not_block_its_restart(
        spark, job_config: Config, bq_client: bigquery.Client) -> None:  # noqa: ANN001
    """A kill -9 between the first offset file's write and its rename leaves `offsets/.0.<uuid>.tmp`; Spark
    then refuses to start a query on that checkpoint, whatever the restart (STATE_STORE_CHECKPOINT_...)."""
    offsets = Path(job_config.spark.checkpoint_location) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.83770520-4e80-4f9f-a6df-3b167590ab11.tmp").write_bytes(b"")  # as the killed run left it
    produce_bookings(job_config, 20)

    summary = Pipeline(job_config, spark).run(available_now=True)

    assert (summary.totals.messages, summary.totals.rows_written) == (20, 20)
    assert len(read_table(bq_client, job_config)) == 20


def delete_records(brokers: str, topic: str, partition: int, before: int) -> None:
    """What retention does: the partition's records below `before` are gone from the broker. Through
    kafka-python's admin client: confluent-kafka's delete_records crashed the test process once
    (a segfault inside the call; confluent-kafka-python#2275 fixed a reference-counting bug there)."""
    from kafka import KafkaAdminClient, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=brokers)
    try:
        admin.delete_records({TopicPartition(topic, partition): before}, timeout_ms=30_000)
    finally:
        admin.close()


def test_records_deleted_before_the_job_read_them_stop_it_and_a_new_checkpoint_goes_on(
        spark, job_env: dict[str, str], job_config: Config, bq_client: bigquery.Client, tmp_path) -> None:  # noqa: ANN001
    brokers, topic = job_config.source.brokers, job_config.source.topics[0]
    produce_bookings(job_config, 30)
    Pipeline(job_config, spark).run(available_now=True)  # the checkpoint and the group are at the end now
    read_up_to = end_offsets(brokers, topic)
    produce_bookings(job_config, 30, start=30)
    new = {p: o - read_up_to[p] for p, o in end_offsets(brokers, topic).items()}
    partition = max(new, key=new.__getitem__)
    lost = min(3, new[partition])
    delete_records(brokers, topic, partition, read_up_to[partition] + lost)

    # The checkpoint plans from where it is: those offsets are gone, which stops the job (on every restart).
    with pytest.raises(FirehoseError) as stopped:
        Pipeline(job_config, spark).run(available_now=True)
    assert f"{topic}/{partition}: offsets from {read_up_to[partition]} are no longer on the broker" in str(stopped.value)
    assert "start a new checkpoint" in str(stopped.value)

    # The way out the error names: a new checkpoint starts at the group's offsets where the broker still has
    # them, and where SOURCE_KAFKA_CONSUMER_CONFIG_AUTO_OFFSET_RESET points where it does not.
    fresh = Config.from_env({**job_env, "SPARK_CHECKPOINT_LOCATION": str(tmp_path / "new-checkpoint")})
    summary = Pipeline(fresh, spark).run(available_now=True)
    assert (summary.totals.messages, summary.totals.failed) == (30 - lost, 0)
    # Every record still on the broker landed (the stopped batch's other partitions may have landed twice:
    # Storage Write is at-least-once for a batch that fails), and only the deleted ones are missing.
    assert len({row["order_number"] for row in read_table(bq_client, job_config)}) == 60 - lost


def test_max_offsets_per_trigger_splits_batches(spark, job_env: dict[str, str], bq_client) -> None:
    cfg = Config.from_env({**job_env, "SPARK_MAX_OFFSETS_PER_TRIGGER": "100"})
    try:
        produce_bookings(cfg, 300)
        summary = Pipeline(cfg, spark).run(available_now=True)
        assert summary.totals.messages == 300
        assert summary.batches >= 3
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def test_undecodable_message_stops_the_job_without_committing(spark, job_config: Config) -> None:
    from kafka import KafkaProducer

    produce_bookings(job_config, 20)
    producer = KafkaProducer(bootstrap_servers=job_config.source.brokers)
    producer.send(job_config.source.topics[0], key=b"bad", value=b"\x0a\x05ab", partition=1).get(timeout=10)
    producer.close()

    with pytest.raises(BatchFailedError) as failed:
        Pipeline(job_config, spark).run(available_now=True)

    text = str(failed.value)
    assert "DESERIALIZATION_ERROR" in text
    assert f"{job_config.source.topics[0]}/1@" in text
    assert "offsets were not committed" in text
    # Nothing was committed: the same batch, with the same bad message, is planned again.
    with pytest.raises(BatchFailedError):
        Pipeline(job_config, spark).run(available_now=True)


def test_failed_write_stops_the_job_with_a_classified_reason(spark, job_config: Config, bq_client) -> None:
    from firehose_bq.errors import FirehoseError

    produce_bookings(job_config, 10)
    pipeline = Pipeline(job_config, spark)
    pipeline.prepare()
    bq_client.delete_table(job_config.bigquery.table_ref)  # gone between start-up and the first write

    with pytest.raises(FirehoseError) as failed:
        pipeline.run(available_now=True)

    text = str(failed.value)
    assert text.startswith("batch 0 stopped, offsets not committed: SINK_4XX_ERROR: "), text
    assert f"Not found: table:{job_config.bigquery.table_ref}" in text
    assert "Traceback" not in text and "py4j" not in text
    assert pipeline.summary.failure == text.splitlines()[0]


@pytest.mark.parametrize("method", WRITE_METHODS)
def test_key_and_every_metadata_column_per_write_method(spark, method: str, job_env: dict[str, str],
                                                         bq_client: bigquery.Client) -> None:
    every = ",".join(f"{name}={type_}" for name, type_ in (
        ("message_topic", "string"), ("message_partition", "integer"), ("message_offset", "integer"),
        ("message_timestamp", "timestamp"), ("load_time", "timestamp"), ("message_headers", "record"),
        ("message_timestamp_type", "string"), ("message_leader_epoch", "integer")))
    cfg = Config.from_env({**job_env, "SINK_BIGQUERY_WRITE_METHOD": method,
                           "INPUT_SCHEMA_PROTO_KEY_CLASS": "firehose.example.v1.BookingKey",
                           "SINK_BIGQUERY_METADATA_COLUMNS_TYPES": every, "SINK_BIGQUERY_METADATA_NAMESPACE": "kafka"})
    topic = cfg.source.topics[0]
    produce_bookings(cfg, 20)
    headers = [("trace", b"\x01\x02"), ("empty", b"")]
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    unkeyed = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    sent = unkeyed.send(topic, value=sample.booking(20, cls).SerializeToString(), headers=headers,
                        partition=0).get(timeout=10)
    unkeyed.close()

    summary = Pipeline(cfg, spark).run(available_now=True)

    assert (summary.totals.rows_written, summary.totals.failed) == (21, 0)
    rows = {r["order_number"]: dict(r.items()) for r in read_table(bq_client, cfg)}
    stamps = kafka_timestamps(cfg.source.brokers, topic)
    for i in range(21):
        row = rows[f"ORD-{i:08d}"]
        row["context"] = json.loads(row["context"])
        key, meta = row.pop("message_key"), row.pop("kafka")
        assert row == expected_row(i), f"booking {i}"
        assert key == (None if i == 20 else {"order_number": f"ORD-{i:08d}"})
        where = (meta["message_partition"], meta["message_offset"])
        assert meta == {
            "message_topic": topic, "message_partition": where[0], "message_offset": where[1],
            "message_timestamp": stamps[where], "load_time": meta["load_time"],
            "message_headers": [{"key": k, "value": v} for k, v in headers] if i == 20 else [],
            "message_timestamp_type": "CreateTime", "message_leader_epoch": 0,
        }, f"booking {i}"
        if i == 20:
            assert where == (sent.partition, sent.offset)
    bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)


def kafka_timestamps(brokers: str, topic: str) -> dict[tuple[int, int], datetime]:
    """(partition, offset) → the record's timestamp, as Kafka has it."""
    consumer = KafkaConsumer(topic, bootstrap_servers=brokers, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000, enable_auto_commit=False)
    try:
        return {(r.partition, r.offset): datetime.fromtimestamp(r.timestamp / 1000, UTC) for r in consumer}
    finally:
        consumer.close()


def assert_sample_landed(client: bigquery.Client, cfg: Config, count: int, started: datetime,
                         finished: datetime) -> None:
    """Bookings 0..count-1 are in the table exactly once each, field by field, with metadata that matches
    Kafka's own records and a load time inside the run [started, finished]."""
    rows = read_table(client, cfg)
    assert len(rows) == count
    topic = cfg.source.topics[0]
    stamps = kafka_timestamps(cfg.source.brokers, topic)
    by_order = {r["order_number"]: r for r in rows}
    assert len(by_order) == count
    for i in range(count):
        row = dict(by_order[f"ORD-{i:08d}"])
        row["context"] = json.loads(row["context"])
        metadata = {k: row.pop(k) for k in ("message_topic", "message_partition", "message_offset",
                                             "message_timestamp", "load_time")}
        assert row == expected_row(i), f"booking {i}"
        assert metadata["message_topic"] == topic
        assert metadata["message_timestamp"] == stamps[(metadata["message_partition"], metadata["message_offset"])]
        assert started.replace(microsecond=0) <= metadata["load_time"] <= finished
    # Every produced offset is in the table exactly once.
    ends = end_offsets(cfg.source.brokers, topic)
    landed = sorted((r["message_partition"], r["message_offset"]) for r in rows)
    assert landed == sorted((p, o) for p, end in ends.items() for o in range(end))
