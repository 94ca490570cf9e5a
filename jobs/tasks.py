"""Celery tasks of the jobs app: thin wrappers that take ids and call one function.

They are sent through the outbox (common.outbox): each claims its row when it starts."""

from celery import shared_task

from common.outbox import outbox_claim
from jobs.models import TrainingJob
from jobs.services import events_follow_up, ledger_snapshot_refresh


@shared_task(name="jobs.events_stored", time_limit=60, ignore_result=True)
def events_stored(job_id: int, kinds: list[str]) -> None:
    """Announce a job's new events to the apps to the right (see jobs.signals)."""
    events_follow_up(job_id=job_id, kinds=kinds)


@shared_task(name="jobs.ledger_refresh", time_limit=120, ignore_result=True)
def ledger_refresh(job_id: int) -> None:
    """Recompute a job's cached ledger if it is stale; a repeat does nothing new."""
    outbox_claim(task="jobs.ledger_refresh", key=str(job_id))
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        ledger_snapshot_refresh(job=job)
