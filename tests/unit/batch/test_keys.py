"""Changelog keys: those whose Timestamp is finer than BigQuery's microsecond are found, and only those;
what a key lacking a field decodes it to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from firehose_bq import descriptors
from firehose_bq.batch.keys import SubMicrosecondKeys
from firehose_bq.descriptors import Descriptors
from firehose_bq.schema import MetadataColumns
from firehose_bq.sink_schema import SinkSpec
from firehose_bq.upsert.flush import absent_key_values
from tests.conftest import compile_protos

LEDGER = Path(__file__).parents[2] / "integration" / "protos" / "ledger"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Descriptors:
    return descriptors.load([str(compile_protos(tmp_path_factory.mktemp("ledger") / "ledger.desc", LEDGER))])


def test_keys_past_the_microsecond_are_refused_naming_the_field(ledger: Descriptors) -> None:
    key_class = ledger.message_class("ledger.v1.AccountKey")
    check = SubMicrosecondKeys.of(key_class)
    assert check is not None

    def key(nanos: int | None) -> bytes:
        k = key_class(tenant="t", account_id=1)
        if nanos is not None:
            k.opened.seconds, k.opened.nanos = 1_700_000_000, nanos
        return k.SerializeToString()

    keys = pa.array([key(123_456_789), key(123_456_000), key(None), key(1), key(999_999_999), key(5)], pa.binary())
    skip = np.array([False, False, False, False, False, True])  # failed already: not looked at
    refused = check.refused(keys, skip)
    assert [i for i, _ in refused] == [0, 3, 4]
    assert refused[0][1].startswith("key: opened has nanos 123456789, finer than the microsecond")


def test_nested_timestamps_are_checked_and_classes_without_any_cost_nothing(test_descriptors: Descriptors) -> None:
    all_types = test_descriptors.message_class("testdata.AllTypes")
    check = SubMicrosecondKeys.of(all_types)
    assert check is not None and check._paths == [("f_timestamp",)]  # repeated Timestamps: no key field
    message = all_types()
    message.f_timestamp.nanos = 7
    assert [i for i, _ in check.refused(pa.array([message.SerializeToString()], pa.binary()),
                                        np.zeros(1, dtype=bool))] == [0]
    assert SubMicrosecondKeys.of(test_descriptors.message_class("testdata.Node")) is None  # recursive, no Timestamp


@pytest.mark.parametrize("decoder", ["python", "auto"])
def test_absent_key_values_are_what_a_key_lacking_the_field_decodes_to(ledger: Descriptors, decoder: str) -> None:
    spec = SinkSpec(ledger, "ledger.v1.Account", MetadataColumns(), key_class="ledger.v1.AccountKey", decoder=decoder)
    # proto3 scalars and enums decode to their default; the Timestamp (a message, with presence) stays NULL.
    assert absent_key_values(spec) == (("tenant", ""), ("account_id", 0), ("region", "REGION_UNSPECIFIED"))
