"""Kafka values → Arrow: one message type's wire bytes decoded into a StructArray in the table's types.

`values.py` holds the contract every decoder keeps; `native.py` (with `_native.c`) is the decoder the
job uses; `reference.py` is the Python decoder (the generated converter of `convert.py`), kept as the
reference the native one is tested against and as the fallback. `make_value_decoder` chooses.
"""

from __future__ import annotations

import importlib
import logging

from google.protobuf.message import Message

from firehose_bq.decode.values import DecodedValues, DecodeFailure, ValueDecoder
from firehose_bq.schema import SchemaOptions

__all__ = ["DECODERS", "DecodeFailure", "DecodedValues", "NativeUnavailable", "ValueDecoder", "make_value_decoder",
           "native_unavailable"]

log = logging.getLogger(__name__)

DECODERS = ("auto", "native", "python")
BUILD_HINT = ("build it with `pip install -e .` (or `make venv`) where a C compiler (gcc) and the Python headers "
              "(e.g. the python3-dev package) are installed")


class NativeUnavailable(RuntimeError):
    """The native decoder was required (INPUT_SCHEMA_PROTO_DECODER=native) but is not built here."""


def native_unavailable() -> str:
    """Why the compiled extension cannot be used here; empty when it can."""
    try:
        importlib.import_module("firehose_bq.decode._native")
    except ImportError as exc:
        return f"the native decoder is not built ({exc}); {BUILD_HINT}"
    return ""


def make_value_decoder(message_class: type[Message], depth: int = 1, options: SchemaOptions = SchemaOptions(),
                       confluent_framed: bool = False, detect_unknown_fields: bool = True,
                       prefer: str = "auto") -> ValueDecoder:
    """The decoder of `message_class` values whose columns sit at level `depth` (1 = the table's top level;
    the Kafka key's message is at 2, inside `message_key`).

    `prefer`: "auto" = the native decoder when it is built and supports the descriptor's shape, else the
    reference, with one log line saying why; "native" = the same, but a missing build raises
    NativeUnavailable (a shape it does not support still falls back: shapes arrive with descriptor
    refreshes, mid-run); "python" = the reference decoder."""
    from firehose_bq.decode.reference import ReferenceDecoder

    if prefer not in DECODERS:
        raise ValueError(f"prefer must be one of {', '.join(DECODERS)}, not {prefer!r}")
    args = (message_class, depth, options, confluent_framed, detect_unknown_fields)
    if prefer == "python":
        return ReferenceDecoder(*args)
    why = native_unavailable()
    if why and prefer == "native":
        raise NativeUnavailable(f"INPUT_SCHEMA_PROTO_DECODER=native, but {why}")
    if not why:
        from firehose_bq.decode.native import NativeDecoder, UnsupportedShape

        try:
            return NativeDecoder(*args)
        except UnsupportedShape as exc:
            why = str(exc)
    log.warning("decoding %s with the Python reference decoder (much slower): %s",
                message_class.DESCRIPTOR.full_name, why)
    return ReferenceDecoder(*args)
