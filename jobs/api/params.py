"""Query parameters shared by the API's list and figure endpoints; 400 when malformed."""

from console.exceptions import ApiError
from jobs.wire import INT64_MAX, parse_ts


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
        raise ApiError(
            400,
            "invalid_parameter",
            f"{name} must be unix seconds or an RFC 3339 time with an offset.",
            field=name,
        )
    return ts


def choice_param(request, name: str, choices) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and value not in choices:
        raise ApiError(
            400, "invalid_parameter", f"{name} must be one of {', '.join(choices)}.", field=name
        )
    return value


def id_param(request, name: str) -> int | None:
    """A row id from `?name=`: ASCII digits within a bigint ('²' is a digit to
    str.isdigit, not to int)."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    if not (value.isascii() and value.isdigit() and int(value) <= INT64_MAX):
        raise ApiError(400, "invalid_parameter", f"{name} must be an id.", field=name)
    return int(value)
