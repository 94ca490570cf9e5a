"""Wire format v1: parse and validate an ingest body.

Plain Python on purpose: it runs for every event of every batch, so it checks
each field once, with no per-event object machinery, and collects every
problem (index, field, reason) instead of stopping at the first.
"""

import json
import math
from dataclasses import dataclass

import orjson

from common.errors import Invalid
from common.time import parse_ts
from common.vocabulary import (
    END_REASONS,
    FAULT_TYPES,
    JOB_KEY,
    KINDS_WITHOUT_ATTEMPT,
    NODE_NAME,
    WIRE_KINDS,
)

# What a client may send (common.vocabulary holds the vocabulary; these names are the wire's).
KINDS = frozenset(WIRE_KINDS)
EVENT_FIELDS = frozenset({"id", "job", "kind", "ts", "attempt", "node", "rank", "data"})
# What the database's integer columns hold: a number past these is refused at the wire.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT32_MIN = -(2**31)
INT64_MIN = -(2**63)
# What `data` may hold beside its kind's fields: any JSON value, its lists and objects
# nested at most this deep (orjson writes at most 254 levels; jsonb keeps what is sent).
MAX_DATA_DEPTH = 8
# Strict JSON has no NaN or infinity; clients may send them as these strings.
NON_FINITE = {
    "nan": math.nan,
    "NaN": math.nan,
    "inf": math.inf,
    "Infinity": math.inf,
    "-inf": -math.inf,
    "-Infinity": -math.inf,
}


class WireError(Invalid):
    """The body as a whole is unusable (not JSON, wrong shape, too many events)."""

    code = "invalid_body"

    def __init__(self, field: str, reason: str):
        error = {"index": None, "field": field, "reason": reason}
        super().__init__(f"{field}: {reason}", errors=[error])
        self.field = field
        self.reason = reason


@dataclass(slots=True)
class WireEvent:
    index: int
    client_id: str
    job: str
    kind: str
    ts: float
    attempt: int | None
    node: str
    rank: int | None
    data: dict


def _is_number(v) -> bool:
    t = type(v)
    return t is float or t is int


def _storable(s: str) -> bool:
    """A string PostgreSQL can hold: no NUL, no lone surrogate (not UTF-8)."""
    if "\x00" in s:
        return False
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NO_NUL = ", no NUL or lone surrogate"
BAD_STRING = "must not contain NUL or lone surrogates (PostgreSQL cannot store them)"


# Field checks for `data`: name -> (check, required, reason when wrong).
def _int_range(lo, hi):
    return lambda v: type(v) is int and lo <= v <= hi


def _num_min(lo, isfinite=math.isfinite):
    # _is_number inlined: this runs for most fields of most events. An integer is held
    # to 64 bits: orjson writes no more, and isfinite would overflow past a double.
    return lambda v: (
        ((type(v) is float and isfinite(v)) or (type(v) is int and v <= INT64_MAX)) and v >= lo
    )


def _str_max(n):
    return lambda v: type(v) is str and 0 < len(v) <= n and _storable(v)


def _choice(options):
    return lambda v: type(v) is str and v in options


def _node_list(v, match=NODE_NAME.match):
    return type(v) is list and len(v) <= 10000 and all(type(x) is str and match(x) for x in v)


def _any_number(v):
    t = type(v)
    return (
        t is float
        or (t is int and INT64_MIN <= v <= INT64_MAX)  # as in _num_min
        or (t is str and v in NON_FINITE)
    )


INT32 = "an integer of at most 2147483647"
COUNT32 = (_int_range(1, INT32_MAX), "an integer from 1 to 2147483647")
STEP = ("step", _int_range(0, INT64_MAX), "an integer from 0 to 9223372036854775807")
COUNT64 = (STEP[1], STEP[2])
EXIT_CODE = (_int_range(INT32_MIN, INT32_MAX), "an integer from -2147483648 to 2147483647")
BAD_NODE = (
    "a node name: letters, digits, '.', '-' and '_', starting with a letter or digit,"
    " 1..128 characters"
)

DATA_SCHEMA: dict[str, dict[str, tuple]] = {
    "attempt_started": {
        "world_size": (COUNT32[0], True, COUNT32[1]),
        "gpus_per_node": (COUNT32[0], False, COUNT32[1]),
        "nodes": (_node_list, False, "a list of node names (each " + BAD_NODE + ")"),
    },
    "ready": {},
    "checkpoint_load_started": {"step": (STEP[1], True, STEP[2])},
    "checkpoint_loaded": {"step": (STEP[1], True, STEP[2])},
    "step": {
        "step": (STEP[1], True, STEP[2]),
        "loss": (_any_number, False, "a number (or 'NaN', 'Infinity', '-Infinity')"),
        "grad_norm": (_any_number, False, "a number (or 'NaN', 'Infinity', '-Infinity')"),
        "tokens": (COUNT64[0], False, COUNT64[1]),
        "step_time_s": (_num_min(0), False, "a finite number >= 0"),
    },
    "checkpoint_save_started": {"step": (STEP[1], True, STEP[2])},
    "checkpoint_saved": {
        "step": (STEP[1], True, STEP[2]),
        "bytes": (COUNT64[0], False, COUNT64[1]),
        "blocking_s": (_num_min(0), False, "a finite number >= 0"),
        "uri": (_str_max(1024), False, "a string of 1..1024 characters" + NO_NUL),
        "tier": (_str_max(32), False, "a string of 1..32 characters" + NO_NUL),
    },
    "rank_window": {
        "first_step": (COUNT64[0], True, COUNT64[1]),
        "last_step": (COUNT64[0], True, COUNT64[1]),
        "compute_s": (_num_min(0), True, "a finite number >= 0"),
        "step_s": (_num_min(0), True, "a finite number >= 0"),
        "comm_wait_s": (_num_min(0), False, "a finite number >= 0"),
        "data_wait_s": (_num_min(0), False, "a finite number >= 0"),
    },
    "heartbeat": {},
    "fault": {
        "type": (_choice(FAULT_TYPES), True, "one of " + ", ".join(sorted(FAULT_TYPES))),
        "xid": (_int_range(0, INT32_MAX), False, "an integer from 0 to 2147483647"),
        "message": (_str_max(4096), False, "a string of 1..4096 characters" + NO_NUL),
        "exit_code": (EXIT_CODE[0], False, EXIT_CODE[1]),
    },
    "attempt_ended": {
        "reason": (_choice(END_REASONS), True, "one of " + ", ".join(sorted(END_REASONS))),
        "exit_code": (EXIT_CODE[0], False, EXIT_CODE[1]),
        # Who asked for the end (an operator, the scheduler, a recovery action): not a fault.
        "requested_by": (_str_max(200), False, "a string of 1..200 characters" + NO_NUL),
    },
    "job_finished": {},
    # The training loop stops stepping on purpose (an evaluation, say) and resumes:
    # the hang detector does not count the time in between as a stall.
    "pause_started": {
        "reason": (_str_max(64), False, "a string of 1..64 characters" + NO_NUL),
    },
    "pause_ended": {},
}


# The same, as tuples: iterated for every event.
_DATA_FIELDS = {
    kind: tuple((name, *spec) for name, spec in fields.items())
    for kind, fields in DATA_SCHEMA.items()
}


def _check_extras(errors: list, index: int, kind: str, data: dict) -> None:
    """The keys of `data` beyond its kind's fields: kept as sent when storable."""
    for key, value in data.items():
        if key in DATA_SCHEMA[kind]:
            continue
        if not _storable(key):
            _error(errors, index, "data", "keys " + BAD_STRING)
            continue
        problem = _extra_problem(value)
        if problem:
            _error(errors, index, _field_name(f"data.{key}"), problem)


BAD_JOB = "required: a slug (letters, digits, '-' and '_', 1..100 characters)"
BAD_TS = (
    "required: unix seconds or an RFC 3339 time with an offset"
    " (2026-11-30T08:00:00.5Z, 2026-11-30T09:00:00+01:00), between 2000 and 2100"
)


def _field_name(key) -> str:
    """A key the client sent, safe to echo in an error (no lone surrogate, bounded)."""
    name = str(key)
    if len(name) > 100:
        name = name[:100] + "..."
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _extra_problem(value, depth: int = 1, isfinite=math.isfinite) -> str | None:
    """Why an extra `data` value cannot be stored as sent, or None. Bounded by
    MAX_DATA_DEPTH, so it never recurses far."""
    t = type(value)
    if t is str:
        return None if _storable(value) else BAD_STRING
    if t is int:
        return None if INT64_MIN <= value <= INT64_MAX else "integers must fit in 64 bits"
    if t is float:
        # At the top of `data`, NaN and infinity are kept as strings; deeper they are refused.
        return None if depth == 1 or isfinite(value) else "numbers must be finite"
    if t is list or t is dict:
        if depth > MAX_DATA_DEPTH:
            return f"lists and objects nest at most {MAX_DATA_DEPTH} levels"
        if t is dict:
            for k, v in value.items():
                problem = BAD_STRING if not _storable(k) else _extra_problem(v, depth + 1)
                if problem:
                    return problem
        else:
            for v in value:
                problem = _extra_problem(v, depth + 1)
                if problem:
                    return problem
    return None  # None, True, False


def _error(errors: list, index: int, field: str, reason: str) -> None:
    errors.append({"index": index, "field": field, "reason": reason})


def parse_body(body: bytes) -> list:
    """The `events` list of a request body, or WireError."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        # orjson is strict; Python's json also reads NaN and Infinity literals.
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise WireError("body", f"not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise WireError("body", "nested too deeply to read") from exc
    if not isinstance(payload, dict):
        raise WireError("body", 'must be a JSON object: {"events": [...]}')
    extra = set(payload) - {"events"}
    if extra:
        name = _field_name(sorted(extra)[0])
        raise WireError(name, "unknown field; the body holds only 'events'")
    events = payload.get("events")
    if not isinstance(events, list):
        raise WireError("events", "required: a list of events")
    return events


def _finite_json(data: dict, isfinite=math.isfinite) -> dict:
    """`data` with non-finite floats written as strings (JSON and jsonb have none)."""
    for v in data.values():
        if type(v) is float and not isfinite(v):
            break
    else:
        return data  # the usual case: nothing to rewrite
    out = {}
    for k, v in data.items():
        if type(v) is float and not math.isfinite(v):
            v = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        out[k] = v
    return out


def as_float(v) -> float | None:
    """A `data` number as a float, reading the non-finite spellings."""
    if v is None:
        return None
    if type(v) is str:
        return NON_FINITE[v]
    return float(v)


def validate_events(raw_events: list, max_events: int) -> tuple[list[WireEvent], list[dict]]:
    """Validated events and a list of problems, each {index, field, reason}."""
    if len(raw_events) == 0:
        raise WireError("events", "must hold at least one event")
    if len(raw_events) > max_events:
        raise WireError("events", f"at most {max_events} events per request")
    errors: list[dict] = []
    out: list[WireEvent] = []
    good_jobs: set[str] = set()  # names already matched in this batch
    good_nodes: set[str] = set()

    for i, ev in enumerate(raw_events):
        if type(ev) is not dict:
            errors.append({"index": i, "field": "", "reason": "an event must be a JSON object"})
            continue
        bad = len(errors)
        if not EVENT_FIELDS.issuperset(ev):
            for k in sorted(set(ev) - EVENT_FIELDS):
                _error(errors, i, _field_name(k), "unknown field")

        cid = ev.get("id")
        if type(cid) is not str or not (0 < len(cid) <= 128):
            _error(errors, i, "id", "required: a string of 1..128 characters")
        elif (not cid.isascii() or "\x00" in cid) and not _storable(cid):
            _error(errors, i, "id", BAD_STRING)  # (an ASCII id without NUL costs no call)

        # The type first: a list or an object cannot even be looked up in a set.
        job = ev.get("job")
        if type(job) is not str or job not in good_jobs:
            if type(job) is str and JOB_KEY.match(job):
                good_jobs.add(job)
            else:
                _error(errors, i, "job", BAD_JOB)

        kind = ev.get("kind")
        if type(kind) is not str or kind not in KINDS:
            _error(errors, i, "kind", "required: one of " + ", ".join(sorted(KINDS)))
            kind = None

        ts = parse_ts(ev.get("ts"))
        if ts is None:
            _error(errors, i, "ts", BAD_TS)

        attempt = ev.get("attempt")
        if attempt is None:
            if kind in KINDS and kind not in KINDS_WITHOUT_ATTEMPT:
                _error(errors, i, "attempt", f"required for {kind}: an integer >= 1")
        elif type(attempt) is not int or not (1 <= attempt <= INT32_MAX):
            _error(errors, i, "attempt", "must be " + COUNT32[1])

        node = ev.get("node")
        if node is None:
            node = ""
            if kind == "heartbeat":
                _error(errors, i, "node", "required for heartbeat: the node that is alive")
        elif type(node) is not str or node not in good_nodes:
            if type(node) is str and NODE_NAME.match(node):
                good_nodes.add(node)
            else:
                _error(errors, i, "node", "must be " + BAD_NODE)

        rank = ev.get("rank")
        if rank is None:
            if kind == "rank_window":
                _error(errors, i, "rank", "required for rank_window: an integer >= 0")
        elif type(rank) is not int or not (0 <= rank <= INT32_MAX):
            _error(errors, i, "rank", "must be an integer from 0 to 2147483647")

        data = ev.get("data")
        if data is None:
            data = {}
        extras = False
        if type(data) is not dict:
            _error(errors, i, "data", "must be a JSON object")
        elif kind is not None:
            known = 0
            for name, check, required, reason in _DATA_FIELDS[kind]:
                value = data.get(name)
                if value is None:
                    if required:
                        _error(errors, i, f"data.{name}", f"required for {kind}: {reason}")
                    continue
                known += 1
                if not check(value):
                    _error(errors, i, f"data.{name}", f"must be {reason}")
            if (
                kind == "rank_window"
                and len(errors) == bad
                and data["first_step"] > data["last_step"]
            ):
                _error(errors, i, "data.last_step", "must be >= data.first_step")
            if len(data) > known:  # keys beyond the kind's fields (or fields set to null)
                extras = True
                _check_extras(errors, i, kind, data)

        if len(errors) == bad:
            if kind == "step" or kind == "fault" or extras:
                data = _finite_json(data)
            out.append(WireEvent(i, cid, job, kind, ts, attempt, node, rank, data))
    return out, errors
