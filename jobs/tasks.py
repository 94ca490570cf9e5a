"""Celery tasks of the jobs app: thin wrappers that take ids and call the service they
are named after.

They are sent through the outbox (common.outbox), which stores a task by its registered
name: those names ("jobs.events_stored", "jobs.ledger_refresh") stay as they are, so a
row stored before a rename is still sent. Each claims its row when it starts."""

from celery import shared_task

from common.outbox import outbox_claim
from jobs import services
from jobs.models import TrainingJob
from jobs.services.follow_up import EVENTS_STORED_TASK, LEDGER_REFRESH_TASK
from jobs.services.page_cache import REFRESH_TASK, refresh_key


@shared_task(name=EVENTS_STORED_TASK, time_limit=60, ignore_result=True)
def events_follow_up(job_id: int, kinds: list[str]) -> None:
    """Announce a job's new events to the apps to the right (see jobs.signals)."""
    services.events_follow_up(job_id=job_id, kinds=kinds)


@shared_task(name=LEDGER_REFRESH_TASK, time_limit=120, ignore_result=True)
def ledger_snapshot_refresh(job_id: int) -> None:
    """Recompute a job's cached ledger if it is stale; a repeat does nothing new."""
    outbox_claim(task=LEDGER_REFRESH_TASK, key=str(job_id))
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        services.ledger_snapshot_refresh(job=job)


@shared_task(name=REFRESH_TASK, time_limit=120, ignore_result=True)
def page_cache_refresh(job_id: int, name: str, params: dict) -> None:
    """Compute a recent-cached read of a job anew (jobs.services.page_cache)."""
    outbox_claim(task=REFRESH_TASK, key=refresh_key(job_id, name, params))
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        services.job_recent_refresh(job, name, params)
