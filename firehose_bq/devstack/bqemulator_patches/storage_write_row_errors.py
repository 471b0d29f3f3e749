"""Storage Write reports bad rows in ``row_errors`` and appends nothing, as BigQuery does.

BigQuery checks every row of an AppendRows request and, when any is bad, appends nothing and answers
INVALID_ARGUMENT with one ``row_errors`` entry (index, FIELDS_ERROR, message) per bad row, so a writer
can send the other rows again. bqemulator converts a whole request at once: a row it cannot convert
fails the request with a bare INVALID_ARGUMENT that names no row, and values BigQuery refuses (a
TIMESTAMP past year 9999, a missing REQUIRED field, text that is no JSON) are stored without a word.

A request over the size cap (``write_api_max_request_bytes``, BigQuery's 10 MiB) is INVALID_ARGUMENT
"AppendRows request too large: N limit M", as BigQuery answers it, not bqemulator's RESOURCE_EXHAUSTED
(which is BigQuery's code for quotas, worth a retry; a request too large never gets in).

``proto_rows_to_arrow_table`` is replaced by a per-row checking version (BigQuery's ranges and value
parsers from ``row_values``) and ``_handle_append_rows`` by bqemulator's own loop that turns those
errors into such a response. Appends also insert BY NAME (after gap 3's ADD COLUMN the stored column
order can differ from the schema's), and, like the insertAll patch, skip the whole-table time-travel
copy after every append unless ``snapshot_each_append`` is set.

An Arrow writer schema holding a column or RECORD field the table lacks is INVALID_ARGUMENT with a
StorageError SCHEMA_MISMATCH_EXTRA_FIELDS, appending nothing, as BigQuery answers it; bqemulator drops such
columns and stores the rest without a word (a writer whose columns came from a table since dropped and
created again with fewer would lose their values: tests/integration/test_routing_kept_checks.py).

Shown by tests/integration/test_emulator_gaps.py::test_storage_write_bad_rows_come_back_as_row_errors_and_nothing_is_appended;
the size refusal by tests/integration/test_poison_rows.py.
(The sink's Storage Write writer checks rows before appending, so its own tests rarely meet row_errors.)
"""

import uuid
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

from ._bq_types import canonical_type
from ._targets import module, replace, require
from .row_values import SCALAR_COERCERS, TS_MAX_SECONDS, TS_MIN_SECONDS, InvalidValue, coerce_date, coerce_timestamp

# BigQuery's ranges, as the Storage Write API's integer encodings.
_TS_MIN_MICROS = int(TS_MIN_SECONDS) * 1_000_000
_TS_MAX_MICROS = int(TS_MAX_SECONDS * 1_000_000)
_DATE_MIN_DAYS = (date(1, 1, 1) - date(1970, 1, 1)).days
_DATE_MAX_DAYS = (date(9999, 12, 31) - date(1970, 1, 1)).days


def _arrow_bq_type(arrow_field: Any) -> str:
    raw = (arrow_field.metadata or {}).get(b"bq_type", b"")
    return canonical_type(raw.decode("ascii") if isinstance(raw, bytes) else str(raw))


# What a decoded Storage Write value is checked and turned into, per column: None = taken as it is.
_StorageValueFn = Callable[[Any, str], Any]


def _in_range(low: int, high: int, what: str, parse_text: Callable[[Any, str], Any]) -> _StorageValueFn:
    """Integer encodings (TIMESTAMP micros, DATE days) checked against BigQuery's range; text parsed."""

    def check(value: Any, loc: str) -> Any:
        if isinstance(value, str):
            return parse_text(value, loc)
        if not low <= value <= high:
            raise InvalidValue(loc, f"{what} field value is out of range: {value}")
        return value

    return check


def _storage_value_fn(arrow_field: Any, arrow_type: Any) -> _StorageValueFn | None:
    """Compile the check of one column's values (``arrow_type``: its type, or a list's element type).

    Storage Write values arrive decoded from protobuf, so they are already
    Python ints, floats, strings, bytes, dicts and lists that pyarrow takes as
    they are. Only BigQuery's ranges, REQUIRED, and the text forms of typed
    columns need a look; everything else passes untouched, which keeps a
    20k-row append fast.
    """
    import pyarrow as pa  # bqemulator dependency

    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = _storage_value_fn(arrow_type.value_field, arrow_type.value_type)
        if inner is None:
            return None
        return lambda value, loc: [inner(e, f"{loc}[{i}]") for i, e in enumerate(value)]
    if pa.types.is_struct(arrow_type):
        record = _storage_row_fn([arrow_type.field(i) for i in range(arrow_type.num_fields)])
        if record is None:
            return None
        return lambda value, loc: record(value, f"{loc}.")
    bq_type = _arrow_bq_type(arrow_field)
    if bq_type == "TIMESTAMP":
        return _in_range(_TS_MIN_MICROS, _TS_MAX_MICROS, "Timestamp", coerce_timestamp)
    if bq_type == "DATE":
        return _in_range(_DATE_MIN_DAYS, _DATE_MAX_DAYS, "Date", coerce_date)
    if bq_type in ("DATETIME", "TIME", "NUMERIC", "BIGNUMERIC", "JSON"):
        parse = SCALAR_COERCERS[bq_type]
        return lambda value, loc: parse(value, loc) if isinstance(value, str) else value
    return None


def _storage_row_fn(arrow_fields: Sequence[Any]) -> Callable[[dict[str, Any], str], dict[str, Any]] | None:
    steps = [(f.name, f.nullable, _storage_value_fn(f, f.type)) for f in arrow_fields]
    if all(nullable and fn is None for _, nullable, fn in steps):
        return None

    def check(row: dict[str, Any], prefix: str) -> dict[str, Any]:
        for name, nullable, fn in steps:
            value = row.get(name)
            if value is None:
                if not nullable:
                    raise InvalidValue(f"{prefix}{name}", f"Missing required field: {prefix}{name}.")
            elif fn is not None:
                row[name] = fn(value, f"{prefix}{name}")
        return row

    return check


class _StorageRowErrors(ValueError):
    """Rows of one AppendRows request that BigQuery would reject: request index → message."""

    def __init__(self, errors: dict[int, str]) -> None:
        super().__init__(f"{len(errors)} row(s) rejected")
        self.errors = errors


def _absent(sent: Sequence[Any], table: Sequence[Any], prefix: str) -> list[str]:
    """Dotted paths of the Arrow fields `sent` that the Arrow fields `table` lack, at any depth."""
    import pyarrow as pa  # bqemulator dependency

    columns = {f.name.lower(): f for f in table}
    out: list[str] = []
    for given in sent:
        column = columns.get(given.name.lower())
        if column is None:
            out.append(f"{prefix}{given.name}")
            continue
        mine, theirs = given.type, column.type
        while pa.types.is_list(mine) and pa.types.is_list(theirs):
            mine, theirs = mine.value_type, theirs.value_type
        if pa.types.is_struct(mine) and pa.types.is_struct(theirs):
            out.extend(_absent(list(mine), list(theirs), f"{prefix}{given.name}."))
    return out


def apply(*, snapshot_each_append: bool) -> list[str]:
    """Check AppendRows rows one by one and answer bad ones as BigQuery's ``row_errors``."""
    import grpc  # bqemulator dependency
    import pyarrow as pa  # bqemulator dependency

    write_servicer = module("bqemulator.grpc_api.write_servicer")
    arrow_bridge = module("bqemulator.storage.arrow_bridge")
    sql_ids = module("bqemulator.storage.sql_identifiers")
    events_mod = module("bqemulator.domain.events")
    handler_cls = require(write_servicer, "BigQueryWriteHandler")
    require(handler_cls, "_handle_append_rows")
    require(handler_cls, "_flush_to_target")
    require(write_servicer, "proto_rows_to_arrow_table")
    rows_for_request = require(write_servicer, "_rows_for_request")
    require(write_servicer, "_oversize_error_response")  # replaced below: BigQuery's code and words
    error_response = require(write_servicer, "_error_response")
    has_offset = require(write_servicer, "_has_offset")
    has_field = require(write_servicer, "_has_field")
    coerce = require(arrow_bridge, "_coerce_to_arrow_value")
    quoted_table_ref = require(sql_ids, "quoted_table_ref")
    register_name = require(sql_ids, "register_name")
    table_data_changed = require(events_mod, "TableDataChanged")

    checks: dict[Any, Any] = {}  # target schema → its compiled row check (one per table version)

    def proto_rows_to_arrow_table(decoder: Any, serialized_rows: list[bytes], target_schema: Any) -> Any:
        if target_schema not in checks:
            # GEOGRAPHY and INTERVAL go through bqemulator's own converter, as before.
            special = [f for f in target_schema if _arrow_bq_type(f) in ("GEOGRAPHY", "INTERVAL")]
            checks[target_schema] = (_storage_row_fn(list(target_schema)), special)
        check, special = checks[target_schema]
        good: list[dict[str, Any]] = []
        errors: dict[int, str] = {}
        for index, raw in enumerate(serialized_rows):
            try:
                row = decoder.decode(raw)
                if check is not None:
                    check(row, "")
                for f in special:
                    row[f.name] = coerce(row.get(f.name), f.type, field=f)
                good.append(row)
            except InvalidValue as exc:
                text, loc = exc.error.message, exc.error.location
                # Name the field unless the message already ends with it.
                errors[index] = text if not loc or text.endswith(f"{loc}.") else f"{text} on field {loc}."
            except Exception as exc:  # noqa: BLE001 - undecodable bytes, values pyarrow refuses
                errors[index] = f"Cannot convert the row: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        if not errors:
            try:
                return pa.Table.from_pylist(good, schema=target_schema)
            except Exception:  # noqa: BLE001 - find the rows pyarrow cannot take
                for index, row in enumerate(good):
                    try:
                        pa.Table.from_pylist([row], schema=target_schema)
                    except Exception as exc:  # noqa: BLE001
                        errors[index] = f"Cannot convert the row: {str(exc).splitlines()[0]}"
                if not errors:
                    raise
        raise _StorageRowErrors(errors)

    def row_errors_response(stream_name: str, errors: dict[int, str]) -> bytes:
        from google.cloud.bigquery_storage_v1 import types
        from google.rpc import status_pb2

        response = types.AppendRowsResponse(
            write_stream=stream_name,
            error=status_pb2.Status(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                message="Errors found while processing rows. Please refer to the row_errors field for details. "
                f"The list may not be complete because of the size limitations. Entity: {stream_name}",
            ),
            row_errors=[
                types.RowError(index=index, code=types.RowError.RowErrorCode.FIELDS_ERROR, message=message)
                for index, message in sorted(errors.items())
            ],
        )
        return types.AppendRowsResponse.serialize(response)

    def extra_fields(request: Any, sticky: bytes | None, target_schema: Any) -> tuple[bytes | None, list[str]]:
        """An Arrow request's writer schema (its own, else the connection's) and the fields of it (dotted
        paths) that the table lacks, compared as BigQuery does, case-insensitively."""
        if not has_field(request, "arrow_rows"):
            return sticky, []
        arrow_data = request.arrow_rows
        if has_field(arrow_data, "writer_schema"):
            sticky = bytes(arrow_data.writer_schema.serialized_schema)
        if sticky is None:
            return sticky, []
        try:
            sent = pa.ipc.read_schema(pa.py_buffer(sticky))
        except Exception:  # noqa: BLE001 - bqemulator's own conversion answers an unreadable schema
            return sticky, []
        return sticky, _absent(list(sent), list(target_schema), "")

    def extra_fields_response(stream_name: str, extra: list[str]) -> bytes:
        from google.cloud.bigquery_storage_v1 import types
        from google.protobuf import any_pb2
        from google.rpc import status_pb2

        message = (f"Input schema has more fields than BigQuery schema, extra fields: "
                   f"{', '.join(repr(x) for x in extra)} Entity: {stream_name}")
        detail = any_pb2.Any()
        detail.Pack(types.StorageError.pb()(code=types.StorageError.StorageErrorCode.SCHEMA_MISMATCH_EXTRA_FIELDS,
                                            entity=stream_name, error_message=message))
        response = types.AppendRowsResponse(
            write_stream=stream_name,
            error=status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=message, details=[detail]),
        )
        return types.AppendRowsResponse.serialize(response)

    def _handle_append_rows(self: Any, request_iterator: Any, context: Any) -> Any:
        # bqemulator's loop, with row errors answered as such.
        from google.cloud.bigquery_storage_v1 import types

        bound_ctx = None
        proto_decoder = None
        arrow_schema_bytes = None
        max_request_bytes = self._ctx.settings.write_api_max_request_bytes
        max_buffered_rows = self._ctx.settings.write_api_max_stream_rows
        for request_bytes in request_iterator:
            if len(request_bytes) > max_request_bytes:
                stream_name = bound_ctx[0].name if bound_ctx else ""
                yield error_response(
                    stream_name,
                    f"AppendRows request too large: {len(request_bytes)} limit {max_request_bytes} "
                    f"Entity: {stream_name}",
                )
                continue
            request = types.AppendRowsRequest.deserialize(request_bytes)
            bound_ctx = self._ensure_stream_bound(request.write_stream, bound_ctx, context)
            if bound_ctx is None:
                return
            bound_stream, target_schema = bound_ctx
            arrow_schema_bytes, extra = extra_fields(request, arrow_schema_bytes, target_schema)
            if extra:
                yield extra_fields_response(bound_stream.name, extra)
                continue
            try:
                rows_table, proto_decoder, arrow_schema_bytes = rows_for_request(
                    request, proto_decoder, arrow_schema_bytes, target_schema
                )
            except _StorageRowErrors as exc:
                yield row_errors_response(bound_stream.name, exc.errors)
                continue
            except ValueError as exc:
                yield error_response(bound_stream.name, str(exc))
                continue
            offset = int(request.offset) if has_offset(request) else None
            yield self._perform_append(bound_stream, rows_table, offset, max_buffered_rows)

    def _flush_to_target(self: Any, stream: Any, rows: Any) -> None:
        target_ref = quoted_table_ref(stream.project_id, stream.dataset_id, stream.table_id)
        reg = register_name(f"__bqemu_write_{uuid.uuid4().hex[:12]}")
        with self._write_lock:
            self._ctx.engine.connection.register(reg, rows)
            try:
                self._ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT * FROM {reg}")
            finally:
                self._ctx.engine.connection.unregister(reg)
            meta = self._ctx.catalog.get_table(stream.project_id, stream.dataset_id, stream.table_id)
            if meta is not None:
                self._ctx.catalog.update_table(meta.model_copy(update={"num_rows": meta.num_rows + rows.num_rows}))
            if snapshot_each_append:
                self._ctx.snapshots.record_change(stream.project_id, stream.dataset_id, stream.table_id)
            else:
                self._ctx.events.publish(table_data_changed(stream.project_id, stream.dataset_id, stream.table_id))

    return [
        replace(write_servicer, "proto_rows_to_arrow_table", proto_rows_to_arrow_table),
        replace(handler_cls, "_handle_append_rows", _handle_append_rows),
        replace(handler_cls, "_flush_to_target", _flush_to_target),
    ]
