"""Celery tasks of the recovery app: they take ids and call one service each.

The database row is the truth: a task only moves a row forward, and a second
delivery of the same message finds nothing left to do.
"""

import logging

from celery import shared_task

from incidents.models import Incident
from recovery import services
from recovery.models import Action

logger = logging.getLogger(__name__)


@shared_task(name="recovery.propose_for_incident", time_limit=60, ignore_result=True)
def propose_for_incident(incident_id: int) -> None:
    """Propose what the policies say for an incident that opened or changed."""
    incident = Incident.objects.select_related("job", "cluster").filter(pk=incident_id).first()
    if incident is not None:
        services.incident_propose(incident=incident)


@shared_task(name="recovery.execute_action", time_limit=930, ignore_result=True)
def execute_action(action_id: int) -> None:
    """Run one queued action; sent with its kind's time limit (services.TIME_LIMITS_S).
    A transient driver error puts the row back in `queued`; it is sent again after
    the backoff."""
    outcome = services.action_execute(action_id=action_id)
    if outcome.retry_in is not None:
        execute_action.apply_async((action_id,), countdown=outcome.retry_in)


@shared_task(name="recovery.after_action", time_limit=60, ignore_result=True)
def after_action(action_id: int) -> None:
    """An action ended: related open incidents may propose their next step."""
    action = Action.objects.filter(pk=action_id).first()
    if action is not None:
        services.action_follow_up(action=action)


@shared_task(name="recovery.reconcile", time_limit=120, ignore_result=True)
def reconcile() -> None:
    """Periodic (Celery beat): rows stuck in queued or running past their deadline."""
    result = services.actions_reconcile()
    if result.resent or result.requeued or result.failed:
        logger.info(
            "reconcile: sent again %s, re-queued %s, gave up on %s",
            result.resent,
            result.requeued,
            result.failed,
        )


@shared_task(name="recovery.expire_approvals", time_limit=60, ignore_result=True)
def expire_approvals() -> None:
    """Periodic (Celery beat): approvals not given in time expire; those whose target
    finished or moved on are retired (cancelled, saying why)."""
    expired = services.approvals_expire()
    if expired:
        logger.info("approvals expired: %s", expired)
    retired = services.approvals_retire()
    if retired:
        logger.info("approvals retired (target finished or moved on): %s", retired)
