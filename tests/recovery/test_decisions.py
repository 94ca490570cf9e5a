"""What an approval must pass at the moment it is given: not expired (whether or not the
expiry task ran), a target that has not finished or moved on (else the action is
retired, saying why), the lease and the spares; what a proposal may name (this
cluster's incident and nodes only); and the spare a replacement used, named."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Incident, TimelineEntry
from jobs.models import Cluster, Node, RankWindow, TrainingJob
from recovery import queue, services, tasks
from recovery.models import Action
from tests.recovery.conftest import T0, audit_moves, make_incident, make_job

pytestmark = pytest.mark.django_db

S = Action.State


def post(persona, url, body=None):
    return persona.client().post(url, data=json.dumps(body or {}), content_type="application/json")


def propose(personas, **body):
    body = {"kind": "cordon_node", "cluster": "east", "node": "n01", "reason": "Xid 48"} | body
    return post(personas["operator"], "/api/v1/actions/", body)


def straggler_replacement(job, nodes, run_on_commit) -> Action:
    """The demo's straggler: replace n02 at the next checkpoint, waiting for approval."""
    from incidents.signals import incident_opened

    incident = make_incident(
        job, cause="straggler", fault_type="straggler", nodes=[nodes["n02"]], attempt=None
    )
    with run_on_commit():
        incident_opened.send(sender=Incident, incident=incident)
    [action] = Action.objects.filter(kind="replace_at_next_checkpoint")
    assert action.state == S.AWAITING_APPROVAL
    return action


# --- 15: an expired approval cannot be given ------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_an_expired_approval_is_refused_and_expires_even_before_the_expiry_task(
    personas, operator2, nodes, job, decision
):
    r = propose(personas)
    action = Action.objects.get(pk=r.json()["id"])
    Action.objects.filter(pk=action.pk).update(expires_at=timezone.now() - timedelta(seconds=5))
    r = post(operator2, f"/api/v1/actions/{action.pk}/{decision}", {"comment": "late"})
    assert r.status_code == 409, r.content
    body = r.json()
    assert (body["error"], body["guardrail"], body["state"]) == ("guardrail", "expired", "expired")
    assert body["detail"].startswith("expired: no decision by")
    action.refresh_from_db()
    assert (action.state, action.approved_by) == (S.EXPIRED, "")
    last = action.audit.order_by("at", "id").last()
    assert (last.from_state, last.to_state, last.actor) == (
        S.AWAITING_APPROVAL,
        S.EXPIRED,
        "rebound:guardrail",
    )
    # Nothing was queued, and the expiry task finds nothing left to do.
    assert services.approvals_expire() == []


def test_an_approval_not_yet_expired_is_given(personas, operator2, nodes, job):
    r = propose(personas)
    assert r.json()["evidence"]["approval_blocked_by"] is None
    action = Action.objects.get(pk=r.json()["id"])
    Action.objects.filter(pk=action.pk).update(expires_at=timezone.now() + timedelta(seconds=60))
    r = post(operator2, f"/api/v1/actions/{action.pk}/approve")
    assert r.status_code == 200 and r.json()["state"] in ("queued", "succeeded")


# --- 16: one cluster's action names only that cluster's things ------------------------


@pytest.fixture
def west(db):
    cluster = Cluster.objects.get_or_create(name="west")[0]
    nodes = {n: Node.objects.create(cluster=cluster, name=n) for n in ("w01", "w02")}
    return cluster, nodes


def test_an_incident_of_another_cluster_is_refused(personas, nodes, job, west):
    cluster, wnodes = west
    wjob = make_job(cluster, wnodes, key="wjob", on=("w01", "w02"))
    foreign = make_incident(wjob, nodes=[wnodes["w01"]])
    r = propose(personas, incident=foreign.pk)
    assert r.status_code == 400, r.content
    body = r.json()
    assert (body["error"], body["field"]) == ("invalid", "incident")
    assert f"incident #{foreign.pk}" in body["detail"] and "east" in body["detail"]
    assert not Action.objects.exists()
    # Its own cluster's incident is fine.
    own = make_incident(job, nodes=[nodes["n01"]])
    assert propose(personas, incident=own.pk).status_code == 201


def test_a_scale_down_naming_nodes_of_another_cluster_is_refused(personas, nodes, job, west):
    body = {"kind": "scale_down", "node": "", "job": "llm", "params": {"nodes": ["n02", "w01"]}}
    r = propose(personas, **body)
    assert r.status_code == 400, r.content
    out = r.json()
    assert (out["error"], out["field"]) == ("invalid", "params.nodes")
    assert "w01" in out["detail"] and "n02" not in out["detail"]
    assert not Action.objects.exists()
    # Unknown names are refused alike; its own nodes are fine.
    r = propose(personas, **(body | {"params": {"nodes": ["nowhere"]}}))
    assert r.status_code == 400 and r.json()["field"] == "params.nodes"
    assert propose(personas, **(body | {"params": {"nodes": ["n02"]}})).status_code == 201


# --- 17: an action that can no longer run is not offered, and is retired --------------


def test_approving_a_replacement_of_a_finished_job_retires_it(
    personas, operator2, job, nodes, run_on_commit
):
    action = straggler_replacement(job, nodes, run_on_commit)
    TrainingJob.objects.filter(pk=job.pk).update(status=TrainingJob.Status.COMPLETED)
    Node.objects.filter(state=Node.State.SPARE).update(state=Node.State.ACTIVE)  # spares used
    # Read first, the API says what approving would answer.
    detail = personas["viewer"].client().get(f"/api/v1/actions/{action.pk}").json()
    blocked = detail["evidence"]["approval_blocked_by"]
    assert blocked["guardrail"] == "moved_on" and "job llm finished" in blocked["reason"]
    r = post(operator2, f"/api/v1/actions/{action.pk}/approve")
    assert r.status_code == 409, r.content
    body = r.json()
    # The first guardrail in the order the page shows them: the job finished.
    assert (body["guardrail"], body["state"]) == ("moved_on", "cancelled")
    assert "job llm finished (completed)" in body["detail"]
    action.refresh_from_db()
    assert action.state == S.CANCELLED
    assert audit_moves(action)[-1] == (S.AWAITING_APPROVAL, S.CANCELLED)
    entry = TimelineEntry.objects.filter(incident=action.incident).order_by("at", "id").last()
    assert "awaiting_approval → cancelled" in entry.message
    assert "job llm finished (completed)" in entry.message


def test_the_expiry_task_retires_approvals_whose_target_moved_on(
    cluster, job, nodes, run_on_commit
):
    action = straggler_replacement(job, nodes, run_on_commit)
    drained = services.action_propose(
        cluster=cluster, kind="cordon_node", node=nodes["n05"], reason="t", requested_by="op"
    )
    waiting = services.action_propose(
        cluster=cluster, kind="cordon_node", node=nodes["n06"], reason="t", requested_by="op"
    )
    tasks.approvals_expire(), tasks.approvals_retire()
    assert Action.objects.filter(state=S.CANCELLED).count() == 0  # nothing moved on yet

    TrainingJob.objects.filter(pk=job.pk).update(status=TrainingJob.Status.COMPLETED)
    Node.objects.filter(pk=nodes["n05"].pk).update(state=Node.State.IN_REPAIR)
    tasks.approvals_retire()
    tasks.approvals_retire()  # a second run finds nothing more
    action.refresh_from_db(), drained.refresh_from_db(), waiting.refresh_from_db()
    assert (action.state, drained.state, waiting.state) == (
        S.CANCELLED,
        S.CANCELLED,
        S.AWAITING_APPROVAL,
    )
    assert action.audit.filter(to_state=S.CANCELLED).count() == 1
    why = action.audit.get(to_state=S.CANCELLED)
    assert why.actor == "rebound:guardrail" and "job llm finished" in why.reason
    assert "node n05 is in_repair already" in drained.audit.get(to_state=S.CANCELLED).reason
    assert TimelineEntry.objects.filter(
        incident=action.incident, message__contains="→ cancelled: moved_on"
    ).exists()


def test_a_restart_is_retired_once_the_job_relaunched_without_it(cluster, job, nodes):
    from jobs.models import Attempt

    restart = services.action_propose(
        cluster=cluster, kind="restart_job", job=job, reason="crash", requested_by="op"
    )
    relaunch = Attempt.objects.create(job=job, number=2, world_size=16)
    relaunch.nodes.set([nodes["n01"], nodes["n03"]])
    assert services.approvals_retire() == [restart.pk]
    restart.refresh_from_db()
    assert "job llm was relaunched since (launch 2 runs)" in restart.audit.last().reason


def test_a_queued_replacement_of_a_job_that_finished_is_cancelled(cluster, job, nodes, noop):
    action = services.action_propose(
        cluster=cluster,
        kind="replace_at_next_checkpoint",
        node=nodes["n02"],
        job=job,
        reason="slow",
        requested_by="policy:t",
        mode="auto",
    )
    assert action.state == S.QUEUED
    assert services.action_execute(action_id=action.pk).what == "waiting"
    # The job completes while the replacement waits for its checkpoint.
    TrainingJob.objects.filter(pk=job.pk).update(status=TrainingJob.Status.COMPLETED)
    Action.objects.filter(pk=action.pk).update(
        queued_at=timezone.now() - timedelta(hours=2)  # past its wait: it would run
    )
    assert services.action_execute(action_id=action.pk).what == "cancelled"
    action.refresh_from_db()
    assert action.state == S.CANCELLED and noop.calls == []
    assert Node.objects.get(pk=nodes["s1"].pk).state == Node.State.SPARE


def test_the_evidence_of_a_replacement_names_what_restarts(personas, job, nodes):
    for rank in range(16):
        RankWindow.objects.create(
            job=job,
            attempt=1,
            rank=rank,
            node=nodes["n01"] if rank < 8 else nodes["n02"],
            first_step=90,
            last_step=99,
            ts=T0 + 990,
            compute_s=1.0,
            step_s=1.0,
        )
    r = propose(
        personas, kind="replace_at_next_checkpoint", node="n02", job="llm", reason="straggler"
    )
    assert r.status_code == 201, r.content
    evidence = r.json()["evidence"]
    assert evidence["restarts_jobs"] is True  # the whole job relaunches
    [row] = evidence["jobs"]
    assert row["ranks_on_nodes"] == {"n02": list(range(8, 16))}
    assert evidence["at_stake"]["llm"]["steps_lost"] == 20  # since the checkpoint of step 80


# --- 20: the spare a replacement used is named ----------------------------------------


def test_a_replacement_names_the_spare_it_used(personas, cluster, job, nodes, run_on_commit):
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes["n02"]])
    with run_on_commit():
        action = services.action_propose(
            cluster=cluster,
            kind="replace_node",
            node=nodes["n02"],
            job=job,
            incident=incident,
            reason="Xid 79",
            requested_by="policy:t",
            mode="auto",
        )
        queue.action_send(action)
    action.refresh_from_db()
    assert action.state == S.SUCCEEDED
    assert action.output["spare"] == "s1"
    done = action.audit.get(to_state=S.SUCCEEDED)
    assert done.data == {"spare": "s1"} and "n02 replaced by spare s1" in done.reason
    assert TimelineEntry.objects.filter(
        incident=incident, message__contains="n02 replaced by spare s1"
    ).exists()
    body = personas["viewer"].client().get(f"/api/v1/actions/{action.pk}").json()
    assert (body["spare"], body["output"]["spare"]) == ("s1", "s1")
    # The incident page's action list names it.
    from django.test import Client

    client = Client()
    client.force_login(personas["viewer"].user)
    html = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "→ spare s1" in html
