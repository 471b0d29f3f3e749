"""A file-loads batch held for a registry refresh, then replayed after a crash between its load job and the
commit of its offsets: the replay, which runs in one go, must find the load job and load nothing again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.cloud import bigquery
from kafka import KafkaProducer

from firehose_bq import descriptors
from firehose_bq.errors import ErrorType, FirehoseError, SinkError
from firehose_bq.pipeline import Pipeline
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.sample import ensure_topic
from firehose_bq.source.kafka_client import READ_BATCH_ROWS
from tests.integration.conftest import FakeRegistry
from tests.integration.test_schema_refresh import refreshing_on_hold

pytestmark = pytest.mark.integration


def test_a_held_file_loads_batch_replayed_in_one_go_is_loaded_once(
        spark, job_env: dict[str, str], registry: tuple[FakeRegistry, object], bq_client: bigquery.Client,
        tmp_path: Path) -> None:
    fake, _server = registry
    cfg, paths = refreshing_on_hold(job_env, fake, tmp_path, SINK_BIGQUERY_WRITE_METHOD="file_loads")
    topic = cfg.source.topics[0]
    ensure_topic(cfg.source.brokers, topic, 1)
    v2 = descriptors.load([str(paths["v2"])]).message_class("evo.Event")
    # One partition: a first read batch that v1 knows all of, then records with v2's fields. The task stages
    # the first, holds at the second; the driver refreshes and runs the rest: the partition is staged in two
    # pieces. Its replay, with v2 known from the start, stages it in one.
    known = READ_BATCH_ROWS
    producer = KafkaProducer(bootstrap_servers=cfg.source.brokers, linger_ms=50)
    for i in range(known):
        producer.send(topic, v2(id=f"o{i}", amount=i).SerializeToString(), partition=0)
    for i in range(3):
        producer.send(topic, v2(id=f"n{i}", detail={"note": "v2", "priority": i}).SerializeToString(), partition=0)
    producer.flush()
    producer.close()

    cache = DescriptorCache.for_stencil(cfg.input_schema.stencil_urls, cfg.registry).start()  # on v1
    fake.routes["/evo.desc"] = paths["v2"].read_bytes()  # what a refresh finds
    try:
        pipeline = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now)
        load = pipeline.mode.finish

        def load_then_die(*args: Any) -> None:
            load(*args)
            raise SinkError(ErrorType.SINK_UNKNOWN_ERROR, "the driver died after the load job, before the commit")

        pipeline.mode.finish = load_then_die  # type: ignore[method-assign]
        with pytest.raises(FirehoseError, match="the driver died after the load job"):
            pipeline.run(available_now=True)
        assert cache.stats().changes == 1, "the batch was held for a refresh"

        replay = Pipeline(cfg, spark, descriptor_source=cache.get, refresh=cache.refresh_now).run(available_now=True)
    finally:
        cache.stop()

    assert replay.totals.messages == known + 3
    count, distinct = next(iter(bq_client.query(
        f"SELECT COUNT(*) AS n, COUNT(DISTINCT id) AS d FROM `{cfg.bigquery.table_ref}`").result()))
    assert (count, distinct) == (known + 3, known + 3), "each record loaded once"
