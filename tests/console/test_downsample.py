"""console.charts.downsample: at most max_points, first and last kept, each bucket's
minimum and maximum kept (a spike and a step back survive), x order kept, short
series unchanged, and mismatched lengths refused."""

import itertools
import math
import random

import pytest

from console.charts import MAX_POINTS, downsample


def series(n, seed=0):
    rng = random.Random(seed)
    xs = list(range(n))
    ys = [math.sin(i / 50) + rng.gauss(0, 0.05) for i in range(n)]
    return xs, ys


@pytest.mark.parametrize("n", [MAX_POINTS + 1, 5_000, 20_001, 1_000_000])
@pytest.mark.parametrize("max_points", [4, 100, MAX_POINTS])
def test_at_most_max_points_with_first_and_last_in_x_order(n, max_points):
    xs, ys = series(n)
    dx, dy = downsample(xs, ys, max_points)
    assert 2 <= len(dx) <= max_points and len(dx) == len(dy)
    assert dx[0] == 0 and dx[-1] == n - 1
    assert dy[0] == ys[0] and dy[-1] == ys[-1]
    assert all(a < b for a, b in itertools.pairwise(dx))  # x order, no repeats
    assert all(dy[k] == ys[x] for k, x in enumerate(dx))  # real points, not averages


def test_each_buckets_minimum_and_maximum_survive():
    xs, ys = series(50_000, seed=3)
    max_points = 400
    dx, _ = downsample(xs, ys, max_points)
    kept = set(dx)
    size = math.ceil(len(xs) / (max_points // 4))
    for start in range(0, len(xs), size):
        chunk = range(start, min(start + size, len(xs)))
        lo = min(chunk, key=lambda i: ys[i])
        hi = max(chunk, key=lambda i: ys[i])
        assert lo in kept and hi in kept


def test_a_spike_and_a_step_back_survive():
    n = 100_000
    xs = list(range(n))
    ys = [1.0] * n
    ys[31_337] = 50.0  # a loss spike, one point
    ys[77_777] = -20.0  # a dip
    # A rollback in a step series: it climbs, drops back 5,000 steps, climbs again.
    steps = [i if i < 60_000 else i - 5_000 for i in range(n)]
    _, dy = downsample(xs, ys, 500)
    assert 50.0 in dy and -20.0 in dy
    _, sy = downsample(xs, steps, 500)
    assert any(b < a for a, b in itertools.pairwise(sy))
    assert 59_999 in sy and 55_000 in sy  # the top before the rollback, and where it resumed


def test_short_series_come_back_unchanged():
    for n in (0, 1, 3, MAX_POINTS):
        xs, ys = series(n)
        assert downsample(xs, ys) == (xs, ys)
    xs, ys = (1, 2, 3), (4.0, None, 6.0)
    assert downsample(xs, ys, 3) == ([1, 2, 3], [4.0, None, 6.0])


def test_gaps_are_not_extremes():
    xs = list(range(10_000))
    ys = [None if i % 10 == 0 else float(i % 7) for i in xs]
    _, dy = downsample(xs, ys, 100)
    assert 6.0 in dy and 0.0 in dy


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError):
        downsample([1, 2, 3], [1, 2])
    with pytest.raises(ValueError):
        downsample(list(range(5_000)), list(range(4_999)), 100)
