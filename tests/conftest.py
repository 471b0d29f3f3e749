"""Test-wide fixtures: descriptor sets compiled from tests/protos with grpcio-tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from firehose_bq import descriptors
from firehose_bq.descriptors import Descriptors

TEST_PROTOS = Path(__file__).parent / "protos"


def compile_protos(out: Path, root: Path = TEST_PROTOS) -> Path:
    """Compile every .proto under `root` into one FileDescriptorSet (with imports) at `out`."""
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    code = protoc.main(["protoc", "--include_imports", "--include_source_info", f"-I{root}",
                        f"-I{Path(protoc.__file__).parent / '_proto'}", f"--descriptor_set_out={out}", *sources])
    assert code == 0, f"protoc failed on {sources}"
    return out


@pytest.fixture(scope="session")
def test_descriptor_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_protos(tmp_path_factory.mktemp("desc") / "testdata.desc")


@pytest.fixture(scope="session")
def test_descriptors(test_descriptor_path: Path) -> Descriptors:
    return descriptors.load([str(test_descriptor_path)])
