"""The Celery tasks: execution claims the row once (a second delivery does nothing),
retries transient driver errors with backoff, fails visibly; the reconciler
re-queues rows stuck past their deadline; approvals expire; a replacement waits
for the next checkpoint."""

from datetime import timedelta

import pytest
from django.utils import timezone

from common.models import OutboxEntry
from common.outbox import outbox_drain
from incidents.models import Incident
from incidents.signals import incident_opened
from jobs.models import Node, TrainingJob
from jobs.signals import events_stored
from recovery import queue, services, tasks
from recovery.drivers import DriverError, DriverTransientError
from recovery.models import Action
from tests.factories import AttemptFactory, CheckpointFactory
from tests.recovery.conftest import T0, audit_moves, dt, make_incident

pytestmark = pytest.mark.django_db

S = Action.State


def queued(cluster, kind="cordon_node", **target):
    action = services.action_propose(
        cluster=cluster, kind=kind, reason="t", requested_by="policy:t", mode="auto", **target
    )
    assert action.state == S.QUEUED, action.blocked_reason
    return action


def test_an_incident_s_proposal_outlives_a_lost_send(
    job, nodes, noop, django_capture_on_commit_callbacks
):
    """The proposal for an opened incident is an outbox row written before its send: a
    send lost with the broker (here: never made) is made again by the drain, and the
    task, claiming the row, proposes once however often it runs."""
    incident = make_incident(job, cause="software", fault_type="crash")
    with django_capture_on_commit_callbacks(execute=False):
        incident_opened.send(sender=Incident, incident=incident)
    entry = OutboxEntry.objects.get(task=tasks.PROPOSE_TASK)
    assert (entry.key, entry.args) == (str(incident.pk), [incident.pk])
    assert not Action.objects.exists()
    assert outbox_drain(now=entry.retry_at) == 1  # a worker (re)connecting, or beat
    assert not OutboxEntry.objects.exists()
    [restart] = Action.objects.all()
    assert (restart.kind, restart.incident_id) == ("restart_job", incident.pk)
    tasks.incident_propose(incident.pk)
    assert Action.objects.count() == 1


def test_execute_twice_does_it_once(cluster, nodes, noop):
    action = queued(cluster, node=nodes["n01"])
    tasks.action_execute(action.pk)
    tasks.action_execute(action.pk)
    action.refresh_from_db()
    assert action.state == S.SUCCEEDED and action.attempts == 1
    assert len(noop.calls) == 1
    assert audit_moves(action)[-2:] == [(S.QUEUED, S.RUNNING), (S.RUNNING, S.SUCCEEDED)]
    assert action.output["op"] == "cordon" and action.output["node_states"] == {"n01": "cordoned"}
    assert action.started_at and action.finished_at and action.deadline is None


def test_execute_of_an_action_not_queued_does_nothing(cluster, nodes, noop):
    action = services.action_propose(
        cluster=cluster, kind="cordon_node", node=nodes["n01"], reason="t", requested_by="op"
    )
    assert services.action_execute(action_id=action.pk).what == "skipped"
    assert services.action_execute(action_id=987654).what == "skipped"
    assert noop.calls == []


def test_a_transient_error_is_retried_with_backoff(cluster, nodes, noop, run_on_commit):
    noop.errors.append(DriverTransientError("scheduler busy"))
    with run_on_commit():
        queue.action_send(queued(cluster, node=nodes["n01"]))
    action = Action.objects.get()
    action.refresh_from_db()
    assert action.state == S.SUCCEEDED and action.attempts == 2
    assert len(noop.calls) == 2
    retry = action.audit.get(from_state=S.RUNNING, to_state=S.QUEUED)
    assert "retry in 5 s: scheduler busy" in retry.reason
    assert services.backoff_s(1) == 5 and services.backoff_s(2) == 20


def test_transient_errors_give_up_after_max_attempts(cluster, nodes, noop, run_on_commit):
    noop.errors.extend(DriverTransientError("down") for _ in range(5))
    with run_on_commit():
        queue.action_send(queued(cluster, node=nodes["n01"]))
    action = Action.objects.get()
    action.refresh_from_db()
    assert (action.state, action.attempts) == (S.FAILED, services.MAX_ATTEMPTS)
    assert action.error == "gave up after 3 attempts: down"
    assert len(noop.calls) == services.MAX_ATTEMPTS


def test_a_driver_refusal_fails_the_action_with_its_error(cluster, nodes, noop):
    noop.errors.append(DriverError("no such node", output={"seen": "nothing"}))
    action = queued(cluster, node=nodes["n01"])
    assert services.action_execute(action_id=action.pk).what == "failed"
    action.refresh_from_db()
    assert (action.state, action.error, action.output) == (
        S.FAILED,
        "DriverError: no such node",
        {"seen": "nothing"},
    )
    nodes["n01"].refresh_from_db()
    assert nodes["n01"].state == Node.State.ACTIVE


def test_a_failed_replacement_gives_its_spare_back(cluster, nodes, job, noop):
    noop.errors.append(DriverError("relaunch refused"))
    action = queued(cluster, "replace_node", node=nodes["n01"], job=job)
    services.action_execute(action_id=action.pk)
    action.refresh_from_db()
    assert action.state == S.FAILED and action.spare is None
    nodes["s1"].refresh_from_db()
    assert nodes["s1"].state == Node.State.SPARE


def test_validate_node_returns_a_repaired_node_to_the_spares(cluster, nodes, noop):
    Node.objects.filter(pk=nodes["n09"].pk).update(state=Node.State.IN_REPAIR)
    action = services.action_propose(
        cluster=cluster, kind="validate_node", node=nodes["n09"], reason="r", requested_by="op"
    )
    services.action_approve(action=action, actor="operator2")
    services.action_execute(action_id=action.pk)
    nodes["n09"].refresh_from_db()
    assert nodes["n09"].state == Node.State.SPARE


def test_the_reconciler_requeues_a_row_stuck_running(cluster, nodes, noop, run_on_commit):
    """Its worker died mid-call: past the deadline it is queued again, and runs."""
    action = queued(cluster, node=nodes["n01"])
    assert services.action_transition(
        action=action,
        to=S.RUNNING,
        actor="rebound:worker",
        why="attempt 1",
        attempts=1,
        deadline=timezone.now() + timedelta(seconds=60),
    )
    assert services.actions_reconcile().requeued == []  # not yet past its deadline
    with run_on_commit():
        result = services.actions_reconcile(now=timezone.now() + timedelta(seconds=61))
        queue.actions_send(result.actions)  # as the beat task does
    assert result.requeued == [action.pk]
    action.refresh_from_db()
    assert (action.state, action.attempts) == (S.SUCCEEDED, 2)
    assert (S.RUNNING, S.QUEUED) in audit_moves(action)
    assert action.audit.get(from_state=S.RUNNING, to_state=S.QUEUED).actor == "rebound:reconciler"
    # And a second pass finds nothing to do.
    assert services.actions_reconcile(now=timezone.now() + timedelta(hours=1)).requeued == []


def test_the_reconciler_gives_up_on_a_row_that_keeps_getting_stuck(cluster, nodes):
    action = queued(cluster, node=nodes["n01"])
    Action.objects.filter(pk=action.pk).update(
        state=S.RUNNING, attempts=services.MAX_ATTEMPTS, deadline=timezone.now()
    )
    result = services.actions_reconcile(now=timezone.now() + timedelta(seconds=1))
    assert result.failed == [action.pk]
    action.refresh_from_db()
    assert action.state == S.FAILED and "gave up" in action.audit.last().reason


def test_the_reconciler_sends_a_stuck_queued_row_again(cluster, nodes, noop, run_on_commit):
    action = queued(cluster, node=nodes["n01"])  # its message was lost: never run
    later = timezone.now() + timedelta(seconds=services.QUEUE_GRACE_S + 1)
    with run_on_commit():
        result = services.actions_reconcile(now=later)
        queue.actions_send(result.actions)
    assert result.resent == [action.pk]
    action.refresh_from_db()
    assert action.state == S.SUCCEEDED and len(noop.calls) == 1
    with run_on_commit():
        tasks.actions_reconcile()  # the beat task: nothing left
    assert len(noop.calls) == 1


def test_approvals_expire(cluster, nodes):
    action = services.action_propose(
        cluster=cluster, kind="cordon_node", node=nodes["n01"], reason="r", requested_by="op"
    )
    assert services.approvals_expire() == []
    Action.objects.filter(pk=action.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    tasks.approvals_expire()
    tasks.approvals_expire()
    action.refresh_from_db()
    assert action.state == S.EXPIRED and action.finished_at is not None
    [entry] = action.audit.filter(to_state=S.EXPIRED)
    assert entry.actor == "rebound:expiry"
    with pytest.raises(services.Refused) as exc:
        services.action_approve(action=action, actor="operator2")
    assert exc.value.code == "invalid_state"


def test_the_default_approval_window_is_30_minutes(cluster, nodes):
    action = services.action_propose(
        cluster=cluster, kind="cordon_node", node=nodes["n01"], reason="r", requested_by="op"
    )
    window = (action.expires_at - action.created_at).total_seconds()
    assert window == pytest.approx(1800, abs=5)


def test_a_replacement_waits_for_the_next_checkpoint(cluster, nodes, job, noop, run_on_commit):
    action = services.action_propose(
        cluster=cluster,
        kind="replace_at_next_checkpoint",
        node=nodes["n02"],
        job=job,
        reason="straggler",
        requested_by="operator",
    )
    with run_on_commit():
        queue.action_send(services.action_approve(action=action, actor="operator2"))
    action.refresh_from_db()
    assert action.state == S.QUEUED
    assert action.output == {"waiting_for": "a durable checkpoint after step 80"}
    assert noop.calls == []
    # The job saves step 120; ingest announces it.
    CheckpointFactory(job=job, attempt=1, step=120, saved_at=dt(T0 + 1200), durable=True)
    with run_on_commit():
        events_stored.send(
            sender=TrainingJob, job_ids=[job.pk], kinds={job.pk: {"step", "checkpoint_saved"}}
        )
    action.refresh_from_db()
    assert action.state == S.SUCCEEDED
    assert [c["op"] for c in noop.calls] == ["replace_node"]


def test_a_replacement_goes_anyway_after_waiting_too_long(cluster, nodes, job, noop):
    action = services.action_propose(
        cluster=cluster,
        kind="replace_at_next_checkpoint",
        node=nodes["n02"],
        job=job,
        params={"max_wait_s": 600},
        reason="straggler",
        requested_by="operator",
    )
    services.action_approve(action=action, actor="operator2")
    assert services.action_execute(action_id=action.pk).what == "waiting"
    Action.objects.filter(pk=action.pk).update(queued_at=timezone.now() - timedelta(seconds=601))
    assert services.action_execute(action_id=action.pk).what == "succeeded"


def test_a_replacement_lost_mid_call_finishes_on_its_spare(cluster, nodes, job, noop):
    """The worker relaunched the job on the spare and died before recording it; the
    new launch is already reported. The re-run is a continuation: not stale, same
    spare, and it completes."""
    action = queued(cluster, "replace_node", node=nodes["n01"], job=job)
    noop.errors.append(DriverTransientError("lost"))  # stands for the worker's death
    assert services.action_execute(action_id=action.pk).what == "retry"
    action.refresh_from_db()
    assert action.spare.name == "s1" and action.state == S.QUEUED
    AttemptFactory(job=job, number=2, world_size=16)  # the new launch reported
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    action.refresh_from_db()
    assert (action.state, action.spare.name, action.attempts) == (S.SUCCEEDED, "s1", 2)
    assert [c["spare"] for c in noop.calls] == ["s1", "s1"]
