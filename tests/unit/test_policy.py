"""The error policy: validation of its lists, retry of failed rows only, and where each record ends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from firehose_bq.batch.rows import Writable
from firehose_bq.config import Config
from firehose_bq.errors import ConfigError, ErrorType, PartialWriteError, RowError, SinkError
from firehose_bq.policy import ErrorHandling, ErrorPolicyConfig, write_with_policy
from tests.unit.clock import Clock


class FlakyWriter:
    """A RowWriter as BigQuery behaves: rows whose id is in `bad` are rejected (4XX); rows in `flaky` fail
    with a 5XX for their first `flaky[id]` writes; rows in `refused` always fail with the type given; the
    first `down` calls fail as a whole."""

    def __init__(self, bad: set[str] = frozenset(), flaky: dict[str, int] | None = None, down: int = 0,
                 down_error: SinkError | None = None, refused: dict[str, ErrorType] | None = None) -> None:
        self.bad, self.flaky, self.down = bad, dict(flaky or {}), down
        self.refused = dict(refused or {})
        self.down_error = down_error or SinkError(ErrorType.SINK_RETRYABLE_ERROR, "Connection refused")
        self.requests: list[list[str]] = []
        self.stored: list[str] = []

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        ids = rows["id"].to_pylist()
        self.requests.append(ids)
        assert insert_ids is not None and insert_ids.to_pylist() == [f"t_0_{i}" for i in ids]
        if self.down:
            self.down -= 1
            raise self.down_error
        failures = []
        for n, i in enumerate(ids):
            if i in self.bad:
                failures.append(RowError(n, ErrorType.SINK_4XX_ERROR, "invalid"))
            elif i in self.refused:
                failures.append(RowError(n, self.refused[i], "refused"))
            elif self.flaky.get(i, 0) > 0:
                self.flaky[i] -= 1
                failures.append(RowError(n, ErrorType.SINK_5XX_ERROR, "backendError"))
            else:
                self.stored.append(i)
        return failures

    def close(self) -> None:
        pass


def batch(ids: list[str], sources: list[int] | None = None) -> Writable:
    """Rows whose `id` is also their source index's insertId suffix (ids are the source indices)."""
    sources = sources if sources is not None else list(range(len(ids)))
    return Writable(pa.RecordBatch.from_pydict({"id": ids}), pa.array([f"t_0_{i}" for i in ids]),
                    np.array(sources, dtype=np.int64))


def handling(dlq: bool = True, **env: str) -> ErrorHandling:
    cfg = Config.from_env({"SOURCE_KAFKA_BROKERS": "b", "SOURCE_KAFKA_TOPIC": "t", "SOURCE_KAFKA_CONSUMER_GROUP_ID": "g",
                           "INPUT_SCHEMA_PROTO_CLASS": "x.Y", "SCHEMA_REGISTRY_STENCIL_URLS": "/d",
                           "SINK_BIGQUERY_GOOGLE_CLOUD_PROJECT_ID": "p", "SINK_BIGQUERY_DATASET_NAME": "d",
                           "SINK_BIGQUERY_TABLE_NAME": "t", "SPARK_CHECKPOINT_LOCATION": "/c",
                           "DLQ_SINK_ENABLE": str(dlq).lower(), **env})
    return ErrorHandling(cfg.errors, cfg.dlq)


def run(h: ErrorHandling, writer: FlakyWriter, pending: Writable, failures: list[RowError] = (),  # noqa: ANN201
        clock: Clock | None = None):
    clock = clock or Clock()
    return write_with_policy(h, pending, list(failures), lambda: writer, clock.sleep, clock), clock.waits


def numbered(*ids: str) -> Writable:
    """Rows with ids "0", "1", ... as given: their source index is their id."""
    return batch(list(ids), [int(i) for i in ids])


def test_defaults_retry_transient_and_dead_letter_the_rest() -> None:
    p = ErrorPolicyConfig()
    assert p.retry_types == {ErrorType.SINK_5XX_ERROR, ErrorType.SINK_RETRYABLE_ERROR}
    assert p.dlq_types == frozenset(ErrorType) and p.failing_types == frozenset()
    # The backoff the defaults give covers more than a minute of outage before giving up; the deadline
    # (SINK_BIGQUERY_RETRY_DEADLINE_MS) ends it, not the attempts.
    backoff = handling().write_backoff()
    assert backoff.budget_s == 120 and sum(backoff.wait_s(n) for n in range(1, backoff.attempts)) > 120


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
    done, _ = run(h, FlakyWriter(), numbered("0"), [RowError(1, ErrorType.DESERIALIZATION_ERROR, "bad bytes")])
    assert [e.error_type for e in done.failed] == [ErrorType.DESERIALIZATION_ERROR] and not done.dead


def test_failing_list_keeps_a_type_out_of_the_default_dlq() -> None:
    h = handling(ERROR_TYPES_FOR_FAILING="DESERIALIZATION_ERROR")
    assert ErrorType.DESERIALIZATION_ERROR not in h.policy.dlq_types
    assert h.final_outcome(ErrorType.DESERIALIZATION_ERROR, False) == "failed"
    assert h.final_outcome(ErrorType.SINK_4XX_ERROR, False) == "dlq"


def test_dlq_types_fail_the_job_when_the_dlq_is_off() -> None:
    done, _ = run(handling(dlq=False), FlakyWriter(bad={"1"}), numbered("0", "1"))
    assert done.written == 1
    assert [(e.error_type, e.index) for e in done.failed] == [(ErrorType.SINK_4XX_ERROR, 1)]


def test_only_the_failed_rows_are_retried_with_backoff() -> None:
    writer = FlakyWriter(flaky={"1": 2, "2": 1})
    done, waits = run(handling(), writer, numbered("0", "1", "2", "3"))
    assert writer.requests == [["0", "1", "2", "3"], ["1", "2"], ["1"]]
    assert sorted(writer.stored) == ["0", "1", "2", "3"]
    assert (done.written, done.retried, done.dead, done.failed) == (4, 2, [], [])
    assert waits == [0.01, 0.02]


def test_retries_run_out_then_the_dlq_or_failure() -> None:
    done, waits = run(handling(RETRY_MAX_ATTEMPTS="3"), FlakyWriter(flaky={"1": 99}), numbered("0", "1"))
    assert len(waits) == 2 and done.written == 1 and done.retried == 1
    assert [(e.error_type, e.index) for e in done.dead] == [(ErrorType.SINK_5XX_ERROR, 1)]

    strict = handling(RETRY_MAX_ATTEMPTS="3", RETRY_FAIL_AFTER_MAX_ATTEMPTS_ENABLE="true")
    done, _ = run(strict, FlakyWriter(flaky={"1": 99}), numbered("0", "1"))
    assert [e.index for e in done.failed] == [1] and not done.dead


def test_rejected_rows_are_dead_lettered_the_others_written_without_retry() -> None:
    done, waits = run(handling(), FlakyWriter(bad={"1"}), numbered("0", "1", "2"))
    assert done.written == 2 and not waits
    assert [(e.error_type, e.index) for e in done.dead] == [(ErrorType.SINK_4XX_ERROR, 1)]


def test_failures_come_back_at_their_source_index() -> None:
    # Rows 0..2 are records 4, 7 and 9 of the source batch; record 5 never became a row.
    pending = batch(["4", "7", "9"], [4, 7, 9])
    decode = [RowError(5, ErrorType.INVALID_MESSAGE_ERROR, "tombstone")]
    done, _ = run(handling(), FlakyWriter(bad={"7"}, flaky={"9": 1}), pending, decode)
    assert done.written == 2 and done.retried == 1
    assert sorted((e.index, e.error_type) for e in done.dead) == [(5, ErrorType.INVALID_MESSAGE_ERROR),
                                                                   (7, ErrorType.SINK_4XX_ERROR)]


def test_a_request_failing_as_a_whole_is_retried_then_stops_the_job() -> None:
    writer = FlakyWriter(down=3)
    done, waits = run(handling(), writer, numbered("0", "1"))
    assert done.written == 2 and done.retried == 2 and len(waits) == 3
    assert sorted(writer.stored) == ["0", "1"]

    with pytest.raises(SinkError) as failed:
        run(handling(RETRY_MAX_ATTEMPTS="2"), FlakyWriter(down=5), numbered("0"))
    assert failed.value.error_type is ErrorType.SINK_RETRYABLE_ERROR
    assert "gave up after 2 attempts" in str(failed.value)

    # A 4XX for the whole request (the table is gone) is not in the retry list: at once.
    gone = FlakyWriter(down=1, down_error=SinkError(ErrorType.SINK_4XX_ERROR, "Not found: Table p:d.t"))
    with pytest.raises(SinkError) as failed:
        run(handling(), gone, numbered("0"))
    assert failed.value.error_type is ErrorType.SINK_4XX_ERROR and len(gone.requests) == 1


def test_nothing_is_written_without_a_writer() -> None:
    done = write_with_policy(handling(), numbered("0", "1"), [], None)
    assert done.written == 0 and not done.errors




class SlowDeadWriter(FlakyWriter):
    """BigQuery gone: every request fails as a whole after `seconds` (a request timeout) of the clock."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__(down=10**6)
        self.clock, self.seconds = clock, seconds

    def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
        self.clock.now += self.seconds
        return super().write(rows, insert_ids)


@pytest.mark.parametrize("request_s", [0.0, 30.0, 59.9])
def test_a_dead_sink_is_retried_until_the_deadline_and_no_longer(request_s: float) -> None:
    h = handling()
    clock = Clock()
    with pytest.raises(SinkError, match=r"gave up after \d+ attempts in") as failed:
        run(h, SlowDeadWriter(clock, request_s), numbered("0", "1"), clock=clock)
    # Retried for the whole deadline (120 s), the last attempt begun by then: never longer than the bound.
    assert 120 <= clock.now <= h.write_backoff().bound_s(request_s) <= 120 + request_s
    assert failed.value.error_type is ErrorType.SINK_RETRYABLE_ERROR
    if request_s == 0:  # refused at once: the waits fill the deadline, the last one cut to fit it
        assert clock.waits[:3] == [0.01, 0.02, 0.04] and sum(clock.waits) == pytest.approx(120)


def test_a_write_that_failed_part_way_sends_only_its_unsent_rows_again() -> None:
    class PartWay(FlakyWriter):
        def write(self, rows: pa.RecordBatch, insert_ids: pa.Array | None) -> list[RowError]:
            ids = rows["id"].to_pylist()
            self.requests.append(ids)
            if len(self.requests) == 1:
                # Row 0 went in, row 1 was bad, the request carrying rows 2 and 3 failed.
                self.stored.append(ids[0])
                raise PartialWriteError(ErrorType.SINK_5XX_ERROR, "backendError", (2, 3),
                                        (RowError(1, ErrorType.SINK_4XX_ERROR, "invalid"),))
            self.stored.extend(ids)
            return []

    writer = PartWay()
    done, waits = run(handling(), writer, numbered("0", "1", "2", "3"))
    assert writer.requests == [["0", "1", "2", "3"], ["2", "3"]] and writer.stored == ["0", "2", "3"]
    assert (done.written, done.retried, len(waits)) == (3, 2, 1)
    assert [(e.index, e.error_type) for e in done.dead] == [(1, ErrorType.SINK_4XX_ERROR)]
