"""The contract of a value decoder: wire bytes in, one Arrow struct slot per input out, failures as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from firehose_bq.errors import RowError


@dataclass
class DecodedValues:
    """One decoded Arrow batch of values.

    `values` has one slot per input, in input order: NULL where the input was NULL (a tombstone: what it
    means is the caller's business) or failed. `unknown_fields` lists the inputs that carried fields the
    descriptor lacks; they are decoded without them."""

    values: pa.StructArray
    # Input `index` could not be decoded: DESERIALIZATION_ERROR (not the message's wire format) or
    # INVALID_MESSAGE_ERROR (parses, but a value has no BigQuery form: a missing proto2 `required`, a
    # Timestamp out of range, a uint64 past INTEGER's range, ...).
    failures: list[RowError] = field(default_factory=list)
    unknown_fields: list[int] = field(default_factory=list)


class ValueDecoder(Protocol):
    """Decodes values of one message type at one column depth; built once per descriptor version."""

    @property
    def arrow_type(self) -> pa.StructType:
        """The struct type of `DecodedValues.values`: `arrow_schema.arrow_struct` of the message's columns."""

    def decode(self, values: pa.Array) -> DecodedValues:
        """`values`: a binary (or large_binary) array of serialized messages."""
