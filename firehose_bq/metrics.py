"""Counters of what happened to messages: per task, merged per micro-batch, summed per run."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from firehose_bq.errors import ErrorType, MessageError

# Failed messages kept per batch for the error report; counts are always complete.
SAMPLE_ERRORS = 5


@dataclass
class BatchStats:
    messages: int = 0
    rows_written: int = 0
    # messages written carrying fields their descriptors lack (dropped, or in additional_properties)
    unknown_fields: int = 0
    # Every message that was not written, by its (final) error type; each is also in `outcomes`.
    errors_by_type: Counter[str] = field(default_factory=Counter)
    # Per policy outcome: `dlq`, `failed`, and `retried` (sent again at least once, whatever came after).
    outcomes: Counter[str] = field(default_factory=Counter)
    sample_errors: list[MessageError] = field(default_factory=list)  # of the failed messages
    # Per destination table (`dataset.table`): messages, written, retried, dlq, failed.
    tables: dict[str, Counter[str]] = field(default_factory=dict)
    # Not-written messages by `ERROR_TYPE:outcome` (dlq or failed).
    error_outcomes: Counter[str] = field(default_factory=Counter)
    # Seconds of each BigQuery write call, per write path (for the latency histogram).
    write_seconds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """Messages that stop the job: in neither the table nor the DLQ."""
        return self.outcomes["failed"]

    @property
    def dead_lettered(self) -> int:
        return self.outcomes["dlq"]

    @property
    def retried(self) -> int:
        return self.outcomes["retried"]

    @property
    def fallback(self) -> int:
        """Unrouted messages sent to the fallback output."""
        return self.outcomes["fallback"]

    def add_table(self, table: str, **counts: int) -> None:
        self.tables.setdefault(table, Counter()).update(counts)

    def add_errors(self, errors: list[MessageError]) -> None:
        """Count `errors` by type (their outcome is counted with `add_outcome`)."""
        self.errors_by_type.update(e.error_type.value for e in errors)

    def add_outcome(self, outcome: str, errors: list[MessageError] | int) -> None:
        if isinstance(errors, int):
            self.outcomes[outcome] += errors
            return
        self.outcomes[outcome] += len(errors)
        self.error_outcomes.update(f"{e.error_type.value}:{outcome}" for e in errors)
        if outcome == "failed":
            self._keep_sample(errors)

    def not_stored(self, outcome: str, errors: list[MessageError], tables: list[str]) -> None:
        """Messages counted as sent to `outcome` (`dlq`, or the route fallback's `fallback`), one per error
        with its table, whose write there failed: the batch stops on it, so they count as failed, not as in
        the DLQ (a run summary, a batch line and the DLQ counter must not claim letters nothing stored)."""
        self.outcomes[outcome] -= len(errors)
        self.outcomes["failed"] += len(errors)
        for error, table in zip(errors, tables, strict=True):
            kind = error.error_type.value
            if self.error_outcomes[f"{kind}:{outcome}"] > 0:
                self.error_outcomes[f"{kind}:{outcome}"] -= 1
            self.error_outcomes[f"{kind}:failed"] += 1
            if (counts := self.tables.get(table)) is not None and counts[outcome] > 0:
                counts[outcome] -= 1
                counts["failed"] += 1
        self._keep_sample(errors)

    @property
    def errors_by_outcome(self) -> dict[tuple[str, str], int]:
        return {tuple(key.split(":", 1)): n for key, n in self.error_outcomes.items()}  # type: ignore[misc]

    def add_write_seconds(self, path: str, seconds: float) -> None:
        self.write_seconds.setdefault(path, []).append(seconds)

    def merge(self, other: BatchStats) -> None:
        self.messages += other.messages
        self.rows_written += other.rows_written
        self.unknown_fields += other.unknown_fields
        self.errors_by_type.update(other.errors_by_type)
        self.outcomes.update(other.outcomes)
        self._keep_sample(other.sample_errors)
        for table, counts in other.tables.items():
            self.add_table(table, **counts)
        self.error_outcomes.update(other.error_outcomes)
        for path, samples in other.write_seconds.items():
            self.write_seconds.setdefault(path, []).extend(samples)

    def _keep_sample(self, errors: list[MessageError]) -> None:
        room = SAMPLE_ERRORS - len(self.sample_errors)
        if room > 0:
            self.sample_errors.extend(errors[:room])

    def to_json(self) -> str:
        return json.dumps(
            {
                "messages": self.messages,
                "rows_written": self.rows_written,
                "unknown_fields": self.unknown_fields,
                "errors_by_type": dict(self.errors_by_type),
                "outcomes": dict(self.outcomes),
                "sample_errors": [
                    [e.error_type.value, e.topic, e.partition, e.offset, e.message] for e in self.sample_errors
                ],
                "tables": {t: dict(c) for t, c in self.tables.items()},
                "error_outcomes": dict(self.error_outcomes),
                "write_seconds": self.write_seconds,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BatchStats:
        data = json.loads(text)
        return cls(
            messages=data["messages"],
            rows_written=data["rows_written"],
            unknown_fields=data["unknown_fields"],
            errors_by_type=Counter(data["errors_by_type"]),
            outcomes=Counter(data.get("outcomes", {})),
            sample_errors=[MessageError(ErrorType(t), topic, p, o, m) for t, topic, p, o, m in data["sample_errors"]],
            tables={t: Counter(c) for t, c in data.get("tables", {}).items()},
            error_outcomes=Counter(data.get("error_outcomes", {})),
            write_seconds={p: list(v) for p, v in data.get("write_seconds", {}).items()},
        )


@dataclass
class RunSummary:
    """Totals of one `firehose-bq run`, printed at its end."""

    batches: int = 0
    seconds: float = 0.0
    totals: BatchStats = field(default_factory=BatchStats)
    failure: str | None = None
    largest_batch: int = 0  # messages in the biggest micro-batch: SPARK_MAX_OFFSETS_PER_TRIGGER at work
    lag: int | None = None  # records the last batch left on the broker (None: not reported yet)

    def render(self) -> str:
        t = self.totals
        rate = t.messages / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"micro-batches      {self.batches}",
            f"messages read      {t.messages}",
            f"rows written       {t.rows_written}",
            f"retried            {t.retried}",
            f"dead-lettered      {t.dead_lettered}",
            *([f"sent to fallback   {t.fallback}"] if t.fallback else []),
            f"messages failed    {t.failed}",
        ]
        if t.unknown_fields:  # written, not an error: a line of its own, not under "errors by type"
            lines.append(f"unknown fields     {t.unknown_fields} (written; the fields dropped or in additional_properties)")
        lines.append(f"errors by type     {sum(t.errors_by_type.values())}")
        for error_type in ErrorType:
            lines.append(f"  {error_type.value:<22} {t.errors_by_type.get(error_type.value, 0)}")
        lines.append(f"elapsed            {self.seconds:.1f} s ({rate:,.0f} messages/s)")
        if len(t.tables) > 1:
            lines.append(f"tables             {len(t.tables)}")
            lines += [f"  {name:<40} {c['written']} written, {c['dlq']} dead-lettered, {c['failed']} failed"
                      for name, c in sorted(t.tables.items())[:20]]
        if self.batches:
            lines.append(f"largest batch      {self.largest_batch} messages")
        if self.lag is not None:
            lines.append(f"lag at the end     {self.lag} records")
        if self.failure:
            lines.append(f"stopped because    {self.failure}")
        return "\n".join(lines)
