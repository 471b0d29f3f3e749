"""One row makes BigQuery refuse a whole Storage Write append: the job isolates it into the DLQ, writes
every other row once and commits, instead of stopping on it at every restart; a micro-batch of that row
alone dead-letters it too.

No row that passes the sink's own checks makes the emulator refuse an append as invalid: its Arrow path
checks nothing per value but a DATETIME text, which both JSON decoders check first (TIME and INTERVAL
texts fail every append, as gRPC UNKNOWN), and a value DuckDB refuses surfaces as UNKNOWN too. The one
whole-request refusal a row can cause is its size, as on BigQuery: "AppendRows request too large"
(INVALID_ARGUMENT). The sink keeps appends under BigQuery's 10 MiB, so this test runs an emulator of its
own whose cap is 512 KiB (`BQEMU_WRITE_API_MAX_REQUEST_BYTES`): a 700 kB booking passes every check of
the sink and is refused by the server with the request it is in. The broker is the session's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from firehose_bq import sample
from firehose_bq.config import Config
from firehose_bq.devstack.stack import Stack, isolated_env
from firehose_bq.devstack.stack_config import StackConfig
from firehose_bq.errors import ErrorType
from firehose_bq.pipeline import Pipeline
from tests.integration.test_dead_letters import read_blobs
from tests.integration.test_sink_outage import settled, table_client
from tests.integration.test_storage_write import booking_class

pytestmark = pytest.mark.integration

REQUEST_CAP = 512 * 1024
GOOD = 200
POISON_AT = 137  # its offset in the one partition
POISON_BYTES = 700_000  # over the emulator's cap, far under the sink's 9 MiB, under the broker's 1 MB


@pytest.fixture(scope="module")
def small_requests_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A BigQuery emulator alone, started by the project's launcher, refusing appends over REQUEST_CAP."""
    stack = Stack(StackConfig.from_env({**os.environ, **isolated_env(tmp_path_factory.mktemp("small"))}))
    stack.services = tuple(s for s in stack.services if s.name == "bigquery")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BQEMU_WRITE_API_MAX_REQUEST_BYTES", str(REQUEST_CAP))  # the launched process's
        stack.up(report=lambda line: None)
    try:
        yield stack
    finally:
        stack.down(report=lambda line: None)


def test_a_row_refused_with_its_whole_append_is_dead_lettered_and_the_rest_lands_once(
        spark, job_env: dict[str, str], small_requests_emulator: Stack, tmp_path: Path) -> None:
    emulator = small_requests_emulator.env()
    cfg = Config.from_env({
        **job_env, "SINK_BIGQUERY_API_ENDPOINT": emulator["SINK_BIGQUERY_API_ENDPOINT"],
        "SINK_BIGQUERY_STORAGE_API_ENDPOINT": emulator["SINK_BIGQUERY_STORAGE_API_ENDPOINT"],
        "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "BLOB", "DLQ_BLOB_LOCAL_DIRECTORY": str(tmp_path / "dlq")})
    assert cfg.bigquery.effective_write_method == "storage_write"  # the default
    topic = cfg.source.topics[0]
    sample.ensure_topic(cfg.source.brokers, topic, 1)  # one partition: one task, one append for all rows
    cls = booking_class(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, max_request_size=2 << 20)
    for i in range(GOOD + 1):
        msg = sample.booking(i, cls)
        if i == POISON_AT:
            msg.signature = os.urandom(POISON_BYTES)
        producer.send(topic, msg.SerializeToString(), key=b"k%d" % i, partition=0).get(timeout=30)
    producer.close()
    client = table_client(cfg)
    try:
        summary = Pipeline(cfg, spark).run(available_now=True)  # returns: the job did not stop

        t = summary.totals
        assert (t.messages, t.rows_written, t.dead_lettered, t.failed) == (GOOD + 1, GOOD, 1, 0)
        rows = client.query(f"SELECT order_number, COUNT(*) AS n FROM `{cfg.bigquery.table_ref}` "
                            "GROUP BY order_number").result()
        landed = {r.order_number: r.n for r in rows}
        assert landed == {f"ORD-{i:08d}": 1 for i in range(GOOD + 1) if i != POISON_AT}  # each once

        (letter,) = read_blobs(tmp_path / "dlq")
        assert (letter.error.topic, letter.error.partition, letter.error.offset) == (topic, 0, POISON_AT)
        assert letter.error.error_type is ErrorType.SINK_4XX_ERROR and letter.key == b"k%d" % POISON_AT
        assert "rejected as a whole" in letter.error.message
        assert "AppendRows request too large" in letter.error.message

        # Committed: the checkpoint has no batch in flight, and a restart finds nothing to read again (no loop).
        assert settled(cfg)
        again = Pipeline(cfg, spark).run(available_now=True)
        assert again.totals.messages == 0 and len(read_blobs(tmp_path / "dlq")) == 1

        # A quiet partition: the poison record is its micro-batch's only one, the append its only row.
        producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, max_request_size=2 << 20)
        alone = sample.booking(GOOD + 1, cls)
        alone.signature = os.urandom(POISON_BYTES)
        producer.send(topic, alone.SerializeToString(), key=b"alone", partition=0).get(timeout=30)
        producer.close()
        quiet = Pipeline(cfg, spark).run(available_now=True)
        assert (quiet.totals.messages, quiet.totals.dead_lettered, quiet.totals.failed) == (1, 1, 0)
        letter = next(x for x in read_blobs(tmp_path / "dlq") if x.key == b"alone")
        assert letter.error.offset == GOOD + 1 and "a request holding only this row" in letter.error.message
        assert settled(cfg)
    finally:
        client.delete_dataset(cfg.bigquery.dataset, delete_contents=True, not_found_ok=True)
        client.close()
