"""The per-rank scores of complete rank windows: the one rule the straggler detector
and the API's ranks endpoint (incidents.selectors.job_rank_scores) both use."""

from __future__ import annotations

import numpy as np

SLOW = 0.75  # a rank scoring below this is slow (NVIDIA's resiliency extension's threshold)


def rank_scores(compute: np.ndarray, best: np.ndarray):
    """(peer, own, slow) per window (row) and rank (column) of `compute`, the ranks'
    compute times, given `best`, each rank's best compute time so far.

    `peer` = the median compute time of all ranks in the window / this rank's;
    `own` = (its best / this one), relative to the median rank's same ratio, which
    catches a rank that degrades alone while a slowdown of every rank scores 1.
    A rank is slow when either score is below SLOW. A rank that reported no
    compute time scores 1 (it tells nothing of its speed)."""
    working = compute > 0
    safe = np.where(working, compute, 1.0)
    peer = np.where(working, np.median(compute, axis=1, keepdims=True) / safe, 1.0)
    degradation = np.where(working, best / safe, 1.0)
    mid = np.median(degradation, axis=1, keepdims=True)
    own = degradation / np.where(mid != 0, mid, 1.0)
    return peer, own, (peer < SLOW) | (own < SLOW)
