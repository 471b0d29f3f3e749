"""Dead letters read back from a blob store (a directory or `gs://bucket/prefix`) for `replay-dlq --from-blob`.

Every `*.jsonl` object under the root is one batch, in name order (`<topic>/<day>/<uuid>.jsonl`: by topic,
then day). Handling a batch renames its object to `*.jsonl.replayed`: that rename is the batch's commit,
so a replay run again skips what an earlier run finished, and an object is replayed whole or not at all.

On Cloud Storage a rename is a copy and then a delete. Once the `.replayed` copy exists the batch is
committed, even if the delete never happened (a crash, a failed request): the next replay finishes the
rename instead of replaying the object, and committing a batch whose rename finished already (a replay
that died before it cleared its pending batch) is a no-op, not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from firehose_bq.blobstore import BlobStore
from firehose_bq.dlq.letters import DeadLetter, Position
from firehose_bq.errors import FirehoseError

log = logging.getLogger(__name__)

LETTERS_SUFFIX = ".jsonl"
REPLAYED_SUFFIX = ".replayed"  # appended to an object whose letters were all handled


class BlobDlqSource:
    def __init__(self, store: BlobStore, max_messages: int | None) -> None:
        self._store = store
        self._limit = max_messages
        names = store.names()
        replayed = {n.removesuffix(REPLAYED_SUFFIX) for n in names if n.endswith(LETTERS_SUFFIX + REPLAYED_SUFFIX)}
        self._names = [n for n in names if n.endswith(LETTERS_SUFFIX) and n not in replayed]
        self._half_renamed = sorted(replayed & set(names))  # committed: the copy exists, the delete did not happen
        # Read once: total() needs every line count before the first batch, and an object costs a request.
        self._texts: dict[str, str] = {}

    def identity(self) -> str:
        """Where the letters are: the same for every replay of them."""
        return self._store.uri("")

    def total(self) -> int:
        """The letters `batches` will yield: whole objects, in order, while they fit in the limit."""
        total = 0
        for name in self._names:
            lines = len(_lines(self._text(name)))
            if self._limit is not None and total + lines > self._limit:
                break
            total += lines
        return total

    def batches(self) -> Iterator[tuple[list[DeadLetter], Position]]:
        for name in self._half_renamed:
            log.info("%s was replayed already (its %s copy exists): finishing its rename instead of replaying it",
                     self._store.uri(name), REPLAYED_SUFFIX)
            self._store.rename(name, name + REPLAYED_SUFFIX)
        self._half_renamed = []
        left = self._limit
        for name in list(self._names):
            if name not in self._names:
                continue  # committed meanwhile (a pending batch a replay finished first)
            text = self._texts.pop(name) if name in self._texts else self._store.get(name).decode()
            letters = _letters(self._store.uri(name), text)
            if left is not None and len(letters) > left:
                # An object is handled whole or not at all (the rename is its commit): say why the rest waits.
                log.warning("stopping before %s: its %d letters exceed what --max-messages leaves (%d); objects "
                            "are replayed whole, so raise --max-messages to replay it", self._store.uri(name),
                            len(letters), left)
                return
            yield letters, {"object": name}
            if left is not None:
                left -= len(letters)

    def commit(self, position: Position) -> None:
        name = position["object"]
        there = self._store.names(name)
        if name not in there and name + REPLAYED_SUFFIX in there:
            log.info("%s was committed already", self._store.uri(name))
        else:
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


def _letters(where: str, text: str) -> list[DeadLetter]:
    """An object's letters. A line that is none (an object cut short, or edited by hand) stops the replay
    naming it, as a Kafka record without dead-letter headers does: skipping it would lose a message."""
    letters = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                letters.append(DeadLetter.from_json(line))
            except (KeyError, TypeError, ValueError) as exc:
                raise FirehoseError(f"{where}, line {number}: not a firehose-bq dead letter "
                                    f"({type(exc).__name__}: {exc})") from None
    return letters


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]
