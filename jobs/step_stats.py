"""Read-only figures derived from a job's step buckets and checkpoints: the slow-step
rule (a step bucket whose slowest step took over SLOW_FACTOR x the rolling median of
the bucket means is slow) and the checkpoint cadence (how often a job saved, and what
a save blocked). The job page charts them and the what-if panel reads them; neither
decides what they mean.

Inputs are the selectors' outputs (`jobs.selectors.job_step_buckets`,
`jobs.selectors.job_checkpoint_groups`): nothing here queries.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from jobs.selectors import StepBuckets

SLOW_FACTOR = 2.0  # a step slower than this x the rolling median is slow
ROLLING_BUCKETS = 21  # the rolling median's window, in step buckets


@dataclass(frozen=True)
class StepTimes:
    """Step time per step bucket (arrays aligned, one value per bucket, step order).

    `means` is the mean reported step time (`source` "reported"), or when no step
    time was reported the mean time between step reports within a launch ("between
    reports"); `slowest` is the slowest reported step (NaN without reports);
    `rolling` the rolling median of `means` over ROLLING_BUCKETS buckets; `slow`
    the indices of the slow buckets, the slowest against its median first."""

    step_lo: np.ndarray
    step_hi: np.ndarray
    means: np.ndarray
    slowest: np.ndarray
    rolling: np.ndarray
    slow: np.ndarray
    source: str


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """The median of each value's centred window (NaN skipped; NaN where a window
    holds no value)."""
    if not len(values):
        return values
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), values, np.full(half, np.nan)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window with no value
        return np.nanmedian(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def job_step_times(*, buckets: StepBuckets) -> StepTimes:
    """The step time of each step bucket (time buckets and launches merged) and the
    slow buckets: those whose slowest step took over SLOW_FACTOR x the rolling median
    of the bucket means. Only reported step times can be slow: the time between
    reports includes saves and restarts."""
    b = buckets
    sb, inverse = np.unique(b.col("sb"), return_inverse=True)
    inverse = inverse.ravel()

    def total(values):
        return np.bincount(inverse, weights=np.nan_to_num(values), minlength=len(sb))

    def extreme(values, how):
        acc = np.full(len(sb), np.inf if how is np.fmin else -np.inf)
        how.at(acc, inverse, values)
        acc[np.isinf(acc)] = np.nan
        return acc

    lo, hi = extreme(b.col("step_lo"), np.fmin), extreme(b.col("step_hi"), np.fmax)
    st_n = total(b.col("st_n"))
    reported = bool(st_n.any())
    with np.errstate(invalid="ignore", divide="ignore"):
        if reported:
            means = np.where(st_n > 0, total(b.col("st_sum")) / st_n, np.nan)
            source = "reported"
        else:  # the time between step reports, within a launch
            several = b.col("n") > 1
            spans = total(np.where(several, b.col("ts_hi") - b.col("ts_lo"), 0.0))
            gaps = total(np.where(several, b.col("n") - 1, 0.0))
            means = np.where(gaps > 0, spans / gaps, np.nan)
            source = "between reports"
    slowest = extreme(b.col("st_max"), np.fmax)
    rolling = rolling_median(means, ROLLING_BUCKETS)
    with np.errstate(invalid="ignore"):
        slow = np.flatnonzero(slowest > SLOW_FACTOR * rolling) if reported else np.array([], int)
    slow = slow[np.argsort(-(slowest[slow] / rolling[slow]), kind="stable")]
    return StepTimes(
        step_lo=lo,
        step_hi=hi,
        means=means,
        slowest=slowest,
        rolling=rolling,
        slow=slow,
        source=source,
    )


@dataclass(frozen=True)
class CheckpointCadence:
    """How a job saved: finished saves, the gaps between consecutive saves within a
    launch and the time they span (launches with two saves or more), and the
    blocking seconds reported with how many saves reported them."""

    saves: int
    save_gaps: int
    save_span_s: float
    blocking_sum_s: float
    blocking_n: int


def job_checkpoint_cadence(*, checkpoint_groups: list[dict]) -> CheckpointCadence:
    """The cadence from `jobs.selectors.job_checkpoint_groups`: the span of each
    launch's saves (its first to its last) over the gaps between them, never across
    launches (the downtime between them is no checkpoint interval)."""
    per_launch: dict[int, list] = {}  # launch -> [saves, first save, last save]
    for g in checkpoint_groups:
        if g["saved"]:
            cur = per_launch.setdefault(g["attempt"], [0, g["first_saved_at"], g["last_saved_at"]])
            cur[0] += g["saved"]
            cur[1], cur[2] = min(cur[1], g["first_saved_at"]), max(cur[2], g["last_saved_at"])
    spread = [v for v in per_launch.values() if v[0] > 1]  # two saves or more
    return CheckpointCadence(
        saves=sum(v[0] for v in per_launch.values()),
        save_gaps=sum(n - 1 for n, _, _ in spread),
        save_span_s=sum((last - first).total_seconds() for _, first, last in spread),
        blocking_sum_s=sum(g["blocking_sum"] or 0.0 for g in checkpoint_groups),
        blocking_n=sum(g["blocking_n"] for g in checkpoint_groups),
    )
