"""The shared error vocabulary: one flat ErrorType for classification, policy and metrics.

Per-message failures are data (`MessageError`), returned next to the rows that succeeded. Only
states the job cannot go on from are raised, as exceptions that carry their ErrorType. Exceptions keep
their constructor arguments in `args` so that they pickle across Spark's Python workers.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class ErrorType(str, enum.Enum):
    """Why one message did not reach its table (Firehose's names, plus the ones it lacks)."""

    DESERIALIZATION_ERROR = "DESERIALIZATION_ERROR"  # the bytes do not parse as the proto
    INVALID_MESSAGE_ERROR = "INVALID_MESSAGE_ERROR"  # parses, but breaks the schema's rules
    UNKNOWN_FIELDS_ERROR = "UNKNOWN_FIELDS_ERROR"  # fields the descriptor does not know
    SINK_4XX_ERROR = "SINK_4XX_ERROR"  # BigQuery rejected the row itself (invalid, out of range)
    SINK_5XX_ERROR = "SINK_5XX_ERROR"  # BigQuery failed or stopped the row (backend error)
    SINK_RETRYABLE_ERROR = "SINK_RETRYABLE_ERROR"  # quota, rate limit, timeout, connection
    SINK_UNKNOWN_ERROR = "SINK_UNKNOWN_ERROR"  # anything the classifier cannot name
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"  # one row over BigQuery's request size limit
    # No destination: a routing attribute is missing, or names no message class (and no fallback topic).
    ROUTING_ERROR = "ROUTING_ERROR"


@dataclass(frozen=True)
class MessageError:
    """One message that failed, identified by its Kafka coordinates."""

    error_type: ErrorType
    topic: str
    partition: int
    offset: int
    message: str

    def describe(self) -> str:
        return f"{self.error_type.value} at {self.topic}/{self.partition}@{self.offset}: {self.message}"


@dataclass(frozen=True)
class RowError:
    """Row `index` of the batch a step was given failed. Each step (decode, write) reports its failures
    by index into its own input; the batch core maps them to the record's index in the source batch,
    which identifies a record up to the policy (Kafka coordinates are looked up only for the report)."""

    index: int
    error_type: ErrorType
    message: str
    # What failed it, for the error output (seed 004's exception_class): the qualified class of the
    # exception that was raised, or the component that refused the row; empty: `cause_of` fills it in.
    exception: str = ""


# The cause a failure is reported with when its step did not name one (what the reference path raises
# for the same input, or the component that refuses such rows).
DEFAULT_CAUSES: dict[ErrorType, str] = {
    ErrorType.DESERIALIZATION_ERROR: "google.protobuf.message.DecodeError",
    ErrorType.INVALID_MESSAGE_ERROR: "ValueError",
    ErrorType.UNKNOWN_FIELDS_ERROR: "firehose_bq.UnknownFieldsError",
    ErrorType.SINK_4XX_ERROR: "google.cloud.bigquery.RowError",
    ErrorType.SINK_5XX_ERROR: "google.cloud.bigquery.RowError",
    ErrorType.SINK_RETRYABLE_ERROR: "google.cloud.bigquery.RowError",
    ErrorType.SINK_UNKNOWN_ERROR: "google.cloud.bigquery.RowError",
    ErrorType.PAYLOAD_TOO_LARGE: "firehose_bq.PayloadTooLargeError",
    ErrorType.ROUTING_ERROR: "firehose_bq.routing.NoRouteError",
}


def cause_of(failure: RowError) -> str:
    return failure.exception or DEFAULT_CAUSES[failure.error_type]


class FirehoseError(Exception):
    """Base of this package's exceptions."""


class ConfigError(FirehoseError):
    """Bad or missing settings; `problems` holds one line per variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        return "; ".join(self.problems)


class SchemaError(FirehoseError):
    """A descriptor cannot be loaded, found, or mapped to a BigQuery schema."""


class RegistryUnavailableError(SchemaError):
    """A schema registry did not answer (refused, timed out, HTTP 5xx or 429): worth another try."""


class SchemaEvolutionError(SchemaError):
    """The live table and the proto disagree in a way BigQuery cannot apply (type or mode change)."""


class SourceError(FirehoseError):
    """Kafka cannot be read as planned (topic missing, partition stalled, offsets gone)."""


class SourceUnavailableError(SourceError):
    """Kafka did not answer (broker down or unreachable, a request timed out): the planner tries again, for as
    long as a task waits for records (SOURCE_KAFKA_POLL_STALL_TIMEOUT_MS), before the job stops on it."""


class SinkError(FirehoseError):
    """A BigQuery call failed as a whole (not per row), after the client's own retries; classified.

    `invalid_request`: BigQuery refused the request itself as invalid (`classify.rejects_request`): not a
    table, stream or permission that is missing, so one bad row of it may be the cause, and the error
    policy may isolate that row (policy.py)."""

    def __init__(self, error_type: ErrorType, message: str, invalid_request: bool = False) -> None:
        super().__init__(error_type, message, invalid_request)
        self.error_type = error_type
        self.message = message
        self.invalid_request = invalid_request

    def __str__(self) -> str:
        return f"{self.error_type.value}: {self.message}"


class PartialWriteError(SinkError):
    """A write of several requests failed as a whole part-way: the rows at `unsent` (positions in what the
    writer was given) are not in the table, `failures` are the rows it had found bad by then, and every
    other row was written. A retry sends only `unsent` again (the Storage Write default stream has no
    insertIds to drop rows written twice)."""

    def __init__(self, error_type: ErrorType, message: str, unsent: tuple[int, ...],
                 failures: tuple[RowError, ...] = (), invalid_request: bool = False) -> None:
        super().__init__(error_type, message, invalid_request)
        self.args = (error_type, message, unsent, failures, invalid_request)  # all of them: Spark pickles exceptions
        self.unsent = unsent
        self.failures = failures


class TableChangedError(PartialWriteError):
    """A write found its table without columns that the writer was told it has: the table was changed under
    the job (dropped and created again with fewer columns) after the check the writer's columns came from. A
    routed task that trusted a worker's kept check checks the table again (which evolves it) and writes again
    (batch/core.py `_heals`); otherwise a stop, whose restart checks the table (not retried: the table does
    not change back by waiting)."""


class BatchFailedError(FirehoseError):
    """A micro-batch holds messages that could not be written; offsets are not committed."""

    def __init__(self, batch_id: int, errors: list[MessageError], total: int) -> None:
        super().__init__(batch_id, errors, total)
        self.batch_id = batch_id
        self.errors = errors
        self.total = total

    def __str__(self) -> str:
        shown = "\n  ".join(e.describe() for e in self.errors)
        more = f"\n  ... and {self.total - len(self.errors)} more" if self.total > len(self.errors) else ""
        return (
            f"batch {self.batch_id} stopped: {self.total} message(s) could not be written; the job stops "
            f"rather than drop them, and offsets were not committed.\n  {shown}{more}"
        )


class StackError(FirehoseError):
    """The local development stack could not be started, checked or stopped."""


class DeadLetterError(FirehoseError):
    """Dead letters could not be stored after every retry: the batch is not committed."""


class DeadLetterTooLargeError(DeadLetterError):
    """A dead letter the DLQ store refuses for its size: no retry can store it, only a larger limit or
    another store can."""


# py4j puts ": " before the JVM exception's line.
_PYTHON_ERROR_LINE = re.compile(r"^(?:: )?([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$")


def worker_error(exc: BaseException) -> str:
    """The last `SomeError: message` line of a Python worker's traceback inside a Spark error (or of the JVM's
    exception inside a Py4JJavaError): the reason, without pages of frames."""
    matches = [m for m in map(_PYTHON_ERROR_LINE.match, str(exc).splitlines()) if m]
    return f"{matches[-1].group(1)}: {matches[-1].group(2)}" if matches else _first_line(exc)


# The JVM's stack trace text (Utils.exceptionString): "Caused by: Class[: message]" starts each cause.
_CAUSED_BY = "Caused by: "
_JVM_FRAME = re.compile(r"^\s+at (?:[\w.$-]+/)?([\w.$]+)\.([\w$<>]+)\(")
# Where Spark throws a bare JVM exception because a Python process it talks to went away, and what that means.
_JVM_THROWERS = {
    "PythonStreamingSourceRunner": "Spark's Python process for the Kafka source (python_streaming_source_runner, "
                                   "a fork of the job's fork server) ended unexpectedly",
}


def query_error(exc: BaseException) -> str:
    """`worker_error` of a failed streaming query; where the query's error carries no message of its own (a
    JVM exception such as an EOFException, thrown when a Python process Spark talks to dies), the innermost
    JVM cause and where Spark threw it: "terminated with exception:" followed by nothing tells nobody why.
    Likewise where Spark met a Python process of known meaning going away with a message that names none
    (a SocketException's "Connection reset", depending on the moment of its death)."""
    reason = worker_error(exc)
    try:
        message = (exc.getMessageParameters() or {}).get("message")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a Spark error, or the JVM is gone: the reason as it is
        return reason
    if message is None:
        return reason
    cause = jvm_cause(_jvm_trace(exc))
    if cause is None or (message.strip() and not any(cause.endswith(meaning) for meaning in _JVM_THROWERS.values())):
        return reason
    # A message of its own ("Connection reset", where the process died mid-exchange) still names no process.
    return f"{reason} (cause: {cause})"


# How many causes deep a JVM exception is followed (Throwable.getCause ends a cycle only at itself).
_MAX_CAUSES = 32


def _jvm_trace(exc: BaseException) -> str:
    """The JVM stack trace of a pyspark error, as far as jvm_cause reads it. pyspark has no public accessor
    for it (str(exc) shows it only with spark.sql.pyspark.jvmStacktrace.enabled), but the error it raised
    from a failed JVM call has that call's py4j Py4JJavaError as its context, whose `java_exception` is the
    JVM's Throwable: its innermost cause, read through Java's public API. An error without it (one
    StreamingQuery.exception() built, or a JVM already gone) falls back to pyspark's own private copy."""
    throwable = getattr(exc.__context__, "java_exception", None)
    if throwable is not None:
        try:
            for _ in range(_MAX_CAUSES):
                cause = throwable.getCause()
                if cause is None:
                    break
                throwable = cause
            frames = "".join(f"\n\tat {frame.toString()}" for frame in throwable.getStackTrace())
            return f"{throwable.toString()}{frames}"
        except Exception:  # noqa: BLE001 - py4j's errors, the gateway gone: pyspark's copy below
            pass
    return str(getattr(exc, "_stackTrace", "") or "")  # CapturedException's (a private attribute)


def jvm_cause(stack_trace: str) -> str | None:
    """The innermost cause of a JVM stack trace as `Class: message`, or `Class in Thrower.method` (what that
    means, where it is known) when it has no message; None for an empty trace."""
    lines = stack_trace.splitlines()
    causes = [i for i, line in enumerate(lines) if line.startswith(_CAUSED_BY)]
    start = causes[-1] if causes else 0
    if start >= len(lines) or not lines[start].strip():
        return None
    header = lines[start].removeprefix(_CAUSED_BY).strip()
    name, _, message = header.partition(": ")
    frames = [m for m in map(_JVM_FRAME.match, lines[start + 1:]) if m]
    # The first frame outside the JDK: where Spark (or a library) met the failure.
    thrower = next((m for m in frames if not m.group(1).startswith(("java.", "javax.", "jdk.", "sun."))), None)
    where = f"{thrower.group(1).rpartition('.')[2]}.{thrower.group(2)}" if thrower is not None else ""
    meaning = _JVM_THROWERS.get(where.partition(".")[0])
    if message.strip():
        return f"{header} in {where}: {meaning}" if meaning else header
    if thrower is None:
        return name
    return f"{name} in {where}" + (f": {meaning}" if meaning else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
