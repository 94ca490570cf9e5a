"""The per-rank scores of complete rank windows: the one rule the straggler detector
and the API's ranks endpoint (incidents.selectors.job_rank_scores) both use."""

from __future__ import annotations

import numpy as np

SLOW = 0.75  # a rank scoring below this is slow (NVIDIA's resiliency extension's threshold)
PEER_QUANTILE = 0.25  # the ranks' reference: as fast as a quarter of them, or faster


def rank_scores(compute: np.ndarray, best: np.ndarray):
    """(peer, own, slow) per window (row) and rank (column) of `compute`, the ranks'
    compute times, given `best`, each rank's best compute time so far.

    `peer` = a typical fast rank's compute time in the window (the lower quartile:
    NVRx takes the fastest rank, the median would let a slow half hide itself, as one
    node of two does) / this rank's;
    `own` = (its best / this one), relative to that of a typical rank that kept its
    pace (the upper quartile), which catches a rank that degrades alone while a
    slowdown of every rank scores 1.
    A rank is slow when either score is below SLOW. A rank that reported no
    compute time scores 1 (it tells nothing of its speed)."""
    working = compute > 0
    safe = np.where(working, compute, 1.0)
    typical = np.percentile(compute, 100 * PEER_QUANTILE, axis=1, keepdims=True)
    peer = np.where(working, typical / safe, 1.0)
    degradation = np.where(working, best / safe, 1.0)
    kept = np.percentile(degradation, 100 * (1 - PEER_QUANTILE), axis=1, keepdims=True)
    own = degradation / np.where(kept != 0, kept, 1.0)
    return peer, own, (peer < SLOW) | (own < SLOW)
