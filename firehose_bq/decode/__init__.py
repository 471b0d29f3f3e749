"""Kafka values → Arrow: one message type's wire bytes decoded into a StructArray in the table's types.

`values.py` holds the contract every decoder keeps; `reference.py` is the Python decoder (the generated
converter of `convert.py`), kept as the reference and the fallback.
"""

from firehose_bq.decode.values import DecodedValues, DecodeFailure, ValueDecoder

__all__ = ["DecodeFailure", "DecodedValues", "ValueDecoder"]
