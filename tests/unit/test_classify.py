"""BigQuery failures → ErrorType, from the shapes BigQuery really returns."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions

from firehose_bq.bigquery.classify import (
    table_missing,
    classify_exception,
    classify_grpc_code,
    classify_storage_row_error,
    classify_row_errors,
    describe_row_errors,
    is_only_stopped,
    rejects_request,
)
from firehose_bq.errors import ErrorType

# insertErrors entries as BigQuery's tabledata.insertAll returns them.
INVALID = [{"reason": "invalid", "location": "amount", "debugInfo": "",
            "message": "Cannot convert value to floating point (bad value): abc"}]
OUT_OF_BOUNDS = [{"reason": "invalid", "location": "created_at", "debugInfo": "",
                  "message": "Value 1999-01-01 for field created_at is outside the allowed bounds. You can only "
                             "stream to date range within 1825 days in the past and 366 days in the future."}]
NO_SUCH_FIELD = [{"reason": "invalid", "location": "extra", "debugInfo": "", "message": "no such field: extra."}]
STOPPED = [{"reason": "stopped", "location": "", "debugInfo": "", "message": ""}]


@pytest.mark.parametrize(
    ("errors", "expected"),
    [
        (INVALID, ErrorType.SINK_4XX_ERROR),
        (OUT_OF_BOUNDS, ErrorType.SINK_4XX_ERROR),
        (NO_SUCH_FIELD, ErrorType.SINK_4XX_ERROR),
        (STOPPED, ErrorType.SINK_5XX_ERROR),
        ([{"reason": "backendError", "message": "x"}], ErrorType.SINK_5XX_ERROR),
        ([{"reason": "timeout"}], ErrorType.SINK_RETRYABLE_ERROR),
        ([{"reason": "somethingNew"}], ErrorType.SINK_UNKNOWN_ERROR),
        ([], ErrorType.SINK_UNKNOWN_ERROR),
        (STOPPED + INVALID, ErrorType.SINK_4XX_ERROR),  # invalid wins over stopped
    ],
)
def test_row_errors(errors: list[dict], expected: ErrorType) -> None:
    assert classify_row_errors(errors) is expected


def test_only_stopped_rows_are_resendable() -> None:
    assert is_only_stopped(STOPPED)
    assert not is_only_stopped(STOPPED + INVALID)
    assert not is_only_stopped([])


def test_description_names_reason_and_location() -> None:
    assert describe_row_errors(INVALID) == ("invalid at amount: Cannot convert value to floating point "
                                            "(bad value): abc")
    assert describe_row_errors(STOPPED) == "stopped"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (exceptions.BadRequest("bad", errors=[{"reason": "invalid"}]), ErrorType.SINK_4XX_ERROR),
        (exceptions.NotFound("no table"), ErrorType.SINK_4XX_ERROR),
        (exceptions.Forbidden("q", errors=[{"reason": "quotaExceeded"}]), ErrorType.SINK_RETRYABLE_ERROR),
        (exceptions.Forbidden("r", errors=[{"reason": "rateLimitExceeded"}]), ErrorType.SINK_RETRYABLE_ERROR),
        (exceptions.Forbidden("denied", errors=[{"reason": "accessDenied"}]), ErrorType.SINK_4XX_ERROR),
        (exceptions.TooManyRequests("slow down"), ErrorType.SINK_RETRYABLE_ERROR),
        (exceptions.InternalServerError("oops"), ErrorType.SINK_5XX_ERROR),
        (exceptions.ServiceUnavailable("down"), ErrorType.SINK_5XX_ERROR),
        (exceptions.RetryError("deadline", cause=None), ErrorType.SINK_RETRYABLE_ERROR),
        (requests.exceptions.ConnectionError("refused"), ErrorType.SINK_RETRYABLE_ERROR),
        (requests.exceptions.ReadTimeout("slow"), ErrorType.SINK_RETRYABLE_ERROR),
        (ValueError("?"), ErrorType.SINK_UNKNOWN_ERROR),
    ],
)
def test_request_failures(exc: BaseException, expected: ErrorType) -> None:
    assert classify_exception(exc) is expected


def test_worker_error_finds_the_python_reason_inside_a_spark_error() -> None:
    from firehose_bq.pipeline import worker_error

    spark_text = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        "firehose_bq.errors.SourceError: bookings/1: no progress for 120000 ms at offset 5, planned to read up to 9\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)\n"
    )
    assert worker_error(RuntimeError(spark_text)) == (
        "firehose_bq.errors.SourceError: bookings/1: no progress for 120000 ms at offset 5, planned to read up to 9")
    assert worker_error(RuntimeError("plain failure\nmore")) == "plain failure"


# What Spark's StreamingQueryException holds when the source's Python process (a fork of the job's fork
# server) is killed: an EOFException, which has no message, so its text ends in "terminated with exception: ".
QUERY_TRACE = (
    "org.apache.spark.sql.streaming.StreamingQueryException:  === Streaming Query ===\n"
    "Identifier: firehose-bq-readings [id = 4359, runId = eefd]\n"
    "\tat org.apache.spark.sql.execution.streaming.runtime.StreamExecution.runStream(StreamExecution.scala:390)\n"
    "Caused by: java.io.EOFException\n"
    "\tat java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)\n"
    "\tat org.apache.spark.sql.execution.python.streaming.PythonStreamingSourceRunner.latestOffset("
    "PythonStreamingSourceRunner.scala:235)\n"
    "\t... 20 more\n"
)


class _QueryFailed(Exception):
    """Stands in for pyspark's StreamingQueryException: its text, message parameters and JVM trace."""

    def __init__(self, message: str, trace: str) -> None:
        super().__init__(f"[STREAM_FAILED] Query [id = 4359, runId = eefd] terminated with exception: {message} "
                         "SQLSTATE: XXKST")
        self.message, self._stackTrace = message, trace

    def getMessageParameters(self) -> dict[str, str]:  # noqa: N802 - pyspark's name
        return {"id": "4359", "runId": "eefd", "message": self.message}


def test_a_query_error_without_a_message_names_its_jvm_cause_and_what_it_means() -> None:
    from firehose_bq.errors import jvm_cause, query_error

    reason = query_error(_QueryFailed("", QUERY_TRACE))
    assert reason.startswith("[STREAM_FAILED] Query [id = 4359, runId = eefd] terminated with exception: ")
    assert reason.endswith("(cause: java.io.EOFException in PythonStreamingSourceRunner.latestOffset: Spark's "
                           "Python process for the Kafka source (python_streaming_source_runner, a fork of the "
                           "job's fork server) ended unexpectedly)")
    # A query error with a message of its own stays as it is, unless its cause is a Python process of known
    # meaning going away: killed mid-exchange, the same runner's death reads "Connection reset".
    plain = "Caused by: java.lang.IllegalStateException: boom\n\tat org.example.Thing.run(Thing.java:1)\n"
    assert query_error(_QueryFailed("boom", plain)) == str(_QueryFailed("boom", plain))
    reset = QUERY_TRACE.replace("Caused by: java.io.EOFException\n\tat java.base/java.io.DataInputStream.readInt("
                                "DataInputStream.java:386)",
                                "Caused by: java.net.SocketException: Connection reset\n\tat java.base/sun.nio.ch."
                                "NioSocketImpl.implRead(NioSocketImpl.java:318)")
    assert query_error(_QueryFailed("Connection reset", reset)).endswith(
        "terminated with exception: Connection reset SQLSTATE: XXKST (cause: java.net.SocketException: Connection "
        "reset in PythonStreamingSourceRunner.latestOffset: Spark's Python process for the Kafka source "
        "(python_streaming_source_runner, a fork of the job's fork server) ended unexpectedly)")
    assert jvm_cause("java.io.IOException: No space left on device\n\tat a.B.c(B.java:1)") == (
        "java.io.IOException: No space left on device")
    assert jvm_cause("java.lang.IllegalStateException\n\tat org.example.Thing.run(Thing.java:1)") == (
        "java.lang.IllegalStateException in Thing.run")
    assert jvm_cause("") is None


class _Frame:
    def __init__(self, text: str) -> None:
        self.text = text

    def toString(self) -> str:  # noqa: N802 - Java's name
        return self.text


class _Throwable:
    """A JVM Throwable as py4j hands it over: what pyspark's error does not show publicly."""

    def __init__(self, text: str, frames: list[str], cause: _Throwable | None = None, gone: bool = False) -> None:
        self.text, self.frames, self.cause, self.gone = text, frames, cause, gone

    def getCause(self) -> _Throwable | None:  # noqa: N802
        if self.gone:
            raise ConnectionError("py4j: the gateway is gone")
        return self.cause

    def toString(self) -> str:  # noqa: N802
        return self.text

    def getStackTrace(self) -> list[_Frame]:  # noqa: N802
        return [_Frame(f) for f in self.frames]


class _Py4JJavaError(Exception):
    def __init__(self, java_exception: _Throwable) -> None:
        super().__init__("An error occurred while calling o88.awaitTermination.")
        self.java_exception = java_exception


def _raised_from_jvm(error: _QueryFailed, throwable: _Throwable) -> _QueryFailed:
    """`error` as pyspark's capture_sql_exception raises it: `from None`, in the except of the py4j error."""
    try:
        try:
            raise _Py4JJavaError(throwable)
        except _Py4JJavaError:
            raise error from None
    except _QueryFailed as raised:
        return raised


EOF_CAUSE = _Throwable("java.io.EOFException", [
    "java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)",
    "org.apache.spark.sql.execution.python.streaming.PythonStreamingSourceRunner.latestOffset("
    "PythonStreamingSourceRunner.scala:235)"])
QUERY_EXCEPTION = _Throwable("org.apache.spark.sql.streaming.StreamingQueryException:  === Streaming Query ===", [
    "org.apache.spark.sql.execution.streaming.runtime.StreamExecution.runStream(StreamExecution.scala:390)"],
    cause=_Throwable("org.apache.spark.SparkException: wrapped", ["org.example.Wrap.it(Wrap.java:1)"], EOF_CAUSE))


def test_a_query_errors_jvm_cause_is_read_from_the_jvms_exception_without_pyspark_private_trace() -> None:
    from firehose_bq.errors import query_error

    public = query_error(_raised_from_jvm(_QueryFailed("", ""), QUERY_EXCEPTION))
    # The same reason as from the trace text pyspark keeps privately.
    assert public == query_error(_QueryFailed("", QUERY_TRACE)), public
    assert public.endswith("(cause: java.io.EOFException in PythonStreamingSourceRunner.latestOffset: Spark's "
                           "Python process for the Kafka source (python_streaming_source_runner, a fork of the "
                           "job's fork server) ended unexpectedly)")


def test_a_query_error_whose_jvm_is_gone_falls_back_to_pyspark_copy_of_the_trace() -> None:
    from firehose_bq.errors import query_error

    gone = _Throwable("org.apache.spark.sql.streaming.StreamingQueryException", [], gone=True)
    assert query_error(_raised_from_jvm(_QueryFailed("", QUERY_TRACE), gone)) == query_error(
        _QueryFailed("", QUERY_TRACE))
    assert query_error(_raised_from_jvm(_QueryFailed("", ""), gone)) == str(_QueryFailed("", ""))  # no trace at all


@pytest.mark.parametrize(
    ("status", "errors", "expected"),
    [
        # What google-api-core builds from BigQuery's JSON error bodies (`error.errors[].reason`).
        (503, [{"reason": "backendError", "message": "Error encountered during execution. Retrying may solve the "
                                                        "problem."}], ErrorType.SINK_5XX_ERROR),
        (400, [{"reason": "invalid", "message": "Request payload size exceeds the limit: 10485760 bytes."}],
         ErrorType.SINK_4XX_ERROR),
        (403, [{"reason": "quotaExceeded", "message": "Exceeded rate limits: too many table update operations"}],
         ErrorType.SINK_RETRYABLE_ERROR),
        (404, [{"reason": "notFound", "message": "Not found: Table p:d.t"}], ErrorType.SINK_4XX_ERROR),
        (408, [], ErrorType.SINK_RETRYABLE_ERROR),
        (500, [{"reason": "internalError"}], ErrorType.SINK_5XX_ERROR),
        (502, [], ErrorType.SINK_5XX_ERROR),
    ],
)
def test_http_status_errors(status: int, errors: list[dict], expected: ErrorType) -> None:
    assert classify_exception(exceptions.from_http_status(status, "failed", errors=errors)) is expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (3, ErrorType.SINK_4XX_ERROR),  # INVALID_ARGUMENT: "Errors found while processing rows"
        (6, ErrorType.SINK_4XX_ERROR),  # ALREADY_EXISTS: offset already written
        (8, ErrorType.SINK_RETRYABLE_ERROR),  # RESOURCE_EXHAUSTED: throughput quota
        (14, ErrorType.SINK_RETRYABLE_ERROR),  # UNAVAILABLE
        (13, ErrorType.SINK_5XX_ERROR),  # INTERNAL
        (2, ErrorType.SINK_UNKNOWN_ERROR),  # UNKNOWN
    ],
)
def test_storage_write_status_codes(code: int, expected: ErrorType) -> None:
    assert classify_grpc_code(code) is expected


def test_storage_write_row_errors() -> None:
    # AppendRowsResponse.row_errors: {"index": 2, "code": "FIELDS_ERROR" (1), "message": "..."}
    assert classify_storage_row_error(1) is ErrorType.SINK_4XX_ERROR
    assert classify_storage_row_error(0) is ErrorType.SINK_UNKNOWN_ERROR


@pytest.mark.parametrize(
    ("exc", "rejected"),
    [
        # The request itself is invalid: one row of it may be why.
        (exceptions.from_http_status(400, "bad", errors=[{"reason": "invalid", "message": "Request payload size "
                                                                                        "exceeds the limit"}]), True),
        (exceptions.from_http_status(400, "bad", errors=[{"reason": "badRequest"}]), True),
        (exceptions.from_http_status(400, "bad"), True),
        (exceptions.from_http_status(413, "too large"), True),
        (exceptions.from_grpc_status(3, "Cannot parse the rows"), True),  # INVALID_ARGUMENT, no row errors
        # A table, a permission, a stream's state, a quota, an outage: no row is the cause.
        (exceptions.from_http_status(404, "Not found: Table p:d.t", errors=[{"reason": "notFound"}]), False),
        (exceptions.from_http_status(400, "bad", errors=[{"reason": "invalid"}, {"reason": "notFound"}]), False),
        (exceptions.from_http_status(403, "denied", errors=[{"reason": "accessDenied"}]), False),
        (exceptions.from_http_status(403, "quota", errors=[{"reason": "quotaExceeded"}]), False),
        (exceptions.from_http_status(401, "who are you"), False),
        (exceptions.from_http_status(403, "forbidden"), False),
        (exceptions.from_http_status(500, "oops", errors=[{"reason": "internalError"}]), False),
        (exceptions.from_grpc_status(5, "Stream not found"), False),  # NOT_FOUND
        (exceptions.from_grpc_status(7, "denied"), False),  # PERMISSION_DENIED
        (exceptions.from_grpc_status(9, "stream finalized"), False),  # FAILED_PRECONDITION (HTTP 400 too)
        (exceptions.from_grpc_status(11, "offset past the end"), False),  # OUT_OF_RANGE (HTTP 400 too)
        (exceptions.from_grpc_status(16, "unauthenticated"), False),
        (exceptions.from_grpc_status(14, "unavailable"), False),
        (exceptions.from_grpc_status(2, "unknown"), False),
        (requests.exceptions.ConnectionError("refused"), False),
        (ValueError("?"), False),
    ],
)
def test_rejected_requests(exc: BaseException, rejected: bool) -> None:
    assert rejects_request(exc) is rejected


def _raised(error: BaseException, cause: BaseException | None) -> BaseException:
    try:
        raise error from cause
    except BaseException as exc:  # noqa: BLE001 - the error as raised, with its cause attached
        return exc


def test_a_missing_table_is_told_from_the_error_a_write_raised_from_it() -> None:
    """NOT_FOUND, however the writer wrapped it (the policy's SinkError, raised from the client's error), says
    the table, its dataset or its default stream is gone; nothing else does."""
    from firehose_bq.errors import SinkError

    gone = exceptions.NotFound("Table p:d.t not found")
    assert table_missing(gone)
    assert table_missing(_raised(SinkError(ErrorType.SINK_4XX_ERROR, "AppendRows failed"), gone))
    grpc_gone = exceptions.from_grpc_status(5, "Requested entity was not found.")  # gRPC NOT_FOUND
    assert table_missing(_raised(SinkError(ErrorType.SINK_4XX_ERROR, "x"), grpc_gone))
    assert not table_missing(_raised(SinkError(ErrorType.SINK_4XX_ERROR, "x"), exceptions.Forbidden("denied")))
    assert not table_missing(SinkError(ErrorType.SINK_5XX_ERROR, "no cause"))
