"""What the wire refuses, never a 500 and nothing stored: names outside their
alphabet, numbers past their column, strings PostgreSQL cannot hold, values of
the wrong JSON type, nesting past what the parsers take, non-RFC 3339 times."""

import json

import pytest

from jobs.models import Event, TrainingJob
from jobs.wire import INT32_MAX, INT64_MAX

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0


def event(kind="ready", **fields):
    out = {"id": "a", "job": "j1", "kind": kind, "ts": T0, "attempt": 1}
    out.update(fields)
    return out


def post_raw(personas, body: bytes | str):
    return (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data=body, content_type="application/json")
    )


def assert_refused(r, field, index=0):
    assert r.status_code == 400, (r.status_code, r.content[:500])
    named = {(e["index"], e["field"]) for e in r.json()["errors"]}
    assert (index, field) in named, r.json()
    assert Event.objects.count() == 0
    assert not TrainingJob.objects.exists()


# --- 3: names are checked with \A...\Z, in their own alphabets ---------------------


@pytest.mark.parametrize("key", ["runnl\n", "a/b", "a.b", "", "x" * 101, "ünï"])
def test_a_job_key_outside_its_alphabet_is_refused(ingest, key):
    assert_refused(ingest([event(job=key)]), "job")


@pytest.mark.parametrize("name", ["rack1/gpu-001", "gpu-001\n", ".hidden", "-x", "a b", "x" * 129])
def test_a_node_name_outside_its_alphabet_is_refused(ingest, name):
    assert_refused(ingest([event("heartbeat", node=name, attempt=None)]), "node")


def test_every_node_of_a_launch_is_checked(ingest):
    started = event("attempt_started", data={"world_size": 2, "nodes": ["gpu-001", "rack1/gpu"]})
    assert_refused(ingest([started]), "data.nodes")


def test_real_node_names_with_dots_and_dashes_are_accepted(ingest):
    nodes = ["gpu-001.rack1.dc-east", "node_7", "10.0.0.12"]
    started = event("attempt_started", data={"world_size": 2, "nodes": nodes})
    beat = {"id": "b", "job": "j1", "kind": "heartbeat", "ts": T0, "node": nodes[0]}
    r = ingest([started, beat])
    assert r.status_code == 202, r.content


def test_the_agent_checks_job_keys_the_same_way():
    from agent import control
    from jobs.wire import JOB_KEY

    for pattern in (control.SLUG,):
        assert pattern.pattern == JOB_KEY.pattern
        assert not pattern.match("runnl\n")


# --- 4 and 6: every number within what its column holds ----------------------------

OUT_OF_RANGE = [
    (event(attempt=INT32_MAX + 1), "attempt"),
    (event(rank=INT32_MAX + 1), "rank"),
    (event("attempt_started", data={"world_size": INT32_MAX + 1}), "data.world_size"),
    (event("attempt_started", data={"world_size": 2**32 + 8}), "data.world_size"),
    (
        event("attempt_started", data={"world_size": 8, "gpus_per_node": INT32_MAX + 1}),
        "data.gpus_per_node",
    ),
    (event("step", data={"step": INT64_MAX + 1}), "data.step"),
    (event("step", data={"step": 1, "tokens": INT64_MAX + 1}), "data.tokens"),
    (event("checkpoint_loaded", data={"step": INT64_MAX + 1}), "data.step"),
    (event("checkpoint_saved", data={"step": 1, "bytes": INT64_MAX + 1}), "data.bytes"),
    (
        event(
            "rank_window",
            rank=0,
            data={"first_step": 1, "last_step": INT64_MAX + 1, "compute_s": 1, "step_s": 1},
        ),
        "data.last_step",
    ),
    (event("fault", data={"type": "gpu_xid", "xid": INT32_MAX + 1}), "data.xid"),
    (event("fault", data={"type": "crash", "exit_code": INT32_MAX + 1}), "data.exit_code"),
    (event("fault", data={"type": "crash", "exit_code": -(2**31) - 1}), "data.exit_code"),
    (
        event("attempt_ended", data={"reason": "failed", "exit_code": 2**31}),
        "data.exit_code",
    ),
    (event("step", data={"step": 1, "step_time_s": 10**400}), "data.step_time_s"),
    (event("step", data={"step": 1, "loss": 10**400}), "data.loss"),
    (event(ts=10**400), "ts"),
]


@pytest.mark.parametrize(("bad", "field"), OUT_OF_RANGE)
def test_a_number_past_its_column_is_a_400_naming_the_field(personas, bad, field):
    # Serialised by hand: json.dumps writes the big integers as they are.
    assert_refused(post_raw(personas, json.dumps({"events": [bad]})), field)


def test_the_largest_numbers_the_columns_hold_are_accepted(ingest):
    events = [
        event(
            "attempt_started",
            id="s",
            attempt=INT32_MAX,
            data={"world_size": INT32_MAX, "gpus_per_node": INT32_MAX},
        ),
        event("step", id="p", attempt=INT32_MAX, rank=INT32_MAX, data={"step": INT64_MAX}),
        event("fault", id="f", data={"type": "gpu_xid", "xid": INT32_MAX, "exit_code": -(2**31)}),
        event(
            "checkpoint_saved", id="c", data={"step": INT64_MAX, "bytes": INT64_MAX, "tier": "x"}
        ),
    ]
    r = ingest(events)
    assert r.status_code == 202, r.content
    assert Event.objects.get(client_id="f").data["exit_code"] == -(2**31)


def test_a_negative_exit_code_within_int32_is_stored_as_sent(ingest):
    r = ingest([event("attempt_ended", data={"reason": "failed", "exit_code": -9})])
    assert r.status_code == 202
    assert TrainingJob.objects.get().attempts.get().exit_code == -9


# --- 7: strings PostgreSQL cannot hold, values of the wrong type, deep nesting --------

NUL = "a\u0000b"
SURROGATE = "a\ud800b"

BAD_STRINGS = [
    (lambda s: event(id=s), "id"),
    (lambda s: event(job=s), "job"),
    (lambda s: event("heartbeat", attempt=None, node=s), "node"),
    (lambda s: event("fault", data={"type": "crash", "message": s}), "data.message"),
    (lambda s: event("checkpoint_saved", data={"step": 1, "uri": s}), "data.uri"),
    (lambda s: event("checkpoint_saved", data={"step": 1, "tier": s}), "data.tier"),
    (
        lambda s: event("attempt_ended", data={"reason": "killed", "requested_by": s}),
        "data.requested_by",
    ),
    (lambda s: event(data={"note": s}), "data.note"),
    (lambda s: event(data={"deep": {"list": ["ok", s]}}), "data.deep"),
    (lambda s: event(data={s: 1}), "data"),
]


@pytest.mark.parametrize("bad_string", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize(("make", "field"), BAD_STRINGS)
def test_a_string_postgresql_cannot_hold_is_a_400(personas, bad_string, make, field):
    # json.dumps escapes both (\u0000, \ud800): the body is valid JSON text.
    r = post_raw(personas, json.dumps({"events": [make(bad_string)]}))
    assert_refused(r, field)


@pytest.mark.parametrize("value", [["ready"], {"a": 1}])
@pytest.mark.parametrize("field", ["kind", "job"])
def test_a_kind_or_job_of_the_wrong_json_type_is_a_400(ingest, field, value):
    assert_refused(ingest([event(**{field: value})]), field)


def test_an_unknown_field_named_with_a_lone_surrogate_is_reported_safely(personas):
    r = post_raw(personas, json.dumps({"events": [event(**{"\ud800": 1})]}))
    assert r.status_code == 400
    assert r.json()["errors"][0]["index"] == 0


@pytest.mark.parametrize("depth", [9, 300])
def test_data_nested_too_deep_is_a_400(personas, depth):
    nested = "[" * depth + "]" * depth
    body = json.dumps({"events": [event(data={"x": 0})]}).replace("0}", nested + "}")
    assert_refused(post_raw(personas, body), "data.x")


def test_data_nested_within_the_bound_is_kept(ingest):
    nested = {"a": [{"b": [1, {"c": "d"}]}]}
    r = ingest([event(data={"extra": nested})])
    assert r.status_code == 202, r.content
    assert Event.objects.get().data == {"extra": nested}


@pytest.mark.parametrize("depth", [1100, 100_000])
def test_a_body_deeper_than_the_parsers_take_is_a_400(personas, depth):
    r = post_raw(personas, "[" * depth + "]" * depth)
    assert r.status_code == 400, r.content[:300]
    assert r.json()["errors"][0]["field"] == "body"


def test_a_non_finite_number_inside_extra_data_is_a_400(personas):
    body = json.dumps({"events": [event(data={"extra": [float("nan")]})]})
    assert_refused(post_raw(personas, body), "data.extra")


# --- 21: RFC 3339 timestamps only ---------------------------------------------------


@pytest.mark.parametrize(
    "ts",
    [
        "2026-11-30 08:00:00Z",
        "20261130T080000Z",
        "2026-11-30T08:00Z",
        "2026-11-30T08:00:00+0100",
        "2026-11-30T08:00:00",
        "2026-W48-1T08:00:00Z",
        "2026-11-30T08:00:00,5Z",
        "\uff12\uff10\uff12\uff16-11-30T08:00:00Z",  # full-width digits
        "2026-11-30T08:00:60Z",
    ],
)
def test_a_time_that_is_not_rfc_3339_is_refused(ingest, ts):
    assert_refused(ingest([event(ts=ts)]), "ts")


@pytest.mark.parametrize(
    "ts",
    [
        "2026-11-30T08:00:00Z",
        "2026-11-30t08:00:00z",
        "2026-11-30T08:00:00.123456789Z",
        "2026-11-30T09:00:00+01:00",
        "2026-11-30T03:00:00.5-05:00",
    ],
)
def test_rfc_3339_times_are_accepted(ingest, ts):
    r = ingest([event(ts=ts)])
    assert r.status_code == 202, r.content
    assert int(Event.objects.get().ts) == 1_796_025_600
