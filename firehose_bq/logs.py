"""Logging for every firehose-bq process: text lines (the default) or JSON lines, with secrets masked.

`LOG_FORMAT=json` writes one JSON object per line to stderr, with the same content as a text line (time,
level, logger, message, the traceback when there is one) plus the context fields known where the line
was logged: `batch_id`, `topic`, `partition`, `table`, `error_type`. A line gets them from
`extra={"batch_id": 3}` on the call, from an enclosing `with log_context(batch_id=3):` (same thread), or
from `add_fields(...)` for the whole process (the job's table). Every line, in either format, passes
through a `Redactor`: URL credentials and the values of secret settings never reach the output.

Spark's Python workers are processes of their own, where nothing else configures logging: the driver
ships `for_workers(batch_id=...)` with each task, and the task entry applies it (`apply_in_worker`), so
lines logged in tasks (retries, dead letters) have the driver's format, masking and context.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TextIO

from firehose_bq.errors import ConfigError
from firehose_bq.redact import Redactor, urls_in
from firehose_bq.settings import load_section, setting

TEXT, JSON = "text", "json"
FORMAT_ENV = "LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("batch_id", "topic", "partition", "table", "error_type")
# Third-party loggers whose INFO lines are per-connection noise.
CHATTY = ("kafka", "py4j")

_context: ContextVar[Mapping[str, Any]] = ContextVar("firehose_bq_log_context", default=MappingProxyType({}))

# What a command says last on stderr (`config error: ...`, `error: ...`).
Say = Callable[[str], None]


@dataclass(frozen=True)
class LogConfig:
    format: str = setting(
        FORMAT_ENV,
        "`text`: one readable line per event; `json`: one JSON object per line with the same content (time, "
        "level, logger, message, exception) plus `batch_id`, `topic`, `partition`, `table` and `error_type` "
        "where known. Secrets (registry headers, passwords, URL credentials) are masked in both.",
        TEXT,
        choices=(TEXT, JSON),
    )


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add context fields to every line logged in this block (in this thread / asyncio task)."""
    token = _context.set(MappingProxyType({**_context.get(), **fields}))
    try:
        yield
    finally:
        _context.reset(token)


def configure(level: str, environ: Mapping[str, str], secret_settings: tuple[str, ...] = ()) -> Say:
    """Send all logging to stderr in LOG_FORMAT, masking the values of `secret_settings`; return `say`.

    Safe to call again (e.g. once the env files are read): it replaces its own handler, nothing else's.
    A bad LOG_FORMAT leaves text logging on and raises ConfigError.
    """
    problems: list[str] = []
    cfg = load_section(LogConfig, environ, problems) or LogConfig()
    redactor = Redactor.of(environ.get(name, "") for name in secret_settings)
    _install(cfg.format, redactor, level)
    if problems:
        raise ConfigError(problems)
    if cfg.format == JSON:
        final = logging.getLogger("firehose_bq")
        return lambda line: final.error("%s", line)
    return lambda line: print(redactor.text(line), file=sys.stderr)


@dataclass(frozen=True)
class WorkerLogging:
    """The driver's logging, for a Spark task to log the same way; small and picklable (shipped with
    each task). `fields`: the context of every line the task logs (the job's table, the batch id)."""

    format: str
    level: int
    redactor: Redactor = field(repr=False)  # holds the secrets it masks: never printed
    fields: Mapping[str, Any] = field(default_factory=dict)


def for_workers(**fields: Any) -> WorkerLogging | None:
    """How this process logs (as `configure` set it up), plus `fields`; None when it was never configured
    (a library caller's own logging, which tasks then leave alone too)."""
    configured = _configured()
    if configured is None:
        return None
    handler, formatter = configured
    process = next((f.fields for f in handler.filters if isinstance(f, _Fields)), {})
    return WorkerLogging(JSON if isinstance(formatter, JsonFormatter) else TEXT,
                         logging.getLogger().level, formatter.redactor, {**process, **fields})


def masked(text: str) -> str:
    """`text` for stdout (a run's summary, whose `stopped because` line is an error's message): masked as a
    log line is; before `configure`, URL credentials only."""
    configured = _configured()
    return configured[1].redactor.text(text) if configured is not None else urls_in(text)


def _configured() -> tuple[logging.Handler, TextFormatter | JsonFormatter] | None:
    """The handler `configure` installed and its formatter; None if never configured (a library caller's
    own logging)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler) and isinstance(handler.formatter, TextFormatter | JsonFormatter):
            return handler, handler.formatter
    return None


def logs_json() -> bool:
    """Whether `configure` set this process up to log JSON lines (what the Spark driver's JVM should do too)."""
    configured = _configured()
    return configured is not None and isinstance(configured[1], JsonFormatter)


def apply_in_worker(settings: WorkerLogging | None) -> None:
    """Log like the driver in this process (a Spark Python worker), whose `fields` a `log_context` of
    the task adds; safe to call for every task (Spark reuses its workers)."""
    if settings is not None:
        _install(settings.format, settings.redactor, settings.level)


def _install(format_: str, redactor: Redactor, level: int | str) -> None:
    """Our one handler on the root logger (replacing an earlier one of ours, nothing else's)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter(redactor) if format_ == JSON else TextFormatter(redactor))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Python's warnings (google-auth's, pyarrow's) would go to stderr as two raw lines each: through
    # logging they are lines in LOG_FORMAT, masked like the rest.
    logging.captureWarnings(True)
    for chatty in CHATTY:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))


def say_unconfigured(logger: str, level: int, message: str, environ: Mapping[str, str],
                     exc_info: bool = False) -> None:
    """Write a line to stderr in the job's LOG_FORMAT (as `environ` has it) from a process that must leave
    logging as it is: the fork server (its forks are Spark's Python processes, which start with logging
    untouched) and the workers' daemon. A JSON record as `configure` would log it, else the message as it
    is (then the current exception's traceback when `exc_info`); URL credentials masked in both. A line
    that cannot be written (the reader of stderr went away) is dropped, as logging drops it: the process
    goes on (a server that ended would take every process it forked with it)."""
    cfg = load_section(LogConfig, environ, []) or LogConfig()  # a bad LOG_FORMAT stopped the job already
    record = logging.LogRecord(logger, level, __file__, 0, "%s", (message,), sys.exc_info() if exc_info else None)
    redactor = Redactor()
    if cfg.format == JSON:
        line = JsonFormatter(redactor).format(record)
    else:
        line = redactor.text(logging.Formatter("%(message)s").format(record))
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def say_plain(line: str) -> None:
    """`say` before logging is configured: the line as it is, URL credentials masked."""
    print(urls_in(line), file=sys.stderr)


def add_fields(**fields: Any) -> None:
    """Context fields for every line this process logs from now on (e.g. the job's destination table)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler):
            earlier = [f for f in handler.filters if isinstance(f, _Fields)]
            merged: dict[str, Any] = {}
            for old in earlier:
                merged.update(old.fields)
                handler.removeFilter(old)
            handler.addFilter(_Fields(MappingProxyType({**merged, **fields})))


class TextFormatter(logging.Formatter):
    """Today's text line, masked."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__(TEXT_FORMAT)
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.text(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, context fields, exception."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": self.redactor.text(record.getMessage()),
        }
        fields = {**getattr(record, "_firehose_fields", {}), **_context.get()}
        fields.update({name: getattr(record, name) for name in CONTEXT_FIELDS if hasattr(record, name)})
        for name in CONTEXT_FIELDS:
            if fields.get(name) is not None:
                entry[name] = _plain(fields[name], self.redactor)
        if record.exc_info:
            entry["exception"] = self.redactor.text(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = self.redactor.text(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (as logging's own last-resort handler does), so a
    handler set up by an earlier command in the same process (tests) never writes to a closed stream."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


class _Fields(logging.Filter):
    """Adds process-wide context fields to each record (without overriding a record's own)."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        record._firehose_fields = self.fields
        return True


def _plain(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, bool | int | float):
        return value
    return redactor.text(str(getattr(value, "value", value)))  # an ErrorType shows as its name
