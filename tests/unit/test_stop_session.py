"""stop_session: the session stops after the job that starts the workers, which is cancelled only when it
does not end by itself."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from firehose_bq.spark import START_WORKERS_GROUP, stop_session


@dataclass
class FakeSession:
    """What stop_session uses of a SparkSession; `calls` in order, `ends` is the workers' job ending."""

    calls: list[str] = field(default_factory=list)
    ends: threading.Event = field(default_factory=threading.Event)

    @property
    def sparkContext(self) -> FakeSession:  # noqa: N802 - PySpark's name
        return self

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802 - PySpark's name
        self.calls.append(f"cancel {group}")
        self.ends.set()

    def stop(self) -> None:
        self.calls.append("stop")


def workers_job(session: FakeSession, seconds: float | None) -> threading.Thread:
    """A stand-in for start_workers' thread: it ends after `seconds`, or (None) only when cancelled."""

    def run() -> None:
        session.ends.wait(seconds)
        session.calls.append("workers' job over")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_session_stops_after_the_workers_job_ends_by_itself() -> None:
    session = FakeSession()
    stop_session(session, workers_job(session, 0.2), wait_s=10)  # type: ignore[arg-type]
    assert session.calls == ["workers' job over", "stop"]


def test_a_workers_job_that_does_not_end_is_cancelled_before_the_session_stops() -> None:
    session = FakeSession()
    stop_session(session, workers_job(session, None), wait_s=0.2)  # type: ignore[arg-type]
    assert session.calls == [f"cancel {START_WORKERS_GROUP}", "workers' job over", "stop"]


def test_without_a_workers_job_the_session_just_stops() -> None:
    session = FakeSession()
    stop_session(session)  # type: ignore[arg-type]
    assert session.calls == ["stop"]
