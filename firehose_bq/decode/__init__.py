"""Kafka values → Arrow: one message type's wire bytes decoded into a StructArray in the table's types.

`values.py` holds the contract every decoder keeps; `reference.py` is the Python decoder (the generated
converter of `convert.py`), kept as the reference and the fallback. JSON input (`INPUT_SCHEMA_DATA_TYPE=JSON`)
is decoded against the destination table's columns: `json_rules.py` holds its rules, `json_native.py` (over
the `_json` C extension) and `json_reference.py` (pure Python) keep them.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.cloud.bigquery import SchemaField
from google.protobuf.message import Message

from firehose_bq.decode.values import DecodedValues, DecodeFailure, ValueDecoder
from firehose_bq.schema import SchemaOptions

__all__ = ["DecodeFailure", "DecodedValues", "ValueDecoder", "make_json_decoder", "make_value_decoder"]


def make_value_decoder(message_class: type[Message], depth: int, options: SchemaOptions, *,
                       confluent_framed: bool, detect_unknown_fields: bool, prefer: str = "auto") -> ValueDecoder:
    from firehose_bq.decode.reference import ReferenceDecoder

    return ReferenceDecoder(message_class, depth, options, confluent_framed, detect_unknown_fields)


def make_json_decoder(columns: Sequence[SchemaField], *, additional_properties: bool, prefer: str = "auto") \
        -> ValueDecoder:
    """A decoder of JSON documents into rows of the table whose columns are `columns`.

    `prefer` (INPUT_SCHEMA_PROTO_DECODER's values): "auto" (the native decoder when the extension is built,
    else the Python one), "native" (an ImportError when it is not built) or "python" (the reference)."""
    if prefer not in ("auto", "native", "python"):
        raise ValueError(f"prefer must be auto, native or python, not {prefer!r}")
    if prefer != "python":
        try:
            from firehose_bq.decode.json_native import JsonNativeDecoder
        except ImportError:
            if prefer == "native":
                raise
        else:
            return JsonNativeDecoder(columns, additional_properties=additional_properties)
    from firehose_bq.decode.json_reference import JsonReferenceDecoder

    return JsonReferenceDecoder(columns, additional_properties=additional_properties)
