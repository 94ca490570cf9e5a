"""Reads of goodput: a job's ledger (its stored snapshot, or computed), and the last
hour's goodput of many running jobs at once."""

from datetime import UTC, datetime

from django.db.models import OuterRef, Q, Subquery

from jobs.accounting import job_ledger, merge_intervals, save_blocking
from jobs.models import Checkpoint, LedgerSnapshot, StepRecord, TrainingJob
from jobs.selectors.launches import attempts_latest_first


def job_goodput(
    *,
    job: TrainingJob,
    start: float | None = None,
    end: float | None = None,
    allow_stale: bool = False,
) -> dict:
    """The ledger's figures: over [start, end], computed; cumulative, the job's snapshot
    when it is current, else computed (and not stored: `jobs.services.job_goodput`
    stores it for the next reader).

    Lists pass `allow_stale`: they show the last snapshot (ingest has a
    refresh on its way, see jobs.services.follow_up) rather than recompute every job.
    """
    if start is not None or end is not None:
        return job_ledger(job, start=start, end=end).as_dict()
    snapshot = job_ledger_snapshot(job)
    if snapshot_usable(job, snapshot, allow_stale=allow_stale):
        return _with_planned(snapshot.figures)
    return job_ledger(job).as_dict()


def _with_planned(figures: dict) -> dict:
    """A snapshot stored before the planned figures existed: none were known (a window
    declared since stales the snapshot, see jobs.services.maintenance)."""
    if "planned_s" in figures:
        return figures
    return figures | {
        "planned_s": 0.0,
        "planned_gpu_seconds": 0.0,
        "goodput_excluding_planned": figures.get("goodput"),
        "gpu_goodput_excluding_planned": figures.get("gpu_goodput"),
    }


def job_ledger_snapshot(job: TrainingJob) -> LedgerSnapshot | None:
    """The job's stored ledger, if any (no query when the job was read with it)."""
    try:
        return job.ledger
    except LedgerSnapshot.DoesNotExist:
        return None


def snapshot_usable(job: TrainingJob, snapshot, *, allow_stale: bool = False) -> bool:
    """Whether `snapshot` may be shown for `job`: current, or any with `allow_stale`."""
    return snapshot is not None and (allow_stale or snapshot.revision == job.revision)


# --- goodput of the last hour, for many running jobs at once --------------------------
# The exact figure is job_ledger(job, start=last event - 1 h); it reads every step of
# the job (a 1,000,000-step job takes about a second), far too much for a page that
# lists 100 jobs. This reads instead what the current launch's rows already tell:
# its first step (an index lookup), the job's latest step and the launch's
# checkpoints saved in the hour. When the current launch was already training at
# the window's start, the launch's step time in the window, less checkpoint blocking,
# IS the ledger's productive time there (its steps are the latest execution of their
# numbers); otherwise the time before its first step counts as lost, so the figure
# is a lower bound and says so (`lower_bound`). Not counted, as the ledger would: a
# save reported without its end, and a step number run twice within the launch.


def _merged_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merge_intervals(intervals))


def jobs_recent_goodput(*, jobs: list[TrainingJob], window_s: float = 3600.0) -> dict[int, dict]:
    """Per job id: `goodput` (time) over the job's last `window_s` seconds on its own
    clock, `lower_bound`, `start` and `end` (unix seconds). Two queries for any number
    of jobs. Jobs with no events are left out."""
    jobs = [j for j in jobs if j.last_event_ts is not None]
    if not jobs:
        return {}
    latest = attempts_latest_first(OuterRef("pk"))
    first_step = StepRecord.objects.filter(job=OuterRef("pk"), attempt=OuterRef("launch"))
    rows = (
        TrainingJob.objects.filter(pk__in=[j.pk for j in jobs])
        .annotate(
            launch=Subquery(latest.values("number")[:1]),
            launch_started_at=Subquery(latest.values("started_at")[:1]),
        )
        .annotate(first_step_ts=Subquery(first_step.order_by("step").values("ts")[:1]))
        .values_list("pk", "launch", "launch_started_at", "first_step_ts")
    )
    launch = {pk: (number, started, first) for pk, number, started, first in rows}
    windows: dict[int, tuple[float, float]] = {}
    by_hour: dict[int, list[int]] = {}  # jobs by the hour their window starts in
    for j in jobs:
        end = j.last_event_ts
        start = max(end - window_s, j.first_event_ts if j.first_event_ts is not None else end)
        windows[j.pk] = (start, end)
        if launch.get(j.pk, (None,))[0] is not None:
            by_hour.setdefault(int(start // 3600), []).append(j.pk)
    # The saves that ended in the windows: one condition per hour the windows start
    # in (jobs report on about the same clock, so usually one or two), the exact
    # window and the current launch picked here.
    match = Q()
    for hour, ids in by_hour.items():
        match |= Q(job_id__in=ids, saved_at__gte=datetime.fromtimestamp(hour * 3600, tz=UTC))
    blocking: dict[int, list[tuple[float, float]]] = {}
    if match:
        for job_id, attempt, started, saved, b in Checkpoint.objects.filter(match).values_list(
            "job_id", "attempt", "save_started_at", "saved_at", "blocking_s"
        ):
            saved = saved.timestamp()
            if attempt != launch[job_id][0] or saved < windows[job_id][0]:
                continue
            span = save_blocking(started.timestamp() if started else None, saved, b)
            if span is not None:
                blocking.setdefault(job_id, []).append(span)
    out = {}
    for j in jobs:
        start, end = windows[j.pk]
        elapsed = end - start
        _, launched, first = launch.get(j.pk, (None, None, None))
        stepping = 0.0
        if first is not None and j.last_step_ts is not None and elapsed > 0:
            lo, hi = max(start, first), min(end, j.last_step_ts)
            if hi > lo:
                stepping = (hi - lo) - _merged_length(blocking.get(j.pk, []), lo, hi)
        out[j.pk] = {
            "goodput": stepping / elapsed if elapsed > 0 else None,
            # Exact when the launch was stepping at the window's start, or began
            # before it and has made no step since (a hang: nothing productive).
            "lower_bound": first > start
            if first is not None
            else launched is None or launched.timestamp() > start,
            "start": start,
            "end": end,
        }
    return out
