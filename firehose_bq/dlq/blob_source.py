"""Dead letters read back from a blob store (a directory or `gs://bucket/prefix`) for `replay-dlq --from-blob`.

Every `*.jsonl` object under the root is one batch, in name order (`<topic>/<day>/<uuid>.jsonl`: by topic,
then day). Handling a batch renames its object to `*.jsonl.replayed`: that rename is the batch's commit,
so a replay run again skips what an earlier run finished, and an object is replayed whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from firehose_bq.blobstore import BlobStore
from firehose_bq.dlq.letters import DeadLetter, Position

LETTERS_SUFFIX = ".jsonl"
REPLAYED_SUFFIX = ".replayed"  # appended to an object whose letters were all handled


class BlobDlqSource:
    def __init__(self, store: BlobStore, max_messages: int | None) -> None:
        self._store = store
        self._limit = max_messages
        self._names = [n for n in store.names() if n.endswith(LETTERS_SUFFIX)]
        # Read once: total() needs every line count before the first batch, and an object costs a request.
        self._texts: dict[str, str] = {}

    def identity(self) -> str:
        """Where the letters are: the same for every replay of them."""
        return self._store.uri("")

    def total(self) -> int:
        lines = sum(len(_lines(self._text(name))) for name in self._names)
        return lines if self._limit is None else min(lines, self._limit)

    def batches(self) -> Iterator[tuple[list[DeadLetter], Position]]:
        left = self._limit
        for name in list(self._names):
            if name not in self._names:
                continue  # committed meanwhile (a pending batch a replay finished first)
            text = self._texts.pop(name) if name in self._texts else self._store.get(name).decode()
            letters = [DeadLetter.from_json(line) for line in _lines(text)]
            if left is not None and len(letters) > left:
                return  # an object is handled whole or not at all: the rename is its commit
            yield letters, {"object": name}
            if left is not None:
                left -= len(letters)

    def commit(self, position: Position) -> None:
        name = position["object"]
        self._store.rename(name, name + REPLAYED_SUFFIX)
        if name in self._names:
            self._names.remove(name)
            self._texts.pop(name, None)

    def close(self) -> None:
        self._texts.clear()

    def _text(self, name: str) -> str:
        if name not in self._texts:
            self._texts[name] = self._store.get(name).decode()
        return self._texts[name]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]
