"""The one retry helper: attempts, exponential waits, the time budget, and the bound it gives."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from firehose_bq.errors import ErrorType, SinkError
from firehose_bq.retrying import Backoff, retry_call
from tests.unit.clock import Clock


class Failing:
    """Raises `errors` in turn (the last one again and again), each after `seconds`; then returns "ok"."""

    def __init__(self, clock: Clock, *errors: BaseException, times: int = 10**6, seconds: float = 0.0) -> None:
        self.clock, self.errors, self.times, self.seconds = clock, list(errors), times, seconds
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        self.clock.now += self.seconds
        if self.calls > self.times:
            return "ok"
        raise self.errors[min(self.calls, len(self.errors)) - 1]


def call(backoff: Backoff, target: Failing, clock: Clock) -> str:
    return retry_call(target, backoff, retry_on=lambda e: isinstance(e, OSError), what="fetch", sleep=clock.sleep,
                      clock=clock)


def test_waits_grow_by_the_rate_up_to_the_cap_and_a_success_ends_them() -> None:
    clock = Clock()
    target = Failing(clock, OSError("refused"), times=4)
    assert call(Backoff(attempts=10, first_s=0.5, rate=3, max_s=5), target, clock) == "ok"
    assert clock.waits == [0.5, 1.5, 4.5, 5] and target.calls == 5


def test_when_attempts_run_out_the_last_error_itself_is_raised() -> None:
    clock = Clock()
    target = Failing(clock, OSError("first"), OSError("last"))
    with pytest.raises(OSError, match="last"):
        call(Backoff(attempts=3, first_s=1), target, clock)
    assert target.calls == 3 and clock.waits == [1, 2]


def test_an_error_not_retried_is_raised_at_once() -> None:
    clock = Clock()
    target = Failing(clock, ValueError("bad answer"))
    with pytest.raises(ValueError):
        call(Backoff(attempts=5, first_s=1), target, clock)
    assert target.calls == 1 and not clock.waits


def test_no_retry_starts_after_the_budget_and_the_last_wait_is_cut_to_fit() -> None:
    clock = Clock()
    target = Failing(clock, OSError("refused"))
    with pytest.raises(OSError):
        call(Backoff(attempts=100, first_s=1, budget_s=10), target, clock)
    assert clock.waits == [1, 2, 4, 3] and clock.now == 10 and target.calls == 5


@pytest.mark.parametrize("attempt_s", [0.0, 0.3, 2.9, 3.0, 7.5, 20.0])
def test_a_call_never_takes_longer_than_the_bound(attempt_s: float) -> None:
    for backoff in (Backoff(attempts=6, first_s=0.5, max_s=4, budget_s=10), Backoff(attempts=3, first_s=1)):
        clock = Clock()
        with pytest.raises(OSError):
            call(backoff, Failing(clock, OSError("timed out"), seconds=attempt_s), clock)
        assert clock.now <= backoff.bound_s(attempt_s) + 1e-9


def test_the_bound_is_the_schedule_or_the_budget_plus_one_attempt() -> None:
    assert Backoff(attempts=3, first_s=1).bound_s(10) == 3 * 10 + 1 + 2
    assert Backoff(attempts=3, first_s=1, budget_s=5).bound_s(10) == 15
    # RETRY_* and SINK_BIGQUERY_*'s defaults: 2 minutes of retries and one request timeout.
    assert Backoff(attempts=15, first_s=0.01, max_s=60, budget_s=120).bound_s(60) == 180


def test_a_sleep_that_raises_cuts_the_retries_short() -> None:
    clock = Clock()

    def stopped(seconds: float) -> None:
        raise InterruptedError("stopping")

    with pytest.raises(InterruptedError):
        retry_call(Failing(clock, OSError("refused")), Backoff(attempts=5, first_s=60), what="fetch",
                   retry_on=lambda e: isinstance(e, OSError), sleep=stopped, clock=clock)


def test_each_retry_is_logged_with_the_error_type_of_the_failure(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    target = Failing(clock, SinkError(ErrorType.SINK_5XX_ERROR, "backendError"), times=1)
    with caplog.at_level(logging.WARNING, logger="firehose_bq.retrying"):
        retry_call(target, Backoff(attempts=3, first_s=0.25), retry_on=lambda e: isinstance(e, SinkError),
                   what="write", sleep=clock.sleep, clock=clock)
    [record] = caplog.records
    assert record.getMessage() == ("write: attempt 1 of 3 failed (SINK_5XX_ERROR: backendError); retrying in "
                                   "0.25 s")
    assert record.error_type is ErrorType.SINK_5XX_ERROR  # type: ignore[attr-defined]


def test_give_up_names_the_reason_raised_once_retries_ran_out() -> None:
    clock = Clock()

    def reason(error: BaseException, attempts: int, seconds: float) -> BaseException:
        return RuntimeError(f"{error} (gave up after {attempts} attempts in {seconds:.0f} s)")

    with pytest.raises(RuntimeError, match=r"refused \(gave up after 3 attempts in 3 s\)") as failed:
        retry_call(Failing(clock, OSError("refused")), Backoff(attempts=3, first_s=1), what="fetch", give_up=reason,
                   retry_on=lambda e: isinstance(e, OSError), sleep=clock.sleep, clock=clock)
    assert isinstance(failed.value.__cause__, OSError)


def test_the_readme_states_the_bounds_the_default_settings_give() -> None:
    from firehose_bq.config import BigQueryConfig
    from firehose_bq.dlq import writers
    from firehose_bq.dlq.config import DlqConfig
    from firehose_bq.policy import ErrorHandling
    from firehose_bq.registry.config import RegistryConfig

    request_s = next(f.default for f in dataclasses.fields(BigQueryConfig) if f.name == "client_timeout_ms") / 1000
    bigquery = ErrorHandling().write_backoff().bound_s(request_s)
    dlq = DlqConfig().backoff().bound_s(writers.CONNECT_TIMEOUT_S + writers.SEND_TIMEOUT_S)
    registry = RegistryConfig().quick_backoff().bound_s(RegistryConfig().fetch_timeout_ms / 1000)
    assert (bigquery, dlq, registry) == (180, 160, 21)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### How long an outage can hold the job")[1].split("\n## ")[0]
    assert f"**{bigquery / 60:.0f} min** per task" in section
    assert f"**{dlq:.0f} s** per task" in section and f"**{registry:.0f} s** at start" in section
