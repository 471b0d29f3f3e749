"""Calls run on a few threads, each in a copy of the caller's context: their log lines keep the caller's fields
(batch, topic, table: logs.log_context, a ContextVar, which a new thread would start without)."""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """A call of `until_failure` not started, or cut short by itself, because another failed for good."""


def in_threads(calls: Sequence[Callable[[], T]], most: int, name: str) -> list[Future[T]]:
    """Every call, on up to `most` threads at once (named `name`-N), in order of submission; their futures, once
    all are done."""
    if not calls:
        return []
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=max(1, min(most, len(calls))), thread_name_prefix=name) as pool:
        return [pool.submit(context.copy().run, call) for call in calls]


def until_failure(calls: Sequence[Callable[[threading.Event], T]], most: int, name: str,
                  stops: Callable[[int, BaseException], bool]) -> list[Future[T]]:
    """Every call, as `in_threads` runs them, until one fails for good: `stops(i, error)` says whether call i's
    error is such a failure. Each call gets the event that such a failure sets, to stop waiting by (raising
    Stopped); the calls not started by then raise Stopped instead of running. Their futures, once all are done.
    One call, or `most` 1: one after another on the caller's thread."""
    stop = threading.Event()

    def guarded(i: int, call: Callable[[threading.Event], T]) -> T:
        if stop.is_set():
            raise Stopped()
        try:
            return call(stop)
        except BaseException as exc:
            if stops(i, exc):
                stop.set()
            raise

    wrapped = [functools.partial(guarded, i, call) for i, call in enumerate(calls)]
    if most < 2 or len(wrapped) < 2:
        return [_run_here(call) for call in wrapped]
    return in_threads(wrapped, most, name)


def _run_here(call: Callable[[], T]) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(call())
    except Exception as exc:  # noqa: BLE001 - kept in the future, as a thread's would be
        future.set_exception(exc)
    return future
