"""Celery tasks of the recovery app: each takes ids, loads the row, calls the one
service it is named after, and sends (through recovery.queue) what the outcome
calls for.

The database row is the truth: a task only moves a row forward, and a second
delivery of the same message finds nothing left to do.
"""

import logging

from celery import shared_task

from common.outbox import outbox_claim
from incidents.models import Incident
from recovery import queue, services
from recovery.models import Action

logger = logging.getLogger(__name__)

PROPOSE_TASK = "recovery.incident_propose"


@shared_task(name=PROPOSE_TASK, time_limit=60, ignore_result=True)
def incident_propose(incident_id: int) -> None:
    """Propose what the policies say for an incident that opened or changed; the
    automatic proposals the guardrails let through are executed. Sent through the
    outbox (recovery.queue.incident_propose_send)."""
    outbox_claim(task=PROPOSE_TASK, key=str(incident_id))
    incident = Incident.objects.select_related("job", "cluster").filter(pk=incident_id).first()
    if incident is not None:
        queue.actions_send(services.incident_propose(incident=incident))


@shared_task(name="recovery.action_execute", time_limit=930, ignore_result=True)
def action_execute(action_id: int) -> None:
    """Run one queued action; sent with its kind's time limit (services.TIME_LIMITS_S).
    A transient driver error puts the row back in `queued`; it is sent again after
    the backoff, and only then."""
    outcome = services.action_execute(action_id=action_id)
    if outcome.retry_in is not None:
        queue.action_execute_send(outcome.action, countdown=outcome.retry_in)
    elif outcome.ended:
        queue.action_follow_up_send(action_id)


@shared_task(name="recovery.action_follow_up", time_limit=60, ignore_result=True)
def action_follow_up(action_id: int) -> None:
    """An action ended: related open incidents may propose their next step."""
    action = Action.objects.filter(pk=action_id).first()
    if action is not None:
        queue.actions_send(services.action_follow_up(action=action))


@shared_task(name="recovery.actions_reconcile", time_limit=120, ignore_result=True)
def actions_reconcile() -> None:
    """Periodic (Celery beat): rows stuck in queued or running past their deadline
    are sent again, re-queued or failed."""
    result = services.actions_reconcile()
    queue.actions_send(result.actions)
    if result.actions:
        logger.info(
            "reconcile: sent again %s, re-queued %s, gave up on %s",
            result.resent,
            result.requeued,
            result.failed,
        )


@shared_task(name="recovery.approvals_expire", time_limit=60, ignore_result=True)
def approvals_expire() -> None:
    """Periodic (Celery beat): approvals not given in time expire."""
    expired = services.approvals_expire()
    for pk in expired:
        queue.action_follow_up_send(pk)
    if expired:
        logger.info("approvals expired: %s", expired)


@shared_task(name="recovery.maintenance_pre_actions", time_limit=120, ignore_result=True)
def maintenance_pre_actions() -> None:
    """Periodic (Celery beat): maintenance windows about to start propose, once each,
    what moves the running jobs off their nodes."""
    result = services.maintenance_pre_actions_propose()
    queue.actions_send(result.actions)
    if result.windows:
        logger.info("pre-maintenance: windows %s, actions %s", result.windows, result.actions)


@shared_task(name="recovery.approvals_retire", time_limit=60, ignore_result=True)
def approvals_retire() -> None:
    """Periodic (Celery beat): approvals whose target finished or moved on are retired
    (cancelled, saying why)."""
    retired = services.approvals_retire()
    for pk in retired:
        queue.action_follow_up_send(pk)
    if retired:
        logger.info("approvals retired (target finished or moved on): %s", retired)
