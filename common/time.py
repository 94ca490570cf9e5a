"""Time helpers every app shares: the wire's clock (unix seconds, or RFC 3339 with an
offset) read and written as aware UTC datetimes."""

from __future__ import annotations

import re
from datetime import UTC, datetime

# RFC 3339's date-time (section 5.6): 'T' and 'Z' in either case, an offset required,
# ASCII digits only. Python's fromisoformat alone also takes '2026-11-30 08:00:00Z',
# '20261130T080000Z', week dates and offsets without a colon.
RFC3339 = re.compile(
    r"\A\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})\Z",
    re.ASCII,
)
# Timestamps outside these years are a unit mistake (ms or ns), not a date.
TS_MIN = 946684800.0  # 2000-01-01
TS_MAX = 4102444800.0  # 2100-01-01


def dt(ts: float) -> datetime:
    """Unix seconds (the wire's clock) as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=UTC)


def parse_ts(value) -> float | None:
    """Unix seconds from a number or an RFC 3339 date-time (an offset required); None
    for anything else, or a time outside TS_MIN..TS_MAX."""
    if type(value) in (int, float):
        # Compared before converting: an integer past a double's range would overflow.
        if not (TS_MIN <= value <= TS_MAX):
            return None
        return float(value)
    if type(value) is not str or not RFC3339.match(value):
        return None
    try:
        ts = datetime.fromisoformat(value.upper()).timestamp()
    except ValueError:  # month 13, second 60, offset +25:00 ...
        return None
    if not (TS_MIN <= ts <= TS_MAX):
        return None
    return ts
