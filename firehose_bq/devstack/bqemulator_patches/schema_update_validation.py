"""Gap 3, part 1: ``tables.patch`` / ``tables.update`` refuse the schema changes BigQuery refuses.

BigQuery accepts new NULLABLE/REPEATED fields (also inside RECORDs) and REQUIRED → NULLABLE, and answers
400 "Provided Schema does not match Table" to anything else: a dropped field, a changed type, a
tightened mode, a new REQUIRED field. bqemulator accepts any new schema as metadata, and the storage
reconciliation of ``schema_update_storage`` can only add and relax columns, so anything else would
leave metadata and storage out of step.

Shown by tests/integration/test_emulator_gaps.py::test_gap3_incompatible_schema_changes_are_rejected.
"""

from collections.abc import Sequence
from typing import Any

from ._bq_types import canonical_type, mode
from ._targets import module, replace, require


def _field_path_changes(old: Sequence[Any], new: Sequence[Any], prefix: str = "") -> str | None:
    """Describe the first schema change BigQuery would refuse, or give ``None``.

    Allowed: new NULLABLE/REPEATED fields (also inside RECORDs), and
    REQUIRED to NULLABLE. Refused: dropping fields, changing types, tightening
    modes, and new REQUIRED fields.
    """
    new_by_name = {f.name.lower(): f for f in new}
    for old_field in old:
        path = f"{prefix}{old_field.name}"
        new_field = new_by_name.get(old_field.name.lower())
        if new_field is None:
            return f"Field {path} is missing in new schema"
        old_type, new_type = canonical_type(old_field.type), canonical_type(new_field.type)
        if old_type != new_type:
            return f"Field {path} has changed type from {old_type} to {new_type}"
        old_mode, new_mode = mode(old_field), mode(new_field)
        if old_mode != new_mode and not (old_mode == "REQUIRED" and new_mode == "NULLABLE"):
            return f"Field {path} has changed mode from {old_mode} to {new_mode}"
        if old_type == "RECORD":
            nested = _field_path_changes(old_field.fields, new_field.fields, f"{path}.")
            if nested:
                return nested
    old_names = {f.name.lower() for f in old}
    for new_field in new:
        if new_field.name.lower() not in old_names and mode(new_field) == "REQUIRED":
            return f"Cannot add required fields to an existing schema. (field: {prefix}{new_field.name})"
    return None


def apply() -> list[str]:
    """Wrap ``_rest_to_table_meta`` so that an incompatible schema change answers 400."""
    tables = module("bqemulator.api.routes.tables")
    errors_mod = module("bqemulator.domain.errors")
    # patch_table / update_table look this helper up at call time; insert_table passes existing=None.
    original = require(tables, "_rest_to_table_meta")
    validation_error = require(errors_mod, "ValidationError")

    def _rest_to_table_meta(
        project_id: str, dataset_id: str, body: dict[str, Any], clock: Any, existing: Any = None
    ) -> Any:
        updated = original(project_id, dataset_id, body, clock, existing)
        if existing is not None and existing.table_type == "TABLE" and existing.schema_.fields:
            problem = _field_path_changes(existing.schema_.fields, updated.schema_.fields)
            if problem:
                ref = f"{project_id}:{dataset_id}.{existing.table_id}"
                raise validation_error(f"Provided Schema does not match Table {ref}. {problem}")
        return updated

    return [replace(tables, "_rest_to_table_meta", _rest_to_table_meta)]
