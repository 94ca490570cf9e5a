"""Reads of a job's rows: its launches and checkpoints (the latest of each asked for
in one place), the job list with its summaries, and the status a job's latest launch
gives it."""

from datetime import datetime

from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce

from jobs.models import Attempt, Checkpoint, TrainingJob
from jobs.selectors.activity import jobs_silent_q


def attempts_latest_first(job) -> QuerySet[Attempt]:
    """A job's launches, newest first; `job` is a job, its id or an `OuterRef` (for a
    subquery per job of an outer query)."""
    return Attempt.objects.filter(job=job).order_by("-number")


def job_latest_attempt(job, *, started: bool = False) -> Attempt | None:
    """The job's newest launch; with `started`, its newest launch that has started,
    falling back to the newest at all."""
    attempts = attempts_latest_first(job)
    if started:
        return attempts.exclude(started_at=None).first() or attempts.first()
    return attempts.first()


def checkpoints_durable_latest_first(
    job, *, saved_by=None, attempt: int | None = None
) -> QuerySet[Checkpoint]:
    """A job's durable checkpoints, newest first (by save time, then step); `job` as in
    `attempts_latest_first`; `saved_by` keeps those saved at or before a time,
    `attempt` those of one launch."""
    qs = Checkpoint.objects.filter(job=job, durable=True).exclude(saved_at=None)
    if saved_by is not None:
        qs = qs.filter(saved_at__lte=saved_by)
    if attempt is not None:
        qs = qs.filter(attempt=attempt)
    return qs.order_by("-saved_at", "-step")


def checkpoints_durable_latest_by_launch(job) -> dict[int, int]:
    """Each launch's newest durable checkpoint step (as `checkpoints_durable_latest_first`
    orders them), for every launch at once: one query, not one per launch."""
    latest: dict[int, int] = {}
    for attempt, step in checkpoints_durable_latest_first(job).values_list("attempt", "step"):
        latest.setdefault(attempt, step)
    return latest


def job_latest_durable_checkpoint(
    job, *, saved_by=None, attempt: int | None = None
) -> Checkpoint | None:
    """The checkpoint a relaunch of the job would restore (see
    `checkpoints_durable_latest_first`)."""
    return checkpoints_durable_latest_first(job, saved_by=saved_by, attempt=attempt).first()


def job_list(
    *,
    cluster: str | None = None,
    status: str | None = None,
    silent: bool | None = None,
    now: datetime | None = None,
) -> QuerySet[TrainingJob]:
    """Jobs, newest first, with the ids of their latest launch and latest durable
    checkpoint (see `attach_summaries`); `silent` keeps the jobs `job_activity` shows as
    silent (True) or all the others (False), as of `now`."""
    latest_attempt = attempts_latest_first(OuterRef("pk"))
    last_durable = checkpoints_durable_latest_first(OuterRef("pk"))
    qs = (
        TrainingJob.objects.select_related("cluster", "ledger")
        .annotate(
            current_attempt_id=Subquery(latest_attempt.values("id")[:1]),
            last_durable_checkpoint_id=Subquery(last_durable.values("id")[:1]),
        )
        .order_by("-created_at", "-id")
    )
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if status:
        qs = qs.filter(status=status)
    if silent is not None:
        q = jobs_silent_q(now=now)
        qs = qs.filter(q) if silent else qs.exclude(q)
    return qs


def attach_summaries(jobs: list[TrainingJob]) -> None:
    """Set `current_attempt` and `last_durable_checkpoint` on each job in two queries."""
    attempts = Attempt.objects.in_bulk([j.current_attempt_id for j in jobs if j.current_attempt_id])
    checkpoints = Checkpoint.objects.in_bulk(
        [j.last_durable_checkpoint_id for j in jobs if j.last_durable_checkpoint_id]
    )
    for j in jobs:
        j.current_attempt = attempts.get(j.current_attempt_id)
        j.last_durable_checkpoint = checkpoints.get(j.last_durable_checkpoint_id)


def with_effective_end(qs: QuerySet[Attempt]) -> QuerySet[Attempt]:
    """Launches annotated with when they ended as the accounting has it: `ended_at_effective`
    is the launch's `attempt_ended`, or else the start of the next launch (a launch that
    died without a word is over once the next one starts), and `end_inferred` says it
    was the latter. The stored row is left as it was received."""
    next_start = Subquery(
        Attempt.objects.filter(
            job=OuterRef("job"), number__gt=OuterRef("number"), started_at__isnull=False
        )
        .order_by("number")
        .values("started_at")[:1]
    )
    return qs.annotate(next_started_at=next_start).annotate(
        ended_at_effective=Coalesce("ended_at", "next_started_at"),
        end_inferred=ExpressionWrapper(
            Q(ended_at__isnull=True, next_started_at__isnull=False),
            output_field=BooleanField(),
        ),
    )


def job_attempts(*, job: TrainingJob) -> QuerySet[Attempt]:
    """A job's launches, oldest first, with their effective ends (`with_effective_end`)."""
    return with_effective_end(job.attempts.prefetch_related(Prefetch("nodes"))).order_by("number")


def job_checkpoints(*, job: TrainingJob) -> QuerySet[Checkpoint]:
    return job.checkpoints.order_by("saved_at", "step", "attempt")


def job_status(job: TrainingJob, attempts: list[Attempt] | None = None) -> str:
    """The status the job's latest launch gives it; `attempts`, when given, are all of
    the job's attempts as stored (saves reading them again)."""
    if attempts is None:
        latest = job_latest_attempt(job, started=True)
    else:
        started = [a for a in attempts if a.started_at is not None]
        latest = max(started or attempts, key=lambda a: a.number, default=None)
    S = TrainingJob.Status
    reason = latest.end_reason if latest else ""
    if job.finished_at is not None:
        return S.COMPLETED if reason in ("", Attempt.EndReason.COMPLETED) else S.FAILED
    if latest is None:
        return S.PENDING
    if latest.ended_at is None:
        return S.RUNNING
    return S.COMPLETED if reason == Attempt.EndReason.COMPLETED else S.INTERRUPTED


def job_launches(*, job: TrainingJob, limit: int = 200) -> dict:
    """The latest `limit` launches (oldest first) as dicts, with their effective ends
    (`with_effective_end`), and how many there are. Two queries at most."""
    qs = with_effective_end(attempts_latest_first(job))
    fields = ("id", "number", "world_size", "started_at", "ready_at", "end_reason")
    rows = list(qs.values(*fields, "ended_at_effective", "end_inferred")[:limit])
    for row in rows:
        row["ended_at"] = row.pop("ended_at_effective")
    rows.reverse()
    total = len(rows) if len(rows) < limit else qs.count()
    return {"rows": rows, "total": total}


def launch_node_names(*, attempt_ids: list[int], per_launch: int = 8) -> dict[int, dict]:
    """Per launch id: up to `per_launch` node names and how many nodes it had. One query."""
    through = Attempt.nodes.through
    out: dict[int, dict] = {a: {"names": [], "count": 0} for a in attempt_ids}
    for attempt_id, name in (
        through.objects.filter(attempt_id__in=attempt_ids)
        .order_by("attempt_id", "node__name")
        .values_list("attempt_id", "node__name")
    ):
        entry = out[attempt_id]
        entry["count"] += 1
        if len(entry["names"]) < per_launch:
            entry["names"].append(name)
    return out


def job_recent_checkpoints(*, job: TrainingJob, limit: int = 50) -> list[Checkpoint]:
    """The latest `limit` checkpoints: of the latest launches, the highest steps first
    (the unique index on (job, attempt, step) read backwards)."""
    return list(Checkpoint.objects.filter(job=job).order_by("-attempt", "-step")[:limit])
