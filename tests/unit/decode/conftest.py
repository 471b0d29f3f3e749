from __future__ import annotations

import pytest

from firehose_bq.descriptors import Descriptors
from tests.unit.decode.protos import load_trees


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Descriptors]:
    return load_trees(tmp_path_factory.mktemp("trees"))
