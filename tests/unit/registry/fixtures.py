"""Helpers shared by the registry tests (unit and integration): fixture sets and a fake HTTP GET."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.conftest import compile_protos

PROTOS = Path(__file__).parent / "protos"
MONEY_PROTO = (PROTOS / "regtest" / "money.proto").read_text()
ORDER_PROTO = (PROTOS / "regtest" / "order.proto").read_text()


def regtest_set(tmp: Path) -> bytes:
    """regtest/order.proto and regtest/money.proto (with imports) as one serialized FileDescriptorSet."""
    return compile_protos(tmp / "regtest.desc", PROTOS).read_bytes()


def with_new_field(blob: bytes, message: str = "Header", field: str = "added") -> bytes:
    """The same set with one more string field on regtest.<message>: what a schema change looks like."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(blob)
    target = next(m for f in fds.file if f.package == "regtest" for m in f.message_type if m.name == message)
    target.field.add(name=field, json_name=field, number=max(f.number for f in target.field) + 1,
                     type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                     label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return fds.SerializeToString()


class FakeGet:
    """Stands in for transport.get: answers from `routes` (bytes, an exception, or a list of those, used
    in turn) and records every request."""

    def __init__(self, routes: Mapping[str, object]) -> None:
        self.routes = dict(routes)
        self.requests: list[tuple[str, dict[str, str], float]] = []

    def __call__(self, url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
        self.requests.append((url, dict(headers), timeout_s))
        answer = self.routes[url]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, bytes)
        return answer

    def urls(self) -> list[str]:
        return [url for url, _, _ in self.requests]


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
