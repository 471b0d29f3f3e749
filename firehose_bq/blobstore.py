"""Whole objects by name under one root: a local directory or `gs://bucket/prefix`.

The BLOB dead-letter queue writes through it and `replay-dlq --from-blob` reads back through it; the
same calls serve file-loads staging (`put_file` a task's rows, `list` a batch's prefix, `uri` for the load
job's source URIs, `delete_prefix` once loaded). Names are `/`-separated paths relative to the root, the
same for both kinds, so code above this module never builds a path or an object name itself.

Writes are atomic, all or nothing: a local file is written beside its target and renamed into place, a
GCS object becomes visible only when its upload completed. A reader never sees half an object.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from firehose_bq.gcp_auth import service_account_credentials

log = logging.getLogger(__name__)

GCS_SCHEME = "gs://"
GCS_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
# One GCS request; what retries there are belong to the caller (the DLQ retries a whole write), so that
# a dead GCS holds a task for attempts × this, not attempts × the client's own 120 s of retries.
GCS_REQUEST_TIMEOUT_S = 30.0
# A local write's temp file: hidden, beside its target, never listed.
_TEMP_PREFIX, _TEMP_SUFFIX = ".", ".tmp"


class BlobStore(Protocol):
    def put(self, name: str, data: bytes) -> str:
        """Store `data` under `name` atomically; return its URI."""

    def put_file(self, name: str, source: Path) -> str:
        """Store the local file `source` under `name` atomically (streamed, not read into memory); return its URI."""

    def get(self, name: str) -> bytes: ...

    def names(self, prefix: str = "") -> list[str]:
        """Names under the root that start with `prefix` (a string prefix, as GCS has it), sorted."""

    def rename(self, name: str, new_name: str) -> None:
        """Give an object a new name (GCS: copy, then delete; a crash in between leaves both)."""

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose name starts with `prefix`; return how many."""

    def uri(self, name: str = "") -> str:
        """Where `name` lives: a local path or `gs://bucket/object`, for logs and load-job source URIs."""


@dataclass(frozen=True)
class GcsOptions:
    """How to reach Cloud Storage: real GCS (a key file or Application Default Credentials) or an emulator."""

    endpoint: str | None = None  # e.g. the local emulator `http://127.0.0.1:19023`, with anonymous credentials
    credential_path: str | None = None
    project: str | None = None
    credential_setting: str = "credential path"  # the setting to name when the key file is bad


def open_blob_store(location: str, gcs: GcsOptions = GcsOptions()) -> BlobStore:
    """The store rooted at `location`: `gs://bucket[/prefix]`, `file:///dir` or a plain directory path.

    ValueError for any other URL scheme or a `gs://` location without a bucket.
    """
    if location.startswith(GCS_SCHEME):
        return GcsBlobStore(*gcs_location(location), gcs)
    parsed = urllib.parse.urlsplit(location)
    if parsed.scheme == "file":
        return LocalBlobStore(urllib.parse.unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter is a Windows drive, not a scheme
        raise ValueError(f"{location!r}: unsupported blob location; use a directory or gs://bucket/prefix")
    return LocalBlobStore(location)


def gcs_location(location: str) -> tuple[str, str]:
    """`gs://bucket[/prefix]` as (bucket, prefix); ValueError when it names no bucket."""
    bucket, _, prefix = location.removeprefix(GCS_SCHEME).partition("/")
    if not bucket:
        raise ValueError(f"{location!r} names no bucket: expected gs://bucket/prefix")
    return bucket, prefix


class LocalBlobStore:
    """Files under a directory (on a cluster: one every process mounts)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def put(self, name: str, data: bytes) -> str:
        with atomic_write(self._path(name)) as out:
            out.write(data)
        return self.uri(name)

    def put_file(self, name: str, source: Path) -> str:
        with atomic_write(self._path(name)) as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        return self.uri(name)

    def get(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def names(self, prefix: str = "") -> list[str]:
        # From the prefix's directory only, and past directories that vanish during the walk (os.walk skips
        # what it cannot list): other writers share the tree, e.g. a load's scratch directory, removed once
        # its upload is done while another table's load lists its own files (file loads run several at once).
        base = self.root / posixpath.dirname(prefix)
        if not base.is_dir():
            return []
        found = []
        for directory, _subdirectories, files in os.walk(base):
            for file in files:
                path = Path(directory, file)
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix) and not _is_temp(path):
                    found.append(name)
        return sorted(found)

    def rename(self, name: str, new_name: str) -> None:
        target = self._path(new_name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(name), target)

    def delete_prefix(self, prefix: str) -> int:
        names = self.names(prefix)
        for name in names:
            path = self._path(name)
            path.unlink(missing_ok=True)
            _prune_empty_dirs(path.parent, self.root)
        return len(names)

    def uri(self, name: str = "") -> str:
        return str(self._path(name)) if name else str(self.root)

    def _path(self, name: str) -> Path:
        path = self.root / name
        # Names come from listings and settings; one that climbs out of the root is a bug, not a request.
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise ValueError(f"blob name {name!r} leaves {self.root}")
        return path


class GcsBlobStore:
    """Objects in a bucket under a name prefix."""

    def __init__(self, bucket: str, prefix: str = "", options: GcsOptions = GcsOptions()) -> None:
        self._bucket = _client(options).bucket(bucket)
        self._prefix = prefix.strip("/")

    def put(self, name: str, data: bytes) -> str:
        # if_generation_match=0: only if no such object exists, so a name is written once (GCS refuses the rest).
        self._blob(name).upload_from_string(data, if_generation_match=0, timeout=GCS_REQUEST_TIMEOUT_S, retry=None)
        return self.uri(name)

    def put_file(self, name: str, source: Path) -> str:
        self._blob(name).upload_from_filename(str(source), if_generation_match=0, timeout=GCS_REQUEST_TIMEOUT_S,
                                              retry=None)
        return self.uri(name)

    def get(self, name: str) -> bytes:
        return bytes(self._blob(name).download_as_bytes(timeout=GCS_REQUEST_TIMEOUT_S, retry=None))

    def names(self, prefix: str = "") -> list[str]:
        return sorted(self._name(blob.name) for blob in self._blobs(prefix))

    def rename(self, name: str, new_name: str) -> None:
        blob = self._blob(name)
        self._bucket.copy_blob(blob, self._bucket, self._full(new_name), timeout=GCS_REQUEST_TIMEOUT_S, retry=None)
        blob.delete(timeout=GCS_REQUEST_TIMEOUT_S, retry=None)

    def delete_prefix(self, prefix: str) -> int:
        count = 0
        for blob in self._blobs(prefix):
            blob.delete(timeout=GCS_REQUEST_TIMEOUT_S, retry=None)
            count += 1
        return count

    def uri(self, name: str = "") -> str:
        full = self._full(name) if name else self._prefix
        return f"{GCS_SCHEME}{self._bucket.name}/{full}"

    def _full(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    def _name(self, full: str) -> str:
        return full.removeprefix(f"{self._prefix}/") if self._prefix else full

    def _blob(self, name: str) -> Any:
        return self._bucket.blob(self._full(name))

    def _blobs(self, prefix: str) -> Iterator[Any]:
        # Under the root prefix only: `gs://b/dlq` must not list `gs://b/dlq-old/...`.
        root = f"{self._prefix}/" if self._prefix else ""
        yield from self._bucket.client.list_blobs(self._bucket, prefix=root + prefix, timeout=GCS_REQUEST_TIMEOUT_S,
                                                  retry=None)


def _client(options: GcsOptions) -> Any:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    if options.endpoint:
        # An emulator takes no Google credentials; "<none>" keeps the client from looking up a project.
        return storage.Client(project=options.project or "<none>", credentials=AnonymousCredentials(),
                              client_options=ClientOptions(api_endpoint=options.endpoint))
    credentials = (service_account_credentials(options.credential_path, GCS_SCOPES, options.credential_setting)
                   if options.credential_path else None)
    return storage.Client(project=options.project, credentials=credentials)


@contextmanager
def atomic_write(target: Path) -> Iterator[IO[bytes]]:
    """A temp file beside `target`, renamed onto it when the block succeeds and removed when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename makes it visible, so a crash leaves no torn file
        os.replace(temp, target)
    finally:
        try:
            Path(temp).unlink(missing_ok=True)  # gone already after the rename
        except OSError as exc:
            # Whatever failed the write (a full disk, one turned read-only) is what the caller must see; a
            # temporary file left behind is skipped by every listing.
            log.warning("could not remove the temporary file %s: %s", temp, exc)


def _is_temp(path: Path) -> bool:
    return path.name.startswith(_TEMP_PREFIX) and path.name.endswith(_TEMP_SUFFIX)


def _prune_empty_dirs(directory: Path, root: Path) -> None:
    """Remove `directory` and its parents up to (not including) `root` while they are empty."""
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:  # not empty (or already gone): stop climbing
            return
        directory = directory.parent
