"""Stragglers: nodes whose ranks compute slower than their peers, or than their own best.

Per complete window (every rank of the launch reported it), each rank gets
two scores: `peer` = the median compute time of all ranks / this rank's
(NVIDIA's resiliency extension calls a rank slow below 0.75), and `own` =
(its best compute time so far / this one) relative to the median rank's same
ratio, which catches a rank that degrades alone while a slowdown of every rank
scores 1. A node is slow in a window when most of its ranks are; it is a
straggler after `straggler.windows` slow windows in a row. The finding stays
tied to the node across launches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jobs.columns import FLOAT, INT, load_columns
from jobs.models import Attempt, Node, TrainingJob

SLOW = 0.75


@dataclass
class Straggler:
    node: str
    first_ts: float  # the end of the first window of its first slow streak
    detected_ts: float  # the end of the window that completed the streak
    first_step: int
    ranks: set[int] = field(default_factory=set)
    windows: int = 0  # slow windows in streaks
    worst_peer: float = 1.0
    worst_own: float = 1.0
    excess_gpu_s: float = 0.0  # step time above the job's baseline, x world size
    evidence: list[str] = field(default_factory=list)


_COLUMNS = [
    ("attempt", INT),
    ("first_step", INT),
    ("last_step", INT),
    ("rank", INT),
    ("COALESCE(node_id, -1)", INT),
    ("ts", FLOAT),
    ("compute_s", FLOAT),
    ("step_s", FLOAT),
]


def _load(job_id: int):
    """(attempt, first_step, last_step, rank, node id, ts, compute_s, step_s) arrays."""
    arrays = load_columns("jobs_rankwindow", _COLUMNS, "job_id = %s", [job_id])
    return arrays if len(arrays[0]) else None


def find_stragglers(job: TrainingJob, *, streak: int) -> list[Straggler]:
    data = _load(job.id)
    if data is None:
        return []
    attempt, first, last, rank, node_id, ts, compute, step_s = data
    worlds = dict(Attempt.objects.filter(job=job).values_list("number", "world_size"))
    names = dict(Node.objects.filter(cluster_id=job.cluster_id).values_list("id", "name"))
    found: dict[str, Straggler] = {}
    slow_step_s: list[tuple[str, int, float, int]] = []  # node, world, step_s, steps
    normal_step_s: list[float] = []  # the baseline: windows with no straggler

    order = np.lexsort((rank, first, attempt))
    attempt, first, last, rank, node_id, ts, compute, step_s = (
        a[order] for a in (attempt, first, last, rank, node_id, ts, compute, step_s)
    )
    for number in np.unique(attempt).tolist():
        world = worlds.get(number) or int(rank[attempt == number].max()) + 1
        sel = np.flatnonzero(attempt == number)
        starts, counts = np.unique(first[sel], return_counts=True)
        complete = set(starts[counts == world].tolist())
        rows = sel[np.isin(first[sel], list(complete))]
        if not len(rows):
            continue
        # One row per window, one column per rank (sorted by first_step, rank).
        shape = (len(rows) // world, world)
        if shape[0] * world != len(rows):
            continue
        c = compute[rows].reshape(shape)
        nodes = node_id[rows].reshape(shape)
        ranks = rank[rows].reshape(shape)
        window_first = first[rows].reshape(shape)[:, 0]
        window_last = last[rows].reshape(shape)[:, 0]
        window_ts = ts[rows].reshape(shape).max(axis=1)
        window_step = step_s[rows].reshape(shape).mean(axis=1)
        straggling = np.zeros(shape[0], dtype=bool)

        safe = np.where(c > 0, c, np.nan)
        peer = np.median(c, axis=1)[:, None] / safe
        best = np.minimum.accumulate(c, axis=0)
        own_ratio = best / safe
        own = own_ratio / np.median(own_ratio, axis=1)[:, None]
        slow_rank = (np.nan_to_num(peer, nan=1.0) < SLOW) | (np.nan_to_num(own, nan=1.0) < SLOW)

        for nid in np.unique(nodes).tolist():
            on_node = nodes == nid
            n_slow = (slow_rank & on_node).sum(axis=1)
            n_all = on_node.sum(axis=1)
            slow_window = (n_all > 0) & (n_slow * 2 > n_all)
            name = names.get(nid, f"node-{nid}")
            # Runs of slow windows, found with numpy: starts and ends of each run.
            edges = np.diff(np.concatenate(([0], slow_window.astype(np.int8), [0])))
            run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
            for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
                if b - a < streak:
                    continue
                s = found.get(name)
                if s is None:
                    s = found[name] = Straggler(
                        node=name,
                        first_ts=float(window_ts[a]),
                        detected_ts=float(window_ts[a + streak - 1]),
                        first_step=int(window_first[a]),
                    )
                straggling[a:b] = True
                mask = on_node[a:b] & slow_rank[a:b]
                s.ranks.update(int(r) for r in np.unique(ranks[a:b][mask]))
                s.worst_peer = min(s.worst_peer, float(np.nanmin(peer[a:b][on_node[a:b]])))
                s.worst_own = min(s.worst_own, float(np.nanmin(own[a:b][on_node[a:b]])))
                s.windows += b - a
                steps = window_last[a:b] - window_first[a:b] + 1
                slow_step_s.extend(
                    (name, world, float(x), int(n))
                    for x, n in zip(window_step[a:b], steps, strict=True)
                )
                s.evidence.extend(f"window:{number}:{int(f)}" for f in window_first[a:b])
        normal_step_s.extend(window_step[~straggling].tolist())
    if not found:
        return []
    baseline = float(np.median(normal_step_s)) if normal_step_s else 0.0
    for name, world, step, steps in slow_step_s:
        found[name].excess_gpu_s += max(0.0, step - baseline) * steps * world
    return sorted(found.values(), key=lambda s: s.first_ts)
