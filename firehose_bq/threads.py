"""Calls run on a few threads, each in a copy of the caller's context: their log lines keep the caller's fields
(batch, topic, table: logs.log_context, a ContextVar, which a new thread would start without)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_threads(calls: Sequence[Callable[[], T]], most: int, name: str) -> list[Future[T]]:
    """Every call, on up to `most` threads at once (named `name`-N), in order of submission; their futures, once
    all are done."""
    if not calls:
        return []
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=max(1, min(most, len(calls))), thread_name_prefix=name) as pool:
        return [pool.submit(context.copy().run, call) for call in calls]
