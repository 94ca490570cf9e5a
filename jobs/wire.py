"""Wire format v1: parse and validate an ingest body.

Plain Python on purpose: it runs for every event of every batch, so it checks
each field once, with no per-event object machinery, and collects every
problem (index, field, reason) instead of stopping at the first.
"""

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime

import orjson

KINDS = frozenset(
    {
        "attempt_started",
        "ready",
        "checkpoint_load_started",
        "checkpoint_loaded",
        "step",
        "checkpoint_save_started",
        "checkpoint_saved",
        "rank_window",
        "heartbeat",
        "fault",
        "attempt_ended",
        "job_finished",
    }
)
KINDS_WITHOUT_ATTEMPT = frozenset({"heartbeat", "fault"})
FAULT_TYPES = frozenset(
    {
        "crash",
        "hang",
        "nccl_timeout",
        "gpu_xid",
        "ecc",
        "oom",
        "nan",
        "loss_spike",
        "sdc",
        "preempted",
        "network",
        "other",
    }
)
END_REASONS = frozenset({"completed", "failed", "killed", "preempted"})
EVENT_FIELDS = frozenset({"id", "job", "kind", "ts", "attempt", "node", "rank", "data"})
# The alphabets of names that end up in URLs, pages and the database. Checked
# with \A...\Z: `$` would let a trailing newline through. Job keys are slugs;
# node names are host names (letters, digits, '.', '-', '_', starting with a
# letter or digit), never '/' (a node's page is /nodes/<cluster>/<name>/).
JOB_KEY = re.compile(r"\A[A-Za-z0-9_-]{1,100}\Z")
NODE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
SLUG = JOB_KEY
# What the database's integer columns hold: a number past these is refused at the wire.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Timestamps outside these years are a unit mistake (ms or ns), not a date.
TS_MIN = 946684800.0  # 2000-01-01
TS_MAX = 4102444800.0  # 2100-01-01
# Strict JSON has no NaN or infinity; clients may send them as these strings.
NON_FINITE = {
    "nan": math.nan,
    "NaN": math.nan,
    "inf": math.inf,
    "Infinity": math.inf,
    "-inf": -math.inf,
    "-Infinity": -math.inf,
}


class WireError(Exception):
    """The body as a whole is unusable (not JSON, wrong shape, too many events)."""

    def __init__(self, field: str, reason: str):
        super().__init__(reason)
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


def _is_int(v) -> bool:
    return type(v) is int


def _is_number(v) -> bool:
    t = type(v)
    return t is float or t is int


# Field checks for `data`: name -> (check, required, reason when wrong).
def _int_min(lo):
    return lambda v: type(v) is int and v >= lo


def _num_min(lo, isfinite=math.isfinite):
    # _is_number inlined: this runs for most fields of most events.
    return lambda v: (type(v) is float or type(v) is int) and isfinite(v) and v >= lo


def _str_max(n):
    return lambda v: type(v) is str and 0 < len(v) <= n


def _choice(options):
    return lambda v: type(v) is str and v in options


def _str_list(v):
    return (
        type(v) is list and len(v) <= 10000 and all(type(x) is str and 0 < len(x) <= 128 for x in v)
    )


def _any_number(v):
    t = type(v)
    return t is float or t is int or (t is str and v in NON_FINITE)


STEP = ("step", _int_min(0), "an integer >= 0")

DATA_SCHEMA: dict[str, dict[str, tuple]] = {
    "attempt_started": {
        "world_size": (_int_min(1), True, "an integer >= 1"),
        "gpus_per_node": (_int_min(1), False, "an integer >= 1"),
        "nodes": (_str_list, False, "a list of node names (strings of 1..128 characters)"),
    },
    "ready": {},
    "checkpoint_load_started": {"step": (STEP[1], True, STEP[2])},
    "checkpoint_loaded": {"step": (STEP[1], True, STEP[2])},
    "step": {
        "step": (STEP[1], True, STEP[2]),
        "loss": (_any_number, False, "a number (or 'NaN', 'Infinity', '-Infinity')"),
        "grad_norm": (_any_number, False, "a number (or 'NaN', 'Infinity', '-Infinity')"),
        "tokens": (_int_min(0), False, "an integer >= 0"),
        "step_time_s": (_num_min(0), False, "a finite number >= 0"),
    },
    "checkpoint_save_started": {"step": (STEP[1], True, STEP[2])},
    "checkpoint_saved": {
        "step": (STEP[1], True, STEP[2]),
        "bytes": (_int_min(0), False, "an integer >= 0"),
        "blocking_s": (_num_min(0), False, "a finite number >= 0"),
        "uri": (_str_max(1024), False, "a string of 1..1024 characters"),
        "tier": (_str_max(32), False, "a string of 1..32 characters"),
    },
    "rank_window": {
        "first_step": (_int_min(0), True, "an integer >= 0"),
        "last_step": (_int_min(0), True, "an integer >= 0"),
        "compute_s": (_num_min(0), True, "a finite number >= 0"),
        "step_s": (_num_min(0), True, "a finite number >= 0"),
        "comm_wait_s": (_num_min(0), False, "a finite number >= 0"),
        "data_wait_s": (_num_min(0), False, "a finite number >= 0"),
    },
    "heartbeat": {},
    "fault": {
        "type": (_choice(FAULT_TYPES), True, "one of " + ", ".join(sorted(FAULT_TYPES))),
        "xid": (_int_min(0), False, "an integer >= 0"),
        "message": (_str_max(4096), False, "a string of 1..4096 characters"),
        "exit_code": (_is_int, False, "an integer"),
    },
    "attempt_ended": {
        "reason": (_choice(END_REASONS), True, "one of " + ", ".join(sorted(END_REASONS))),
        "exit_code": (_is_int, False, "an integer"),
        # Who asked for the end (an operator, the scheduler, a recovery action): not a fault.
        "requested_by": (_str_max(200), False, "a string of 1..200 characters"),
    },
    "job_finished": {},
}


# The same, as tuples: iterated for every event.
_DATA_FIELDS = {
    kind: tuple((name, *spec) for name, spec in fields.items())
    for kind, fields in DATA_SCHEMA.items()
}


BAD_JOB = "required: a slug (letters, digits, '-' and '_', 1..100 characters)"
BAD_TS = "required: unix seconds or an RFC 3339 time with an offset, between 2000 and 2100"


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
    if not isinstance(payload, dict):
        raise WireError("body", 'must be a JSON object: {"events": [...]}')
    extra = set(payload) - {"events"}
    if extra:
        raise WireError(sorted(extra)[0], "unknown field; the body holds only 'events'")
    events = payload.get("events")
    if not isinstance(events, list):
        raise WireError("events", "required: a list of events")
    return events


def parse_ts(value) -> float | None:
    """Unix seconds from a number or an RFC 3339 string with an offset."""
    if _is_number(value):
        ts = float(value)
    elif type(value) is str:
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            return None
        if dt.tzinfo is None:
            return None
        ts = dt.timestamp()
    else:
        return None
    if not (TS_MIN <= ts <= TS_MAX):
        return None
    return ts


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
    good_jobs: set[str] = set()

    for i, ev in enumerate(raw_events):
        if type(ev) is not dict:
            errors.append({"index": i, "field": "", "reason": "an event must be a JSON object"})
            continue
        bad = len(errors)
        if not EVENT_FIELDS.issuperset(ev):
            for k in sorted(set(ev) - EVENT_FIELDS):
                _error(errors, i, str(k), "unknown field")

        cid = ev.get("id")
        if type(cid) is not str or not (0 < len(cid) <= 128):
            _error(errors, i, "id", "required: a string of 1..128 characters")

        job = ev.get("job")
        if job not in good_jobs:
            if type(job) is str and SLUG.match(job):
                good_jobs.add(job)
            else:
                _error(errors, i, "job", BAD_JOB)

        kind = ev.get("kind")
        if kind not in KINDS:
            _error(errors, i, "kind", "required: one of " + ", ".join(sorted(KINDS)))

        ts = parse_ts(ev.get("ts"))
        if ts is None:
            _error(errors, i, "ts", BAD_TS)

        attempt = ev.get("attempt")
        if attempt is None:
            if kind in KINDS and kind not in KINDS_WITHOUT_ATTEMPT:
                _error(errors, i, "attempt", f"required for {kind}: an integer >= 1")
        elif type(attempt) is not int or attempt < 1:
            _error(errors, i, "attempt", "must be an integer >= 1")

        node = ev.get("node")
        if node is None:
            node = ""
            if kind == "heartbeat":
                _error(errors, i, "node", "required for heartbeat: the node that is alive")
        elif type(node) is not str or not (0 < len(node) <= 128):
            _error(errors, i, "node", "must be a string of 1..128 characters")

        rank = ev.get("rank")
        if rank is None:
            if kind == "rank_window":
                _error(errors, i, "rank", "required for rank_window: an integer >= 0")
        elif type(rank) is not int or rank < 0:
            _error(errors, i, "rank", "must be an integer >= 0")

        data = ev.get("data")
        if data is None:
            data = {}
        if type(data) is not dict:
            _error(errors, i, "data", "must be a JSON object")
        elif kind in KINDS:
            for name, check, required, reason in _DATA_FIELDS[kind]:
                value = data.get(name)
                if value is None:
                    if required:
                        _error(errors, i, f"data.{name}", f"required for {kind}: {reason}")
                elif not check(value):
                    _error(errors, i, f"data.{name}", f"must be {reason}")
            if (
                kind == "rank_window"
                and len(errors) == bad
                and data["first_step"] > data["last_step"]
            ):
                _error(errors, i, "data.last_step", "must be >= data.first_step")

        if len(errors) == bad:
            if kind == "step" or kind == "fault":
                data = _finite_json(data)
            out.append(WireEvent(i, cid, job, kind, ts, attempt, node, rank, data))
    return out, errors
