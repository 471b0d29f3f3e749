"""Confluent Schema Registry, protobuf flavour: the wire format, and schema ids → message classes.

A framed message is: magic byte 0, the schema id (4 bytes, big-endian), the message indexes (a
zig-zag varint count, then that many zig-zag varint indexes; a lone 0 means [0], the first message),
then the protobuf payload. The indexes walk the schema file: the first picks a top-level message, each
further one a nested message of the previous. Counted as Confluent's Java serializer and registry count
them (`ProtobufSchema.toMessageIndexes`, over the parsed schema text): message declarations only, so the
entry types protoc makes for `map<,>` fields are not counted.

Both value decoders (decode/native.py's C and convert.py's `_parser`) check a frame the same way
(`frame_payload` here is the rule; `_native.c` mirrors it byte for byte, messages included): a value
whose frame names another message of the schema than the class it is decoded as is refused, never
decoded as that class.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc_tools
from google.protobuf import descriptor_pb2, message
from google.protobuf.descriptor import Descriptor

from firehose_bq import redact
from firehose_bq.descriptors import Descriptors
from firehose_bq.errors import SchemaError
from firehose_bq.registry import transport
from firehose_bq.registry.config import RegistryConfig, Secret

MAGIC_BYTE = 0


class WireFormatError(SchemaError):
    """The bytes are not a Confluent-framed message: a problem of that message, not of the registry."""


# Descriptors.moved_indexes of a message an older version does not declare: no frame names it so.
NOT_DECLARED: tuple[int, ...] = ()


@dataclass(frozen=True)
class Frame:
    schema_id: int
    message_indexes: tuple[int, ...]
    payload_offset: int


def parse_frame(data: bytes) -> Frame:
    if len(data) < 6 or data[0] != MAGIC_BYTE:
        raise WireFormatError("not in Confluent's wire format (magic byte 0, schema id, message indexes)")
    count, pos = _read_zigzag(data, 5)
    if count == 0:  # the common case, [0], in one byte
        return Frame(int.from_bytes(data[1:5], "big"), (0,), pos)
    if not 0 < count <= len(data) - pos:
        raise WireFormatError(f"message index count {count} does not fit a {len(data)}-byte message")
    indexes = []
    for _ in range(count):
        index, pos = _read_zigzag(data, pos)
        indexes.append(index)
    return Frame(int.from_bytes(data[1:5], "big"), tuple(indexes), pos)


def frame_payload(data: bytes, expected: tuple[int, ...], name: str) -> int:
    """Where the payload of framed `data` starts, once its frame is known to name message `name`, whose
    indexes are `expected` (`message_indexes`). WireFormatError for a malformed frame, and for one that
    names another message: decoding that as `name` would turn it into a wrong row, silently."""
    frame = parse_frame(data)
    if frame.message_indexes != expected:
        raise WireFormatError(another_message_type(frame, name, shown_indexes(expected)))
    return frame.payload_offset


def another_message_type(frame: Frame, name: str, where: str) -> str:
    """Why a frame naming another message than the class `name` (which is `where`: its indexes, in the
    frame's version) is refused; the C decoder words it the same."""
    return (f"written as another message type: its Confluent frame names message indexes "
            f"{shown_indexes(frame.message_indexes)} (schema id {frame.schema_id}), the configured class {name} "
            f"is {where}")


# How many indexes an error message shows: a hostile frame may carry thousands.
SHOWN_INDEXES = 8


def shown_indexes(indexes: Sequence[int]) -> str:
    """`[1, 0]`; longer lists cut after SHOWN_INDEXES with `, ...` (the C decoder writes the same text)."""
    head = ", ".join(str(i) for i in indexes[:SHOWN_INDEXES])
    return f"[{head}, ...]" if len(indexes) > SHOWN_INDEXES else f"[{head}]"


def message_indexes(descriptor: Descriptor) -> tuple[int, ...]:
    """The message indexes a Confluent serializer writes for messages of `descriptor` (module doc):
    its position among the message declarations of its file, through each enclosing message."""
    path = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        declared = [d for d in parent.nested_types if not d.GetOptions().map_entry]
        path.append(declared.index(descriptor))
        descriptor = parent
    path.append(list(descriptor.file.message_types_by_name.values()).index(descriptor))
    return tuple(reversed(path))


def encode_frame(schema_id: int, message_indexes: Sequence[int], payload: bytes) -> bytes:
    indexes = [] if list(message_indexes) == [0] else [len(message_indexes), *message_indexes]
    varints = b"".join(_zigzag(i) for i in indexes) or b"\x00"
    return bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big") + varints + payload


def _read_zigzag(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of at most 10 bytes, as a signed 64-bit value (bits past 64 dropped, as
    protobuf's own varints)."""
    value = shift = 0
    while shift < 64:
        if pos >= len(data):
            break
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            value &= 0xFFFFFFFFFFFFFFFF
            return (value >> 1) ^ -(value & 1), pos
    raise WireFormatError("truncated or overlong message-index varint")


def _zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes(out) + bytes([raw])


@dataclass(frozen=True)
class ConfluentSchema:
    """One registered schema, compiled with its references into descriptors."""

    schema_id: int
    descriptors: Descriptors
    main_file: str  # the name the schema's own .proto has inside `descriptors`

    def indexes_by_name(self) -> dict[str, tuple[int, ...]]:
        """The message indexes (`message_indexes`) of every message declared in the schema's own file."""
        fds = descriptor_pb2.FileDescriptorSet.FromString(self.descriptors.sets[0])
        file = next(f for f in fds.file if f.name == self.main_file)
        found: dict[str, tuple[int, ...]] = {}

        def walk(prefix: str, messages: Sequence[descriptor_pb2.DescriptorProto], path: tuple[int, ...]) -> None:
            for index, m in enumerate(m for m in messages if not m.options.map_entry):
                found[f"{prefix}{m.name}"] = (*path, index)
                walk(f"{prefix}{m.name}.", m.nested_type, (*path, index))

        walk(f"{file.package}." if file.package else "", file.message_type, ())
        return found

    def message_name(self, indexes: Sequence[int]) -> str:
        """The message at `indexes`: `indexes_by_name` read backwards (one walk, one counting rule)."""
        for name, path in self.indexes_by_name().items():
            if path == tuple(indexes):
                return name
        raise SchemaError(f"schema id {self.schema_id} has no message at indexes {list(indexes)}")


class ConfluentRegistry:
    """Schemas by id from `GET {url}/schemas/ids/{id}`, compiled once per id. Thread-safe."""

    def __init__(self, url: str, *, user_info: Secret | None, timeout_s: float,
                 get: transport.Get = transport.get) -> None:
        self.url = url.rstrip("/")
        self._shown = redact.url(self.url)  # for messages: the URL may carry credentials
        self._user_info = user_info
        self._timeout_s = timeout_s
        self._get = get
        self._lock = threading.Lock()  # also makes concurrent first requests for one id compile it once
        self._schemas: dict[int, ConfluentSchema] = {}
        self._classes: dict[tuple[int, tuple[int, ...]], type[message.Message]] = {}
        # subject → {version: schema id}: a registered version never changes, so each is fetched once.
        self._versions: dict[str, dict[int, int]] = {}

    @classmethod
    def from_config(cls, config: RegistryConfig) -> ConfluentRegistry | None:
        if not config.confluent_url:
            return None
        return cls(config.confluent_url, user_info=config.confluent_basic_auth,
                   timeout_s=config.fetch_timeout_ms / 1000)

    def decode(self, data: bytes) -> message.Message:
        """Parse a framed message with the class its schema id and indexes name."""
        frame = parse_frame(data)
        cls = self.message_class(frame.schema_id, frame.message_indexes)
        return cls.FromString(data[frame.payload_offset:])

    def message_class(self, schema_id: int, indexes: Sequence[int]) -> type[message.Message]:
        key = (schema_id, tuple(indexes))
        known = self._classes.get(key)  # lock-free on the hot path: a dict lookup is atomic
        if known is not None:
            return known
        with self._lock:
            if key not in self._classes:
                schema = self._schema_locked(schema_id)
                self._classes[key] = schema.descriptors.message_class(schema.message_name(indexes))
            return self._classes[key]

    def schema(self, schema_id: int) -> ConfluentSchema:
        with self._lock:
            return self._schema_locked(schema_id)

    def latest(self, subject: str) -> ConfluentSchema:
        """The newest schema registered under `subject` (e.g. `<topic>-value`)."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        body = self._get_json(path, f"the latest schema of subject {subject!r}")
        if not isinstance(body.get("id"), int):
            raise SchemaError(f"subject {subject!r}: {self._shown}{path} answered without a schema `id`")
        return self.schema(body["id"])

    def subject_ids(self, subject: str) -> frozenset[int]:
        """The schema ids of every version registered under `subject`, soft-deleted ones included (records
        written with them are still in the topics). Only versions not seen before are fetched; versions
        that are gone (hard-deleted) are dropped."""
        quoted = urllib.parse.quote(subject, safe="")
        path = f"/subjects/{quoted}/versions?deleted=true"
        listed = self._get_body(path, f"the versions of subject {subject!r}")
        if not isinstance(listed, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in listed):
            raise SchemaError(f"subject {subject!r}: {self._shown}{path} did not answer a list of version numbers")
        with self._lock:
            known = dict(self._versions.get(subject, {}))
        ids = {v: known[v] for v in listed if v in known}
        for version in sorted(set(listed) - set(known)):
            where = f"version {version} of subject {subject!r}"
            body = self._get_json(f"/subjects/{quoted}/versions/{version}?deleted=true", where)
            if not isinstance(body.get("id"), int):
                raise SchemaError(f"{where}: {self._shown} answered without a schema `id`")
            ids[version] = body["id"]
        with self._lock:
            self._versions[subject] = ids
        return frozenset(ids.values())

    def _schema_locked(self, schema_id: int) -> ConfluentSchema:
        if schema_id not in self._schemas:
            self._schemas[schema_id] = self._load(schema_id)
        return self._schemas[schema_id]

    def _load(self, schema_id: int) -> ConfluentSchema:
        where = f"schema id {schema_id}"
        body = self._get_json(f"/schemas/ids/{schema_id}", where)
        if body.get("schemaType", "AVRO") != "PROTOBUF":  # the registry leaves schemaType out for Avro
            raise SchemaError(f"{where} is {body.get('schemaType', 'AVRO')}, not PROTOBUF")
        files: dict[str, str] = {}
        pending = [(ref, where) for ref in body.get("references") or ()]
        while pending:
            ref, parent = pending.pop()
            try:
                name, subject, version = ref["name"], ref["subject"], ref["version"]
            except (KeyError, TypeError):
                raise SchemaError(f"{parent} has a malformed reference {ref!r}") from None
            if name in files:
                continue
            child = f"reference {name!r} (subject {subject!r} version {version}) of {where}"
            path = f"/subjects/{urllib.parse.quote(str(subject), safe='')}/versions/{version}"
            referenced = self._get_json(path, child)
            files[name] = referenced["schema"]
            pending.extend((r, child) for r in referenced.get("references") or ())
        main_file = f"confluent_schema_{schema_id}.proto"
        compiled = compile_proto(main_file, {**files, main_file: body["schema"]}, where)
        source = f"{self._shown}/schemas/ids/{schema_id}"
        return ConfluentSchema(schema_id, Descriptors((compiled,), (source,)), main_file)

    def _get_json(self, path: str, what: str) -> dict[str, Any]:
        """A schema's JSON object (`schema` text, `id`, `references`, ...)."""
        body = self._get_body(path, what)
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise SchemaError(f"{what}: {self._shown}{path} answered without a `schema` text")
        return body

    def _get_body(self, path: str, what: str) -> Any:
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if self._user_info is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(self._user_info.reveal().encode()).decode()
        try:
            body = json.loads(self._get(self.url + path, headers, self._timeout_s))
        except OSError as exc:
            raise transport.failure(f"cannot fetch {what} from the Confluent registry at {self._shown}", exc) from exc
        except ValueError as exc:
            raise SchemaError(f"{what}: {self._shown}{path} did not answer JSON: {exc}") from exc
        return body


def compile_proto(main_file: str, files: Mapping[str, str], what: str) -> bytes:
    """Compile `main_file`, importing from `files` and the well-known types, to a FileDescriptorSet."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="confluent-schema-") as tmp:
        root = Path(tmp, "src")
        for name, text in files.items():
            try:
                path = (root / name).resolve()
                if not path.is_relative_to(root.resolve()):  # names come from the registry: stay in the temp dir
                    raise SchemaError(f"{what}: reference name {name!r} leaves the source tree")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            except ValueError as exc:  # a NUL or a lone surrogate in a name or text: the schema's fault, like a typo
                raise SchemaError(f"{what}: {name!r} cannot be written as a file: {exc}") from exc
        out = Path(tmp, "schema.desc")
        # A subprocess, because protoc prints its errors to the process's stderr and they belong in the
        # SchemaError; run in `root` so that they name `x.proto:1:5`, not the temp dir.
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", "--include_imports", "-I.", f"-I{well_known}",
             f"--descriptor_set_out={out}", main_file],
            cwd=root, capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise SchemaError(f"{what} does not compile: {result.stderr.strip() or result.stdout.strip()}")
        return out.read_bytes()
