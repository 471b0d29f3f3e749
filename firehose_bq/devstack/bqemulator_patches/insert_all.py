"""Gap 2: ``tabledata.insertAll`` validates rows and answers per-row ``insertErrors``, as BigQuery does.

BigQuery answers HTTP 200 with one ``insertErrors`` entry per bad row (reason ``invalid``, the field
path as ``location``); without ``skipInvalidRows`` every other row of the request is ``stopped`` and
nothing is inserted, with it the good rows are. Unknown fields are ``invalid`` unless
``ignoreUnknownValues``; a missing REQUIRED field is ``invalid``. A row whose ``insertId`` was inserted
within about a minute is dropped without error (best-effort de-duplication).

bqemulator 1.4.0 hands the raw JSON to pyarrow instead: a badly typed row raises, the client sees HTTP
500 and retries it for up to 600 s; unknown fields and missing REQUIRED fields are accepted without a
word; ``insertId`` is ignored. The replacement route validates every row with ``row_values``
(recursively, through RECORD and REPEATED fields); table lookup, GEOGRAPHY projection, row count and the
change event are done as bqemulator does them.

bqemulator also copies the whole table into an AUTO time-travel snapshot after every insert and keeps
the copies for 7 days: streaming 100k rows in 500-row batches then holds about 10M copied rows (about
0.8 GB) and makes each insert slower than the last. Unless ``snapshot_each_insert`` is set, the route
publishes the change event without the copy, so ``FOR SYSTEM_TIME AS OF`` reads the live table for
streamed data.

Shown by tests/integration/test_emulator_gaps.py, the ``test_gap2_*`` tests:
::test_gap2_invalid_type_reports_invalid_and_stopped_and_inserts_nothing,
::test_gap2_skip_invalid_rows_inserts_only_the_good_rows, ::test_gap2_unknown_field_is_invalid,
::test_gap2_unknown_field_is_dropped_with_ignore_unknown_values, ::test_gap2_missing_required_field_is_invalid,
::test_gap2_nested_record_and_repeated_errors_carry_the_field_path, ::test_gap2_lenient_conversions_match_bigquery,
::test_gap2_wrong_scalar_types_and_value_ranges and ::test_gap2_insert_id_deduplicates_rows.
"""

import collections
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._bq_types import canonical_type
from ._targets import PatchTargetMissingError, dotted, module, require
from .row_values import SCALAR_COERCERS, RowError, validate_row


def invalid_entry(index: int, error: RowError) -> dict[str, Any]:
    return {
        "index": index,
        "errors": [
            {"reason": "invalid", "location": error.location, "debugInfo": "", "message": error.message}
        ],
    }


def stopped_entry(index: int) -> dict[str, Any]:
    return {"index": index, "errors": [{"reason": "stopped", "location": "", "debugInfo": "", "message": ""}]}


def build_insert_errors(
    row_count: int, errors: dict[int, RowError], *, skip_invalid_rows: bool
) -> list[dict[str, Any]]:
    """Give the ``insertErrors`` list BigQuery returns for the given per-row errors.

    Without ``skipInvalidRows`` one bad row stops the whole request: bad rows
    are reported ``invalid`` and every other row ``stopped``.
    """
    if not errors:
        return []
    if skip_invalid_rows:
        return [invalid_entry(i, errors[i]) for i in sorted(errors)]
    return [invalid_entry(i, errors[i]) if i in errors else stopped_entry(i) for i in range(row_count)]


@dataclass(frozen=True, slots=True)
class GoodRow:
    """A row that passed validation: its request index, canonical values and insertId."""

    index: int
    values: dict[str, Any]
    insert_id: str | None


def validate_rows(
    rows: Sequence[Any], fields: Sequence[Any], *, ignore_unknown: bool
) -> tuple[list[GoodRow], dict[int, RowError]]:
    """Split insertAll ``rows`` (``{"insertId": ..., "json": {...}}``) into good rows and errors."""
    good: list[GoodRow] = []
    errors: dict[int, RowError] = {}
    for index, row in enumerate(rows):
        row = row if isinstance(row, dict) else {}
        values, error = validate_row(row.get("json"), fields, ignore_unknown=ignore_unknown)
        if error is not None or values is None:
            errors[index] = error or RowError("", "Cannot convert value to record")
            continue
        insert_id = row.get("insertId")
        good.append(GoodRow(index, values, str(insert_id) if insert_id not in (None, "") else None))
    return good, errors


class InsertIdCache:
    """Remember recent ``insertId``s per table, for best-effort de-duplication.

    BigQuery says it remembers an insertId for at least one minute. Entries
    are kept in insertion order, and all share one TTL, so expiry only has to
    look at the oldest ones.
    """

    def __init__(self, ttl_seconds: float, max_entries: int = 2_000_000) -> None:
        self._ttl = ttl_seconds
        self._max = max_entries
        self._seen: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def _expire(self, now: float) -> None:
        while self._seen:
            key, expiry = next(iter(self._seen.items()))
            if expiry > now and len(self._seen) <= self._max:
                break
            self._seen.pop(key)

    def drop_duplicates(self, table_key: str, rows: list[GoodRow]) -> list[GoodRow]:
        """Leave out rows whose insertId was stored recently or already appears earlier in ``rows``."""
        self._expire(time.monotonic())
        fresh: list[GoodRow] = []
        in_request: set[str] = set()
        for row in rows:
            if row.insert_id is not None:
                if row.insert_id in in_request or (table_key, row.insert_id) in self._seen:
                    continue
                in_request.add(row.insert_id)
            fresh.append(row)
        return fresh

    def remember(self, table_key: str, rows: Iterable[GoodRow]) -> None:
        expiry = time.monotonic() + self._ttl
        for row in rows:
            if row.insert_id is not None:
                self._seen.pop((table_key, row.insert_id), None)
                self._seen[(table_key, row.insert_id)] = expiry
        self._expire(time.monotonic())


def _plain_types_only(fields: Sequence[Any]) -> bool:
    """True when every field, at any depth, is a type this module validates and canonicalises."""
    return all(
        _plain_types_only(f.fields)
        if canonical_type(f.type) == "RECORD"
        else canonical_type(f.type) in SCALAR_COERCERS
        for f in fields
    )


def apply(*, insert_id_ttl_seconds: float, snapshot_each_insert: bool) -> list[str]:
    """Replace the insertAll route with one that validates, reports per row and de-duplicates."""
    import pyarrow as pa  # bqemulator dependency
    from fastapi import Request  # bqemulator dependency

    tabledata = module("bqemulator.api.routes.tabledata")
    arrow_bridge = module("bqemulator.storage.arrow_bridge")
    sql_ids = module("bqemulator.storage.sql_identifiers")
    errors_mod = module("bqemulator.domain.errors")
    events_mod = module("bqemulator.domain.events")
    router = require(tabledata, "router")
    ctx_annotation = require(tabledata, "_Ctx")
    build_arrow_schema = require(tabledata, "_build_arrow_schema")
    fields_raw_from_schema = require(tabledata, "_fields_raw_from_schema")
    has_geography = require(tabledata, "_has_geography_column")
    build_insert_select = require(tabledata, "_build_insert_select")
    bq_rows_to_arrow = require(arrow_bridge, "bq_rows_to_arrow")
    quoted_table_ref = require(sql_ids, "quoted_table_ref")
    register_name = require(sql_ids, "register_name")
    resource_not_found = require(errors_mod, "resource_not_found")
    resource_ref = require(errors_mod, "ResourceRef")
    validation_error = require(errors_mod, "ValidationError")
    table_data_changed = require(events_mod, "TableDataChanged")

    routes = [r for r in router.routes if getattr(r, "path", "").endswith("/insertAll")]
    if len(routes) != 1 or "POST" not in getattr(routes[0], "methods", ()):
        raise PatchTargetMissingError("bqemulator.api.routes.tabledata.router: no single POST .../insertAll")
    original_route = routes[0]
    recent_ids = InsertIdCache(insert_id_ttl_seconds)

    def convert(rows: list[GoodRow], fields: Sequence[Any], arrow_schema: Any) -> Any:
        if _plain_types_only(fields):
            # Values are already canonical Python objects, so pyarrow can take
            # them as they are. That is about 4x faster than bqemulator's
            # converter, which dispatches every value again.
            return pa.Table.from_pylist([r.values for r in rows], schema=arrow_schema)
        # GEOGRAPHY, INTERVAL and RANGE need bqemulator's own converter.
        return bq_rows_to_arrow([{"json": r.values} for r in rows], arrow_schema)

    def to_arrow(rows: list[GoodRow], fields: Sequence[Any]) -> tuple[Any, dict[int, RowError]]:
        """Convert rows to Arrow. If that fails, find the rows that cannot be converted.

        Validation should catch everything first, but GEOGRAPHY, INTERVAL and
        RANGE values reach the converter unchecked.
        """
        arrow_schema = build_arrow_schema(fields_raw_from_schema(fields))
        try:
            return convert(rows, fields, arrow_schema), {}
        except Exception:  # noqa: BLE001 - pyarrow and bqemulator raise assorted types
            bad: dict[int, RowError] = {}
            for row in rows:
                try:
                    convert([row], fields, arrow_schema)
                except Exception as exc:  # noqa: BLE001
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    bad[row.index] = RowError("", f"Cannot convert row to the table schema: {reason}")
            good = [r for r in rows if r.index not in bad]
            return (convert(good, fields, arrow_schema) if good else None), bad

    async def append(ctx: Any, table_meta: Any, arrow_table: Any) -> None:
        project_id, dataset_id, table_id = table_meta.project_id, table_meta.dataset_id, table_meta.table_id
        fields = list(table_meta.schema_.fields)
        target_ref = quoted_table_ref(project_id, dataset_id, table_id)
        reg = register_name(f"__bqemu_insertall_{uuid.uuid4().hex[:12]}")
        projection = build_insert_select(fields, reg) if has_geography(fields) else "*"
        async with ctx.engine.write_lock():
            ctx.engine.connection.register(reg, arrow_table)
            try:
                # BY NAME: after gap 3's ADD COLUMN the stored column order can
                # differ from the schema order.
                ctx.engine.execute(f"INSERT INTO {target_ref} BY NAME SELECT {projection} FROM {reg}")
            finally:
                ctx.engine.connection.unregister(reg)
            # Re-read under the lock so that concurrent inserts do not lose row counts.
            current = ctx.catalog.get_table(project_id, dataset_id, table_id) or table_meta
            ctx.catalog.update_table(
                current.model_copy(update={"num_rows": current.num_rows + arrow_table.num_rows})
            )
            if snapshot_each_insert:
                ctx.snapshots.record_change(project_id, dataset_id, table_id)
            else:
                ctx.events.publish(table_data_changed(project_id, dataset_id, table_id))

    async def insert_all(
        project_id: str, dataset_id: str, table_id: str, request: Request, ctx: Any
    ) -> dict[str, Any]:
        table_meta = ctx.catalog.get_table(project_id, dataset_id, table_id)
        if table_meta is None:
            raise resource_not_found(resource_ref("table", project_id, dataset_id, table_id))
        body = await request.json()
        if not isinstance(body, dict):
            raise validation_error("insertAll request body must be a JSON object")
        rows = body.get("rows") or []
        skip_invalid = bool(body.get("skipInvalidRows", False))
        fields = list(table_meta.schema_.fields)
        good, errors = validate_rows(rows, fields, ignore_unknown=bool(body.get("ignoreUnknownValues")))

        table_key = f"{project_id}:{dataset_id}.{table_id}"
        to_store = recent_ids.drop_duplicates(table_key, good) if skip_invalid or not errors else []
        if to_store:
            arrow_table, bad = to_arrow(to_store, fields)
            errors.update(bad)
            if arrow_table is not None and (skip_invalid or not bad):
                await append(ctx, table_meta, arrow_table)
                recent_ids.remember(table_key, [r for r in to_store if r.index not in bad])

        response: dict[str, Any] = {"kind": "bigquery#tableDataInsertAllResponse"}
        insert_errors = build_insert_errors(len(rows), errors, skip_invalid_rows=skip_invalid)
        if insert_errors:
            response["insertErrors"] = insert_errors
        return response

    # FastAPI finds the AppContext dependency through this annotation. It is
    # set here rather than in the signature because it is only known at run time.
    insert_all.__annotations__["ctx"] = ctx_annotation
    # create_app() copies router.routes when the server is built, so swapping
    # the route in the router now is enough.
    prefix = router.prefix or ""
    path = original_route.path.removeprefix(prefix)
    position = router.routes.index(original_route)
    router.add_api_route(path, insert_all, methods=["POST"], name=original_route.name)
    router.routes[position] = router.routes.pop()
    return [f"{dotted(tabledata)}.insert_all (route POST {original_route.path} replaced)"]
