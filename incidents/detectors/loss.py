"""The loss detector: per launch, its first non-finite loss (NaN or infinity) and its
first spike.

A spike is a loss above the rolling median of the previous `loss.window`
losses by more than `loss.mad_factor` robust deviations (1.4826 x MAD) and at
least `loss.min_rel` of the median, past the first `loss.warmup_steps` losses.
Only rises count: a falling loss is progress. A spike counts only before the
launch's first non-finite loss.
"""

from __future__ import annotations

import numpy as np

from incidents.detectors.base import Signal, by_launch
from incidents.detectors.state import EngineState, LossFinding, LossState


def advance(state: EngineState, steps, cfg) -> list[Signal]:
    """Read the new steps' losses; the findings of every launch so far."""
    attempt, number, ts, has_loss, loss = steps[0], steps[1], steps[2], steps[4], steps[5]
    for launch_number, rows in by_launch(attempt):
        rows = rows[has_loss[rows] == 1]
        if not len(rows):
            continue
        ls = state.launches[launch_number]
        if ls.loss is None:
            ls.loss = LossState()
        o = rows[np.lexsort((number[rows], ts[rows]))]
        _chunk(ls.loss, number[o], ts[o], loss[o], cfg)
    found = []
    for launch_number, ls in state.launches.items():
        if ls.loss is None:
            continue
        for finding in (ls.loss.nan, ls.loss.spike):
            if finding is not None:
                found.append(_signal(launch_number, finding))
    return found


def _chunk(s: LossState, numbers, ts, x, cfg) -> None:
    if s.nan is not None:
        return
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.argmax(bad))
        s.nan = LossFinding("nan", step=int(numbers[i]), ts=float(ts[i]), loss=str(x[i]))
        numbers, ts, x = numbers[:i], ts[:i], x[:i]
    window = int(cfg["loss.window"])
    start = max(window, int(cfg["loss.warmup_steps"]))  # the first position judged
    tail = np.array(s.tail, dtype=np.float64)
    n0 = s.n
    s.n = n0 + len(x)
    s.tail = np.concatenate((tail, x))[-window:].tolist()
    if s.spike is not None or not len(x) or n0 + len(x) <= start:
        return
    allx = np.concatenate((tail, x))  # positions n0 - len(tail) ...
    offset = n0 - len(tail)
    first = max(start, n0) - offset  # the first new position judged, in allx
    windows = np.lib.stride_tricks.sliding_window_view(allx[:-1], window)[first - window :]
    current = allx[first:]
    candidates = np.arange(len(current))
    min_rel, k = cfg["loss.min_rel"], cfg["loss.mad_factor"]
    if (allx > 0).all():
        # A spike clears (1 + min_rel) x the median, so (1 + min_rel) x the
        # window's minimum: only those few points need a median.
        candidates = np.flatnonzero(current > (1 + min_rel) * windows.min(axis=1))
    for j in candidates.tolist():
        med = float(np.median(windows[j]))
        mad = float(np.median(np.abs(windows[j] - med))) * 1.4826
        if current[j] > med + max(k * mad, min_rel * abs(med)):
            i = first + j - (len(allx) - len(x))  # its index among the new losses
            s.spike = LossFinding(
                "loss_spike",
                step=int(numbers[i]),
                ts=float(ts[i]),
                loss=float(x[i]),
                median=med,
                robust_sd=mad,
            )
            return


def _signal(attempt: int, found: LossFinding) -> Signal:
    return Signal(
        client_id=f"inferred:{found.type}:{attempt}:{found.step}",
        kind="fault",
        ts=found.ts,
        attempt=attempt,
        node="",
        rank=None,
        data={**found.data(), "inferred": True},
    )
