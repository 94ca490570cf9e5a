"""Celery tasks of the jobs app: thin wrappers that take ids and call one function."""

from celery import shared_task

from jobs.models import TrainingJob
from jobs.services import ledger_snapshot_refresh


@shared_task(name="jobs.ledger_refresh", time_limit=120, ignore_result=True)
def ledger_refresh(job_id: int) -> None:
    """Recompute a job's cached ledger if it is stale; a repeat does nothing new."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        ledger_snapshot_refresh(job=job)
