"""Routing: which table (and which protobuf class) each Kafka record goes to, from its attributes.

A record's attributes are its Kafka headers (`${header.NAME}`), its topic (`${topic}`), partition
(`${partition}`) and key (`${key}`, as UTF-8 text). The dataset and table names may be templates over
them; a route map may pick the protobuf message class by one header's value (seed 004's route map;
e.g. CloudEvents' `ce_type`). Everything here is column-wise over the source's Arrow batch: attributes
are extracted in Arrow, and a template is rendered once per distinct combination of values, not per
record.

A resolved name is sanitized like a column name (`schema.sanitize_name`: characters other than ASCII
letters, digits and `_` become `_`, a leading digit gets a `_` in front) and then validated; it only ever reaches SQL or
an API as an identifier the upsert/table code quotes. A table name's own text may also hold dashes, as
BigQuery's table names may (`orders-v2`, `events-${header.type}`); the values put into it never keep one
(`eu-west` gives `..._eu_west`, as it always did). A record whose route cannot be resolved (a
missing attribute, a class header value the map does not name and no default class) is *unrouted*:
it goes to the fallback output, or is a ROUTING_ERROR for the error policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from firehose_bq.errors import ErrorType, RowError
from firehose_bq.schema import sanitize_chars, sanitize_name

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
# Attributes a template may name besides `header.NAME`.
SOURCE_ATTRIBUTES = ("topic", "partition", "key")
HEADER_PREFIX = "header."
# BigQuery's limits on dataset and table names (characters).
MAX_DATASET_NAME = 1024
MAX_TABLE_NAME = 1024
# BigQuery's dataset names: letters, digits, `_`, anywhere (`2024_events` too). Its table names take Unicode
# letters, marks, numbers, connectors, dashes and spaces; this sink keeps to ASCII letters, digits, `_` and
# `-` (not first: a name read as an option by `bq` and shells), which SQL and every API take quoted.
DATASET_NAME = re.compile(r"[A-Za-z0-9_]+")
TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


class TemplateError(ValueError):
    """A name template names something that is not an attribute."""


@dataclass(frozen=True)
class NameTemplate:
    """A dataset or table name with `${...}` placeholders; plain text is the name itself."""

    text: str
    table: bool = False  # a table's name, which may hold dashes; else a dataset's

    def __post_init__(self) -> None:
        for name in self.attributes:
            header = name.startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX)
            if not header and name not in SOURCE_ATTRIBUTES:
                raise TemplateError(f"{self.text!r}: unknown placeholder ${{{name}}} (use ${{header.NAME}}, "
                                    f"{', '.join('${' + a + '}' for a in SOURCE_ATTRIBUTES)})")

    @property
    def attributes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.group(1) for m in PLACEHOLDER.finditer(self.text)))

    @property
    def is_template(self) -> bool:
        return bool(self.attributes)

    def render(self, values: Mapping[str, str | None]) -> str | None:
        """The name for these attribute values, sanitized; None when an attribute it needs is missing."""
        if any(values.get(a) is None for a in self.attributes):
            return None
        name = PLACEHOLDER.sub(lambda m: sanitize_chars(values[m.group(1)] or ""), self.text)
        if self.text[:1].isdigit():
            # The job's own text, checked at start, starts the name: BigQuery takes its leading digit as it is.
            return name
        # The text around the values is the job's own, checked at start: a table's keeps its dashes. A
        # value's leading digit gets a `_`, as it always has (the tables of running jobs keep their names).
        return sanitize_name(name, limit=None, dashes=self.table)


@dataclass(frozen=True)
class Destination:
    """Where a group of records goes: a table, and the message class its values are decoded with."""

    dataset: str
    table: str
    proto_class: str | None = None  # None: JSON input (the table's schema is the schema)
    streaming: bool = False  # `mixed` output: this table is streamed (else loaded from files)

    @property
    def name(self) -> str:
        return f"{self.dataset}.{self.table}"


@dataclass
class Assignment:
    """A source batch split by destination: the source indices of each group, in source order."""

    groups: list[tuple[Destination, np.ndarray]] = field(default_factory=list)
    unrouted: list[RowError] = field(default_factory=list)


@dataclass(frozen=True)
class Router:
    """Templates and the class route map, from configuration; picklable (shipped to every task)."""

    dataset: NameTemplate
    table: NameTemplate
    default_class: str | None = None
    class_header: str | None = None
    class_routes: tuple[tuple[str, str], ...] = ()  # (header value, message class)
    # `mixed` output: the tables to stream (templates rendered per record); None: not mixed.
    streaming: tuple[NameTemplate, ...] | None = None
    max_destinations: int = 100  # per task, Kafka partition and micro-batch (SINK_BIGQUERY_MAX_DESTINATIONS_PER_TASK)
    concurrent_writes: int = 8  # destination tables a task writes at once (SINK_BIGQUERY_CONCURRENT_TABLE_WRITES)

    @property
    def is_static(self) -> bool:
        """One destination for every record: no template, no class routing."""
        templates = (self.dataset, self.table, *(self.streaming or ()))
        return not (any(t.is_template for t in templates) or self.class_header)

    def static_destination(self) -> Destination:
        assert self.is_static, "a routed job has no single destination"
        return Destination(self.dataset.text, self.table.text, self.default_class, self._streams(self.table.text, {}))

    def attributes(self) -> tuple[str, ...]:
        header = (HEADER_PREFIX + self.class_header,) if self.class_header else ()
        streaming = tuple(a for t in self.streaming or () for a in t.attributes)
        return tuple(dict.fromkeys(self.dataset.attributes + self.table.attributes + header + streaming))

    def _streams(self, table: str, values: Mapping[str, str | None]) -> bool:
        # A plain entry names the table as written too: a static table is used as written, while rendering
        # gives a name with a reserved prefix (`_partition_log`) a `_` in front, which it would never equal.
        return any(t.render(values) == table or (not t.is_template and t.text == table) for t in self.streaming or ())

    def assign(self, source: pa.RecordBatch) -> Assignment:
        """Each record's destination, or why it has none."""
        out = Assignment()
        if self.is_static:
            out.groups.append((self.static_destination(), np.arange(source.num_rows)))
            return out
        names = self.attributes()
        columns = {name: attribute(source, name) for name in names}
        index = pa.array(np.arange(source.num_rows))
        grouped = pa.table({**{f"a{i}": columns[n] for i, n in enumerate(names)}, "i": index}) \
            .group_by([f"a{i}" for i in range(len(names))], use_threads=False).aggregate([("i", "list")])
        routes = dict(self.class_routes)
        by_destination: dict[Destination, list[np.ndarray]] = {}
        for row in grouped.to_pylist():  # one per distinct combination of attribute values
            values = {n: row[f"a{i}"] for i, n in enumerate(names)}
            members = np.asarray(row["i_list"], dtype=np.int64)
            destination, reason = self._resolve(values, routes)
            if destination is None:
                out.unrouted.extend(RowError(int(i), ErrorType.ROUTING_ERROR, reason) for i in members)
            else:
                by_destination.setdefault(destination, []).append(members)
        for destination, parts in by_destination.items():
            out.groups.append((destination, np.sort(np.concatenate(parts))))
        out.groups.sort(key=lambda g: int(g[1][0]))
        out.unrouted.sort(key=lambda f: f.index)
        return out

    def _resolve(self, values: Mapping[str, str | None], routes: Mapping[str, str]) -> tuple[Destination | None, str]:
        proto_class = self.default_class
        if self.class_header:
            chosen = values[HEADER_PREFIX + self.class_header]
            proto_class = routes.get(chosen, self.default_class) if chosen is not None else self.default_class
            if proto_class is None:
                return None, (f"header {self.class_header}={chosen!r} names no message class in "
                              "INPUT_SCHEMA_PROTO_CLASS_ROUTES" if chosen is not None
                              else f"no header {self.class_header} (absent, null, or not UTF-8) to pick the message "
                                   "class by")
        dataset, table = self.dataset.render(values), self.table.render(values)
        if dataset is None or table is None:
            missing = [a for a in self.dataset.attributes + self.table.attributes if values.get(a) is None]
            return None, (f"no {', '.join(dict.fromkeys(missing))} (absent, null, or not UTF-8) to name the "
                          "destination table by")
        problem = name_problem(dataset, table=False) or name_problem(table, table=True)
        if problem:
            return None, f"destination {dataset}.{table}: {problem}"
        return Destination(dataset, table, proto_class, self._streams(table, values)), ""


def name_problem(name: str, table: bool) -> str | None:
    """Why BigQuery (or this sink) would not take `name` as a table's (else a dataset's) name, or None."""
    if not name:
        return "an empty name"
    limit = MAX_TABLE_NAME if table else MAX_DATASET_NAME
    if len(name) > limit:
        return f"a name longer than {limit} characters"
    if not (TABLE_NAME if table else DATASET_NAME).fullmatch(name):
        return (f"{name!r} is not a valid BigQuery {'table' if table else 'dataset'} name (ASCII letters, digits"
                f"{', _ and -; not starting with -' if table else ' and _'})")
    return None


def attribute(source: pa.RecordBatch, name: str) -> pa.Array:
    """One attribute of every record as text (NULL where the record has none)."""
    if name == "topic":
        return source["topic"].cast(pa.string())
    if name == "partition":
        return source["partition"].cast(pa.string())
    if name == "key":
        return _text(source["key"])
    return header_values(source["headers"], name.removeprefix(HEADER_PREFIX))


def header_values(headers: pa.Array, name: str) -> pa.Array:
    """The value of header `name` of each record as text: the last one when a record repeats it, NULL
    when it has none (or its value is NULL or not UTF-8)."""
    n = len(headers)
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy()
    hits = np.flatnonzero(pc.fill_null(pc.equal(flat.field("key"), name), False).to_numpy(zero_copy_only=False))
    chosen = np.full(n, -1, dtype=np.int64)
    chosen[parents[hits]] = hits  # in order: a later header of a record overwrites an earlier one
    values = _text(flat.field("value").take(pa.array(np.where(chosen >= 0, chosen, 0)))) if len(flat) else \
        pa.nulls(n, pa.string())
    return pc.if_else(pa.array(chosen >= 0), values, pa.scalar(None, pa.string()))


def _text(values: pa.Array) -> pa.Array:
    """Binary values as UTF-8 text; values that are not UTF-8 become NULL (they name nothing)."""
    try:
        return values.cast(pa.string())  # validates UTF-8 in one pass
    except pa.ArrowInvalid:
        pass
    # Rare: some value is not UTF-8; find which, one by one.
    return pa.array([_utf8(v) for v in values.to_pylist()], pa.string())


def _utf8(value: bytes | None) -> str | None:
    try:
        return None if value is None else value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_class_routes(text: str) -> tuple[tuple[str, str], ...]:
    """`value=pkg.Message,value2=pkg.Other` → pairs; ValueError naming what is wrong."""
    routes: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        value, equals, message = (p.strip() for p in item.partition("="))
        if not equals or not value or not message:
            raise ValueError(f"{item!r}: expected header-value=package.Message")
        if value in routes:
            raise ValueError(f"header value {value!r} is routed twice")
        routes[value] = message
    return tuple(routes.items())


def router_of(dataset: str, table: str, default_class: str | None, class_header: str | None,
              class_routes: str) -> Router:
    return Router(NameTemplate(dataset), NameTemplate(table, table=True), default_class or None, class_header or None,
                  parse_class_routes(class_routes))


__all__: Sequence[str] = ["Assignment", "Destination", "NameTemplate", "Router", "TemplateError", "router_of"]
