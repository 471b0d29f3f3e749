"""The error policy: validation of its lists, retry of failed rows only, and where each message ends."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from google.api_core import exceptions

from firehose_bq.bigquery.insert_all import InsertAllWriter
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.convert import ConvertedBatch, KafkaRecords
from firehose_bq.dlq.config import DlqConfig
from firehose_bq.errors import ConfigError, ErrorType, MessageError, SinkError
from firehose_bq.metrics import BatchStats
from firehose_bq.policy import ErrorHandling, ErrorPolicyConfig, apply_policy, write_with_policy

BACKEND = [{"reason": "backendError", "location": "", "debugInfo": "", "message": "Backend error, retry"}]
INVALID = [{"reason": "invalid", "location": "id", "debugInfo": "", "message": "bad id"}]
STOPPED = [{"reason": "stopped", "location": "", "debugInfo": "", "message": ""}]


class FlakyClient:
    """insert_rows_json as BigQuery answers it: rows in `bad` are invalid (the rest of the request stopped);
    rows in `flaky` fail with backendError for their first `flaky[id]` requests; `down` raises N times."""

    def __init__(self, bad: set[str] = frozenset(), flaky: dict[str, int] | None = None, down: int = 0,
                 down_error: Exception | None = None) -> None:
        self.bad, self.flaky, self.down = bad, dict(flaky or {}), down
        self.down_error = down_error or requests.exceptions.ConnectionError("Connection refused")
        self.requests: list[list[str]] = []
        self.stored: list[str] = []

    def insert_rows_json(self, table: str, rows: list[dict], row_ids: list, **_: Any) -> list[dict]:
        self.requests.append([r["id"] for r in rows])
        if self.down:
            self.down -= 1
            raise self.down_error
        answers = {}
        for i, r in enumerate(rows):
            if r["id"] in self.bad:
                answers[i] = INVALID
            elif self.flaky.get(r["id"], 0) > 0:
                self.flaky[r["id"]] -= 1
                answers[i] = BACKEND
        if any(a is INVALID for a in answers.values()):
            answers = {i: answers.get(i, STOPPED) for i in range(len(rows))}
        self.stored.extend(r["id"] for i, r in enumerate(rows) if i not in answers)
        return [{"index": i, "errors": e} for i, e in sorted(answers.items())]

    def close(self) -> None:
        pass


def batch(ids: list[str], errors: list[MessageError] = ()) -> tuple[ConvertedBatch, KafkaRecords]:
    n = len(ids) + len(errors)
    records = KafkaRecords(["t"] * n, [0] * n, list(range(n)), [1000] * n, [b"v%d" % k for k in range(n)],
                           keys=[b"k"] * n, headers=[[("h", b"1")]] * n)
    rows = [{"id": i} for i in ids]
    return ConvertedBatch(rows, [records.insert_id(k) for k in range(len(ids))], list(range(len(ids))),
                          errors=list(errors)), records


def handling(dlq: bool = True, **env: str) -> ErrorHandling:
    cfg = Config.from_env({"SOURCE_KAFKA_BROKERS": "b", "SOURCE_KAFKA_TOPIC": "t", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
                           "INPUT_SCHEMA_PROTO_CLASS": "x.Y", "SCHEMA_REGISTRY_STENCIL_URLS": "/d",
                           "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "p", "SINK_BIGQUERY_DATASET_NAME": "d",
                           "SINK_BIGQUERY_TABLE_NAME": "t", "SPARK_CHECKPOINT_LOCATION": "/c",
                           "DLQ_SINK_ENABLE": str(dlq).lower(), **env})
    return ErrorHandling(cfg.errors, cfg.dlq)


def run(h: ErrorHandling, client: FlakyClient, converted: ConvertedBatch, records: KafkaRecords):  # noqa: ANN201
    waits: list[float] = []
    writer = InsertAllWriter(client, BigQueryConfig(project_id="p", dataset="d", table="t"))  # type: ignore[arg-type]
    return write_with_policy(h, converted, records, lambda: writer, waits.append), waits


def test_defaults_retry_transient_and_dead_letter_the_rest() -> None:
    p = ErrorPolicyConfig()
    assert p.retry_types == {ErrorType.SINK_5XX_ERROR, ErrorType.SINK_RETRYABLE_ERROR}
    assert p.dlq_types == frozenset(ErrorType) and p.failing_types == frozenset()
    # The backoff the defaults give covers more than a minute of outage before giving up.
    assert sum(p.backoff_ms(n) for n in range(1, p.max_attempts)) > 120_000


@pytest.mark.parametrize(("env", "problem"), [
    ({"ERROR_TYPES_FOR_FAILING": "SINK_4XX_ERROR", "ERROR_TYPES_FOR_DLQ": "SINK_4XX_ERROR,SINK_5XX_ERROR"},
     "SINK_4XX_ERROR in both lists"),
    ({"ERROR_TYPES_FOR_DLQ": "SINK_4XX,DESERIALIZATION_ERROR"}, "unknown error type 'SINK_4XX'"),
    ({"ERROR_TYPES_FOR_RETRY": "DESERIALIZATION_ERROR"}, "cannot be retried"),
])
def test_bad_lists_are_config_errors(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as failed:
        handling(**env)
    assert problem in str(failed.value)


def test_empty_list_means_none() -> None:
    h = handling(ERROR_TYPES_FOR_DLQ="", ERROR_TYPES_FOR_RETRY="")
    assert h.policy.dlq_types == frozenset() and h.policy.retry_types == frozenset()
    converted, records = batch(["a"], [MessageError(ErrorType.DESERIALIZATION_ERROR, "t", 0, 1, "bad bytes")])
    done, _ = run(h, FlakyClient(), converted, records)
    assert [e.error_type for e in done.failed] == [ErrorType.DESERIALIZATION_ERROR] and not done.dead


def test_failing_list_keeps_a_type_out_of_the_default_dlq() -> None:
    h = handling(ERROR_TYPES_FOR_FAILING="DESERIALIZATION_ERROR")
    assert ErrorType.DESERIALIZATION_ERROR not in h.policy.dlq_types
    assert h.final_outcome(ErrorType.DESERIALIZATION_ERROR, False) == "failed"
    assert h.final_outcome(ErrorType.SINK_4XX_ERROR, False) == "dlq"


def test_dlq_types_fail_the_job_when_the_dlq_is_off() -> None:
    converted, records = batch(["a", "bad"])
    done, _ = run(handling(dlq=False), FlakyClient(bad={"bad"}), converted, records)
    assert done.written == 1
    assert [(e.error_type, e.offset) for e in done.failed] == [(ErrorType.SINK_4XX_ERROR, 1)]


def test_only_the_failed_rows_are_retried_with_backoff() -> None:
    client = FlakyClient(flaky={"b": 2, "c": 1})
    converted, records = batch(["a", "b", "c", "d"])
    done, waits = run(handling(), client, converted, records)
    assert client.requests == [["a", "b", "c", "d"], ["b", "c"], ["b"]]
    assert sorted(client.stored) == ["a", "b", "c", "d"]
    assert (done.written, done.retried, done.dead, done.failed) == (4, 2, [], [])
    assert waits == [0.01, 0.02]


def test_retries_run_out_then_the_dlq_or_failure() -> None:
    converted, records = batch(["a", "b"])
    done, waits = run(handling(RETRY_MAX_ATTEMPTS="3"), FlakyClient(flaky={"b": 99}), converted, records)
    assert len(waits) == 2 and done.written == 1 and done.retried == 1
    assert [(e.error_type, e.offset) for e in done.dead] == [(ErrorType.SINK_5XX_ERROR, 1)]

    converted, records = batch(["a", "b"])
    strict = handling(RETRY_MAX_ATTEMPTS="3", RETRY_FAIL_AFTER_MAX_ATTEMPTS_ENABLE="true")
    done, _ = run(strict, FlakyClient(flaky={"b": 99}), converted, records)
    assert [e.offset for e in done.failed] == [1] and not done.dead


def test_stopped_rows_are_written_not_dead_lettered() -> None:
    converted, records = batch(["a", "bad", "c"])
    done, waits = run(handling(), FlakyClient(bad={"bad"}), converted, records)
    assert done.written == 2 and not waits
    assert [(e.error_type, e.offset) for e in done.dead] == [(ErrorType.SINK_4XX_ERROR, 1)]


def test_a_request_failing_as_a_whole_is_retried_then_stops_the_job() -> None:
    client = FlakyClient(down=3)
    converted, records = batch(["a", "b"])
    done, waits = run(handling(), client, converted, records)
    assert done.written == 2 and done.retried == 2 and len(waits) == 3
    assert sorted(client.stored) == ["a", "b"]

    with pytest.raises(SinkError) as failed:
        run(handling(RETRY_MAX_ATTEMPTS="2"), FlakyClient(down=5), *batch(["a"]))
    assert failed.value.error_type is ErrorType.SINK_RETRYABLE_ERROR
    assert "gave up after 2 attempts" in str(failed.value)

    # A 4XX for the whole request (the table is gone) is not in the retry list: at once.
    gone = FlakyClient(down=1, down_error=exceptions.NotFound("Not found: Table p:d.t"))
    with pytest.raises(SinkError) as failed:
        run(handling(), gone, *batch(["a"]))
    assert failed.value.error_type is ErrorType.SINK_4XX_ERROR and len(gone.requests) == 1


def test_unknown_fields_are_errors_when_not_allowed() -> None:
    converted, records = batch(["a", "b"])
    converted.unknown_fields = [1]
    done, _ = run(handling(INPUT_SCHEMA_PROTO_ALLOW_UNKNOWN_FIELDS_ENABLE="false"), client := FlakyClient(),
                  converted, records)
    assert client.stored == ["a"] and done.written == 1
    assert [(e.error_type, e.offset) for e in done.dead] == [(ErrorType.UNKNOWN_FIELDS_ERROR, 1)]
    done, _ = run(handling(), FlakyClient(), *batch(["a", "b"]))
    assert done.written == 2


def test_every_message_is_counted_once_and_dead_letters_keep_the_record() -> None:
    errors = [MessageError(ErrorType.DESERIALIZATION_ERROR, "t", 0, 3, "bad bytes")]
    converted, records = batch(["a", "bad", "c"], errors)
    stats = BatchStats(messages=len(records))
    writer = InsertAllWriter(FlakyClient(bad={"bad"}), BigQueryConfig(project_id="p", dataset="d", table="t"))  # type: ignore[arg-type]
    letters = apply_policy(handling(DLQ_WRITER_TYPE="KAFKA"), converted, records, lambda: writer, stats, lambda s: None)
    assert stats.rows_written + stats.dead_lettered + stats.failed == stats.messages == 4
    assert dict(stats.errors_by_type) == {"DESERIALIZATION_ERROR": 1, "SINK_4XX_ERROR": 1}
    by_offset = {letter.error.offset: letter for letter in letters}
    assert by_offset[3].value == b"v3" and by_offset[3].key == b"k" and by_offset[3].headers == (("h", b"1"),)
    assert by_offset[1].attempt == 1 and by_offset[1].timestamp_ms == 1000
    assert DlqConfig(enabled=True, writer_type="KAFKA") == handling(DLQ_WRITER_TYPE="KAFKA").dlq
