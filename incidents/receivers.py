"""How incidents hear of new events: the jobs app's `events_stored` signal."""

from django.core.cache import cache

from incidents.tasks import detect_job, open_reported

# Kinds that can open or change a fault episode: detect at once.
EPISODE_KINDS = frozenset({"fault", "attempt_ended", "attempt_started"})
# Anything else (steps, heartbeats, windows) moves the job's clock: a hang may
# now show, figures may move. One pass per job in this window is enough; for a
# long job, whose full pass reads its whole history, passes are spaced to keep
# them under a quarter of a worker's time.
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
