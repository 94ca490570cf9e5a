"""Recovery on real parts: PostgreSQL, Redis, a real Celery worker process, and the
`local` driver acting on a local cluster of real torch ranks under tmp_path.

- a crash under the automatic policy: the worker relaunches the job from its
  checkpoint, the action ends succeeded with its audit trail;
- a risky action waits in the queue, its requester may not approve it, a second
  operator does, and the worker carries it out;
- the worker is killed (SIGKILL) while an action runs: after a restart it ends
  once, and the node was drained once."""

import json
import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

pytest.importorskip("torch")

from incidents.models import Incident
from jobs.models import Cluster, Event, Node, StepRecord
from recovery import queue, services
from recovery.models import Action, ClusterRecoverySettings
from tests.live import TRAIN, stored_step, until
from tests.processes import celery_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = Action.State


@pytest.fixture
def driven(live_cluster):
    """Cluster `local` recovered by the local driver, over the test's local cluster;
    n3 is its spare."""
    local = Cluster.objects.get(name="local")
    ClusterRecoverySettings.objects.create(
        cluster=local, driver="local", driver_options={"root": str(live_cluster.root)}
    )
    Node.objects.create(cluster=local, name="n3", state=Node.State.SPARE)
    return live_cluster


def moves(action) -> list[tuple[str, str]]:
    return list(action.audit.order_by("at", "id").values_list("from_state", "to_state"))


def driver_log(local_cluster) -> list[dict]:
    path = local_cluster.root / "rebound-driver.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ended(action_id):
    a = Action.objects.get(pk=action_id)
    return a if a.state in (S.SUCCEEDED, S.FAILED, S.REJECTED, S.CANCELLED, S.EXPIRED) else None


def test_a_crash_is_restarted_from_its_checkpoint_by_policy(driven):
    with celery_worker():
        driven.launch("auto", nodes=["n1", "n2"], steps=250, **TRAIN)
        until(lambda: stored_step("auto") >= 60, "step 60", cluster=driven, job="auto")
        driven.kill_rank("auto", 1)
        incident = until(
            lambda: Incident.objects.filter(job__key="auto").first(), "the crash incident"
        )
        action = until(
            lambda: Action.objects.filter(incident=incident, kind="restart_job").first(),
            "a restart proposed by policy",
        )
        action = until(lambda: ended(action.pk), "the restart to end", timeout_s=90)
        assert action.state == S.SUCCEEDED, (action.error, action.output)
        assert (action.mode, action.requested_by) == ("auto", action.requested_by)
        assert action.requested_by.startswith("policy:")
        assert driven.wait("auto", 120)["state"] == "completed"
        until(lambda: stored_step("auto", 2) == 250, "launch 2 to finish")
    assert moves(action) == [
        ("", S.PROPOSED),
        (S.PROPOSED, S.QUEUED),
        (S.QUEUED, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
    ]
    loaded = Event.objects.get(job__key="auto", kind="checkpoint_loaded", attempt=2)
    first = StepRecord.objects.filter(job__key="auto", attempt=2).order_by("step").first()
    assert first.step == loaded.data["step"] + 1
    assert [e["op"] for e in driver_log(driven)].count("restart_job") == 1
    kinds = set(incident.timeline.values_list("kind", flat=True))
    assert {"action", "detection"} <= kinds


def test_a_risky_action_waits_for_a_second_operator(driven, personas, operator2):
    with celery_worker():
        driven.launch("risky", nodes=["n1", "n2"], steps=100_000, **TRAIN)
        until(lambda: stored_step("risky") >= 30, "step 30", cluster=driven, job="risky")
        body = {
            "kind": "replace_node",
            "cluster": "local",
            "job": "risky",
            "node": "n2",
            "reason": "n2 is flaky",
        }
        r = personas["operator"].client().post("/api/v1/actions/", body, format="json")
        assert r.status_code == 201, r.content
        pk = r.json()["id"]
        assert Action.objects.get(pk=pk).state == S.AWAITING_APPROVAL
        approve = f"/api/v1/actions/{pk}/approve"
        own = personas["operator"].client().post(approve, {}, format="json")
        assert own.status_code == 403 and own.json()["error"] == "own_action"
        ok = operator2.client().post(approve, {"comment": "go"}, format="json")
        assert ok.status_code == 200, ok.content
        action = until(lambda: ended(pk), "the replacement to end", timeout_s=90)
        assert action.state == S.SUCCEEDED, (action.error, action.output)
        until(lambda: stored_step("risky", 2) > 0, "launch 2 to train", cluster=driven, job="risky")
        assert driven.plan("risky")["nodes"] == ["n1", "n3"]
        driven.stop("risky")
    assert action.approved_by == operator2.user.username
    assert [to for _, to in moves(action)] == [
        S.PROPOSED,
        S.AWAITING_APPROVAL,
        S.APPROVED,
        S.QUEUED,
        S.RUNNING,
        S.SUCCEEDED,
    ]


def test_a_worker_killed_mid_action_ends_it_once(driven, personas, operator2):
    """The worker dies (SIGKILL) while it drains a node; a new worker and the
    reconciler finish the action: one terminal state, one drain on the cluster."""
    driven.launch("victim", nodes=["n1", "n2"], steps=100_000, **TRAIN)
    until(lambda: stored_step("victim") >= 10, "step 10", cluster=driven, job="victim")
    local = Cluster.objects.get(name="local")
    with celery_worker() as worker:
        action = services.action_propose(
            kind="drain_node",
            cluster=local,
            node=Node.objects.get(cluster=local, name="n2"),
            reason="test",
            requested_by="operator",
        )
        action = services.action_approve(
            action=action, actor=operator2.user.username, user=operator2.user
        )
        queue.action_send(action)
        until(lambda: Action.objects.get(pk=action.pk).state == S.RUNNING, "the drain to run")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    stuck = Action.objects.get(pk=action.pk)
    assert stuck.state == S.RUNNING  # its worker is gone
    with celery_worker():
        later = stuck.deadline + timedelta(seconds=1)
        result = services.actions_reconcile(now=max(later, timezone.now()))
        assert result.requeued == [action.pk]
        queue.actions_send(result.actions)  # as the beat task does
        action = until(lambda: ended(action.pk), "the drain to end", timeout_s=60)
    assert action.state == S.SUCCEEDED, (action.error, action.output)
    assert action.attempts == 2
    terminal = [to for _, to in moves(action) if to in (S.SUCCEEDED, S.FAILED)]
    assert terminal == [S.SUCCEEDED]
    assert [e["op"] for e in driver_log(driven) if e.get("node") == "n2"].count("drain") == 1
    assert Node.objects.get(cluster=local, name="n2").state == Node.State.IN_REPAIR
    driven.shutdown()
