"""Reads of the jobs app: jobs with their summary, and the cached ledger."""

from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery

from jobs.accounting import Ledger, job_ledger
from jobs.models import Attempt, Checkpoint, LedgerSnapshot, TrainingJob


def job_list(*, cluster: str | None = None, status: str | None = None) -> QuerySet[TrainingJob]:
    latest_attempt = Attempt.objects.filter(job=OuterRef("pk")).order_by("-number")
    last_durable = Checkpoint.objects.filter(job=OuterRef("pk"), durable=True).order_by(
        "-saved_at", "-step"
    )
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


def job_attempts(*, job: TrainingJob) -> QuerySet[Attempt]:
    return job.attempts.prefetch_related(Prefetch("nodes")).order_by("number")


def job_checkpoints(*, job: TrainingJob) -> QuerySet[Checkpoint]:
    return job.checkpoints.order_by("saved_at", "step", "attempt")


def job_goodput(
    *,
    job: TrainingJob,
    start: float | None = None,
    end: float | None = None,
    allow_stale: bool = False,
) -> dict:
    """The ledger's figures; the cumulative one is cached per job revision.

    Lists pass `allow_stale`: they show the last snapshot (ingest has a
    refresh on its way, see services) rather than recompute every job.
    """
    if start is not None or end is not None:
        return job_ledger(job, start=start, end=end).as_dict()
    snapshot = getattr(job, "ledger", None) if _has_cached_ledger(job) else None
    if snapshot is not None and (allow_stale or snapshot.revision == job.revision):
        return snapshot.figures
    figures = job_ledger(job).as_dict()
    try:
        with transaction.atomic():
            LedgerSnapshot.objects.update_or_create(
                job=job, defaults={"revision": job.revision, "figures": figures}
            )
    except IntegrityError:
        pass  # a concurrent reader stored the same figures first
    return figures


def _has_cached_ledger(job: TrainingJob) -> bool:
    try:
        job.ledger  # noqa: B018
    except LedgerSnapshot.DoesNotExist:
        return False
    return True


__all__ = [
    "Ledger",
    "attach_summaries",
    "job_attempts",
    "job_checkpoints",
    "job_goodput",
    "job_list",
]
