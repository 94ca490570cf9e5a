"""Celery tasks of the incidents app: they take ids and call the services."""

import logging
import time

from celery import shared_task
from django.core.cache import cache

from incidents import services
from jobs.models import TrainingJob

logger = logging.getLogger(__name__)


@shared_task(name="incidents.open_reported", time_limit=30, ignore_result=True)
def open_reported(job_id: int) -> None:
    """The quick pass: open incidents for reported faults, whatever the job's length."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        services.incidents_detect(job=job, inferred=False)


@shared_task(name="incidents.detect_job", time_limit=120, ignore_result=True)
def detect_job(job_id: int) -> None:
    """The full pass: open or update the job's incidents, inferred faults included,
    reading what was stored since the last pass; a repeat changes nothing. Figures
    of incidents it changed are brought up to date at once; the others follow
    the ledger's refreshes (see receivers)."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return
    began = time.monotonic()
    if services.incidents_detect(job=job):
        services.incidents_update_figures(job=job)
    # How long a pass takes for this job: the receivers space passes by it.
    cache.set(f"incident-pass-s:{job_id}", time.monotonic() - began, timeout=3600)


@shared_task(name="incidents.sweep", time_limit=120, ignore_result=True)
def sweep() -> None:
    """The periodic wall-clock check (Celery beat, every SWEEP_EVERY_S)."""
    result = services.incidents_sweep()
    if result.judged or result.suspect or result.deaf:
        logger.info(
            "sweep: judged %s, suspect %s, nothing heard from %s",
            result.judged,
            result.suspect,
            result.deaf,
        )
