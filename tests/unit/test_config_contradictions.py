"""Settings an operator can get wrong without a parse error: an empty value where only a real one works,
a setting that the rest of the configuration makes the job ignore. Each must stop the start naming the
variable, not take effect minutes later in a task or never."""

from __future__ import annotations

import pytest

from firehose_bq.config import Config
from firehose_bq.errors import ConfigError

from tests.unit.test_config import MINIMAL


def _problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        Config.from_env(env)
    return failed.value.problems


@pytest.mark.parametrize("name", ["DLQ_KAFKA_TOPIC", "SPARK_MASTER", "SPARK_APP_NAME", "SINK_BIGQUERY_DATASET_LOCATION",
                                  "SINK_BIGQUERY_INTERMEDIATE_TABLE_SUFFIX"])
def test_an_empty_value_where_the_default_is_not_empty_stops_the_start(name: str) -> None:
    # `NAME=` (an env file, a template whose variable was unset) would otherwise be taken as the value: a DLQ
    # topic named '' fails only when the first letter is written, after minutes of retries.
    problems = _problems({**MINIMAL, "DLQ_SINK_ENABLE": "true", name: ""})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: empty"), problems


@pytest.mark.parametrize("name", ["SPARK_DRIVER_JAVA_OPTIONS", "ERROR_TYPES_FOR_DLQ", "ERROR_TYPES_FOR_RETRY",
                                  "SINK_BIGQUERY_METADATA_NAMESPACE"])
def test_an_empty_value_that_means_something_is_kept(name: str) -> None:
    Config.from_env({**MINIMAL, name: ""})
