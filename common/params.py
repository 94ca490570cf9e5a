"""Query parameters the apps' APIs share (times, choices, ids): each malformed one is
an `InvalidParameter` naming it, answered 400 as
`{"error": "invalid_parameter", "detail": ..., "field": name}`."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from common.errors import Invalid
from common.time import dt, parse_ts

# The largest id a bigint primary key holds: past it a lookup would overflow, not miss.
ID_MAX = 2**63 - 1


class InvalidParameter(Invalid):
    """A query parameter that can never be accepted as written; `field` names it."""

    code = "invalid_parameter"

    def __init__(self, detail: str, *, field: str):
        super().__init__(detail, field=field)


def time_param(request, name: str) -> float | None:
    """Unix seconds from `?name=` given as unix seconds or RFC 3339 with an offset."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    try:
        ts = parse_ts(float(value))
    except ValueError:  # not a number: RFC 3339 (a '+' in a query string may arrive as ' ')
        ts = parse_ts(value.replace(" ", "+"))
    if ts is None:
        raise InvalidParameter(
            f"{name} must be unix seconds or an RFC 3339 time with an offset.", field=name
        )
    return ts


def period_params(request, *, default_days: float) -> tuple[datetime, datetime]:
    """`?start=&end=`: end defaults to now, start to `default_days` before end."""
    end_ts = time_param(request, "end")
    end = timezone.now() if end_ts is None else dt(end_ts)
    start_ts = time_param(request, "start")
    start = end - timedelta(days=default_days) if start_ts is None else dt(start_ts)
    if end <= start:
        raise InvalidParameter("end must be after start.", field="end")
    return start, end


def choice_param(request, name: str, choices) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and value not in choices:
        raise InvalidParameter(f"{name} must be one of {', '.join(choices)}.", field=name)
    return value


def id_param(request, name: str) -> int | None:
    """A row id from `?name=`: ASCII digits within a bigint ('²' is a digit to
    str.isdigit, not to int)."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    if not (value.isascii() and value.isdigit() and int(value) <= ID_MAX):
        raise InvalidParameter(f"{name} must be an id.", field=name)
    return int(value)


def int_param(request, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer from `?name=` within [minimum, maximum], `default` when absent:
    ASCII digits, an optional minus sign."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    digits = value[1:] if value.startswith("-") else value
    number = int(value) if digits.isascii() and digits.isdigit() and len(digits) < 20 else None
    if number is None or not minimum <= number <= maximum:
        raise InvalidParameter(
            f"{name} must be an integer from {minimum} to {maximum}.", field=name
        )
    return number


def bool_param(request, name: str) -> bool | None:
    """`?name=true` or `?name=false`; None when absent."""
    value = choice_param(request, name, ("true", "false"))
    return None if value is None else value == "true"
