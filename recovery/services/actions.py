"""The action state machine: its moves, the one function that makes them
(`action_transition`) and the record each move leaves (the audit entry, the incident's
timeline entry, the audit log line).

A move is a conditional UPDATE (`WHERE state = <from>`) whose row count says whether
this caller won; the records are written in the same transaction. A move only
records: what the new state calls for (a queued row's execution, an ended row's
follow-up) is sent by the caller, through `recovery.queue`, once committed.

The states (design.md, Actions):

    proposed -> awaiting_approval -> approved | rejected | expired
    approved (or proposed under an automatic policy) -> queued -> running
    running -> succeeded | failed
    any state before running -> cancelled

and three returns the design implies: approved or queued -> awaiting_approval
(a stale approval, or a guardrail tripped right before running: back to the
approval queue), and running -> queued (a transient driver error to retry, or
the reconciler re-queuing a row stuck past its deadline).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from incidents.models import TimelineEntry
from incidents.services import timeline_entry_add
from jobs.models import Node
from jobs.services import node_set_state
from recovery import guardrails, signals
from recovery.models import Action, ActionAudit
from recovery.selectors import cluster_settings

audit_log = logging.getLogger("rebound.audit")

K = Action.Kind
S = Action.State
N = Node.State

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PROPOSED: frozenset({S.AWAITING_APPROVAL, S.QUEUED, S.CANCELLED}),
    S.AWAITING_APPROVAL: frozenset({S.APPROVED, S.REJECTED, S.EXPIRED, S.CANCELLED}),
    S.APPROVED: frozenset({S.QUEUED, S.AWAITING_APPROVAL, S.CANCELLED}),
    S.QUEUED: frozenset({S.RUNNING, S.AWAITING_APPROVAL, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED}),
}
STAMPS = {
    S.APPROVED: "approved_at",
    S.QUEUED: "queued_at",
    S.RUNNING: "started_at",
    **{s: "finished_at" for s in Action.TERMINAL_STATES},
}
APPROVAL_STATES = frozenset({S.AWAITING_APPROVAL, S.APPROVED, S.REJECTED, S.EXPIRED})
RELEASE_SPARE = frozenset({S.AWAITING_APPROVAL, S.CANCELLED, S.FAILED, S.REJECTED, S.EXPIRED})

QUEUE_GRACE_S = 120  # a queued row no worker took by then is sent again

# What each kind acts on.
NODE_KINDS = frozenset({K.CORDON_NODE, K.UNCORDON_NODE, K.DRAIN_NODE, K.VALIDATE_NODE})
JOB_KINDS = frozenset({K.RESTART_JOB, K.ROLLBACK, K.CHECKPOINT_JOB})
JOB_AND_NODE_KINDS = frozenset({K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT})


class InvalidTransition(Exception):
    """A move the state machine does not have (a bug in the caller, not a race)."""


def action_transition(
    *, action: Action, to: str, actor: str, why: str, data: dict | None = None, **fields
) -> bool:
    """Moves `action` from the state it was read in to `to`, if it is still in it.

    Returns False (and changes nothing) when another worker or request moved it
    first. Raises InvalidTransition for a move the state machine does not have.
    `fields` are set in the same UPDATE (F expressions allowed)."""
    frm = action.state
    if to not in TRANSITIONS.get(frm, ()):
        raise InvalidTransition(f"action #{action.pk}: {frm} -> {to} is not a transition")
    now = timezone.now()
    values = {"state": to, "updated_at": now, **fields}
    if to in STAMPS:
        values.setdefault(STAMPS[to], now)
    if to == S.QUEUED:
        values.setdefault("deadline", now + timedelta(seconds=QUEUE_GRACE_S))
    elif to != S.RUNNING:
        values.setdefault("deadline", None)
    if to == S.AWAITING_APPROVAL:
        ttl = cluster_settings(action.cluster_id).approval_ttl_s
        values.setdefault("expires_at", now + timedelta(seconds=ttl))
    # A replacement that will not run (now) gives its claimed spare back to the pool.
    spare_id = action.spare_id if to in RELEASE_SPARE and not action.dry_run else None
    if spare_id:
        values["spare"] = None
    with transaction.atomic():
        if Action.objects.filter(pk=action.pk, state=frm).update(**values) != 1:
            return False
        if spare_id:
            node_set_state(node_id=spare_id, to=N.SPARE, from_states=[N.ACTIVE])
        expressions = [f for f, v in values.items() if hasattr(v, "resolve_expression")]
        for f, v in values.items():
            if f not in expressions:
                setattr(action, f, v)
        if expressions:
            action.refresh_from_db(fields=expressions)
        action_audit_add(action=action, frm=frm, to=to, actor=actor, why=why, at=now, data=data)
        action_changed_send(action=action, frm=frm, to=to, why=why)
    return True


def action_changed_send(*, action: Action, frm: str, to: str, why: str) -> None:
    """recovery.signals.action_changed, once the caller's transaction commits."""
    transaction.on_commit(
        lambda: signals.action_changed.send(
            sender=Action, action=action, from_state=frm, to_state=to, why=why
        ),
        robust=True,
    )


def action_audit_add(
    *, action: Action, frm: str, to: str, actor: str, why: str, at, data: dict | None = None
) -> None:
    """The audit entry, and the timeline entry of the incident the action answers."""
    ActionAudit.objects.create(
        action=action,
        at=at,
        actor=actor,
        from_state=frm,
        to_state=to,
        reason=why,
        data=data or {},
    )
    if action.incident_id:
        move = f"{frm} → {to}" if frm else to
        timeline_entry_add(
            incident_id=action.incident_id,
            kind=TimelineEntry.Kind.APPROVAL
            if to in APPROVAL_STATES
            else TimelineEntry.Kind.ACTION,
            at=at,
            actor=actor,
            source="recovery",
            message=f"action #{action.pk} {action.kind} ({_target(action)}): {move}: {why}",
            data={"action": action.pk, "kind": action.kind, "from": frm, "to": to},
        )
    message = f"action #{action.pk} {action.kind} {frm or '-'} -> {to} by {actor}: {why}"
    transaction.on_commit(lambda: audit_log.info(message))


def _target(action: Action) -> str:
    parts = []
    if action.node_id:
        parts.append(f"node {action.node.name}")
    if action.job_id:
        parts.append(f"job {action.job.key}")
    return ", ".join(parts) or "cluster"


def action_back_to_approval(*, action: Action, actor: str, name: str, why: str) -> bool:
    """Approved or queued, but not runnable as approved: awaiting approval again,
    on the target's state as it is now."""
    return action_transition(
        action=action,
        to=S.AWAITING_APPROVAL,
        actor=actor,
        why=why,
        blocked_by=name,
        blocked_reason=why,
        approved_by="",
        approved_by_user=None,
        approved_at=None,
        target_snapshot=guardrails.target_snapshot(action),
    )
