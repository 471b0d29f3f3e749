"""Protobuf FileDescriptorSets: fetch them, index them, and build message classes from them.

A `Descriptors` value is immutable and cheap to pickle (it holds the serialized sets), so the driver
loads it once and Spark ships it to the Python workers, which build their own descriptor pool.
"""

from __future__ import annotations

import difflib
import hashlib
import threading
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message, message_factory

from firehose_bq import redact
from firehose_bq.errors import SchemaError

FETCH_TIMEOUT_S = 10


@dataclass(frozen=True)
class Descriptors:
    """One or more serialized FileDescriptorSets, merged into a single lookup space."""

    sets: tuple[bytes, ...]
    sources: tuple[str, ...] = ()
    # Confluent registry: the ids of every version of the subject, the schema ids a framed record may carry
    # (batch/rows.py). None: no such check (Stencil, files).
    schema_ids: frozenset[int] | None = None
    # Confluent registry: schema id → {message name: its message indexes in that version}, for the older
    # versions in which a message's indexes differ from the latest's (a message declared above it since),
    # or () where the version does not declare it (registry.confluent.NOT_DECLARED): their writers' frames
    # name it so (batch/rows.py). Not compared (a dict is not hashable), but in the
    # fingerprint: a version left out once (it did not compile, or its fetch was refused) and learnt on a
    # later refresh changes no text and no id, yet its writers' records land only with the new descriptors.
    moved_indexes: Mapping[int, Mapping[str, tuple[int, ...]]] | None = field(default=None, compare=False)
    _pool: descriptor_pool.DescriptorPool | None = field(default=None, compare=False, repr=False)

    @property
    def fingerprint(self) -> str:
        """Content hash: equal descriptors give equal fingerprints, whatever their source."""
        digest = hashlib.sha256()
        for blob in self.sets:
            digest.update(hashlib.sha256(blob).digest())
        if self.schema_ids is not None:  # a new version with the same text is a change: its id is allowed now
            digest.update(",".join(map(str, sorted(self.schema_ids))).encode())
        if self.moved_indexes:
            digest.update(repr(sorted((i, sorted(names.items())) for i, names in self.moved_indexes.items())).encode())
        return digest.hexdigest()[:16]

    def pool(self) -> descriptor_pool.DescriptorPool:
        if self._pool is None:
            object.__setattr__(self, "_pool", _shared_pool(self.sets))
        assert self._pool is not None
        return self._pool

    def find_message(self, full_name: str) -> descriptor.Descriptor:
        try:
            return self.pool().FindMessageTypeByName(full_name.removeprefix("."))
        except KeyError:
            raise SchemaError(
                f"message {full_name!r} is not in the descriptors from {', '.join(map(redact.url, self.sources))}; "
                f"{_known_messages(full_name, self.message_names())}"
            ) from None

    def message_class(self, full_name: str) -> type[message.Message]:
        return message_factory.GetMessageClass(self.find_message(full_name))

    def message_names(self) -> list[str]:
        names = []
        for blob in self.sets:
            fds = descriptor_pb2.FileDescriptorSet.FromString(blob)
            for file in fds.file:
                prefix = f"{file.package}." if file.package else ""
                names.extend(prefix + m.name for m in file.message_type)
        return names

    def __getstate__(self) -> dict[str, object]:
        # The pool is a C object: workers rebuild it from the bytes.
        return {"sets": self.sets, "sources": self.sources, "schema_ids": self.schema_ids,
                "moved_indexes": self.moved_indexes, "_pool": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)


def load(urls: tuple[str, ...] | list[str]) -> Descriptors:
    """Fetch every URL (file://, plain path, http(s)://) and merge the sets; errors name the URL."""
    if not urls:
        raise SchemaError("no descriptor source configured (SCHEMA_REGISTRY_STENCIL_URLS is empty)")
    blobs = tuple(_fetch(url) for url in urls)
    result = Descriptors(blobs, tuple(urls))
    result.pool()  # fail now, with the URL in the message, rather than in a Spark worker later
    return result


def _fetch(url: str) -> bytes:
    parsed = urllib.parse.urlparse(url)
    try:
        if parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
                data = response.read()
        elif parsed.scheme in ("file", ""):
            path = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else url)
            data = path.read_bytes()
        else:
            raise SchemaError(f"unsupported descriptor URL scheme {parsed.scheme!r} in {redact.url(url)!r}")
    except OSError as exc:
        raise SchemaError(f"cannot read descriptors from {redact.url(url)}: {exc}") from exc
    try:
        descriptor_pb2.FileDescriptorSet.FromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeWarning-ish errors by backend
        raise SchemaError(f"{redact.url(url)} is not a serialized FileDescriptorSet: {exc}") from exc
    return data


def _known_messages(wanted: str, names: list[str], shown: int = 20) -> str:
    """The part of a "message not found" error that helps: the nearest names first, then the set's own
    messages before the imported well-known types, which sort first and would otherwise fill the list."""
    near = difflib.get_close_matches(wanted.removeprefix("."), names, n=2, cutoff=0.8)
    ordered = sorted(set(names), key=lambda name: (name.startswith("google.protobuf."), name))
    more = f" (and {len(ordered) - shown} more)" if len(ordered) > shown else ""
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{hint}known messages: {', '.join(ordered[:shown]) or 'none (the set holds no message)'}{more}"


# The pools this process built, newest last, by their sets' content. A Spark task gets the descriptors
# unpickled, without a pool, with every micro-batch; a large set (a monorepo's, tens of MB) took most of a
# second to build in each task of each batch. Two are kept: the current version and the one before it.
_POOLS: OrderedDict[bytes, descriptor_pool.DescriptorPool] = OrderedDict()
_POOLS_KEPT = 2
_POOLS_LOCK = threading.Lock()


def _shared_pool(sets: tuple[bytes, ...]) -> descriptor_pool.DescriptorPool:
    """The pool of `sets`, built once per process (and content) while it is one of the last two used."""
    digest = hashlib.sha256(b"".join(hashlib.sha256(blob).digest() for blob in sets)).digest()
    with _POOLS_LOCK:
        if digest in _POOLS:
            _POOLS.move_to_end(digest)
            return _POOLS[digest]
    pool = _build_pool(sets)  # outside the lock: a failing or slow build holds no one else up
    with _POOLS_LOCK:
        pool = _POOLS.setdefault(digest, pool)
        _POOLS.move_to_end(digest)
        while len(_POOLS) > _POOLS_KEPT:
            _POOLS.popitem(last=False)
    return pool


def _build_pool(sets: tuple[bytes, ...]) -> descriptor_pool.DescriptorPool:
    """Add every file to a fresh pool, dependencies first, each file once across all sets."""
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for blob in sets:
        for file in descriptor_pb2.FileDescriptorSet.FromString(blob).file:
            files.setdefault(file.name, file)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in added:
            return
        if name not in files:
            raise SchemaError(
                f"descriptor file {chain[-1]!r} imports {name!r}, which no descriptor set contains "
                "(build the set with --include_imports)"
            )
        for dependency in files[name].dependency:
            add(dependency, (*chain, name))
        try:
            pool.Add(_json_names_apart(files[name]))
        except TypeError as exc:
            raise SchemaError(f"descriptor file {name!r} is inconsistent: {exc}") from exc
        added.add(name)

    for name in files:
        add(name, (name,))
    return pool


def _json_names_apart(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """`file`, or a copy in which no two fields of a message share a JSON name.

    protoc only warns when two fields of a proto2 message have one JSON name (`fooBar` and `foo_bar`),
    and Java and C++ load such a file; upb refuses it whole. The sink never uses JSON names (cut messages
    are written with proto field names), so the later field gets a JSON name of its own in the pool: the
    set as fetched, and its fingerprint, stay as they are."""
    def clashes(messages: Iterable[descriptor_pb2.DescriptorProto]) -> bool:
        for m in messages:
            names = [f.json_name if f.HasField("json_name") else _json_name(f.name) for f in m.field]
            if len(set(names)) != len(names) or clashes(m.nested_type):
                return True
        return False

    def apart(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for m in messages:
            taken: set[str] = set()
            for f in m.field:
                name = f.json_name if f.HasField("json_name") else _json_name(f.name)
                while name in taken:
                    name += "_"
                f.json_name = name
                taken.add(name)
            apart(m.nested_type)

    if not clashes(file.message_type):
        return file
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(file)
    apart(copy.message_type)
    return copy


def _json_name(name: str) -> str:
    """protoc's default JSON name: underscores dropped, the letter after each one upper-cased."""
    out, upper = [], False
    for char in name:
        if char == "_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)
