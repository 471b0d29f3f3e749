"""A clock for retry tests: time passes only when the code under test sleeps (or a fake advances it)."""

from __future__ import annotations


class Clock:
    """Call it for the time; pass `sleep` where the code sleeps: the wait is recorded, not slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
