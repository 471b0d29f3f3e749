"""Gap 5: Storage Write into a table with RECORD columns keeps the subfields.

BigQuery's AppendRows writes RECORD columns like any other. ``write_servicer._table_arrow_schema``
projects the table schema onto name, type and mode only, so a RECORD column becomes an Arrow struct
with no fields and the INSERT fails with "Type STRUCT does not match with STRUCT(...)". The replacement
keeps the subfields, through the same projection the insertAll route uses.

Shown by tests/integration/test_emulator_gaps.py::test_gap5_storage_write_into_record_columns.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Replace ``_table_arrow_schema`` with the full (nested) projection of the table schema."""
    write_servicer = module("bqemulator.grpc_api.write_servicer")
    tabledata = module("bqemulator.api.routes.tabledata")
    build_arrow_schema = require(tabledata, "_build_arrow_schema")
    fields_raw_from_schema = require(tabledata, "_fields_raw_from_schema")

    def _table_arrow_schema(table_meta: Any) -> Any:
        return build_arrow_schema(fields_raw_from_schema(table_meta.schema_.fields))

    # The servicer looks the name up at call time, when a stream is bound.
    return [replace(write_servicer, "_table_arrow_schema", _table_arrow_schema)]
