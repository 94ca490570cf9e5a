"""How incidents hear of the jobs app: new events, and a job's ledger recomputed."""

from django.core.cache import cache

from incidents.models import Incident
from incidents.services import incidents_update_figures
from incidents.tasks import detect_job, open_reported

# Kinds that can open or change a fault episode: detect at once.
EPISODE_KINDS = frozenset({"fault", "attempt_ended", "attempt_started"})
# Anything else (steps, heartbeats, windows) moves the job's clock: a hang may
# now show. One pass per job in this window is enough; a pass reads only what
# is new, but one that had to rebuild its state reads the whole history, so
# passes are also spaced to keep them under a quarter of a worker's time.
DEBOUNCE_S = 5
MAX_SHARE = 0.25


def on_events_stored(sender, job_ids, kinds, **kwargs):
    for job_id in job_ids:
        if kinds.get(job_id, set()) & EPISODE_KINDS:
            open_reported.delay(job_id)
            detect_job.delay(job_id)
        else:
            last_pass_s = cache.get(f"incident-pass-s:{job_id}") or 0.0
            wait = max(DEBOUNCE_S, last_pass_s / MAX_SHARE)
            if cache.add(f"incident-detect:{job_id}", 1, timeout=wait):
                detect_job.apply_async((job_id,), countdown=wait)


def on_ledger_refreshed(sender, job, ledger, steps, **kwargs):
    """The ledger was recomputed (in the refresh task): the job's incidents' times
    and lost GPU-hours follow it from the same reading of the history."""
    if Incident.objects.filter(job=job).exclude(attempt=None).exists():
        incidents_update_figures(job=job, ledger=ledger, steps=steps)
