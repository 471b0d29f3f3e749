"""Retrying, written once: attempts with exponential backoff inside a time budget, on tenacity.

Every retry of the sink goes through `retry_call`, and each kind of failure is retried by exactly one
layer, so that a dead service holds the job for a sum of waits and timeouts that can be stated, not a
product of nested retry loops:

- a BigQuery write in a task (insertAll, AppendRows, the writer's read of the table) and the rows that
  fail in it: the error policy (policy.py), RETRY_* within SINK_BIGQUERY_RETRY_DEADLINE_MS; the driver's
  load job (bigquery/file_loads.py) and MERGE (upsert/flush.py) the same way;
- any other single BigQuery call (creating and evolving tables): the BigQuery client's own retry, for
  SINK_BIGQUERY_RETRY_DEADLINE_MS (bigquery/client.call_options);
- a dead-letter write: dlq/writers.dead_letter, DLQ_RETRY_* within DLQ_RETRY_DEADLINE_MS;
- a schema registry fetch: registry/cache.DescriptorCache, patiently in the background, once and soon
  when someone waits.
- the Kafka source's planner asking a broker that does not answer for end offsets: source/kafka_source.
  `_end_offsets`, within SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS, as long as a task's reads wait for records.

Inside a layer nothing retries again (the BigQuery client gets `retry=None`, bigquery/client.
attempt_options; GCS calls `retry=None`; the Kafka producer's retries end with its delivery timeout),
and every request has a timeout. So a call retried here takes at most `Backoff.bound_s(the longest
attempt)`: README, "How long an outage can hold the job".

tenacity rather than google.api_core's Retry: the settings users have count attempts
(RETRY_MAX_ATTEMPTS, DLQ_RETRY_MAX_ATTEMPTS, SCHEMA_REGISTRY_STENCIL_FETCH_RETRIES), which api_core's
Retry cannot; its waits are jittered between 0 and the nominal wait, which would change what
RETRY_EXPONENTIAL_BACKOFF_INITIAL_MS means; and its sleep cannot be cut short (a stopping descriptor
cache) or faked (unit tests).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How a caller retries: at most `attempts` tries (the first included), waiting `first_s` before the
    first retry and `rate` times longer before each further one, never longer than `max_s`; no retry
    starts later than `budget_s` after the first try started (the wait before the last one is cut to fit)."""

    attempts: int
    first_s: float
    rate: float = 2.0
    max_s: float = math.inf
    budget_s: float = math.inf

    def wait_s(self, retry: int) -> float:
        """The nominal wait before retry number `retry` (1 = the first), before the budget cuts it."""
        return min(self.max_s, self.first_s * self.rate ** (retry - 1))

    def bound_s(self, attempt_s: float) -> float:
        """The longest a call can take when each attempt ends (fails) within `attempt_s`: the whole
        schedule, or the budget plus one last attempt begun just before it ended, whichever is shorter."""
        schedule = self.attempts * attempt_s + sum(self.wait_s(r) for r in range(1, self.attempts))
        return min(schedule, self.budget_s + attempt_s)


# What a caller raises instead of the last exception once retries ran out: (exception, attempts, seconds).
GiveUp = Callable[[BaseException, int, float], BaseException]


def retry_call(call: Callable[[], T], backoff: Backoff, *, retry_on: Callable[[BaseException], bool], what: str,
               give_up: GiveUp | None = None, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> T:
    """`call()`, tried again per `backoff` while it raises an exception that `retry_on` accepts; the
    last exception (or what `give_up` makes of it) is raised when attempts or budget run out, any other
    one at once.

    `what` names the call in the warning logged before each retry; an exception carrying an `error_type`
    (SinkError) adds it to that line's context. `sleep` may raise to cut the retries short."""
    started = clock()

    def spent(_state: tenacity.RetryCallState) -> float:
        return clock() - started

    def stop(state: tenacity.RetryCallState) -> bool:
        return state.attempt_number >= backoff.attempts or spent(state) >= backoff.budget_s

    def wait(state: tenacity.RetryCallState) -> float:
        return max(0.0, min(backoff.wait_s(state.attempt_number), backoff.budget_s - spent(state)))

    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        failure = state.outcome.exception()
        error_type = getattr(failure, "error_type", None)
        log.warning("%s: attempt %d of %d failed (%s); retrying in %.2f s", what, state.attempt_number,
                    backoff.attempts, failure, state.upcoming_sleep,
                    extra={"error_type": error_type} if error_type is not None else None)

    def exhausted(state: tenacity.RetryCallState) -> T:
        # The last exception itself (or the caller's word for it), not tenacity's RetryError around it.
        assert state.outcome is not None
        failure = state.outcome.exception()
        if failure is not None and give_up is not None:
            reason = give_up(failure, state.attempt_number, spent(state))
            if reason is not failure:
                raise reason from failure
        return state.outcome.result()  # type: ignore[no-any-return]

    retrying = tenacity.Retrying(stop=stop, wait=wait, retry=tenacity.retry_if_exception(retry_on), sleep=sleep,
                                 before_sleep=before_sleep, retry_error_callback=exhausted)
    return retrying(call)
