"""The wire validator over any JSON: it never raises, it only yields errors or
events the database can store."""

import contextlib
import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.wire import (
    DATA_SCHEMA,
    INT32_MAX,
    INT64_MAX,
    JOB_KEY,
    KINDS,
    NODE_NAME,
    WireError,
    parse_body,
    validate_events,
)
from tests.conftest import examples

# Any JSON value, with the awkward parts over-represented: huge and negative
# integers, non-finite floats, NUL and lone surrogates, deep nesting.
awkward_ints = st.sampled_from(
    [
        0,
        -1,
        1,
        INT32_MAX,
        INT32_MAX + 1,
        INT64_MAX,
        INT64_MAX + 1,
        2**64,
        -(2**63) - 1,
        10**100,
        10**400,
    ]
)
awkward_strings = st.sampled_from(
    ["", "a\x00b", "\ud800", "runnl\n", "rack1/gpu", "gpu-001.rack", "ready", "step", "x" * 200]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | awkward_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | awkward_strings
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
field_names = st.sampled_from(["id", "job", "kind", "ts", "attempt", "node", "rank", "data"])
data_names = st.sampled_from(
    ["step", "world_size", "nodes", "xid", "exit_code", "message", "tokens", "loss", "type", "x"]
)


def plausible_event():
    """An event near the valid ones, with any field replaced by any JSON value."""
    base = st.fixed_dictionaries(
        {
            "id": st.text(min_size=1, max_size=8) | awkward_strings,
            "job": st.just("j1") | awkward_strings,
            "kind": st.sampled_from(sorted(KINDS)) | json_values,
            "ts": st.just(1_790_000_000.0) | st.just("2026-11-30T08:00:00Z") | json_values,
            "attempt": st.integers(min_value=1, max_value=3) | json_values,
            "node": st.just("gpu-001") | json_values,
            "rank": st.integers(min_value=0, max_value=7) | json_values,
            "data": st.dictionaries(data_names, json_values, max_size=5) | json_values,
        }
    )
    return base.flatmap(
        lambda ev: st.sets(field_names).map(
            lambda drop: {k: v for k, v in ev.items() if k not in drop}
        )
    )


# A valid `data` of each kind: one field of it at a time is replaced by anything.
VALID_DATA = {
    "attempt_started": {"world_size": 8, "gpus_per_node": 4, "nodes": ["gpu-001"]},
    "ready": {},
    "checkpoint_load_started": {"step": 1},
    "checkpoint_loaded": {"step": 1},
    "step": {"step": 1, "loss": 2.5, "grad_norm": 1.0, "tokens": 10, "step_time_s": 1.0},
    "checkpoint_save_started": {"step": 1},
    "checkpoint_saved": {"step": 1, "bytes": 10, "blocking_s": 1.0, "uri": "s3://x", "tier": "t"},
    "rank_window": {"first_step": 1, "last_step": 2, "compute_s": 0.5, "step_s": 1.0},
    "heartbeat": {},
    "fault": {"type": "gpu_xid", "xid": 79, "message": "m", "exit_code": 1},
    "attempt_ended": {"reason": "failed", "exit_code": 1, "requested_by": "op"},
    "job_finished": {},
}


def one_field_wrong_event(kind, name, value) -> dict:
    data = dict(VALID_DATA[kind]) | {name: value}
    event = {"id": "a", "job": "j1", "kind": kind, "ts": 1_790_000_000.0, "attempt": 1}
    return event | {"node": "gpu-001", "rank": 0, "data": data}


@st.composite
def one_field_wrong(draw):
    """A valid event of any kind, one of its `data` fields (or an extra key) any JSON."""
    kind = draw(st.sampled_from(sorted(VALID_DATA)))
    name = draw(st.sampled_from([*VALID_DATA[kind], "extra"]))
    return one_field_wrong_event(kind, name, draw(awkward_ints | awkward_strings | json_values))


def storable(value) -> bool:
    """What orjson writes and PostgreSQL's jsonb keeps: no NUL, no lone surrogate,
    64-bit integers, no deeper than orjson writes."""
    try:
        text = orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        return False
    return "\\u0000" not in text


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(one_field_wrong() | plausible_event() | json_values, min_size=1, max_size=5))
def test_any_json_yields_errors_or_storable_events(raw):
    events, errors = validate_events(raw, 5000)
    assert len(events) + len({e["index"] for e in errors}) == len(raw)
    for e in errors:
        json.dumps(e).encode("utf-8")  # the 400 that names it can be written
    for e in events:
        assert JOB_KEY.match(e.job) and e.kind in KINDS
        assert type(e.client_id) is str and storable(e.client_id)
        assert e.node == "" or NODE_NAME.match(e.node)
        assert e.attempt is None or 1 <= e.attempt <= INT32_MAX
        assert e.rank is None or 0 <= e.rank <= INT32_MAX
        assert math.isfinite(e.ts)
        assert storable(e.data), e.data
        fields = DATA_SCHEMA[e.kind]  # the kind's own; other keys are kept as sent
        for name in ("step", "tokens", "bytes", "first_step", "last_step"):
            v = e.data.get(name) if name in fields else None
            assert v is None or 0 <= v <= INT64_MAX
        for name in ("world_size", "gpus_per_node", "xid"):
            v = e.data.get(name) if name in fields else None
            assert v is None or 0 <= v <= INT32_MAX
        v = e.data.get("exit_code") if "exit_code" in fields else None
        assert v is None or -(2**31) <= v <= INT32_MAX


AWKWARD = [
    None,
    True,
    -1,
    0.5,
    float("nan"),
    float("inf"),
    INT32_MAX + 1,
    INT64_MAX + 1,
    2**64,
    -(2**63) - 1,
    10**100,
    10**400,
    "",
    "a\x00b",
    "\ud800",
    "NaN",
    "rack1/gpu",
    [],
    ["\ud800"],
    {},
    {"k\x00": 1},
    [[[[[[[[[["deep"]]]]]]]]]],
]


@pytest.mark.parametrize("kind", sorted(VALID_DATA))
def test_every_field_of_every_kind_given_each_awkward_value(kind):
    """The same property, exhaustively over the awkward values hypothesis may miss."""
    for name in [*VALID_DATA[kind], "extra"]:
        for value in AWKWARD:
            event = one_field_wrong_event(kind, name, value)
            test_any_json_yields_errors_or_storable_events.hypothesis.inner_test([event])


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_body_parses_or_is_a_wire_error(body):
    with contextlib.suppress(WireError):
        parse_body(body)
