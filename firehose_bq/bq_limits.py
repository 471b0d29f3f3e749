"""BigQuery's value ranges, in the units Arrow holds them: one place for every layer that checks them.

Free of imports beyond the standard library: the source's planning process reads it too.
"""

from __future__ import annotations

from datetime import date

# TIMESTAMP and DATE: 0001-01-01 .. 9999-12-31, in microseconds and days since the epoch.
MIN_MICROS = -62_135_596_800_000_000
MAX_MICROS = 253_402_300_799_999_999
MIN_DAYS = (date(1, 1, 1) - date(1970, 1, 1)).days
MAX_DAYS = (date(9999, 12, 31) - date(1970, 1, 1)).days
