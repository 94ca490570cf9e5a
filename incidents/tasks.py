"""Celery tasks of the incidents app: they take ids and call the services."""

from celery import shared_task

from incidents import services
from jobs.models import TrainingJob


@shared_task(name="incidents.detect_job", time_limit=120, ignore_result=True)
def detect_job(job_id: int) -> None:
    """Open or update the job's incidents, then their figures; a repeat changes nothing."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return
    services.incidents_detect(job=job, inferred=False)  # quick: reported faults first
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
