"""The local blob store: atomic writes, GCS-style prefix listing, rename and prefix deletion; location parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from firehose_bq import blobstore
from firehose_bq.blobstore import GcsBlobStore, GcsOptions, LocalBlobStore, open_blob_store


def test_put_get_list_rename_and_delete_a_prefix(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "root")
    assert store.names() == []  # the root need not exist yet
    assert store.put("b/1/x.ndjson", b"one") == str(tmp_path / "root" / "b" / "1" / "x.ndjson")
    source = tmp_path / "rows.ndjson"
    source.write_bytes(b"two\n" * 1000)
    store.put_file("b/10/y.ndjson", source)
    store.put("a.jsonl", b"three")
    assert store.names() == ["a.jsonl", "b/1/x.ndjson", "b/10/y.ndjson"]
    assert store.names("b/1") == ["b/1/x.ndjson", "b/10/y.ndjson"]  # a string prefix, as GCS has it
    assert store.names("b/1/") == ["b/1/x.ndjson"]
    assert store.get("b/10/y.ndjson") == source.read_bytes()
    store.rename("a.jsonl", "done/a.jsonl.replayed")
    assert store.names() == ["b/1/x.ndjson", "b/10/y.ndjson", "done/a.jsonl.replayed"]
    assert store.delete_prefix("b/1/") == 1
    assert not (tmp_path / "root" / "b" / "1").exists()  # emptied directories go too
    assert store.names() == ["b/10/y.ndjson", "done/a.jsonl.replayed"]


def test_a_failed_write_leaves_neither_a_file_nor_a_temp_file(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    store.put("x.jsonl", b"old")
    with pytest.raises(FileNotFoundError):
        store.put_file("x.jsonl", tmp_path / "missing")
    with pytest.raises(RuntimeError):
        with blobstore.atomic_write(tmp_path / "y.jsonl") as out:
            out.write(b"half")
            raise RuntimeError("crash mid-write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]
    assert store.get("x.jsonl") == b"old"


def test_a_failed_write_reports_its_own_error_not_the_cleanup_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A disk that fills, then refuses the temporary file's removal too (turned read-only): the error the
    caller sees is the write's."""
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    def refused(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Read-only file system", str(self))

    monkeypatch.setattr(blobstore.os, "replace", full)
    monkeypatch.setattr(blobstore.Path, "unlink", refused)
    with pytest.raises(OSError, match="No space left on device"):
        LocalBlobStore(tmp_path).put("x.jsonl", b"rows")
    monkeypatch.undo()
    (warning,) = [r for r in caplog.records if r.name == blobstore.__name__]
    assert "could not remove the temporary file" in warning.getMessage() and "Read-only" in warning.getMessage()
    assert [p.name for p in tmp_path.iterdir() if not blobstore._is_temp(p)] == []


def test_names_cannot_leave_the_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="leaves"):
        LocalBlobStore(tmp_path / "root").put("../outside", b"x")


def test_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_blob_store(str(tmp_path)), LocalBlobStore)
    assert open_blob_store(f"file://{tmp_path}/dlq").uri() == f"{tmp_path}/dlq"
    made: list[tuple[str, str, GcsOptions]] = []
    monkeypatch.setattr(GcsBlobStore, "__init__", lambda self, b, p, o: made.append((b, p, o)))
    options = GcsOptions(endpoint="http://127.0.0.1:1")
    open_blob_store("gs://bucket/some/prefix/", options)
    open_blob_store("gs://bucket", options)
    assert made == [("bucket", "some/prefix/", options), ("bucket", "", options)]
    for bad in ("gs://", "s3://bucket/x", "https://host/x"):
        with pytest.raises(ValueError):
            open_blob_store(bad)



def test_a_local_listing_goes_past_a_directory_removed_while_it_walks(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """File loads run a batch's load jobs at once: one table's load lists its staged files while another's
    scratch directory (its combined upload) is removed. The listing must not fail on it."""
    import os
    import shutil

    store = LocalBlobStore(tmp_path)
    store.put("batch-0/d.t1/part-0.parquet", b"1")
    store.put("batch-0/d.t2/.load-x/combined.parquet", b"2")
    store.put("other/x", b"3")
    real = os.scandir

    def scandir(path):  # noqa: ANN001, ANN202 - the other load finishes just as this walk reaches batch-0
        entries = real(path)
        if isinstance(path, str) and Path(path) == tmp_path / "batch-0":
            shutil.rmtree(tmp_path / "batch-0" / "d.t2" / ".load-x")
        return entries

    monkeypatch.setattr(os, "scandir", scandir)
    assert store.names("batch-0/") == ["batch-0/d.t1/part-0.parquet"]
    assert store.names("batch-0/d.t1/") == ["batch-0/d.t1/part-0.parquet"]
