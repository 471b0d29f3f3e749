"""A dead letter: the original Kafka record, unchanged, plus why and where it failed.

The same fields travel as Kafka headers (KAFKA writer) and as one JSON object (BLOB writer), and are
read back by the replay. The source coordinates are the ORIGINAL ones: a message dead-lettered again
by a replay keeps them, so its insertId stays `topic_partition_offset` of the first write.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from firehose_bq.errors import ErrorType, MessageError

HEADER_PREFIX = "firehose-dlq-"
H_TYPE = HEADER_PREFIX + "error-type"
H_MESSAGE = HEADER_PREFIX + "error-message"
H_TOPIC = HEADER_PREFIX + "source-topic"
H_PARTITION = HEADER_PREFIX + "source-partition"
H_OFFSET = HEADER_PREFIX + "source-offset"
H_TIMESTAMP = HEADER_PREFIX + "source-timestamp-ms"
H_TIMESTAMP_TYPE = HEADER_PREFIX + "source-timestamp-type"  # Kafka's id: 0 CreateTime, 1 LogAppendTime
H_LEADER_EPOCH = HEADER_PREFIX + "source-leader-epoch"
H_FAILED_AT = HEADER_PREFIX + "failed-at-ms"
H_ATTEMPT = HEADER_PREFIX + "attempt-count"
H_ROUTE = HEADER_PREFIX + "route"  # the destination table the record had (empty: unrouted)
H_EXCEPTION = HEADER_PREFIX + "exception-class"  # what failed it: an exception's class, or the refusing component
# What of the record was null but travels as b"" (kafka-python's producer sends neither a null header value
# nor a record whose key and value are both null): `key` and `header:<i>` (its own headers' positions),
# comma-separated, so the replay routes and writes the record as it was (a missing header is not "").
H_NULLS = HEADER_PREFIX + "nulls"
# Error messages can be long (a row's every error); a header is no place for kilobytes.
# Where a batch of letters sits in its DLQ (offsets, an object name), as JSON: what commits the batch, in
# this run or, for a batch whose load may have run before a crash, in the next one (dlq/replay.py).
Position = dict[str, Any]

MAX_MESSAGE_CHARS = 4000

Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True)
class DeadLetter:
    error: MessageError  # its topic/partition/offset are the original record's
    key: bytes | None
    value: bytes | None
    headers: Headers  # the record's own headers, without earlier dead-letter headers
    timestamp_ms: int | None
    attempt: int  # 1 the first time a message is dead-lettered; a replay that fails again adds 1
    failed_at_ms: int
    route: str = ""  # `dataset.table` the record was routed to; empty when it had none
    exception_class: str = ""
    # The record's metadata columns besides its coordinates and time, for the replay's rows (None: unknown,
    # as in letters written before they were kept).
    timestamp_type: int | None = None
    leader_epoch: int | None = None

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        e = self.error
        extra = {H_TYPE: e.error_type.value, H_MESSAGE: e.message[:MAX_MESSAGE_CHARS], H_TOPIC: e.topic,
                 H_PARTITION: str(e.partition), H_OFFSET: str(e.offset), H_FAILED_AT: str(self.failed_at_ms),
                 H_ATTEMPT: str(self.attempt), H_ROUTE: self.route, H_EXCEPTION: self.exception_class}
        for header, number in ((H_TIMESTAMP, self.timestamp_ms), (H_TIMESTAMP_TYPE, self.timestamp_type),
                               (H_LEADER_EPOCH, self.leader_epoch)):
            if number is not None:
                extra[header] = str(number)
        nulls = [f"header:{i}" for i, (_, v) in enumerate(self.headers) if v is None]
        if self.key is None and self.value is None:
            nulls.insert(0, "key")
        if nulls:
            extra[H_NULLS] = ",".join(nulls)
        own = [(k, v if v is not None else b"") for k, v in self.headers]
        return own + [(k, v.encode()) for k, v in extra.items()]

    def kafka_key(self) -> bytes | None:
        """The key to send: b"" for a record with neither key nor value (marked null in H_NULLS)."""
        return b"" if self.key is None and self.value is None else self.key

    @classmethod
    def from_kafka(cls, key: bytes | None, value: bytes | None, headers: Headers) -> DeadLetter:
        """Read back what `kafka_headers` wrote; ValueError if the record carries no dead-letter headers."""
        own = [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]
        ours = {k: (v or b"").decode() for k, v in headers if k.startswith(HEADER_PREFIX)}
        nulls = set(filter(None, ours.get(H_NULLS, "").split(",")))
        own = [(k, None if f"header:{i}" in nulls else v) for i, (k, v) in enumerate(own)]
        if "key" in nulls:
            key = None
        try:
            error = MessageError(ErrorType(ours[H_TYPE]), ours[H_TOPIC], int(ours[H_PARTITION]),
                                 int(ours[H_OFFSET]), ours.get(H_MESSAGE, ""))
            stamp, kind, epoch = (int(ours[h]) if h in ours else None
                                  for h in (H_TIMESTAMP, H_TIMESTAMP_TYPE, H_LEADER_EPOCH))
            return cls(error, key, value, tuple(own), stamp, int(ours.get(H_ATTEMPT, "1")),
                       int(ours.get(H_FAILED_AT, "0")), ours.get(H_ROUTE, ""), ours.get(H_EXCEPTION, ""), kind, epoch)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"not a firehose-bq dead letter (missing or bad header {exc})") from None

    def to_json(self) -> str:
        e = self.error
        return json.dumps({
            "error_type": e.error_type.value, "error_message": e.message, "topic": e.topic,
            "partition": e.partition, "offset": e.offset, "timestamp_ms": self.timestamp_ms,
            "failed_at_ms": self.failed_at_ms, "attempt": self.attempt, "route": self.route,
            "exception_class": self.exception_class, "timestamp_type": self.timestamp_type,
            "leader_epoch": self.leader_epoch, "key": _b64(self.key),
            "value": _b64(self.value), "headers": [[k, _b64(v)] for k, v in self.headers],
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> DeadLetter:
        d = json.loads(line)
        error = MessageError(ErrorType(d["error_type"]), d["topic"], d["partition"], d["offset"], d["error_message"])
        return cls(error, _unb64(d["key"]), _unb64(d["value"]), tuple((k, _unb64(v)) for k, v in d["headers"]),
                   d["timestamp_ms"], d["attempt"], d["failed_at_ms"], d.get("route", ""), d.get("exception_class", ""),
                   d.get("timestamp_type"), d.get("leader_epoch"))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
