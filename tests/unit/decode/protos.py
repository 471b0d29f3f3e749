"""Every test proto of the repository, compiled once per session: the differential tests run on all of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from google.protobuf.descriptor import Descriptor

from firehose_bq import descriptors
from firehose_bq.descriptors import Descriptors
from tests.conftest import compile_protos

REPO = Path(__file__).resolve().parents[3]
# Each tree is its own descriptor pool: v1/v2 (and dlq_v1/dlq_v2) define the same names.
PROTO_TREES = {
    "testdata": REPO / "tests" / "protos",
    "evo_v1": REPO / "tests" / "integration" / "protos" / "v1",
    "evo_v2": REPO / "tests" / "integration" / "protos" / "v2",
    "dlq_v1": REPO / "tests" / "integration" / "protos" / "dlq_v1",
    "dlq_v2": REPO / "tests" / "integration" / "protos" / "dlq_v2",
    "registry": REPO / "tests" / "unit" / "registry" / "protos",
    "example": REPO / "proto",
}


def load_trees(out: Path) -> dict[str, Descriptors]:
    return {name: descriptors.load([str(compile_protos(out / f"{name}.desc", root))])
            for name, root in PROTO_TREES.items()}


def messages(tree: Descriptors) -> Iterator[Descriptor]:
    """Every message type the tree's own files define (nested ones too), map entries excluded."""
    def walk(desc: Descriptor) -> Iterator[Descriptor]:
        if desc.GetOptions().map_entry:
            return
        yield desc
        for nested in desc.nested_types:
            yield from walk(nested)

    for name in tree.message_names():
        if not name.startswith("google."):
            yield from walk(tree.find_message(name))
