"""Celery tasks of the shared pieces."""

from celery import shared_task

from common import outbox


@shared_task(name="common.outbox_drain", time_limit=60, ignore_result=True)
def outbox_drain() -> None:
    """Send what the outbox still holds past its time (beat runs it; the worker
    also drains at each (re)connection to the broker)."""
    outbox.outbox_drain()
