"""Storage Write with Arrow rows takes TIME values as their text, as BigQuery does for TIME literals.

BigQuery's AppendRows reads a TIME column from a TIME literal (`HH:MM:SS[.ffffff]`) string; the sink's
Arrow rows carry TIME (like DATETIME) as that text (firehose_bq/arrow_schema.py), which insertAll and
load jobs on this emulator take. ``write_servicer._align_to_target`` casts each column of an Arrow append
to the table's Arrow type with pyarrow, which has no cast from string to time64: every append into a
table with a TIME column failed as a whole ("Unsupported cast from string to time64"), and a JSON job
writing such a table stopped on every restart. The replacement reads such text as a time of day (via a
timestamp on 1970-01-01, which pyarrow can parse and cast) before the original alignment. Top-level TIME
columns only: a TIME inside a RECORD still fails to append on this emulator.

Shown by tests/integration/test_emulator_gaps.py::test_storage_write_arrow_rows_take_time_as_text.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Wrap ``_align_to_target``: string columns whose target is a time type are parsed first."""
    import pyarrow as pa  # bqemulator dependency
    import pyarrow.compute as pc

    write_servicer = module("bqemulator.grpc_api.write_servicer")
    original = require(write_servicer, "_align_to_target")

    def as_time(column: Any, target: Any) -> Any:
        text = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        stamped = pc.binary_join_element_wise("1970-01-01T", text.cast(pa.string()), "")
        return stamped.cast(pa.timestamp("us")).cast(target)

    def _align_to_target(table: Any, target_schema: Any) -> Any:
        for field in target_schema:
            if (pa.types.is_time(field.type) and field.name in table.column_names
                    and pa.types.is_string(table.schema.field(field.name).type)):
                index = table.column_names.index(field.name)
                table = table.set_column(index, field.name, as_time(table.column(field.name), field.type))
        return original(table, target_schema)

    return [replace(write_servicer, "_align_to_target", _align_to_target)]
