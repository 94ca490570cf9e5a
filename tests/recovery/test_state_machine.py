"""The action state machine: the moves of design.md and no other, each one audited,
a conditional update (of two racing writers one wins), the lease constraint, and
the incident's timeline."""

import itertools

import pytest
from django.db import IntegrityError, transaction

from incidents.models import TimelineEntry
from recovery import services
from recovery.models import Action, ActionAudit
from tests.factories import ActionFactory
from tests.recovery.conftest import audit_moves, make_incident

pytestmark = pytest.mark.django_db

S = Action.State
ALLOWED = {
    (S.PROPOSED, S.AWAITING_APPROVAL),
    (S.PROPOSED, S.QUEUED),  # under an automatic policy
    (S.PROPOSED, S.CANCELLED),
    (S.AWAITING_APPROVAL, S.APPROVED),
    (S.AWAITING_APPROVAL, S.REJECTED),
    (S.AWAITING_APPROVAL, S.EXPIRED),
    (S.AWAITING_APPROVAL, S.CANCELLED),
    (S.APPROVED, S.QUEUED),
    (S.APPROVED, S.AWAITING_APPROVAL),  # a stale approval goes back to the queue
    (S.APPROVED, S.CANCELLED),
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.AWAITING_APPROVAL),  # a guardrail tripped right before running
    (S.QUEUED, S.CANCELLED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.QUEUED),  # retry a transient error; the reconciler's re-queue
}


def make_action(cluster, node, state, **fields):
    return ActionFactory(
        cluster=cluster,
        kind=Action.Kind.CORDON_NODE,
        node=node,
        state=state,
        requested_by="operator",
        **fields,
    )


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(S.values, S.values)))
def test_only_the_designed_moves_are_allowed_and_each_is_audited(cluster, nodes, frm, to):
    action = make_action(cluster, nodes["n01"], frm)
    if (frm, to) in ALLOWED:
        assert services.action_transition(action=action, to=to, actor="tester", why="because")
        action.refresh_from_db()
        assert action.state == to
        [entry] = ActionAudit.objects.filter(action=action)
        assert (entry.actor, entry.from_state, entry.to_state, entry.reason) == (
            "tester",
            frm,
            to,
            "because",
        )
        assert entry.at is not None
    else:
        with pytest.raises(services.InvalidTransition):
            services.action_transition(action=action, to=to, actor="tester", why="no")
        action.refresh_from_db()
        assert action.state == frm
        assert not ActionAudit.objects.filter(action=action).exists()


def test_terminal_states_go_nowhere():
    for state in Action.TERMINAL_STATES:
        assert not services.TRANSITIONS.get(state)


def test_timestamps_follow_the_states(cluster, nodes):
    action = make_action(cluster, nodes["n01"], S.AWAITING_APPROVAL)
    for to, stamp in (
        (S.APPROVED, "approved_at"),
        (S.QUEUED, "queued_at"),
        (S.RUNNING, "started_at"),
        (S.SUCCEEDED, "finished_at"),
    ):
        services.action_transition(action=action, to=to, actor="t", why="w")
        action.refresh_from_db()
        assert getattr(action, stamp) is not None
    assert action.deadline is None  # a finished action has nothing to reconcile


def test_of_two_racing_writers_one_wins(cluster, nodes):
    """Two workers read the same queued row; only one claims it, and one entry says so."""
    action = make_action(cluster, nodes["n01"], S.QUEUED)
    first, second = Action.objects.get(pk=action.pk), Action.objects.get(pk=action.pk)
    assert services.action_transition(action=first, to=S.RUNNING, actor="w1", why="claim")
    assert not services.action_transition(action=second, to=S.RUNNING, actor="w2", why="claim")
    assert audit_moves(action) == [(S.QUEUED, S.RUNNING)]
    assert ActionAudit.objects.get(action=action).actor == "w1"


def test_a_proposal_is_audited_from_creation(cluster, nodes):
    auto = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=nodes["n01"],
        reason="xid 79",
        requested_by="policy:hardware",
        mode="auto",
    )
    assert audit_moves(auto) == [("", S.PROPOSED), (S.PROPOSED, S.QUEUED)]
    assert auto.deadline is not None  # the reconciler re-sends it if no worker takes it
    manual = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=nodes["n02"],
        reason="flaky",
        requested_by="operator",
    )
    assert audit_moves(manual) == [("", S.PROPOSED), (S.PROPOSED, S.AWAITING_APPROVAL)]
    assert manual.expires_at is not None


def test_one_active_action_per_node_and_per_job_is_a_database_constraint(cluster, nodes, job):
    make_action(cluster, nodes["n01"], S.QUEUED)
    with pytest.raises(IntegrityError), transaction.atomic():
        make_action(cluster, nodes["n01"], S.APPROVED)
    # Waiting for a person holds nothing; approving takes the lease.
    waiting = make_action(cluster, nodes["n01"], S.AWAITING_APPROVAL)
    with pytest.raises(IntegrityError), transaction.atomic():
        Action.objects.filter(pk=waiting.pk).update(state=S.APPROVED)
    ActionFactory(cluster=cluster, kind="restart_job", job=job, state=S.RUNNING, requested_by="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        ActionFactory(cluster=cluster, kind="rollback", job=job, state=S.PROPOSED, requested_by="x")
    # Finished actions hold nothing.
    Action.objects.filter(node=nodes["n01"]).update(state=S.SUCCEEDED)
    make_action(cluster, nodes["n01"], S.PROPOSED)


def test_a_proposal_on_a_leased_target_is_refused_naming_the_holder(cluster, nodes):
    holder = make_action(cluster, nodes["n01"], S.RUNNING)
    with pytest.raises(services.Refused) as exc:
        services.action_propose(
            cluster=cluster,
            kind="drain_node",
            node=nodes["n01"],
            reason="x",
            requested_by="operator",
        )
    assert exc.value.code == "lease" and exc.value.extra["guardrail"] == "lease"
    assert f"#{holder.pk}" in exc.value.detail
    assert Action.objects.count() == 1


def test_an_approval_takes_the_lease_or_is_refused_naming_the_holder(cluster, nodes):
    """Two proposals on one node both wait for a person; the first approved takes
    the node, the second cannot be approved while the first holds it."""
    first, second = (
        services.action_propose(
            cluster=cluster, kind=kind, node=nodes["n01"], reason="x", requested_by="operator"
        )
        for kind in ("drain_node", "cordon_node")
    )
    assert {first.state, second.state} == {S.AWAITING_APPROVAL}
    services.action_approve(action=first, actor="operator2")
    with pytest.raises(services.Refused) as exc:
        services.action_approve(action=second, actor="operator2")
    assert exc.value.extra["guardrail"] == "lease" and f"#{first.pk}" in exc.value.detail
    second.refresh_from_db()
    assert second.state == S.AWAITING_APPROVAL and not second.approved_by


def test_each_move_of_an_action_answering_an_incident_is_on_its_timeline(cluster, nodes, job):
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes["n01"]])
    action = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=nodes["n01"],
        incident=incident,
        reason="xid",
        requested_by="operator",
    )
    services.action_reject(action=action, actor="operator2", comment="not now")
    entries = list(
        TimelineEntry.objects.filter(incident=incident, source="recovery").order_by("id")
    )
    assert [(e.kind, e.data["from"], e.data["to"]) for e in entries] == [
        ("action", "", "proposed"),
        ("approval", "proposed", "awaiting_approval"),
        ("approval", "awaiting_approval", "rejected"),
    ]
    assert entries[-1].actor == "operator2" and "not now" in entries[-1].message
    assert "cordon_node" in entries[0].message and "n01" in entries[0].message
