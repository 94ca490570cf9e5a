"""Decisions on an action: a person approves (never their own), rejects or cancels
it; approvals not given in time expire, and those whose target finished or moved on
are retired. What an approval must pass is `guardrails.decision_block`, the answer
the approval page shows too."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery import guardrails
from recovery.errors import OwnAction, Refused
from recovery.models import Action
from recovery.selectors import action_is_own, cluster_settings
from recovery.services.actions import TRANSITIONS, action_back_to_approval, action_transition

S = Action.State


def _fresh(action: Action) -> Action:
    return Action.objects.select_related("cluster", "node", "job").get(pk=action.pk)


def action_approve(*, action: Action, actor: str, user=None, comment: str = "") -> Action:
    """An operator other than the requester approves; the action takes the lease and
    is queued at once, unless its target changed since it was proposed (then it is
    back in the queue, with the new state to approve, and Refused `stale` says so).
    Refused `guardrail` when another action holds the target (`lease`) or no spare
    is left; OwnAction for the requester."""
    action = _fresh(action)
    if action_is_own(action=action, user=user, actor=actor):
        raise OwnAction(f"{actor} requested action #{action.pk}; another operator must approve it.")
    if action.state != S.AWAITING_APPROVAL:
        raise Refused(f"action #{action.pk} is {action.state}, not awaiting", code="invalid_state")
    ctx = guardrails.Context(cluster_settings(action.cluster_id), timezone.now())
    blocked = guardrails.decision_block(action, ctx)
    if blocked:
        name, why = blocked
        _retire(action, name=name, why=why)
        raise Refused(why, code="guardrail", guardrail=name, state=action.state)
    with transaction.atomic():
        try:
            done = action_transition(
                action=action,
                to=S.APPROVED,
                actor=actor,
                why=comment or "approved",
                approved_by=actor,
                approved_by_user=user if getattr(user, "pk", None) else None,
                comment=comment,
            )
        except IntegrityError as exc:  # the lease was taken since the check above
            raise Refused(
                "lease: another action took this target; try again",
                code="guardrail",
                guardrail="lease",
            ) from exc
        if not done:
            raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
        stale = guardrails.stale(action, ctx)
        if stale:
            action_back_to_approval(
                action=action, actor="rebound:guardrail", name="stale", why=stale
            )
        else:
            action_transition(action=action, to=S.QUEUED, actor=actor, why="approved")
    if stale:
        raise Refused(f"{stale}; it is back in the approval queue", code="stale", action=action.pk)
    return action


def _retire(action: Action, *, name: str, why: str) -> bool:
    """An approval that can no longer be given ends here, audited: `expired` past its
    expiry, `moved_on` (its target finished or moved on) cancelled. Other guardrails
    leave it waiting. True when this call moved it."""
    to = {"expired": S.EXPIRED, "moved_on": S.CANCELLED}.get(name)
    if to is None:
        return False
    return action_transition(action=action, to=to, actor="rebound:guardrail", why=why)


def action_reject(*, action: Action, actor: str, user=None, comment: str) -> Action:
    action = _fresh(action)
    if action.state != S.AWAITING_APPROVAL:
        raise Refused(f"action #{action.pk} is {action.state}, not awaiting", code="invalid_state")
    late = guardrails.expired(action, guardrails.Context(None, timezone.now()))
    if late:
        _retire(action, name="expired", why=late)
        raise Refused(late, code="guardrail", guardrail="expired", state=action.state)
    if not action_transition(
        action=action,
        to=S.REJECTED,
        actor=actor,
        why=comment,
        approved_by=actor,
        approved_by_user=user if getattr(user, "pk", None) else None,
        comment=comment,
    ):
        raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
    return action


def action_cancel(*, action: Action, actor: str, comment: str = "") -> Action:
    action = _fresh(action)
    if S.CANCELLED not in TRANSITIONS.get(action.state, ()):
        raise Refused(
            f"action #{action.pk} is {action.state}: too late to cancel", code="invalid_state"
        )
    if not action_transition(
        action=action, to=S.CANCELLED, actor=actor, why=comment or "cancelled"
    ):
        raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
    return action


def approvals_retire(*, now=None, limit: int = 500) -> list[int]:
    """Approvals whose target finished or moved on (guardrails.moved_on): cancelled,
    saying why, in the audit and on the incident's timeline."""
    now = now or timezone.now()
    waiting = list(
        Action.objects.filter(state=S.AWAITING_APPROVAL).order_by("created_at", "id")[:limit]
    )
    ctx = guardrails.Context(None, now, guardrails.Facts(waiting))
    retired = []
    for action in waiting:
        why = guardrails.moved_on(action, ctx)
        if why and _retire(action, name="moved_on", why=why):
            retired.append(action.pk)
    return retired


def approvals_expire(*, now=None) -> list[int]:
    """Approvals not given in time: expired (a rejection)."""
    now = now or timezone.now()
    expired = []
    for action in Action.objects.filter(state=S.AWAITING_APPROVAL, expires_at__lt=now):
        if action_transition(
            action=action,
            to=S.EXPIRED,
            actor="rebound:expiry",
            why=f"no decision by {action.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        ):
            expired.append(action.pk)
    return expired
