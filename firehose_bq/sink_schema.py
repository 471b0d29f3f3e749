"""Keeping the sink's schema in step: descriptors → table plan → live table → the spec tasks decode with.

`plan_table` turns configuration and descriptors into the table they call for; `apply_plan` creates or
evolves it; `SinkSchema` does both whenever the descriptors' content changes, and hands out the
`SinkSpec` that Spark ships to its Python workers with each micro-batch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.cloud import bigquery

from firehose_bq.bigquery.classify import classify_exception, rejects_request
from firehose_bq.bigquery.client import REQUEST_ERRORS, Clients, call_options, make_client
from firehose_bq.bigquery.tables import ensure_dataset, ensure_table, table_definition
from firehose_bq.config import Config
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import FirehoseError, SchemaError, SinkError
from firehose_bq.registry.cache import DescriptorCache, Fetch, confluent_fetch, fetch_retrying
from firehose_bq.registry.confluent import ConfluentRegistry
from firehose_bq.registry.stencil import StencilFetcher
from firehose_bq.routing import Destination, Router

if TYPE_CHECKING:
    from firehose_bq.json_tables import JsonTableSchema
from firehose_bq.schema import MetadataColumns, SchemaOptions, parse_metadata_columns, table_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkSpec:
    """Everything a task needs to decode records into table rows; pickled to the Python workers.
    (Where the rows go is the write mode's TaskPlan.)"""

    descriptors: Descriptors | None  # None: JSON input
    proto_class: str
    metadata: MetadataColumns
    options: SchemaOptions = SchemaOptions()
    key_class: str | None = None
    # Stop before writing a batch holding fields the descriptors lack, so the driver can refresh them.
    hold_on_unknown_fields: bool = False
    confluent_framed: bool = False
    # The Confluent subject whose versions' ids (`descriptors.schema_ids`) a framed value may carry.
    schema_subject: str | None = None
    # False = decode only, write nothing (benchmarks measure the pipeline without a sink).
    write: bool = True
    decoder: str = "auto"  # INPUT_SCHEMA_PROTO_DECODER: auto | native | python
    router: Router | None = None  # None: every record to the one table the driver keeps
    tables: TableKeeper | None = None  # routed jobs: what creates and evolves the tables the records name
    # JSON input: the one table's payload columns (json_tables.schema_json); routed jobs' come per table.
    json_columns: tuple[str, ...] | None = None
    # SINK_BIGQUERY_ADDITIONAL_PROPERTIES_ENABLE: JSON input's decoder fills the column; protobuf's rows get
    # their unknown fields' values there (decode/unknown.py).
    additional_properties: bool = False

    @property
    def json(self) -> bool:
        return self.descriptors is None


@dataclass(frozen=True)
class TablePlan:
    """The destination table that the configuration and the current descriptors call for."""

    descriptors: Descriptors
    message_name: str
    metadata: MetadataColumns
    options: SchemaOptions
    key_name: str | None
    table: bigquery.Table


def metadata_of(cfg: Config) -> MetadataColumns:
    bq = cfg.bigquery
    return MetadataColumns(bq.add_metadata, bq.metadata_namespace, parse_metadata_columns(bq.metadata_columns_types))


def options_of(cfg: Config) -> SchemaOptions:
    bq = cfg.bigquery
    return SchemaOptions(bq.record_max_depth, bq.sanitize_field_names, bq.uint64_column_type)


def plan_table(cfg: Config, loaded: Descriptors, destination: Destination | None = None) -> TablePlan:
    """The table for `destination` (default: the job's one table) and the descriptors `loaded`."""
    destination = destination or cfg.router.static_destination()
    bq = cfg.bigquery
    assert destination.proto_class, "a protobuf destination names its message class"
    message = loaded.find_message(destination.proto_class)
    key = loaded.find_message(cfg.input_schema.key_class) if cfg.input_schema.key_class else None
    metadata, options = metadata_of(cfg), options_of(cfg)
    schema = table_schema(message, metadata, options, key, descriptor_sets=loaded.sets,
                          additional_properties=bq.additional_properties)
    description = (f"Written by firehose-bq from {message.full_name} messages of Kafka topic(s) "
                   f"{', '.join(cfg.source.topics)}.")
    table = table_definition(f"{bq.project_id}.{destination.dataset}.{destination.table}", schema, cfg.table,
                             description)
    return TablePlan(loaded, message.full_name, metadata, options, key.full_name if key else None, table)


def apply_plan(client: bigquery.Client, cfg: Config, plan: TablePlan,
               on_change: Callable[[str], None] | None = None, dataset_ready: bool = False) -> bigquery.Table:
    """Create or evolve the dataset and table so that rows of `plan` fit; `dataset_ready`: the caller has
    just ensured the dataset (for another of its tables), which is not checked again."""
    call = call_options(cfg.bigquery)
    if not dataset_ready:
        ensure_dataset(client, cfg.bigquery.project_id, plan.table.dataset_id, cfg.bigquery.dataset_location,
                       cfg.table.dataset_labels, **call)
    return ensure_table(client, plan.table, on_change, **call)


def spec_of(cfg: Config, loaded: Descriptors, proto_class: str) -> SinkSpec:
    """What tasks decode with, for the descriptors `loaded`; routed jobs also get what creates and
    evolves their tables (which only the records name)."""
    router = cfg.router
    return SinkSpec(loaded, proto_class, metadata_of(cfg), options_of(cfg), cfg.input_schema.key_class,
                    confluent_framed=bool(cfg.registry.confluent_url), decoder=cfg.input_schema.decoder,
                    schema_subject=cfg.confluent_subject if cfg.registry.confluent_url else None,
                    router=router, tables=None if router.is_static else TableKeeper(cfg),
                    additional_properties=cfg.bigquery.additional_properties)


@dataclass(frozen=True)
class Ensured:
    """A routed table as `TableKeeper.ensure` left it: its live columns, and with JSON input its payload
    columns as schema_json."""

    schema: list[bigquery.SchemaField]
    json_columns: tuple[str, ...] | None = None
    kept: bool = False  # taken from a worker's earlier check (CheckedTables), not made by this call


class CheckedTables:
    """The routed tables a Python worker has checked (`TableKeeper.ensure`), kept from one of its tasks to
    the next for SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS.

    Without them every task of every micro-batch checked each table its records named: a `tables.get` each
    (tens of milliseconds on BigQuery, one after another), so a job routed to 200 tables spent seconds of
    each task on checks, and its tasks together could pass BigQuery's 100 API requests a second per method.
    A check is kept for the same job settings, destination and descriptors (new descriptors check again at
    once); a task that saw a request fail as a whole drops them all (`clear`), as it drops its clients; and a
    write that finds no table where its task trusted a kept check checks it again, creating the table
    (batch/core.py `_heals`). Only tables the tasks write themselves are kept (`TaskPlan.writes_to_table`).
    Each entry is a table's columns: a bound on their number keeps a template over a high-cardinality
    attribute from growing a worker without end (past it, the expired go first, then the oldest)."""

    LIMIT = 2_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[Hashable, tuple[float, Ensured]] = {}  # insertion order: oldest first

    def get(self, key: Hashable, ttl_s: float) -> Ensured | None:
        """The check kept under `key` if it is younger than `ttl_s`."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() - entry[0] >= ttl_s:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: Hashable, ensured: Ensured, ttl_s: float) -> None:
        self._entries.pop(key, None)
        if len(self._entries) >= self.LIMIT:
            now = self._clock()
            self._entries = {k: e for k, e in self._entries.items() if now - e[0] < ttl_s}
        while len(self._entries) >= self.LIMIT:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (self._clock(), ensured)

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class TableKeeper:
    """Creates and evolves a routed job's tables from inside its tasks: only the records name them.
    A task calls `ensure` once per destination it writes, with the descriptors it decodes with."""

    config: Config

    @functools.cached_property
    def _settings(self) -> str:
        """The job's settings, as a key part of its checks (`CheckedTables`): a worker may run the tasks of
        more than one job of a Spark application, and a table is planned from the settings too (metadata
        columns, partitioning, labels). Computed in the worker, once per task (each unpickles its spec)."""
        return hashlib.blake2b(repr(self.config).encode(), digest_size=16).hexdigest()

    def ensure(self, loaded: Descriptors | None, destination: Destination, clients: Clients,
               dataset_ready: bool = False, kept: CheckedTables | None = None) -> Ensured:
        """`destination`'s table as `check` leaves it, or as a check in `kept` (the worker's) left it less than
        SINK_BIGQUERY_TABLE_SCHEMA_CACHE_TTL_MS ago for the same settings and descriptors."""
        if kept is None:
            return self.check(loaded, destination, clients, dataset_ready)
        key, ttl = self._key(loaded, destination), self.config.bigquery.table_schema_cache_ttl_ms / 1000
        if (ensured := kept.get(key, ttl)) is not None:
            return dataclasses.replace(ensured, kept=True)
        ensured = self.check(loaded, destination, clients, dataset_ready)
        kept.put(key, ensured, ttl)
        return ensured

    def forget(self, loaded: Descriptors | None, destination: Destination, kept: CheckedTables) -> None:
        """Drop `kept`'s check of `destination`: the table turned out to be gone."""
        kept.forget(self._key(loaded, destination))

    def _key(self, loaded: Descriptors | None, destination: Destination) -> Hashable:
        return self._settings, destination, None if loaded is None else loaded.fingerprint

    def check(self, loaded: Descriptors | None, destination: Destination, clients: Clients,
              dataset_ready: bool = False) -> Ensured:
        """Create or evolve `destination`'s table; return its live columns as this call left them (the task's
        writer for the table starts from them instead of reading them again) and, with JSON input (`loaded`
        None), its payload columns (json_tables.schema_json), which are what its records are coerced to. The
        calls go through the task's `clients` (the worker's, as its writers'): a client of its own per call
        would cost every task, per micro-batch and per destination table, new credentials and their token (ADC:
        a metadata server lookup; a key file: a signed OAuth request) and a new connection. `dataset_ready`: the
        task ensured the destination's dataset already, for another of its tables (a template over the table
        name alone puts them all in one dataset: one datasets.get per task, not one per table)."""
        from firehose_bq import json_tables

        try:
            client = clients.bigquery_client(self.config.bigquery)
            if loaded is None:
                metadata = metadata_of(self.config)
                live = json_tables.ensure_json_table(client, self.config, destination, metadata, dataset_ready)
                return Ensured(live, json_tables.schema_json(json_tables.payload_columns(live, metadata)))
            table = apply_plan(client, self.config, plan_table(self.config, loaded, destination),
                               dataset_ready=dataset_ready)
            return Ensured(list(table.schema))
        except REQUEST_ERRORS as exc:
            if rejects_request(exc):
                # BigQuery refused this dataset or table itself (a name it does not take, a schema it will
                # not apply): the records' attributes chose it, so their records fail alone (the caller's
                # ROUTING_ERROR); stopping would stop again on every restart, for one record's header.
                raise SchemaError(f"BigQuery refused to create or evolve it: {exc}") from exc
            # After the client's own retries: a reason for the task to stop (a SinkError), not a crash
            # that Spark would run again (spark.task.maxFailures times on a cluster).
            raise SinkError(classify_exception(exc), f"creating or evolving table {destination.name} failed: "
                                                     f"{exc}") from exc


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
        self._json: JsonTableSchema | None = None
        self._lock = threading.Lock()  # the batch thread and a registry listener may both evolve
        self.table_updates = 0  # tables this driver created or evolved (metrics)

    def current(self) -> SinkSpec:
        """The spec for the newest descriptors, the table evolved to them first if they changed."""
        if self.config.input_schema.data_type == "JSON":
            return self._json_spec()
        # The source is read under the lock: a batch thread holding an older version can then never
        # undo what a listener just applied for a newer one.
        with self._lock:
            loaded = self._source()
            if self._spec is None or self._spec.descriptors.fingerprint != loaded.fingerprint:
                self._spec = self._evolve(loaded)
            return self._spec

    def _json_spec(self) -> SinkSpec:
        """JSON input: no descriptors; the table (re-read after its TTL) is the schema."""
        from firehose_bq.json_tables import JsonTableSchema

        cfg, router = self.config, self.config.router
        if self._json is None:
            self._json = JsonTableSchema(cfg, metadata_of(cfg))
        return SinkSpec(None, "", metadata_of(cfg), options_of(cfg), None, decoder=cfg.input_schema.decoder,
                        router=router, tables=None if router.is_static else TableKeeper(cfg),
                        json_columns=self._json.columns() if router.is_static else None,
                        additional_properties=cfg.bigquery.additional_properties)

    def _table_changed(self, what: str) -> None:
        self.table_updates += 1

    def on_descriptors_changed(self, loaded: Descriptors) -> None:
        """Registry listener: evolve the table now, so new columns exist before new messages do."""
        try:
            self.current()  # reads the same newest descriptors as `loaded`
        except FirehoseError as exc:
            # The next micro-batch meets the same error and stops the job with it.
            log.error("new descriptors %s cannot be applied to the table: %s", loaded.fingerprint, exc)

    def _evolve(self, loaded: Descriptors) -> SinkSpec:
        cfg = self.config
        router = cfg.router
        if not router.is_static:
            # Tables are named by the records: tasks create and evolve them. Every class the routes name
            # must be in the descriptors now, not when its first record comes.
            for name in sorted({router.default_class, *(c for _, c in router.class_routes)} - {None}):
                loaded.find_message(name)
            log.info("descriptors %s: routing to %s.%s", loaded.fingerprint, router.dataset.text, router.table.text)
            return spec_of(cfg, loaded, router.default_class or "")
        plan = plan_table(cfg, loaded)
        with make_client(cfg.bigquery) as client:
            apply_plan(client, cfg, plan, self._table_changed)
        previous = self._spec.descriptors.fingerprint if self._spec else None
        log.info("descriptors %s%s (%s) → %s, %d columns", f"{previous} → " if previous else "",
                 loaded.fingerprint, plan.message_name, cfg.bigquery.table_ref, len(plan.table.schema))
        return spec_of(cfg, loaded, plan.message_name)


def load_descriptors(config: Config) -> Descriptors:
    """The configured descriptors, once: the Stencil URLs, or the Confluent subject's latest schema;
    retried as a job's first load is (someone waits)."""
    registry = ConfluentRegistry.from_config(config.registry)
    fetch: Fetch
    if registry is not None:
        fetch = confluent_fetch(registry, config.confluent_subject)
    else:
        # Through the Stencil fetcher: headers, timeout and refresh strategy as the running job uses them.
        fetch = StencilFetcher(config.input_schema.stencil_urls, config.registry, messages=job_classes(config)).fetch
    return fetch_retrying(fetch, config.registry.quick_backoff(), "loading the descriptors")


def descriptor_cache(config: Config) -> DescriptorCache:
    """The configured descriptors, refreshed in the background once started."""
    registry = ConfluentRegistry.from_config(config.registry)
    if registry is not None:
        return DescriptorCache.for_confluent(registry, config.confluent_subject, config.registry)
    return DescriptorCache.for_stencil(config.input_schema.stencil_urls, config.registry, job_classes(config))


def job_classes(config: Config) -> tuple[str, ...]:
    """Every message class the job decodes: the value's (or each route's) and the key's."""
    router = config.router
    names = {router.default_class, *(c for _, c in router.class_routes), config.input_schema.key_class}
    return tuple(sorted(n for n in names if n))


def _fixed(config: Config) -> DescriptorSource:
    """Descriptors loaded once, on first use: for runs without a refreshing registry cache."""
    loaded: list[Descriptors] = []

    def get() -> Descriptors:
        if not loaded:
            loaded.append(load_descriptors(config))
        return loaded[0]

    return get
