"""How incidents hear of new events: the jobs app's `events_stored` signal."""

from django.core.cache import cache

from incidents.models import Incident
from incidents.tasks import detect_job

# Kinds that can open or change a fault episode: detect at once.
EPISODE_KINDS = frozenset({"fault", "attempt_ended", "attempt_started"})
# Steps only move the figures of incidents that have not recovered yet.
FIGURES_DEBOUNCE_S = 5


def on_events_stored(sender, job_ids, kinds, **kwargs):
    for job_id in job_ids:
        stored = kinds.get(job_id, set())
        if stored & EPISODE_KINDS:
            detect_job.delay(job_id)
        elif (
            "step" in stored
            and Incident.objects.filter(job_id=job_id, recovered_at=None).exists()
            and cache.add(f"incident-figures:{job_id}", 1, timeout=FIGURES_DEBOUNCE_S)
        ):
            detect_job.apply_async((job_id,), countdown=FIGURES_DEBOUNCE_S)
