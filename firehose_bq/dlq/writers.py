"""DLQ writers: KAFKA, BLOB and LOG, behind one call that retries and then raises DeadLetterError.

A writer runs inside the Spark task, after the batch's rows were written and before the task reports
success: a DLQ write that keeps failing fails the task's batch, so its offsets are not committed and
no message is in neither the table nor the DLQ.
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
from firehose_bq.errors import DeadLetterError

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
# kafka-python's default is 1 MB; a dead letter is the original record plus headers, so allow what a
# broker commonly allows for a topic (messages over it fail the DLQ write, loudly).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
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
        self._producer = KafkaProducer(bootstrap_servers=cfg.kafka_brokers, acks=acks,
                                       max_request_size=MAX_REQUEST_BYTES, retries=3)

    def write(self, letters: Sequence[DeadLetter]) -> None:
        futures = [self._producer.send(self._topic, key=letter.key, value=letter.value,
                                       headers=letter.kafka_headers(), timestamp_ms=letter.timestamp_ms)
                   for letter in letters]
        self._producer.flush(SEND_TIMEOUT_S)
        for future in futures:
            future.get(timeout=SEND_TIMEOUT_S)  # raises the send's own error

    def close(self) -> None:
        self._producer.close(timeout=5)


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
                "attempt": letter.attempt, "value_bytes": len(letter.value or b""), "error": e.message}))

    def close(self) -> None:
        pass


def open_dlq_writer(cfg: DlqConfig) -> DlqWriter:
    if cfg.writer_type == KAFKA:
        return KafkaDlqWriter(cfg)
    if cfg.writer_type == BLOB:
        return BlobDlqWriter(open_blob_store(cfg.blob_location(), cfg.gcs_options()))
    return LogDlqWriter()


def dead_letter(cfg: DlqConfig, letters: Sequence[DeadLetter], opener: Callable[[DlqConfig], DlqWriter] = open_dlq_writer,
                sleep: Callable[[float], None] = time.sleep) -> None:
    """Write `letters` with DLQ_RETRY_MAX_ATTEMPTS attempts; raise DeadLetterError when all failed."""
    if not letters:
        return
    wait = cfg.retry_backoff_ms / 1000
    for attempt in range(1, cfg.retry_max_attempts + 1):
        writer = None
        try:
            writer = opener(cfg)
            writer.write(letters)
            return
        except Exception as exc:  # noqa: BLE001 - any failure of the DLQ is retried, then reported
            if attempt == cfg.retry_max_attempts:
                first = letters[0].error
                raise DeadLetterError(
                    f"{cfg.writer_type} dead-letter write of {len(letters)} message(s) (first "
                    f"{first.topic}/{first.partition}@{first.offset}) failed {attempt} time(s): "
                    f"{type(exc).__name__}: {exc}") from exc
            log.warning("DLQ write attempt %d of %d failed (%s: %s); retrying in %.1f s", attempt,
                        cfg.retry_max_attempts, type(exc).__name__, exc, wait)
            sleep(wait)
            wait = min(MAX_BACKOFF_S, max(wait * 2, 0.1))
        finally:
            if writer is not None:
                writer.close()
