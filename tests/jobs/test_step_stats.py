"""jobs.step_stats: the slow-step rule and the checkpoint cadence, on hand-made
selector output (no database)."""

from datetime import UTC, datetime, timedelta

import numpy as np

from jobs.selectors import BUCKET_COLUMNS, StepBuckets
from jobs.step_stats import (
    ROLLING_BUCKETS,
    SLOW_FACTOR,
    job_checkpoint_cadence,
    job_step_times,
    rolling_median,
)


def buckets(step_times: list[float], *, reported: bool = True) -> StepBuckets:
    """One launch, one step a bucket, each step taking `step_times[k]` seconds."""
    rows = np.full((len(step_times), len(BUCKET_COLUMNS)), np.nan)
    col = {name: i for i, name in enumerate(BUCKET_COLUMNS)}
    ts = np.cumsum(step_times)
    for k, st in enumerate(step_times):
        values = {
            "attempt": 1,
            "sb": k,
            "tb": k,
            "n": 1,
            "step_lo": k,
            "step_hi": k,
            "ts_lo": ts[k],
            "ts_hi": ts[k],
            "st_max": st if reported else np.nan,
            "st_sum": st if reported else 0.0,
            "st_n": 1 if reported else 0,
        }
        for name, value in values.items():
            rows[k, col[name]] = value
    return StepBuckets(1, 60.0, rows)


def test_a_step_over_the_factor_times_the_rolling_median_is_slow():
    times = [1.0] * 40
    times[10] = SLOW_FACTOR * 1.0 + 0.5  # slow
    times[30] = SLOW_FACTOR * 1.0 - 0.1  # under the factor: not slow
    times[20] = 10.0  # the slowest against its median: listed first
    got = job_step_times(buckets=buckets(times))
    assert got.source == "reported"
    assert got.slow.tolist() == [20, 10]
    assert np.allclose(got.rolling, 1.0)
    assert got.slowest[10] == times[10]


def test_without_reported_step_times_nothing_is_slow():
    times = [1.0] * 30
    times[5] = 50.0
    got = job_step_times(buckets=buckets(times, reported=False))
    assert got.source == "between reports"
    assert got.slow.size == 0


def test_the_rolling_median_skips_missing_values():
    values = np.array([1.0, np.nan, 3.0, 100.0, 5.0])
    assert rolling_median(values, 3).tolist() == [1.0, 2.0, 51.5, 5.0, 52.5]
    assert ROLLING_BUCKETS % 2 == 1  # centred on its bucket


def test_the_checkpoint_cadence_never_spans_two_launches():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def group(attempt, saved, first_s, last_s, blocking_sum, blocking_n):
        return {
            "attempt": attempt,
            "saved": saved,
            "first_saved_at": t0 + timedelta(seconds=first_s),
            "last_saved_at": t0 + timedelta(seconds=last_s),
            "blocking_sum": blocking_sum,
            "blocking_n": blocking_n,
        }

    cadence = job_checkpoint_cadence(
        checkpoint_groups=[
            group(1, 2, 0, 600, 8.0, 2),
            group(1, 1, 1200, 1200, None, 0),  # launch 1: 3 saves over 1,200 s
            group(2, 1, 9000, 9000, 4.0, 1),  # launch 2: one save, no interval
            group(3, 0, 0, 0, None, 0),  # started, never finished
        ]
    )
    assert cadence.saves == 4
    assert cadence.save_gaps == 2
    assert cadence.save_span_s == 1200.0
    assert cadence.blocking_sum_s == 12.0
    assert cadence.blocking_n == 3
