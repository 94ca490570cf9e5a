"""How incidents hear of the jobs app: new events, a job's ledger recomputed, and a
maintenance window declared or cancelled."""

from django.conf import settings

from common.outbox import Work, outbox_enqueue
from incidents.models import DetectorState, Incident
from incidents.services import incidents_update_figures
from jobs.models import TrainingJob

OPEN_REPORTED = "incidents.open_reported"
DETECT_JOB = "incidents.detect_job"
# Kinds that can open or change a fault episode: detect at once.
EPISODE_KINDS = frozenset({"fault", "attempt_ended", "attempt_started"})
# Anything else (steps, heartbeats, windows) moves the job's clock: a hang may
# now show. One pass per job in this window is enough (a pass already waiting in
# the outbox takes the later requests in); a pass reads only what is new, but one
# that had to rebuild its state reads the whole history, so passes are also spaced
# to keep them under a quarter of a worker's time.
DEBOUNCE_S = settings.REBOUND_DETECT_DEBOUNCE_S
MAX_SHARE = 0.25


def on_events_stored(sender, job_ids, kinds, **kwargs):
    """Ask for the passes through the outbox: in the sender's transaction, so they are
    not lost if the broker is away (see common.outbox)."""
    works = []
    for job_id in job_ids:
        key = str(job_id)
        if kinds.get(job_id, set()) & EPISODE_KINDS:
            works += [Work(OPEN_REPORTED, key, [job_id]), Work(DETECT_JOB, key, [job_id])]
        else:
            last_pass_s = (
                DetectorState.objects.filter(job_id=job_id)
                .values_list("last_pass_s", flat=True)
                .first()
            ) or 0.0
            wait = max(DEBOUNCE_S, last_pass_s / MAX_SHARE)
            works.append(Work(DETECT_JOB, key, [job_id], delay_s=wait))
    outbox_enqueue(works)


def on_maintenance_changed(sender, window_id, cluster_id, start, end, **kwargs):
    """What a window covers is planned now, or no longer: a full pass of each job that
    ran on the cluster during it judges its incidents again (incidents.detectors.planned
    recomputes their cause from their signals and the windows in force)."""
    jobs = TrainingJob.objects.filter(
        cluster_id=cluster_id, first_event_ts__lte=end, last_event_ts__gte=start
    ).values_list("pk", flat=True)
    outbox_enqueue([Work(DETECT_JOB, str(pk), [pk]) for pk in jobs])


def on_ledger_refreshed(sender, job, ledger, steps, **kwargs):
    """The ledger was recomputed (in the refresh task): the job's incidents' times
    and lost GPU-hours follow it from the same reading of the history."""
    if Incident.objects.filter(job=job).exclude(attempt=None).exists():
        incidents_update_figures(job=job, ledger=ledger, steps=steps)
