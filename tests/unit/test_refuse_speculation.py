"""refuse_speculation: a job whose Spark may run speculative task copies does not start (both copies write)."""

from __future__ import annotations

import pytest

from firehose_bq.errors import ConfigError
from firehose_bq.spark import refuse_speculation


class FakeSession:
    """What refuse_speculation reads of a SparkSession: its SparkConf."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = conf

    @property
    def sparkContext(self) -> FakeSession:  # noqa: N802 - PySpark's name
        return self

    def getConf(self) -> FakeSession:  # noqa: N802 - PySpark's name
        return self

    def get(self, key: str, default: str) -> str:
        return self.conf.get(key, default)


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_speculation_on_is_a_start_error(value: str) -> None:
    with pytest.raises(ConfigError, match="spark.speculation=true: a speculative copy of a task writes"):
        refuse_speculation(FakeSession({"spark.speculation": value}))  # type: ignore[arg-type]


@pytest.mark.parametrize("conf", [{}, {"spark.speculation": "false"}])
def test_speculation_off_or_unset_starts(conf: dict[str, str]) -> None:
    refuse_speculation(FakeSession(conf))  # type: ignore[arg-type]
