"""threads.until_failure: the one way the routed flush and the insertAll writer run calls until one fails for good."""

from __future__ import annotations

import threading

import pytest

from firehose_bq.threads import Stopped, until_failure


@pytest.mark.parametrize("most", [1, 2])
def test_a_failure_for_good_stops_the_calls_not_started(most: int) -> None:
    ran: list[int] = []

    def call(i: int, stop: threading.Event) -> int:
        ran.append(i)
        if i == 1:
            raise ValueError("for good")
        if most > 1:
            assert stop.wait(10)  # on 2 threads, 0 and 1 run together: 0 ends only after 1 has failed
        return i

    calls = [lambda stop, i=i: call(i, stop) for i in range(4)]
    futures = until_failure(calls, most, "t", stops=lambda i, error: isinstance(error, ValueError))
    assert futures[0].result() == 0 and isinstance(futures[1].exception(), ValueError)
    assert all(isinstance(f.exception(), Stopped) for f in futures[2:]) and sorted(ran) == [0, 1]


def test_failures_not_for_good_let_the_others_run_and_a_running_call_sees_the_stop() -> None:
    def passing(stop: threading.Event) -> str:
        raise KeyError("not for good")

    def waiting(stop: threading.Event) -> str:
        return "stopped" if stop.wait(10) else "waited out"

    def failing(stop: threading.Event) -> str:
        raise ValueError("for good")

    futures = until_failure([passing, waiting, failing], 3, "t", stops=lambda i, error: i == 2)
    assert isinstance(futures[0].exception(), KeyError) and isinstance(futures[2].exception(), ValueError)
    assert futures[1].result() == "stopped"


def test_no_calls_no_futures() -> None:
    assert until_failure([], 4, "t", stops=lambda i, error: True) == []
