"""Deterministic example data and a producer for it: what `make run`, the examples in config/ and the
tests and benchmarks send.

- bookings (proto/firehose/example/v1/booking.proto): `booking_values(i)` is plain Python data, so tests
  can state what BigQuery must hold without going through the decoder under test; `booking(i, cls)` is
  the same data as a protobuf message;
- events (events.proto): three event types on one topic, told apart by their CloudEvents `ce_type`
  header, plus a type no route names (the routing example);
- JSON documents whose producer runs ahead of the table: renamed keys, a map, nested objects for STRING
  columns, numbers in strings and fields the table lacks (the JSON-input example).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import message as pb_message
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from firehose_bq.source.kafka_security import KafkaSecurityConfig

EXAMPLE_MESSAGE = "firehose.example.v1.Booking"
STATUSES = ("CREATED", "DRIVER_FOUND", "COMPLETED", "CANCELLED")
TAGS = ("airport", "night", "promo", "shared", "vip")
# 2026-01-01T00:00:00Z: sample timestamps fall in a fixed, recent window.
BASE_EPOCH_S = 1_767_225_600


def booking_values(i: int) -> dict[str, Any]:
    """Field values of booking number `i`; every field type of the example proto is exercised."""
    rng = random.Random(i)
    values: dict[str, Any] = {
        "order_number": f"ORD-{i:08d}",
        "customer_id": rng.randrange(1, 2**40),
        "status": STATUSES[i % len(STATUSES)],
        "amount": round(rng.uniform(1, 500), 2),
        "discount": 0.5 if i % 3 == 0 else 0.0,
        "is_paid": i % 2 == 0,
        "signature": rng.randbytes(8),
        "passenger_count": rng.randrange(1, 5),
        "balance_delta": rng.randrange(-10_000, 10_000),
        "region_code": rng.randrange(0, 2**32),
        "pickup": {"latitude": round(rng.uniform(-6.4, -6.1), 6), "longitude": round(rng.uniform(106.7, 107.0), 6),
                   "name": f"stop {rng.randrange(100)}"},
        "items": [{"sku": f"SKU-{rng.randrange(1000)}", "quantity": rng.randrange(1, 4),
                   "price_micros": rng.randrange(10**6, 10**8)} for _ in range(i % 3)],
        "tags": sorted(rng.sample(TAGS, i % 3)),
        "attributes": {"channel": "app" if i % 2 else "web", "city": "jakarta"},
        "created_at": (BASE_EPOCH_S + i * 37, (i % 1000) * 1_000_000 + 123_000),  # (seconds, nanos)
        "eta": (rng.randrange(60, 3600), 500_000_000),
        "context": {"source": "sample", "retry": i % 4},
        "status_history": [STATUSES[j % len(STATUSES)] for j in range(i % 3)],
    }
    if i % 5 == 0:
        values["dropoff"] = {"latitude": -6.2, "longitude": 106.8, "name": "terminal 3"}
    return values


def booking(i: int, cls: type[pb_message.Message]) -> pb_message.Message:
    v = booking_values(i)
    msg = cls()
    for name in ("order_number", "customer_id", "status", "amount", "discount", "is_paid", "signature",
                 "passenger_count", "balance_delta", "region_code"):
        setattr(msg, name, v[name])
    for place in ("pickup", "dropoff"):
        if place in v:
            for key, value in v[place].items():
                setattr(getattr(msg, place), key, value)
    for item in v["items"]:
        msg.items.add(**item)
    msg.tags.extend(v["tags"])
    msg.attributes.update(v["attributes"])
    msg.created_at.seconds, msg.created_at.nanos = v["created_at"]
    msg.eta.seconds, msg.eta.nanos = v["eta"]
    msg.context.update(v["context"])
    msg.status_history.extend(v["status_history"])
    return msg


def ensure_topic(brokers: str, topic: str, partitions: int, security: KafkaSecurityConfig = KafkaSecurityConfig()) -> bool:
    """Create the topic if missing; True when it was created."""
    admin = KafkaAdminClient(bootstrap_servers=brokers.split(","), **security.kafka_python())
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
        return True
    except TopicAlreadyExistsError:
        return False
    finally:
        admin.close()


Headers = Sequence[tuple[str, bytes]]
# (key, value, headers) of sample record i.
Record = tuple[bytes | None, bytes | None, Headers]


def produce(
    brokers: str,
    topic: str,
    messages: Callable[[int], Record],
    count: int,
    *,
    start: int = 0,
    progress: bool = True,
    security: KafkaSecurityConfig = KafkaSecurityConfig(),
) -> int:
    """Send `count` records made by `messages(i)`; waits until all are acknowledged."""
    from tqdm import tqdm

    producer = KafkaProducer(bootstrap_servers=brokers.split(","), linger_ms=20, acks="all",
                             batch_size=256 * 1024, **security.kafka_python())
    failures: list[BaseException] = []
    try:
        with tqdm(total=count, desc=f"producing to {topic}", unit="msg", disable=not progress) as bar:
            for i in range(start, start + count):
                key, value, headers = messages(i)
                producer.send(topic, key=key, value=value, headers=list(headers)).add_errback(failures.append)
                if i % 1000 == 999:
                    bar.update(1000)
            bar.update(count - bar.n)
            producer.flush()
    finally:
        producer.close()
    if failures:
        raise RuntimeError(f"{len(failures)} of {count} messages were not acknowledged: {failures[0]}")
    return count


def booking_messages(cls: type[pb_message.Message]) -> Callable[[int], Record]:
    """Booking i: the key is a serialized BookingKey, as a keyed topic would carry."""
    from google.protobuf import message_factory

    key_class = message_factory.GetMessageClass(cls.DESCRIPTOR.file.message_types_by_name["BookingKey"])

    def make(i: int) -> Record:
        msg = booking(i, cls)
        key = key_class(order_number=msg.order_number)  # type: ignore[attr-defined]
        return key.SerializeToString(), msg.SerializeToString(), ()

    return make


# ce_type → the example message it carries (events.proto); every UNROUTED_EVERY-th event has a type no
# route names, so the example shows the fallback output too.
EVENT_TYPES = {"ride.requested": "RideRequested", "ride.completed": "RideCompleted",
               "payment.captured": "PaymentCaptured"}
UNROUTED_TYPE = "ride.rated"
UNROUTED_EVERY = 50


def event_type(i: int) -> str:
    return UNROUTED_TYPE if i % UNROUTED_EVERY == UNROUTED_EVERY - 1 else list(EVENT_TYPES)[i % len(EVENT_TYPES)]


def event_messages(classes: dict[str, type[pb_message.Message]]) -> Callable[[int], Record]:
    """Event i as a CloudEvents binary-mode record: the payload is the message, `ce_*` are headers.
    `classes`: the example message classes by their short names (RideRequested, ...)."""

    def make(i: int) -> Record:
        kind = event_type(i)
        rng = random.Random(i)
        ride = f"RIDE-{i // 3:08d}"
        if kind in ("ride.requested", UNROUTED_TYPE):
            msg = classes["RideRequested"](ride_id=ride, customer_id=rng.randrange(1, 2**40))
            msg.pickup.latitude, msg.pickup.longitude = -6.2, 106.8  # type: ignore[attr-defined]
            msg.requested_at.seconds = BASE_EPOCH_S + i  # type: ignore[attr-defined]
        elif kind == "ride.completed":
            msg = classes["RideCompleted"](ride_id=ride, fare=round(rng.uniform(2, 80), 2), tags=["sample"])
            msg.duration.seconds = rng.randrange(300, 3600)  # type: ignore[attr-defined]
            msg.completed_at.seconds = BASE_EPOCH_S + i  # type: ignore[attr-defined]
        else:
            msg = classes["PaymentCaptured"](payment_id=f"PAY-{i:08d}", ride_id=ride, currency="IDR",
                                             amount_micros=rng.randrange(10**6, 10**9))
            msg.metadata["channel"] = "app"  # type: ignore[attr-defined]
        headers = [("ce_specversion", b"1.0"), ("ce_type", kind.encode()), ("ce_source", b"/sample"),
                   ("ce_id", f"evt-{i}".encode())]
        return ride.encode(), msg.SerializeToString(), headers

    return make


def json_document(i: int) -> dict[str, Any]:
    """A telemetry-like JSON document, number i, as its producer sends it (see config/json-schema.json
    for the table it lands in): keys with `-` and `.`, a key starting with a digit, a map, an object
    for a STRING column, a number in a string, and fields the table does not have."""
    rng = random.Random(i)
    document: dict[str, Any] = {
        "client-id": f"client-{i % 97:04d}",
        "document.type": "main" if i % 4 else "event",
        "2fa_enabled": i % 3 == 0,
        "os": {"name": "Linux", "version": f"6.{i % 10}", "build-number": str(1000 + i % 5)},
        "counters": {"clicks": rng.randrange(100), "scrolls": rng.randrange(100)},
        "settings": {"theme": "dark" if i % 2 else "light", "flags": [i % 2 == 0, True]},
        "duration_ms": str(rng.randrange(10, 10_000)),
        "submitted_at": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
    }
    if i % 10 == 0:
        document["experiment"] = {"branch": "b", "enrolled": True}  # newer than the table: kept aside
    return document


def json_messages() -> Callable[[int], Record]:
    def make(i: int) -> Record:
        return f"client-{i % 97:04d}".encode(), json.dumps(json_document(i)).encode(), ()

    return make
