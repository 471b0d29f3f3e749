"""A dead letter carries its error's message to whoever reads the DLQ (a Kafka topic, blob files): the
values of secret settings and URL credentials never travel with it, as they never reach a log line."""

from __future__ import annotations

import pytest

from firehose_bq.batch import core
from firehose_bq.batch.core import process_batch
from firehose_bq.config import Config
from firehose_bq.descriptors import Descriptors
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.modes import handling_of
from tests.unit.batch.sources import source_batch
from tests.unit.batch.test_core import FakePlan, spec, values
from tests.unit.test_config import MINIMAL
from tests.unit.test_logs import HEADER_TOKEN, PASSWORD, LeakyWriter


def test_dead_letters_carry_no_secret_and_no_url_credentials(test_descriptors: Descriptors,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    stored: list[DeadLetter] = []
    monkeypatch.setattr(core, "dead_letter", lambda cfg, batch: stored.extend(batch))
    cfg = Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true",
                           "SCHEMA_REGISTRY_STENCIL_FETCH_HEADERS": f"Authorization: Bearer {HEADER_TOKEN}"})
    result = process_batch([source_batch(values(test_descriptors, "a", "b"))], spec(test_descriptors),
                           FakePlan(LeakyWriter()), handling_of(cfg))
    assert result.stats.dead_lettered == 2 and len(stored) == 2
    for letter in stored:
        for text in (letter.error.message, letter.to_json(), repr(letter.kafka_headers())):
            assert HEADER_TOKEN not in text and PASSWORD not in text
        assert "https://***@bq.test/x" in letter.error.message
