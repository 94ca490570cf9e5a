"""Time helpers every app shares: the wire's unix seconds as aware datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def dt(ts: float) -> datetime:
    """Unix seconds (the wire's clock) as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=UTC)
