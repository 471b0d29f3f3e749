"""Kafka values → Arrow: one message type's wire bytes decoded into a StructArray in the table's types.

`values.py` holds the contract every decoder keeps; `native.py` (with `_native.c`) is the protobuf decoder
the job uses; `reference.py` is the Python decoder (the generated converter of `convert.py`), kept as the
reference the native one is tested against and as the fallback. JSON input (`INPUT_SCHEMA_DATA_TYPE=JSON`)
is decoded against the destination table's columns: `json_rules.py` holds its rules, `json_native.py` (over
the `_json` C extension) and `json_reference.py` (pure Python) keep them. `make_value_decoder` and
`make_json_decoder` choose.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence

from google.cloud.bigquery import SchemaField
from google.protobuf.message import Message

from firehose_bq.decode.values import DecodedValues, ValueDecoder
from firehose_bq.schema import SchemaOptions

__all__ = ["DECODERS", "DecodedValues", "NativeUnavailable", "ValueDecoder", "make_json_decoder",
           "make_value_decoder", "native_unavailable"]

log = logging.getLogger(__name__)

DECODERS = ("auto", "native", "python")
BUILD_HINT = ("build it with `pip install -e .` (or `make venv`) where a C compiler (gcc) and the Python headers "
              "(e.g. the python3-dev package) are installed")


class NativeUnavailable(RuntimeError):
    """The native decoder was required (INPUT_SCHEMA_PROTO_DECODER=native) but is not built here."""


def native_unavailable(module: str = "_native") -> str:
    """Why the compiled extension `module` (`_native`: protobuf, `_json`: JSON) cannot be used here; empty
    when it can."""
    try:
        importlib.import_module(f"firehose_bq.decode.{module}")
    except ImportError as exc:
        return f"the native decoder is not built ({exc}); {BUILD_HINT}"
    return ""


def _why_not_native(prefer: str, module: str) -> str | None:
    """Whether the extension `module` decodes under `prefer`: None = the Python decoder was asked for, "" =
    the extension is there, else why it is not (for the log line); NativeUnavailable when it was required."""
    if prefer not in DECODERS:
        raise ValueError(f"prefer must be one of {', '.join(DECODERS)}, not {prefer!r}")
    if prefer == "python":
        return None
    why = native_unavailable(module)
    if why and prefer == "native":
        raise NativeUnavailable(f"INPUT_SCHEMA_PROTO_DECODER=native, but {why}")
    return why


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

    args = (message_class, depth, options, confluent_framed, detect_unknown_fields)
    why = _why_not_native(prefer, "_native")
    if why is None:
        return ReferenceDecoder(*args)
    if not why:
        from firehose_bq.decode.native import NativeDecoder, UnsupportedShape

        try:
            return NativeDecoder(*args)
        except UnsupportedShape as exc:
            why = str(exc)
    log.warning("decoding %s with the Python reference decoder (much slower): %s",
                message_class.DESCRIPTOR.full_name, why)
    return ReferenceDecoder(*args)


def make_json_decoder(columns: Sequence[SchemaField], *, additional_properties: bool, prefer: str = "auto") \
        -> ValueDecoder:
    """A decoder of JSON documents into rows of the table whose columns are `columns`; `prefer` as for
    make_value_decoder (the JSON decoder supports every column shape, so only a missing build falls back)."""
    from firehose_bq.decode.json_reference import JsonReferenceDecoder

    why = _why_not_native(prefer, "_json")
    if why == "":
        from firehose_bq.decode.json_native import JsonNativeDecoder

        return JsonNativeDecoder(columns, additional_properties=additional_properties)
    if why is not None:
        log.warning("decoding JSON with the Python reference decoder (much slower): %s", why)
    return JsonReferenceDecoder(columns, additional_properties=additional_properties)
