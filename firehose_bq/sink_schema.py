"""Keeping the sink's schema in step: descriptors → table plan → live table → the spec tasks decode with.

`plan_table` turns configuration and descriptors into the table they call for; `apply_plan` creates or
evolves it; `SinkSchema` does both whenever the descriptors' content changes, and hands out the
`SinkSpec` that Spark ships to its Python workers with each micro-batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from google.cloud import bigquery

from firehose_bq.bigquery.client import call_options, make_client
from firehose_bq.bigquery.tables import ensure_dataset, ensure_table, table_definition
from firehose_bq.config import BigQueryConfig, Config
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import FirehoseError
from firehose_bq.registry.cache import DescriptorCache
from firehose_bq.registry.confluent import ConfluentRegistry
from firehose_bq.registry.stencil import StencilFetcher
from firehose_bq.schema import MetadataColumns, SchemaOptions, parse_metadata_columns, table_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkSpec:
    """Everything a Spark task needs to decode and write; pickled to the Python workers."""

    descriptors: Descriptors
    proto_class: str
    metadata: MetadataColumns
    bigquery: BigQueryConfig
    options: SchemaOptions = SchemaOptions()
    key_class: str | None = None
    # Stop before writing a batch holding fields the descriptors lack, so the driver can refresh them.
    hold_on_unknown_fields: bool = False
    confluent_framed: bool = False
    # False = decode and convert only, write nothing (benchmarks measure the pipeline without a sink).
    write: bool = True


@dataclass(frozen=True)
class TablePlan:
    """The destination table that the configuration and the current descriptors call for."""

    descriptors: Descriptors
    message_name: str
    metadata: MetadataColumns
    options: SchemaOptions
    key_name: str | None
    table: bigquery.Table


def plan_table(cfg: Config, loaded: Descriptors) -> TablePlan:
    bq = cfg.bigquery
    message = loaded.find_message(cfg.input_schema.proto_class)
    key = loaded.find_message(cfg.input_schema.key_class) if cfg.input_schema.key_class else None
    metadata = MetadataColumns(bq.add_metadata, bq.metadata_namespace,
                               parse_metadata_columns(bq.metadata_columns_types))
    options = SchemaOptions(bq.record_max_depth, bq.sanitize_field_names, bq.uint64_column_type)
    schema = table_schema(message, metadata, options, key, descriptor_sets=loaded.sets)
    description = (f"Written by firehose-bq from {message.full_name} messages of Kafka topic(s) "
                   f"{', '.join(cfg.source.topics)}.")
    table = table_definition(bq.table_ref, schema, cfg.table, description)
    return TablePlan(loaded, message.full_name, metadata, options, key.full_name if key else None, table)


def apply_plan(client: bigquery.Client, cfg: Config, plan: TablePlan) -> bigquery.Table:
    """Create or evolve the dataset and table so that rows of `plan` fit."""
    call = call_options(cfg.bigquery)
    ensure_dataset(client, cfg.bigquery.project_id, cfg.bigquery.dataset, cfg.bigquery.dataset_location,
                   cfg.table.dataset_labels, **call)
    return ensure_table(client, plan.table, **call)


DescriptorSource = Callable[[], Descriptors]


class SinkSchema:
    """Keeps the sink's spec in step with the descriptors, evolving the table first on a change.

    `descriptor_source` returns the current descriptors (a registry cache refreshing in the
    background, or a fixed set). The pipeline asks for `current()` before every micro-batch and
    ships that spec with it; a registry listener may call `on_descriptors_changed` in between.
    """

    def __init__(self, config: Config, descriptor_source: DescriptorSource | None = None) -> None:
        self.config = config
        self._source = descriptor_source or _fixed(config)
        self._spec: SinkSpec | None = None
        self._lock = threading.Lock()  # the batch thread and a registry listener may both evolve

    def current(self) -> SinkSpec:
        """The spec for the newest descriptors, the table evolved to them first if they changed."""
        # The source is read under the lock: a batch thread holding an older version can then never
        # undo what a listener just applied for a newer one.
        with self._lock:
            loaded = self._source()
            if self._spec is None or self._spec.descriptors.fingerprint != loaded.fingerprint:
                self._spec = self._evolve(loaded)
            return self._spec

    def on_descriptors_changed(self, loaded: Descriptors) -> None:
        """Registry listener: evolve the table now, so new columns exist before new messages do."""
        try:
            self.current()  # reads the same newest descriptors as `loaded`
        except FirehoseError as exc:
            # The next micro-batch meets the same error and stops the job with it.
            log.error("new descriptors %s cannot be applied to the table: %s", loaded.fingerprint, exc)

    def _evolve(self, loaded: Descriptors) -> SinkSpec:
        cfg = self.config
        plan = plan_table(cfg, loaded)
        with make_client(cfg.bigquery) as client:
            apply_plan(client, cfg, plan)
        previous = self._spec.descriptors.fingerprint if self._spec else None
        log.info("descriptors %s%s (%s) → %s, %d columns", f"{previous} → " if previous else "",
                 loaded.fingerprint, plan.message_name, cfg.bigquery.table_ref, len(plan.table.schema))
        return SinkSpec(plan.descriptors, plan.message_name, plan.metadata, cfg.bigquery, plan.options, plan.key_name,
                        confluent_framed=bool(cfg.registry.confluent_url))


def load_descriptors(config: Config) -> Descriptors:
    """The configured descriptors, once: the Stencil URLs, or the Confluent subject's latest schema."""
    registry = ConfluentRegistry.from_config(config.registry)
    if registry is not None:
        return registry.latest(config.confluent_subject).descriptors
    # Through the Stencil fetcher: headers, timeout and refresh strategy as the running job uses them.
    return StencilFetcher(config.input_schema.stencil_urls, config.registry).fetch(threading.Event())


def descriptor_cache(config: Config) -> DescriptorCache:
    """The configured descriptors, refreshed in the background once started."""
    registry = ConfluentRegistry.from_config(config.registry)
    if registry is not None:
        return DescriptorCache.for_confluent(registry, config.confluent_subject, config.registry)
    return DescriptorCache.for_stencil(config.input_schema.stencil_urls, config.registry)


def _fixed(config: Config) -> DescriptorSource:
    """Descriptors loaded once, on first use: for runs without a refreshing registry cache."""
    loaded: list[Descriptors] = []

    def get() -> Descriptors:
        if not loaded:
            loaded.append(load_descriptors(config))
        return loaded[0]

    return get
