"""Celery tasks of the incidents app: they take ids and call the services.

The detection tasks are sent through the outbox (common.outbox, see receivers):
each claims its row when it starts. A pass that fails is reported by the service
(logged at ERROR, recorded on the job's detector state) and not retried here: the
next events or the next sweep run it again."""

import logging

from celery import shared_task

from common.outbox import outbox_claim
from incidents import services
from incidents.upkeep import incidents_storage_upkeep
from jobs.models import TrainingJob

logger = logging.getLogger(__name__)


@shared_task(name="incidents.open_reported", time_limit=30, ignore_result=True)
def incidents_open_reported(job_id: int) -> None:
    """The quick pass: open incidents for reported faults, whatever the job's length."""
    outbox_claim(task="incidents.open_reported", key=str(job_id))
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        services.incidents_detect_pass(job=job, inferred=False)


@shared_task(name="incidents.detect_job", time_limit=120, ignore_result=True)
def incidents_detect_pass(job_id: int) -> None:
    """The full pass: open or update the job's incidents, inferred faults included,
    reading what was stored since the last pass; a repeat changes nothing. Figures
    of incidents it changed are brought up to date at once; the others follow
    the ledger's refreshes (see receivers)."""
    outbox_claim(task="incidents.detect_job", key=str(job_id))
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None:
        services.incidents_detect_pass(job=job)


@shared_task(name="incidents.sweep", time_limit=120, ignore_result=True)
def incidents_sweep() -> None:
    """The periodic wall-clock check (Celery beat, every SWEEP_EVERY_S)."""
    result = services.incidents_sweep()
    if result.judged or result.suspect or result.deaf or result.failed:
        logger.info(
            "sweep: judged %s, suspect %s, nothing heard from %s, failed %s",
            result.judged,
            result.suspect,
            result.deaf,
            result.failed,
        )


@shared_task(name="incidents.storage_upkeep", time_limit=1800, ignore_result=True)
def storage_upkeep() -> None:
    """Roll up and drop what the streams no longer need (incidents.upkeep); a repeat
    finds less or nothing to do."""
    run = incidents_storage_upkeep()
    logger.info("storage upkeep: %s", run.report)
