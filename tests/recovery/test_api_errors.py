"""The recovery API's error answers, whole: each refusal's status and exact body
(`{"error", "detail", ...}` with its extra fields), so that where the error is
raised and how it is mapped to HTTP may change and the answer may not."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Cluster
from recovery.models import Action, ClusterRecoverySettings

pytestmark = pytest.mark.django_db

S = Action.State


def post(persona, url, body=None):
    return persona.client().post(url, data=json.dumps(body or {}), content_type="application/json")


def propose(personas, **body):
    body = {"kind": "cordon_node", "cluster": "east", "node": "n01", "reason": "Xid 48"} | body
    return post(personas["operator"], "/api/v1/actions/", body)


def answer(r) -> tuple[int, dict]:
    return r.status_code, r.json()


@pytest.fixture
def proposed(personas, nodes, job) -> Action:
    r = propose(personas)
    assert r.status_code == 201, r.content
    return Action.objects.get(pk=r.json()["id"])


def test_ones_own_approval(personas, proposed):
    r = post(personas["operator"], f"/api/v1/actions/{proposed.pk}/approve")
    assert answer(r) == (
        403,
        {
            "error": "own_action",
            "detail": f"operator requested action #{proposed.pk};"
            " another operator must approve it.",
        },
    )


def test_an_invalid_proposal_names_its_field(personas, nodes, job):
    r = propose(personas, kind="restart_job", node="")
    assert answer(r) == (
        400,
        {"error": "invalid", "detail": "restart_job needs a job", "field": "job"},
    )


def test_unknown_things_a_proposal_names(personas, nodes, job):
    assert answer(propose(personas, cluster="nowhere")) == (
        404,
        {"error": "not_found", "detail": "No such cluster: nowhere.", "field": "cluster"},
    )
    assert answer(propose(personas, node="n99")) == (
        404,
        {"error": "not_found", "detail": "No node n99 in east.", "field": "node"},
    )
    assert answer(propose(personas, kind="restart_job", node="", job="nope")) == (
        404,
        {"error": "not_found", "detail": "No such job: nope.", "field": "job"},
    )
    assert answer(propose(personas, incident=424242)) == (
        404,
        {"error": "not_found", "detail": "No such incident.", "field": "incident"},
    )
    r = post(personas["operator"], "/api/v1/actions/4242/approve")
    assert answer(r) == (404, {"error": "not_found", "detail": "No such action."})


def test_a_leased_target(personas, operator2, proposed):
    assert post(operator2, f"/api/v1/actions/{proposed.pk}/approve").status_code == 200
    state = Action.objects.get(pk=proposed.pk).state
    r = propose(personas, kind="drain_node")
    assert answer(r) == (
        409,
        {
            "error": "lease",
            "detail": f"lease: action #{proposed.pk} (cordon_node, {state}) holds this target",
            "guardrail": "lease",
        },
    )


def test_a_decided_action_and_a_late_cancel(personas, operator2, proposed):
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/reject", {"comment": "no"})
    assert r.status_code == 200
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/approve")
    assert answer(r) == (
        409,
        {"error": "invalid_state", "detail": f"action #{proposed.pk} is rejected, not awaiting"},
    )
    Action.objects.filter(pk=proposed.pk).update(state=S.RUNNING)
    r = post(personas["operator"], f"/api/v1/actions/{proposed.pk}/cancel")
    assert answer(r) == (
        409,
        {
            "error": "invalid_state",
            "detail": f"action #{proposed.pk} is running: too late to cancel",
        },
    )


def test_a_stale_approval(personas, operator2, proposed, nodes):
    nodes["n01"].state = "suspect"
    nodes["n01"].save()
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/approve")
    assert answer(r) == (
        409,
        {
            "error": "stale",
            "detail": "stale: the target changed since it was proposed"
            " (node state active -> suspect); it is back in the approval queue",
            "action": proposed.pk,
        },
    )


def test_an_expired_approval(personas, operator2, proposed):
    expires = timezone.now() - timedelta(seconds=5)
    Action.objects.filter(pk=proposed.pk).update(expires_at=expires)
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/approve")
    assert answer(r) == (
        409,
        {
            "error": "guardrail",
            "detail": f"expired: no decision by {expires:%Y-%m-%d %H:%M:%S} UTC",
            "guardrail": "expired",
            "state": "expired",
        },
    )


@pytest.fixture
def lab(db):
    cluster = Cluster.objects.create(name="lab")
    ClusterRecoverySettings.objects.create(cluster=cluster, driver="noop")
    return cluster


def test_a_fault_missing_what_it_needs_or_on_a_driver_that_cannot(personas, lab):
    url = "/api/v1/clusters/lab/faults"
    r = post(personas["admin"], url, {"kind": "crash", "job": "j1"})
    assert answer(r) == (
        400,
        {"error": "fault_refused", "detail": "a crash fault needs `rank`", "field": "rank"},
    )
    r = post(personas["admin"], url, {"kind": "crash", "job": "nope", "rank": 0})
    assert answer(r) == (
        400,
        {"error": "fault_refused", "detail": "no job nope on cluster lab", "field": "job"},
    )
    r = post(personas["admin"], url, {"kind": "silence", "node": "a"})
    assert answer(r) == (
        409,
        {"error": "fault_refused", "detail": "the noop driver of lab cannot inject faults"},
    )
