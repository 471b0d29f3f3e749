"""Cloud Storage on the local stack's GCS emulator: the blob store, and the BLOB dead-letter queue on GCS
written by the streaming job and read back by `replay-dlq --from-blob gs://...`."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery, storage
from kafka import KafkaProducer

from firehose_bq import cli, descriptors, sample
from firehose_bq.blobstore import GcsOptions, open_blob_store
from firehose_bq.config import Config
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.dlq.writers import dead_letter
from firehose_bq.errors import ErrorType, MessageError
from firehose_bq.pipeline import Pipeline

pytestmark = pytest.mark.integration

VALID = 5
CORRUPT = [b"\xff\xff\xff\xff\xff", b"\x0a\x7f"]  # not a protobuf; a string field cut short


def raw_names(endpoint: str, bucket: str, prefix: str) -> list[str]:
    """Object names as GCS lists them, through the plain client: what the store wrote, not what it says."""
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options=ClientOptions(api_endpoint=endpoint))
    return sorted(b.name for b in client.list_blobs(bucket, prefix=prefix))


def test_blob_store_on_the_emulator(stack_env: dict[str, str], tmp_path: Path) -> None:
    endpoint, bucket = stack_env["DLQ_GCS_API_ENDPOINT"], stack_env["FIREHOSE_STACK_GCS_BUCKET"]
    prefix = f"it-{uuid.uuid4().hex[:8]}"
    store = open_blob_store(f"gs://{bucket}/{prefix}", GcsOptions(endpoint=endpoint))
    sibling = open_blob_store(f"gs://{bucket}/{prefix}-other", GcsOptions(endpoint=endpoint))
    sibling.put("x", b"must not show under the other prefix")

    assert store.put("batch-1/a.ndjson", b'{"a":1}\n') == f"gs://{bucket}/{prefix}/batch-1/a.ndjson"
    staged = tmp_path / "rows.ndjson"
    staged.write_bytes(b'{"b":2}\n' * 50_000)  # 400 kB, uploaded from the file
    store.put_file("batch-1/b.ndjson", staged)
    store.put("batch-10/c.ndjson", b"")
    assert store.names() == ["batch-1/a.ndjson", "batch-1/b.ndjson", "batch-10/c.ndjson"]
    assert store.names("batch-1/") == ["batch-1/a.ndjson", "batch-1/b.ndjson"]
    assert store.get("batch-1/b.ndjson") == staged.read_bytes()
    store.rename("batch-1/a.ndjson", "batch-1/a.ndjson.done")
    assert raw_names(endpoint, bucket, f"{prefix}/") == [
        f"{prefix}/batch-1/a.ndjson.done", f"{prefix}/batch-1/b.ndjson", f"{prefix}/batch-10/c.ndjson"]
    assert store.delete_prefix("batch-1/") == 2
    assert store.names() == ["batch-10/c.ndjson"]
    assert sibling.names() == ["x"]


def test_stream_dead_letters_to_gcs_and_replay_reads_them_back(
        spark, job_env: dict[str, str], bq_client: bigquery.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, bucket = job_env["DLQ_GCS_API_ENDPOINT"], job_env["FIREHOSE_STACK_GCS_BUCKET"]
    prefix = f"dlq-{uuid.uuid4().hex[:8]}"
    env = {**job_env, "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "BLOB", "DLQ_BLOB_STORAGE_TYPE": "GCS",
           "DLQ_GCS_BUCKET_NAME": bucket, "DLQ_GCS_PREFIX": prefix}
    cfg = Config.from_env(env)
    topic = cfg.source.topics[0]
    cls = descriptors.load(cfg.input_schema.stencil_urls).message_class(cfg.input_schema.proto_class)
    sample.ensure_topic(cfg.source.brokers, topic, 1)
    sample.produce(cfg.source.brokers, topic, sample.booking_messages(cls), VALID, progress=False)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers)
    for value in CORRUPT:
        producer.send(topic, value, key=b"bad").get(timeout=10)
    producer.close()
    try:
        totals = Pipeline(cfg, spark).run(available_now=True).totals
        assert (totals.rows_written, totals.dead_lettered, totals.failed) == (VALID, len(CORRUPT), 0)

        # The Spark task wrote them: `<prefix>/<topic>/<day>/<uuid>.jsonl`, JSON lines with the original record.
        written = raw_names(endpoint, bucket, f"{prefix}/")
        assert len(written) == 1 and written[0].startswith(f"{prefix}/{topic}/") and written[0].endswith(".jsonl")
        store = open_blob_store(cfg.dlq.blob_location(), cfg.dlq.gcs_options())
        letters = [DeadLetter.from_json(line) for line in store.get(written[0].removeprefix(f"{prefix}/")).splitlines()]
        assert [(x.error.offset, x.error.error_type, x.value, x.key) for x in letters] == [
            (VALID + i, ErrorType.DESERIALIZATION_ERROR, value, b"bad") for i, value in enumerate(CORRUPT)]

        # A letter whose cause is gone (BigQuery failed, then recovered), dead-lettered the same way a task does.
        fixable = DeadLetter(MessageError(ErrorType.SINK_5XX_ERROR, topic, 0, 1_000, "backendError"), None,
                             sample.booking(1_000, cls).SerializeToString(), (), None, 1, int(time.time() * 1000))
        dead_letter(cfg.dlq, [fixable])

        for name, value in env.items():
            monkeypatch.setenv(name, value)
        location = f"gs://{bucket}/{prefix}"
        assert cli.main(["replay-dlq", "--available-now", "--from-blob", location]) == 0
        count = f"SELECT COUNT(*) AS n FROM `{cfg.bigquery.table_ref}`"
        assert next(iter(bq_client.query(count).result())).n == VALID + 1
        after = store.names()
        assert len([n for n in after if n.endswith(".jsonl.replayed")]) == 2  # both objects handled
        again = [n for n in after if n.endswith(".jsonl")]  # the corrupt two, dead-lettered again
        assert len(again) == 1
        assert [(x.error.offset, x.attempt) for x in map(DeadLetter.from_json, store.get(again[0]).splitlines())] == [
            (VALID, 2), (VALID + 1, 2)]

        # A second replay handles only what is left, and lands nothing twice.
        assert cli.main(["replay-dlq", "--available-now", "--from-blob", location]) == 0
        assert next(iter(bq_client.query(count).result())).n == VALID + 1
        assert len([n for n in store.names() if n.endswith(".jsonl.replayed")]) == 3
    finally:
        bq_client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
