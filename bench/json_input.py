"""P7: JSON payloads → Arrow rows in the destination table's schema, against a bare json.loads loop over them.

The document is what seed 004's producers send: ~30 keys, some spelled with `-` and `.`, nested records, a
map, an array of records, timestamps as RFC 3339 text and as epoch seconds, numbers in strings, an object
for a STRING column, and a few keys the table does not have yet (kept in `additional_properties`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
from google.cloud.bigquery import SchemaField as F

from bench.conversion import ROUNDS, best_times
from firehose_bq.decode import make_json_decoder

MESSAGES = 50_000
BATCH = 10_000  # the source's READ_BATCH_ROWS: one decode() call per Arrow batch
REFERENCE_MESSAGES = 5_000  # the Python fallback is timed on fewer: it is an order of magnitude slower

COLUMNS = [
    F("event_id", "STRING", "REQUIRED"), F("event_type", "STRING"), F("sent_at", "TIMESTAMP"),
    F("received_at", "TIMESTAMP"), F("user_id", "INTEGER"), F("session_id", "STRING"), F("sequence", "INTEGER"),
    F("amount", "NUMERIC"), F("ratio", "FLOAT"), F("is_test", "BOOLEAN"), F("country", "STRING"),
    F("locale", "STRING"), F("day", "DATE"), F("referrer", "STRING"), F("page", "STRING"),
    F("duration_ms", "INTEGER"), F("retries", "INTEGER"), F("network", "STRING"), F("battery", "FLOAT"),
    F("consent", "BOOLEAN"), F("payload", "STRING"), F("tags", "STRING", "REPEATED"),
    F("client", "RECORD", fields=[
        F("os", "STRING"), F("os_version", "STRING"), F("app_version", "STRING"),
        F("device", "RECORD", fields=[F("model", "STRING"), F("width", "INTEGER"), F("height", "INTEGER"),
                                      F("dpi", "FLOAT")])]),
    F("geo", "RECORD", fields=[F("lat", "FLOAT"), F("lon", "FLOAT"), F("city", "STRING")]),
    F("labels", "RECORD", "REPEATED", fields=[F("key", "STRING"), F("value", "STRING")]),
    F("items", "RECORD", "REPEATED", fields=[F("sku", "STRING"), F("qty", "INTEGER"), F("price", "NUMERIC")]),
    F("additional_properties", "STRING"),
]


def document(i: int) -> bytes:
    return json.dumps({
        "event_id": f"{i:08x}-7d1c-4d7e-9a51-2b4c8f0e{i % 10_000:04d}", "event-type": "checkout",
        "sent_at": f"2026-03-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1_000_000:06d}Z",
        "received_at": 1_772_000_000 + i + 0.25, "user.id": 1_000_000 + i, "session_id": f"s-{i // 7}",
        "sequence": str(i % 500), "amount": f"{i % 9_999}.{i % 100:02d}", "ratio": (i % 1000) / 1000,
        "is_test": i % 11 == 0, "country": "DE", "locale": "de-DE", "day": f"2026-03-{1 + i % 28:02d}",
        "referrer": "https://example.com/landing?utm_source=newsletter", "page": f"/cart/{i % 50}",
        "duration_ms": i % 30_000, "retries": i % 3, "network": "wifi", "battery": 0.87, "consent": True,
        "payload": {"ab": "variant-b", "flags": [1, 2, 3], "score": 12.50},
        "tags": ["mobile", "returning", f"cohort-{i % 12}"],
        "client": {"os": "android", "os-version": "14", "app_version": "5.12.0", "build.flavor": "play",
                   "device": {"model": "Pixel 8", "width": 1080, "height": 2400, "dpi": 420.0}},
        "geo": {"lat": 52.52 + i % 100 / 1000, "lon": 13.405, "city": "Berlin"},
        "labels": {"campaign": "spring", "channel": "email", "segment": f"seg-{i % 40}"},
        "items": [{"sku": f"sku-{i % 300}", "qty": 1 + i % 4, "price": "19.99"},
                  {"sku": f"sku-{(i + 1) % 300}", "qty": 2, "price": "5.00", "gift_wrap": True}],
        "new_top_level": {"experiment": "exp-42", "bucket": i % 4}, "2fa_used": False,
    }).encode()


def run() -> dict[str, float]:
    payloads = [document(i) for i in range(MESSAGES)]
    batches = [pa.array(payloads[start:start + BATCH], pa.binary()) for start in range(0, MESSAGES, BATCH)]
    reference_batches = [pa.array(payloads[:REFERENCE_MESSAGES], pa.binary())]
    native = make_json_decoder(COLUMNS, additional_properties=True, prefer="native")
    reference = make_json_decoder(COLUMNS, additional_properties=True, prefer="python")
    for decoder in (native, reference):  # the benchmark measures what is right
        out = decoder.decode(batches[0][:100])
        assert not out.failures and out.values.null_count == 0, out.failures[:3]
    loads = json.loads

    def parse_only() -> None:
        for payload in payloads:
            loads(payload)

    def decode(decoder: object, work: list[pa.Array]) -> Callable[[], None]:
        def go() -> None:
            for batch in work:  # each batch's rows dropped before the next, as once written
                decoder.decode(batch)  # type: ignore[attr-defined]
        return go

    loads_s, native_s, reference_s = best_times([parse_only, decode(native, batches), decode(reference,
                                                                                          reference_batches)])
    loads_rate, native_rate = MESSAGES / loads_s, MESSAGES / native_s
    reference_rate = REFERENCE_MESSAGES / reference_s
    size = sum(map(len, payloads)) / MESSAGES
    print(f"P7 JSON input ({MESSAGES} documents in batches of {BATCH}, {size:.0f} bytes, {len(COLUMNS)} top-level "
          f"columns, nested records, a map, an array, unknown keys; CPU time, best of {ROUNDS})")
    print(f"  json.loads loop               {loads_rate:>12,.0f} msg/s  {1e6 / loads_rate:6.2f} µs/msg")
    print(f"  JSON → Arrow rows (native)    {native_rate:>12,.0f} msg/s  {1e6 / native_rate:6.2f} µs/msg")
    print(f"  ratio                         {native_rate / loads_rate:>12.2f}x   (target ≥ 0.5x)")
    print(f"  … Python reference (fallback) {reference_rate:>12,.0f} msg/s  {1e6 / reference_rate:6.2f} µs/msg  "
          f"{reference_rate / loads_rate:.2f}x")
    return {"p7_ratio": native_rate / loads_rate}


if __name__ == "__main__":
    run()
