"""Reads behind the job page's checkpoint and rank charts: bounded, whatever the number
of checkpoints, ranks or rank windows."""

import math

import numpy as np
from django.db.models import Count, F, Max, Min, Sum
from django.db.models.functions import Coalesce

from jobs.models import Checkpoint, Node, RankWindow, TrainingJob


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
    max_rows: int = 256,
    max_read: int = 160_000,
) -> dict:
    """Compute seconds per row and window of one launch, for its latest windows, with
    each window's median rank, so that a chart can colour each cell by its ratio to it.

    A launch of at most `max_rows` ranks has a row per rank (`by` = "rank"). A larger
    one has a row per node holding, per window, the node's slowest rank (its seconds in
    `compute`, its number in `ranks`): every rank is accounted for, and a slow node
    stands out whatever its rank numbers. When even the nodes outnumber `max_rows`,
    the rows are the nodes whose slowest window is slowest (`left_out` nodes are not
    shown; `left_out_peak` is the highest ratio among them). At most `max_windows`
    windows, fewer when the rows times windows pass `max_cells` or the cells read pass
    `max_read`; never fewer than 10. Rows are in the order of their lowest rank.

    Five queries at most, each an index range of (job, attempt, rank, first_step) or of
    the node ids shown (the job page reads it through jobs.services.rank_heatmap_ensure,
    cached per job revision)."""
    windows = RankWindow.objects.filter(job=job, attempt=attempt)
    heatmap = {
        "attempt": attempt,
        "by": "rank",
        "rows": [],
        "first_steps": [],
        "compute": [],
        "ranks": None,
        "median": [],
        "rank_count": 0,
        "node_count": 0,
        "left_out": 0,
        "left_out_peak": None,
    }
    first_rank = windows.order_by("rank", "first_step").values_list("rank", flat=True).first()
    if first_rank is None:
        return heatmap
    if world_size:
        rank_count = world_size
    else:
        last = windows.order_by("-rank", "-first_step").values_list("rank", flat=True).first()
        rank_count = last - first_rank + 1
    by_rank = rank_count <= max_rows
    rows_max = rank_count if by_rank else max_rows
    n = max(10, min(max_windows, max_cells // rows_max, max_read // rank_count))
    # The n-th latest window of the first rank: one backward index range.
    edge = (
        windows.filter(rank=first_rank)
        .order_by("-first_step")
        .values_list("first_step", flat=True)[n - 1 : n]
    )
    cells = windows.filter(first_step__gte=edge[0]) if edge else windows
    read = list(
        cells.values_list("rank", "first_step", "compute_s", "node_id")[: 2 * n * rank_count]
    )
    if not read:
        return heatmap
    # One conversion of every cell (a node id of None becomes NaN).
    table = np.array(read, dtype=np.float64)
    rank = table[:, 0].astype(np.int64)
    step = table[:, 1].astype(np.int64)
    compute = table[:, 2]
    first_steps = np.unique(step)[-n:].tolist()
    col = np.searchsorted(first_steps, step)
    # Cells of a window older than those kept, or no usable time, are left out.
    keep = (step >= first_steps[0]) & np.isfinite(compute)
    # The row of each cell: its rank, or its node (a rank with no node is a row alone).
    node_key = np.where(np.isnan(table[:, 3]), -1 - rank, table[:, 3]).astype(np.int64)
    rank, col, compute, node_key = rank[keep], col[keep], compute[keep], node_key[keep]
    median = [
        float(np.median(compute[col == j])) if (col == j).any() else None
        for j in range(len(first_steps))
    ]
    key = rank if by_rank else node_key
    # Per (row, window): its slowest cell (sorted by row, window, then seconds: the last).
    order = np.lexsort((compute, col, key))
    key, col, compute, rank = key[order], col[order], compute[order], rank[order]
    last = np.ones(len(key), dtype=bool)
    last[:-1] = (key[1:] != key[:-1]) | (col[1:] != col[:-1])
    key, col, compute, rank = key[last], col[last], compute[last], rank[last]

    keys, row = np.unique(key, return_inverse=True)
    grid = np.full((len(keys), len(first_steps)), np.nan)
    grid[row, col] = compute
    slowest = np.full((len(keys), len(first_steps)), -1, dtype=np.int64)
    slowest[row, col] = rank
    lowest_rank = np.full(len(keys), np.iinfo(np.int64).max)
    np.minimum.at(lowest_rank, row, rank)
    medians = np.array([np.nan if m is None else m for m in median])
    with np.errstate(divide="ignore", invalid="ignore"):
        peak = np.nanmax(np.where(medians > 0, grid / medians, np.nan), axis=1, initial=0.0)
    shown = np.arange(len(keys))
    if len(keys) > max_rows:
        by_peak = np.lexsort((lowest_rank, -peak))
        shown, hidden = by_peak[:max_rows], by_peak[max_rows:]
        heatmap["left_out"] = len(hidden)
        heatmap["left_out_peak"] = round(float(peak[hidden].max()), 4)
    shown = shown[np.argsort(lowest_rank[shown], kind="stable")]

    # A by-rank row's node: the one its cells name (a rank stays on its node in a launch).
    rank_node = dict(zip(rank.tolist(), node_key.tolist(), strict=True)) if by_rank else {}
    node_of = [int(rank_node.get(int(keys[i]), -1)) if by_rank else int(keys[i]) for i in shown]
    names = dict(
        Node.objects.filter(pk__in=[k for k in node_of if k >= 0]).values_list("pk", "name")
    )
    rows = []
    for i, k in zip(shown, node_of, strict=True):
        name = names.get(k, "node ?")
        if by_rank:
            rows.append({"label": f"rank {int(keys[i])} \u00b7 {name}", "rank": int(keys[i])})
        else:
            latest = int(slowest[i][slowest[i] >= 0][-1])
            rows.append({"label": f"{name} (slowest rank {latest})", "rank": latest})
    heatmap.update(
        by="rank" if by_rank else "node",
        rows=rows,
        first_steps=first_steps,
        compute=[[_seconds(v) for v in grid[i]] for i in shown],
        ranks=None if by_rank else [[int(r) for r in slowest[i]] for i in shown],
        median=[None if m is None else round(m, 6) for m in median],
        rank_count=rank_count,
        node_count=len(np.unique(node_key)),
    )
    return heatmap


def _seconds(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 6)
