"""Celery tasks of the notify app: each takes ids and calls one service
(notify.services). Delivery is sent through the outbox; a second message for the same
notification finds nothing due."""

import logging

from celery import shared_task

from common.outbox import outbox_claim
from notify import services

logger = logging.getLogger(__name__)


@shared_task(name="notify.deliver", soft_time_limit=240, time_limit=270, ignore_result=True)
def deliver(notification_id: int) -> None:
    """Deliver one notification when due (retries send themselves again)."""
    outbox_claim(task=services.DELIVER_TASK, key=str(notification_id))
    services.notification_deliver(notification_id=notification_id)


@shared_task(name="notify.approvals_expiring", time_limit=60, ignore_result=True)
def approvals_expiring() -> None:
    """Periodic (Celery beat): actions about to expire unapproved are announced."""
    count = services.approvals_expiring_record()
    if count:
        logger.info("approvals about to expire announced: %d", count)


@shared_task(name="notify.resend", time_limit=60, ignore_result=True)
def resend() -> None:
    """Periodic (Celery beat): pending notifications whose message was lost, sent again."""
    count = services.notifications_resend()
    if count:
        logger.info("notifications sent again: %d", count)
