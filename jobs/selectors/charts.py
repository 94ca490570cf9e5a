"""Reads behind the job page's checkpoint and rank charts: bounded, whatever the number
of checkpoints or rank windows."""

from django.db.models import Count, F, Max, Min, Sum
from django.db.models.functions import Coalesce

from jobs.models import Checkpoint, RankWindow, TrainingJob


def job_checkpoint_groups(*, job: TrainingJob, step_width: int) -> list[dict]:
    """The job's checkpoints grouped by (launch, step // step_width, durable): how many,
    the first and latest step, the latest time, the finished saves with their first
    and last time, the blocking seconds reported and by how many saves. Bounded by the
    step buckets and launches, whatever the number of checkpoints. One query (the job
    page reads it through jobs.services.checkpoint_groups_ensure, cached per job revision)."""
    return list(
        Checkpoint.objects.filter(job=job)
        .annotate(bucket=F("step") / step_width)
        .values("attempt", "bucket", "durable")
        .annotate(
            n=Count("id"),
            first_step=Min("step"),
            step=Max("step"),
            at=Max(Coalesce("saved_at", "save_started_at")),
            saved=Count("saved_at"),
            first_saved_at=Min("saved_at"),
            last_saved_at=Max("saved_at"),
            blocking_sum=Sum("blocking_s"),
            blocking_n=Count("blocking_s"),
        )
        .order_by("attempt", "bucket", "durable")
    )


def job_rank_heatmap(
    *,
    job: TrainingJob,
    attempt: int,
    world_size: int | None = None,
    max_windows: int = 200,
    max_cells: int = 20_000,
) -> dict:
    """Compute seconds per (rank, window) of one launch, for its latest windows: at most
    `max_windows` windows, fewer when there are many ranks (about `max_cells` cells,
    the first 1,024 ranks). Four queries at most, each an index range of (job, attempt,
    rank, first_step) (the job page reads it through jobs.services.rank_heatmap_ensure,
    cached per job revision)."""
    windows = RankWindow.objects.filter(job=job, attempt=attempt)
    empty = {"attempt": attempt, "ranks": [], "first_steps": [], "cells": [], "rank_count": 0}
    first_rank = windows.order_by("rank", "first_step").values_list("rank", flat=True).first()
    if first_rank is None:
        return empty
    if world_size:
        ranks = list(range(world_size))
    else:
        last = windows.order_by("-rank", "-first_step").values_list("rank", flat=True).first()
        ranks = list(range(first_rank, last + 1))
    rank_count = len(ranks)
    ranks = ranks[:1024]
    n = max(10, min(max_windows, max_cells // len(ranks)))
    # The n-th latest window of the first rank: one backward index range.
    edge = (
        windows.filter(rank=first_rank)
        .order_by("-first_step")
        .values_list("first_step", flat=True)[n - 1 : n]
    )
    cells = windows.filter(rank__in=ranks)
    if edge:
        cells = cells.filter(first_step__gte=edge[0])
    rows = list(
        cells.order_by("rank", "first_step").values_list(
            "rank", "first_step", "last_step", "compute_s", "node__name"
        )[: 2 * max(max_cells, 10 * len(ranks))]
    )
    first_steps = sorted({r[1] for r in rows})[-n:]
    return {
        "attempt": attempt,
        "ranks": sorted({r[0] for r in rows}),
        "first_steps": first_steps,
        "cells": [r for r in rows if r[1] >= first_steps[0]] if first_steps else [],
        "rank_count": rank_count,
    }
