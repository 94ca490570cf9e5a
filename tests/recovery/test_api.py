"""The approval queue API: every endpoint allowed and forbidden for every persona,
one's own approval refused, the evidence of an action, filters, the pause switch."""

import json

import pytest
from rest_framework.test import APIClient

from recovery.models import Action, ClusterRecoverySettings
from tests.recovery.conftest import make_incident

pytestmark = pytest.mark.django_db

S = Action.State
READERS = ("admin", "operator", "viewer")
FORBIDDEN_TO_READ = ("outsider", "ingest")
WRITERS = ("admin", "operator")
FORBIDDEN_TO_WRITE = ("viewer", "outsider", "ingest")


def post(persona, url, body=None):
    return persona.client().post(url, data=json.dumps(body or {}), content_type="application/json")


def propose(personas, persona="operator", **body):
    body = {"kind": "cordon_node", "cluster": "east", "node": "n01", "reason": "Xid 48"} | body
    return post(personas[persona], "/api/v1/actions/", body)


@pytest.fixture
def proposed(personas, nodes, job):
    r = propose(personas)
    assert r.status_code == 201, r.content
    return Action.objects.get(pk=r.json()["id"])


# --- roles -------------------------------------------------------------------------


@pytest.mark.parametrize("who", READERS)
def test_readers_list_and_read(personas, proposed, who):
    c = personas[who].client()
    assert c.get("/api/v1/actions/").status_code == 200
    assert c.get(f"/api/v1/actions/{proposed.pk}").status_code == 200
    assert c.get("/api/v1/clusters/east/recovery").status_code == 200


@pytest.mark.parametrize("who", FORBIDDEN_TO_READ)
def test_others_may_not_read(personas, proposed, who):
    c = personas[who].client()
    assert c.get("/api/v1/actions/").status_code == 403
    assert c.get(f"/api/v1/actions/{proposed.pk}").status_code == 403
    assert c.get("/api/v1/clusters/east/recovery").status_code == 403


def test_anonymous_may_do_nothing(proposed):
    c = APIClient()
    assert c.get("/api/v1/actions/").status_code in (401, 403)
    assert c.post(f"/api/v1/actions/{proposed.pk}/approve").status_code in (401, 403)


@pytest.mark.parametrize("who", WRITERS)
def test_operators_propose(personas, nodes, job, who):
    r = propose(personas, who)
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["state"], body["mode"], body["requested_by"]) == (
        "awaiting_approval",
        "approval",
        who,
    )


@pytest.mark.parametrize("who", FORBIDDEN_TO_WRITE)
def test_others_may_not_propose_or_decide(personas, proposed, who):
    p = personas[who]
    assert propose(personas, who, node="n02").status_code == 403
    for verb in ("approve", "reject", "cancel"):
        r = post(p, f"/api/v1/actions/{proposed.pk}/{verb}", {"comment": "no"})
        assert r.status_code == 403, (verb, r.content)
    assert post(p, "/api/v1/clusters/east/pause", {"reason": "x"}).status_code == 403
    assert post(p, "/api/v1/clusters/east/resume").status_code == 403
    proposed.refresh_from_db()
    assert proposed.state == S.AWAITING_APPROVAL


@pytest.mark.parametrize("who", ["operator2", "admin"])
def test_another_operator_approves(personas, operator2, proposed, noop, run_on_commit, who):
    with run_on_commit():
        r = post(personas[who], f"/api/v1/actions/{proposed.pk}/approve", {"comment": "go"})
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["approved_by"], body["comment"]) == (who, "go")
    assert body["state"] == "queued"  # at once; the worker runs it once committed
    body = personas["viewer"].client().get(f"/api/v1/actions/{proposed.pk}").json()
    assert body["state"] == "succeeded"
    moves = [(a["from_state"], a["to_state"], a["actor"]) for a in body["audit"]]
    assert moves == [
        ("", "proposed", "operator"),
        ("proposed", "awaiting_approval", "operator"),
        ("awaiting_approval", "approved", who),
        ("approved", "queued", who),
        ("queued", "running", "rebound:worker"),
        ("running", "succeeded", "rebound:worker"),
    ]
    assert noop.calls[0]["op"] == "cordon"


def test_the_requester_may_not_approve_their_own(personas, proposed):
    r = post(personas["operator"], f"/api/v1/actions/{proposed.pk}/approve")
    assert r.status_code == 403
    assert r.json()["error"] == "own_action"
    assert "another operator" in r.json()["detail"]
    proposed.refresh_from_db()
    assert proposed.state == S.AWAITING_APPROVAL and proposed.audit.count() == 2


def test_reject_needs_a_comment(personas, operator2, proposed):
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/reject")
    assert r.status_code == 400 and r.json()["error"] == "invalid"
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/reject", {"comment": "healthy node"})
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["comment"]) == ("rejected", "healthy node")
    # A decided action cannot be decided again.
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/approve")
    assert r.status_code == 409 and r.json()["error"] == "invalid_state"


def test_cancel_before_running_only(personas, proposed):
    r = post(personas["operator"], f"/api/v1/actions/{proposed.pk}/cancel", {"comment": "oops"})
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    Action.objects.filter(pk=proposed.pk).update(state=S.RUNNING)
    r = post(personas["operator"], f"/api/v1/actions/{proposed.pk}/cancel")
    assert r.status_code == 409 and r.json()["error"] == "invalid_state"


def test_a_second_action_on_a_leased_target_is_409(personas, operator2, proposed):
    """Waiting for approval holds nothing; once approved, the action holds the node."""
    assert propose(personas, kind="uncordon_node").status_code == 201
    assert post(operator2, f"/api/v1/actions/{proposed.pk}/approve").status_code == 200
    r = propose(personas, kind="drain_node")
    assert r.status_code == 409
    body = r.json()
    assert (body["error"], body["guardrail"]) == ("lease", "lease")
    assert f"#{proposed.pk}" in body["detail"]


def test_a_stale_approval_is_409_and_back_in_the_queue(personas, operator2, proposed, nodes):
    nodes["n01"].state = "suspect"
    nodes["n01"].save()
    r = post(operator2, f"/api/v1/actions/{proposed.pk}/approve")
    assert r.status_code == 409 and r.json()["error"] == "stale"
    body = personas["viewer"].client().get(f"/api/v1/actions/{proposed.pk}").json()
    assert (body["state"], body["blocked_by"]) == ("awaiting_approval", "stale")
    assert body["target_snapshot"] == {"node_state": "suspect"}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"kind": "explode"}, 400, "kind"),
        ({"reason": ""}, 400, "reason"),
        ({"cluster": "nowhere"}, 404, "cluster"),
        ({"node": "n99"}, 404, "node"),
        ({"kind": "restart_job", "node": ""}, 400, "job"),
        ({"kind": "rollback", "node": "", "job": "llm"}, 400, "params"),
        ({"kind": "restart_job", "node": "", "job": "nope"}, 404, "job"),
        ({"incident": 424242}, 404, "incident"),
    ],
)
def test_invalid_proposals(personas, nodes, job, body, status, field):
    r = propose(personas, **body)
    assert r.status_code == status, r.content
    out = r.json()
    assert out.get("field") == field or field in out.get("fields", {})
    assert not Action.objects.exists()


def test_unknown_actions_and_clusters_are_404(personas, nodes):
    op = personas["operator"]
    assert op.client().get("/api/v1/actions/4242").status_code == 404
    assert post(op, "/api/v1/actions/4242/approve").status_code == 404
    assert post(op, "/api/v1/clusters/nowhere/pause", {"reason": "x"}).status_code == 404


# --- evidence and the list ---------------------------------------------------------


def test_the_detail_has_the_evidence(personas, nodes, job):
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", xid=79, nodes=[nodes["n01"]])
    r = propose(
        personas,
        kind="replace_node",
        job="llm",
        node="n01",
        incident=incident.pk,
        reason="Xid 79 on n01",
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["incident"] == incident.pk
    ev = body["evidence"]
    assert ev["incident"]["id"] == incident.pk and ev["incident"]["nodes"] == ["n01"]
    assert ev["nodes"] == [
        {"name": "n01", "state": "active", "state_changed_at": ev["nodes"][0]["state_changed_at"]}
    ]
    assert ev["jobs"] == [
        {
            "key": "llm",
            "status": "running",
            "attempt": 1,
            "world_size": 16,
            "nodes": ["n01", "n02"],
            "last_step": 100,
            "ranks_on_nodes": {},  # no rank windows reported
        }
    ]
    # Step 100 at T0+1000, the checkpoint of step 80 at T0+800: 200 s x 16 GPUs.
    assert ev["restarts_jobs"] is True
    assert ev["gpu_hours_at_stake"] == pytest.approx(200 * 16 / 3600, abs=1e-6)
    assert ev["at_stake"]["llm"]["checkpoint_step"] == 80
    assert ev["at_stake"]["llm"]["steps_lost"] == 20
    # The incident's timeline shows it.
    timeline = personas["viewer"].client().get(f"/api/v1/incidents/{incident.pk}").json()
    assert [e["kind"] for e in timeline["timeline"] if e["source"] == "recovery"] == [
        "action",
        "approval",
    ]


def test_a_cordon_shows_the_jobs_on_the_node(personas, nodes, job):
    body = propose(personas).json()
    assert [j["key"] for j in body["evidence"]["jobs"]] == ["llm"]
    assert body["evidence"]["restarts_jobs"] is False
    assert body["evidence"]["gpu_hours_at_stake"] == 0.0


def test_list_filters(personas, nodes, job):
    propose(personas)
    propose(personas, kind="restart_job", node="", job="llm", reason="crash")
    c = personas["viewer"].client()

    def count(**params):
        r = c.get("/api/v1/actions/", params)
        assert r.status_code == 200, r.content
        return r.json()["count"]

    assert count() == 2
    assert count(state="awaiting_approval") == 2
    assert count(state="queued") == 0
    assert count(cluster="east") == 2 and count(cluster="west") == 0
    assert count(job="llm") == 1 and count(node="n01") == 1
    assert count(kind="restart_job") == 1
    assert c.get("/api/v1/actions/", {"state": "asleep"}).status_code == 400
    assert c.get("/api/v1/actions/", {"incident": "x"}).status_code == 400


def test_the_list_costs_the_same_queries_however_long(personas, nodes, job):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    c = personas["viewer"].client()
    propose(personas)
    with CaptureQueriesContext(connection) as one:
        c.get("/api/v1/actions/")
    for name in ("n02", "n03", "n04", "n05"):
        propose(personas, node=name)
    with CaptureQueriesContext(connection) as five:
        assert c.get("/api/v1/actions/").json()["count"] == 5
    assert len(five.captured_queries) == len(one.captured_queries) <= 8


# --- the pause switch --------------------------------------------------------------


def test_pause_and_resume(personas, nodes, job, noop, run_on_commit):
    op = personas["operator"]
    assert post(op, "/api/v1/clusters/east/pause").status_code == 400  # a reason is required
    r = post(op, "/api/v1/clusters/east/pause", {"reason": "switch firmware upgrade"})
    assert r.status_code == 200
    body = r.json()
    assert (body["paused"], body["pause_reason"], body["paused_by"]) == (
        True,
        "switch firmware upgrade",
        "operator",
    )
    assert body["policies"]["crash"] == [
        {"kind": "restart_job", "mode": "auto", "source": "default"}
    ]
    from recovery import queue, services

    # Automatic proposals wait for approval, naming the pause; approved ones are held.
    with run_on_commit():
        auto = services.action_propose(
            cluster=job.cluster,
            kind="restart_job",
            job=job,
            reason="crash",
            requested_by="policy:crash",
            mode="auto",
        )
    assert (auto.state, auto.blocked_by) == (S.AWAITING_APPROVAL, "pause")
    with run_on_commit():
        queue.action_send(services.action_approve(action=auto, actor="operator"))
    auto.refresh_from_db()
    assert (auto.state, auto.blocked_by) == (S.QUEUED, "pause")
    assert noop.calls == []

    with run_on_commit():
        r = post(op, "/api/v1/clusters/east/resume")
    assert r.status_code == 200 and r.json()["paused"] is False
    auto.refresh_from_db()
    assert auto.state == S.SUCCEEDED and [c["op"] for c in noop.calls] == ["restart_job"]
    assert not ClusterRecoverySettings.objects.get(cluster=job.cluster).paused


def test_the_endpoints_are_in_the_openapi_schema(client):
    r = client.get("/api/v1/schema", {"format": "json"})
    assert r.status_code == 200
    paths = json.loads(r.content)["paths"]
    for path in (
        "/api/v1/actions/",
        "/api/v1/actions/{id}",
        "/api/v1/actions/{id}/approve",
        "/api/v1/actions/{id}/reject",
        "/api/v1/actions/{id}/cancel",
        "/api/v1/clusters/{name}/pause",
        "/api/v1/clusters/{name}/resume",
        "/api/v1/clusters/{name}/recovery",
    ):
        assert path in paths, path
    assert "post" in paths["/api/v1/actions/"] and "get" in paths["/api/v1/actions/"]
