"""BigQuery failures → ErrorType, from the structured reason BigQuery returns (never by message text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from requests import exceptions as http_exceptions

from firehose_bq.errors import ErrorType

# https://cloud.google.com/bigquery/docs/error-messages — the `reason` of an error object.
REASON_TYPES: dict[str, ErrorType] = {
    "invalid": ErrorType.SINK_4XX_ERROR,  # bad value, unknown field, missing REQUIRED, partition out of range
    "invalidQuery": ErrorType.SINK_4XX_ERROR,
    "notFound": ErrorType.SINK_4XX_ERROR,
    "duplicate": ErrorType.SINK_4XX_ERROR,
    "accessDenied": ErrorType.SINK_4XX_ERROR,
    "billingNotEnabled": ErrorType.SINK_4XX_ERROR,
    "resourceInUse": ErrorType.SINK_4XX_ERROR,
    "responseTooLarge": ErrorType.SINK_4XX_ERROR,
    "stopped": ErrorType.SINK_5XX_ERROR,  # a valid row, not written because another row was bad
    "backendError": ErrorType.SINK_5XX_ERROR,
    "internalError": ErrorType.SINK_5XX_ERROR,
    "timeout": ErrorType.SINK_RETRYABLE_ERROR,
    "rateLimitExceeded": ErrorType.SINK_RETRYABLE_ERROR,
    "quotaExceeded": ErrorType.SINK_RETRYABLE_ERROR,
}

# When a row carries several errors, the most specific one names it: a row that is invalid is
# invalid, even if BigQuery also says it was stopped.
_PRECEDENCE = (
    ErrorType.SINK_4XX_ERROR,
    ErrorType.SINK_RETRYABLE_ERROR,
    ErrorType.SINK_5XX_ERROR,
    ErrorType.SINK_UNKNOWN_ERROR,
)


def classify_row_errors(errors: Sequence[Mapping[str, Any]]) -> ErrorType:
    """The ErrorType of one row from its insertErrors entry's `errors` list."""
    found = {REASON_TYPES.get(str(e.get("reason", "")), ErrorType.SINK_UNKNOWN_ERROR) for e in errors}
    return next((t for t in _PRECEDENCE if t in found), ErrorType.SINK_UNKNOWN_ERROR)


def is_only_stopped(errors: Sequence[Mapping[str, Any]]) -> bool:
    return bool(errors) and all(e.get("reason") == "stopped" for e in errors)


def describe_row_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for e in errors:
        where = f" at {e['location']}" if e.get("location") else ""
        parts.append(f"{e.get('reason', '?')}{where}: {e.get('message', '')}".rstrip(": "))
    return "; ".join(parts)


def classify_exception(exc: BaseException) -> ErrorType:
    """The ErrorType of a whole failed request (after the client's own retries gave up)."""
    if isinstance(exc, grpc.RpcError) and not isinstance(exc, api_exceptions.GoogleAPICallError):
        exc = api_exceptions.from_grpc_error(exc)  # a raw gRPC failure: name it by its status code
    if isinstance(exc, api_exceptions.Aborted):
        return ErrorType.SINK_RETRYABLE_ERROR  # gRPC ABORTED: a concurrency conflict, worth another try
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        reasons = [str(e.get("reason", "")) for e in (exc.errors or []) if isinstance(e, Mapping)]
        by_reason = [REASON_TYPES[r] for r in reasons if r in REASON_TYPES]
        if by_reason:
            return next(t for t in _PRECEDENCE if t in by_reason)
        code = exc.code or 0
        if code == 429 or code == 408:
            return ErrorType.SINK_RETRYABLE_ERROR
        if 400 <= code < 500:
            return ErrorType.SINK_4XX_ERROR
        if code >= 500:
            return ErrorType.SINK_5XX_ERROR
    if isinstance(exc, (api_exceptions.RetryError, http_exceptions.ConnectionError, http_exceptions.Timeout,
                        ConnectionError, TimeoutError, auth_exceptions.TransportError)):
        return ErrorType.SINK_RETRYABLE_ERROR
    return ErrorType.SINK_UNKNOWN_ERROR


# Reasons that say the request itself is invalid (`invalid`, and the `badRequest` BigQuery's REST front end
# answers an oversized or malformed request with), as opposed to a table, permission or quota.
INVALID_REQUEST_REASONS = frozenset({"invalid", "badRequest"})
# HTTP statuses of such a request when no reason says more: 400, and 413 (the request is too large).
INVALID_REQUEST_CODES = frozenset({400, 413})


def rejects_request(exc: BaseException) -> bool:
    """Whether BigQuery refused a whole request as invalid in itself, which one bad row of it can cause: every
    reason it gives is `invalid` (or `badRequest`), or, without reasons, HTTP 400/413 or gRPC INVALID_ARGUMENT.
    Never for a table, dataset or stream that is missing (notFound, NOT_FOUND), permissions or credentials
    (accessDenied, PERMISSION_DENIED, 401/403), a stream's state (FAILED_PRECONDITION, OUT_OF_RANGE,
    ALREADY_EXISTS), quotas, or anything 5xx or retryable: for those a request without the row fails the same."""
    if isinstance(exc, grpc.RpcError) and not isinstance(exc, api_exceptions.GoogleAPICallError):
        exc = api_exceptions.from_grpc_error(exc)
    if not isinstance(exc, api_exceptions.GoogleAPICallError):
        return False
    reasons = [str(e.get("reason", "")) for e in (exc.errors or []) if isinstance(e, Mapping)]
    if reasons:
        return all(r in INVALID_REQUEST_REASONS for r in reasons)
    if exc.grpc_status_code is not None:  # gRPC: FAILED_PRECONDITION and OUT_OF_RANGE are HTTP 400 too
        return exc.grpc_status_code == grpc.StatusCode.INVALID_ARGUMENT
    return exc.code in INVALID_REQUEST_CODES


def table_missing(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is BigQuery saying NOT_FOUND (HTTP 404 or the gRPC code):
    the table, its dataset or its default stream is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, grpc.RpcError) and not isinstance(current, api_exceptions.GoogleAPICallError):
            current = api_exceptions.from_grpc_error(current)
        if isinstance(current, api_exceptions.NotFound):
            return True
        current = current.__cause__ or current.__context__
    return False


# Storage Write API: an AppendRows response that fails carries a google.rpc.Status whose `code` is a
# google.rpc.Code, and, for bad rows, `row_errors` entries {index, code, message} whose code is
# RowError.RowErrorCode (FIELDS_ERROR = 1: a value does not fit its column).
GRPC_CODE_TYPES: dict[int, ErrorType] = {
    3: ErrorType.SINK_4XX_ERROR,  # INVALID_ARGUMENT
    5: ErrorType.SINK_4XX_ERROR,  # NOT_FOUND (table or stream)
    6: ErrorType.SINK_4XX_ERROR,  # ALREADY_EXISTS (an offset written before)
    7: ErrorType.SINK_4XX_ERROR,  # PERMISSION_DENIED
    9: ErrorType.SINK_4XX_ERROR,  # FAILED_PRECONDITION (stream finalized, schema mismatch)
    11: ErrorType.SINK_4XX_ERROR,  # OUT_OF_RANGE (offset past the end)
    1: ErrorType.SINK_RETRYABLE_ERROR,  # CANCELLED
    4: ErrorType.SINK_RETRYABLE_ERROR,  # DEADLINE_EXCEEDED
    8: ErrorType.SINK_RETRYABLE_ERROR,  # RESOURCE_EXHAUSTED (quota, throughput)
    10: ErrorType.SINK_RETRYABLE_ERROR,  # ABORTED
    14: ErrorType.SINK_RETRYABLE_ERROR,  # UNAVAILABLE
    13: ErrorType.SINK_5XX_ERROR,  # INTERNAL
    15: ErrorType.SINK_5XX_ERROR,  # DATA_LOSS
}
STORAGE_FIELDS_ERROR = 1


def classify_grpc_code(code: int) -> ErrorType:
    """The ErrorType of a failed Storage Write call from its google.rpc.Code number."""
    return GRPC_CODE_TYPES.get(int(code), ErrorType.SINK_UNKNOWN_ERROR)


def classify_storage_row_error(code: int) -> ErrorType:
    """The ErrorType of one Storage Write `row_errors` entry: FIELDS_ERROR is the row's own fault."""
    return ErrorType.SINK_4XX_ERROR if int(code) == STORAGE_FIELDS_ERROR else ErrorType.SINK_UNKNOWN_ERROR
