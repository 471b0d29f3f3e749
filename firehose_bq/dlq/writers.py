"""DLQ writers: KAFKA, BLOB and LOG, behind one call that retries and then raises DeadLetterError.

A writer runs inside the Spark task, after the batch's rows were written and before the task reports
success: a DLQ write that keeps failing fails the task's batch, so its offsets are not committed and
no message is in neither the table nor the DLQ.

`dead_letter` is the only layer that retries (DLQ_RETRY_* through retrying.py); inside an attempt each
writer waits a bounded time: the Kafka producer's own retries end with its delivery timeout, GCS calls
make one request each (blobstore.GCS_REQUEST_TIMEOUT_S).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from firehose_bq.blobstore import BlobStore, open_blob_store
from firehose_bq.dlq.config import BLOB, KAFKA, DlqConfig
from firehose_bq.dlq.letters import DeadLetter
from firehose_bq.errors import DeadLetterError, DeadLetterTooLargeError
from firehose_bq.retrying import retry_call

log = logging.getLogger(__name__)

# kafka-python's default is 1 MB; a dead letter is the original record plus headers, so allow what a
# broker commonly allows for a topic (messages over it fail the DLQ write, loudly).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# One attempt of a Kafka DLQ write: so long to reach the broker, then so long for every letter to be
# acknowledged (the producer's own retries included). A healthy broker needs milliseconds.
CONNECT_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0


class DlqWriter(Protocol):
    def write(self, letters: Sequence[DeadLetter]) -> None:
        """Store every letter durably, or raise."""

    def close(self) -> None: ...


class KafkaDlqWriter:
    """The original key, value and headers, plus `firehose-dlq-*` error headers, to one topic."""

    def __init__(self, cfg: DlqConfig) -> None:
        from kafka import KafkaProducer

        acks: int | str = cfg.kafka_acks if cfg.kafka_acks == "all" else int(cfg.kafka_acks)
        self._topic = cfg.kafka_topic
        send_ms = int(SEND_TIMEOUT_S * 1000)
        self._producer = KafkaProducer(bootstrap_servers=cfg.kafka_brokers, acks=acks,
                                       max_request_size=MAX_REQUEST_BYTES, retries=3,
                                       bootstrap_timeout_ms=int(CONNECT_TIMEOUT_S * 1000), max_block_ms=send_ms,
                                       request_timeout_ms=send_ms, delivery_timeout_ms=send_ms,
                                       **cfg.kafka_security.kafka_python())

    def write(self, letters: Sequence[DeadLetter]) -> None:
        from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

        deadline = time.monotonic() + SEND_TIMEOUT_S
        sent = []
        current = letters[0]  # the letter being sent, or whose delivery is being awaited
        try:
            for current in letters:
                # No timestamp of the record's own: the letter's is when it was written, so the topic's
                # retention counts from then. With the original one, letters of a backlog older than the
                # topic's retention.ms would be deleted as soon as their segment rolled, before any replay
                # (their offsets committed already). The original is kept in -source-timestamp-ms.
                sent.append((current, self._producer.send(self._topic, key=current.kafka_key(), value=current.value,
                                                          headers=current.kafka_headers())))
            self._producer.flush(max(0.0, deadline - time.monotonic()))
            for current, future in sent:
                future.get(timeout=max(0.001, deadline - time.monotonic()))  # raises the send's own error
        except (MessageSizeTooLargeError, RecordListTooLargeError) as exc:
            # Refused by this client's request limit (at send) or the topic's max.message.bytes (at get).
            raise DeadLetterTooLargeError(
                f"the dead letter of {current.error.topic}/{current.error.partition}@{current.error.offset} "
                f"({_size(current):,} bytes with its headers) is too large for DLQ topic {self._topic!r}: "
                f"{type(exc).__name__}: {exc}. Raise the topic's max.message.bytes (up to "
                f"{MAX_REQUEST_BYTES:,} bytes, this writer's request limit), or use DLQ_WRITER_TYPE=BLOB; "
                "the batch is not committed until then") from exc

    def close(self) -> None:
        self._producer.close(timeout=5)


def _size(letter: DeadLetter) -> int:
    return (len(letter.kafka_key() or b"") + len(letter.value or b"")
            + sum(len(k) + len(v or b"") for k, v in letter.kafka_headers()))


class BlobDlqWriter:
    """JSON lines (base64 key/value/headers, the full error), one new object per topic and day per write.

    Objects are named `<topic>/<yyyy-mm-dd>/<uuid>.jsonl` under the store's root (a directory or
    `gs://bucket/prefix`); each is written whole or not at all, so a replay never reads half a write.
    """

    def __init__(self, store: BlobStore) -> None:
        self._store = store

    def write(self, letters: Sequence[DeadLetter]) -> None:
        groups: dict[str, list[DeadLetter]] = defaultdict(list)
        for letter in letters:
            day = datetime.fromtimestamp(letter.failed_at_ms / 1000, UTC).strftime("%Y-%m-%d")
            groups[f"{letter.error.topic}/{day}"].append(letter)
        for folder, group in groups.items():
            data = "".join(letter.to_json() + "\n" for letter in group).encode()
            where = self._store.put(f"{folder}/{uuid.uuid4().hex}.jsonl", data)
            log.info("dead-lettered %d message(s) to %s", len(group), where, extra={"topic": group[0].error.topic})

    def close(self) -> None:
        pass


class LogDlqWriter:
    """One structured line per message, without the payload (logs are no place for user data)."""

    def write(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            e = letter.error
            log.warning("dead letter %s", json.dumps({
                "error_type": e.error_type.value, "topic": e.topic, "partition": e.partition, "offset": e.offset,
                "attempt": letter.attempt, "value_bytes": len(letter.value or b""), "error": e.message}),
                extra={"error_type": e.error_type, "topic": e.topic, "partition": e.partition})

    def close(self) -> None:
        pass


def open_dlq_writer(cfg: DlqConfig) -> DlqWriter:
    if cfg.writer_type == KAFKA:
        return KafkaDlqWriter(cfg)
    if cfg.writer_type == BLOB:
        return BlobDlqWriter(open_blob_store(cfg.blob_location(), cfg.gcs_options()))
    return LogDlqWriter()


def dead_letter(cfg: DlqConfig, letters: Sequence[DeadLetter], opener: Callable[[DlqConfig], DlqWriter] = open_dlq_writer,
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Write `letters`, retried per DLQ_RETRY_*; DeadLetterError when every attempt failed."""
    if not letters:
        return
    first = letters[0].error

    def attempt() -> None:
        writer = opener(cfg)  # a new one per attempt: a producer or client may be what broke
        try:
            writer.write(letters)
        finally:
            _close(writer)

    def gave_up(error: BaseException, attempts: int, seconds: float) -> BaseException:
        return DeadLetterError(
            f"{cfg.writer_type} dead-letter write of {len(letters)} message(s) (first {first.topic}/"
            f"{first.partition}@{first.offset}) failed {attempts} time(s) in {seconds:.1f} s: "
            f"{type(error).__name__}: {error}")

    # Any failure of the DLQ is retried, then reported: which ones could pass is the store's business,
    # except a letter the store refused for its size, which no retry can change.
    retry_call(attempt, cfg.backoff(), retry_on=lambda e: not isinstance(e, DeadLetterTooLargeError),
               give_up=gave_up,
               what=f"{cfg.writer_type} dead-letter write of {len(letters)} message(s)", sleep=sleep, clock=clock)


def _close(writer: DlqWriter) -> None:
    try:
        writer.close()
    except Exception as exc:  # noqa: BLE001 - the letters are stored or the write failed already: no retry for this
        log.warning("closing the DLQ writer failed: %s: %s", type(exc).__name__, exc)
