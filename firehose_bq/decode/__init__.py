"""Kafka values → Arrow: one message type's wire bytes decoded into a StructArray in the table's types.

`values.py` holds the contract every decoder keeps; `reference.py` is the Python decoder (the generated
converter of `convert.py`), kept as the reference and the fallback.
"""

from __future__ import annotations

from google.protobuf.message import Message

from firehose_bq.decode.values import DecodedValues, DecodeFailure, ValueDecoder
from firehose_bq.schema import SchemaOptions

__all__ = ["DecodeFailure", "DecodedValues", "ValueDecoder", "make_value_decoder"]


def make_value_decoder(message_class: type[Message], depth: int, options: SchemaOptions, *,
                       confluent_framed: bool, detect_unknown_fields: bool, prefer: str = "auto") -> ValueDecoder:
    from firehose_bq.decode.reference import ReferenceDecoder

    return ReferenceDecoder(message_class, depth, options, confluent_framed, detect_unknown_fields)
