"""A load job that creates its destination keeps ``timePartitioning`` and ``clustering``.

In BigQuery a load job's ``timePartitioning`` / ``clustering`` apply to the table it creates.
``executor._maybe_create_load_destination`` builds the new table's metadata from the schema alone, so
``get_table`` afterwards shows no partitioning. The wrapper copies the load configuration's
``timePartitioning`` and ``clustering`` onto the new table, parsed by the ``tables`` route's own helpers.

Shown by tests/integration/test_emulator_gaps.py::test_load_job_keeps_time_partitioning.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Wrap ``_maybe_create_load_destination`` to copy partitioning and clustering onto a new table."""
    executor = module("bqemulator.jobs.executor")
    tables = module("bqemulator.api.routes.tables")
    original = require(executor, "_maybe_create_load_destination")
    to_partitioning = require(tables, "_rest_to_time_partitioning")
    to_clustering = require(tables, "_rest_to_clustering")

    def _maybe_create_load_destination(
        *,
        dest_project: str,
        dest_dataset: str,
        dest_table_id: str,
        load_config: dict[str, Any],
        now: Any,
        ctx: Any,
    ) -> None:
        existed = ctx.catalog.get_table(dest_project, dest_dataset, dest_table_id) is not None
        original(
            dest_project=dest_project,
            dest_dataset=dest_dataset,
            dest_table_id=dest_table_id,
            load_config=load_config,
            now=now,
            ctx=ctx,
        )
        meta = ctx.catalog.get_table(dest_project, dest_dataset, dest_table_id)
        if existed or meta is None:
            return
        update: dict[str, Any] = {}
        if load_config.get("timePartitioning") and meta.time_partitioning is None:
            update["time_partitioning"] = to_partitioning(load_config["timePartitioning"], None)
        if load_config.get("clustering") and meta.clustering is None:
            update["clustering"] = to_clustering(load_config["clustering"], None)
        if update:
            ctx.catalog.update_table(meta.model_copy(update=update))

    return [replace(executor, "_maybe_create_load_destination", _maybe_create_load_destination)]
