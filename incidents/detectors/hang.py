"""The hang detector: a launch that stopped making steps for longer than it should.

timeout = max(floor, factor x the longest step interval learned so far), where
the longest interval is this launch's own so far (its first steps skipped:
warm-up is slow) or, when larger, the smoothed longest of earlier launches; a
gap with a checkpoint save started in it gets an allowance more, and is not
learned from (nor is an interval found to be a hang). A running launch's open
tail runs to the job's latest event. The time of announced pauses (`pause_started` ..
`pause_ended`: an evaluation, say) is left out of a gap, both to judge it and to
learn from it; a pause still open counts up to `hang.pause_max_s`, after which
the time counts again (a hang inside an evaluation).
"""

from __future__ import annotations

import math

import numpy as np
from django.conf import settings

from incidents.detectors.base import Signal, by_launch, launch_stop
from incidents.detectors.state import EngineState, Hang, Rebuild, StepsState, Verdict
from jobs.accounting import Launch
from jobs.models import HeartbeatBucket, Node


def advance(job, state: EngineState, launches, finished, steps, cfg) -> list[Signal]:
    """Per launch: the steps read so far, the longest interval learned, its hang if any."""
    attempt, number, ts, seq = steps[0], steps[1], steps[2], steps[3]
    new = dict(by_launch(attempt))
    smoothed = 0.0
    alpha = cfg["hang.smoothing"]
    found = []
    for k, launch in enumerate(launches):
        ls = state.launch(launch.number, launch.start)
        s = ls.steps
        if s is None:
            s = ls.steps = StepsState(smoothed_in=smoothed)
        elif s.n and not math.isclose(s.smoothed_in, smoothed, rel_tol=1e-9, abs_tol=1e-9):
            raise Rebuild  # an earlier launch's intervals changed after this one was read
        s.smoothed_in = smoothed
        rows = new.get(launch.number)
        stop = launch_stop(job, launches, k, finished)
        if s.closed is not None:  # judged to its end already
            if rows is not None or s.closed.stop != stop:
                raise Rebuild  # its steps or its end moved after it was closed
            hang, learned = s.closed.hang, s.closed.learned
        else:
            if rows is not None:
                o = rows[np.lexsort((seq[rows], ts[rows]))]
                if s.n and ts[o[0]] < s.last_ts:
                    raise Rebuild  # a step landed behind the ones read
                ls.started = True
                _chunk(s, launch, ts[o], number[o], cfg)
            hang, learned = _tail(s, launch, stop, cfg)
            # Once a later launch trains, this one's end is settled: keep its verdict.
            if any(x.number in new or _trained(state, x) for x in launches[k + 1 :]):
                s.closed = Verdict(stop, hang, learned)
        if hang is not None and s.closed is not None and hang.culprit is None:
            # A settled hang's node is read once: that node's heartbeats may come back.
            hang.culprit = _culprit(job, launch.number, _detected(launch, hang, cfg))
        if hang is not None:
            found.append(_signal(job, launch, hang, cfg))
        smoothed = learned if smoothed == 0 else alpha * learned + (1 - alpha) * smoothed
    return found


def _trained(state: EngineState, launch: Launch) -> bool:
    ls = state.launches.get(launch.number)
    return bool(ls is not None and ls.steps is not None and ls.steps.n)


def _timeouts(idx, learned_before, smoothed, begins, ends, launch, cfg):
    baseline = np.maximum(learned_before, smoothed)
    learned = np.maximum(cfg["hang.floor_s"], cfg["hang.factor"] * baseline)
    # A launch's first steps compile and warm caches: minutes, whatever earlier launches
    # learned (and a slow node makes them slower still); so does the first interval
    # after them when nothing was learned yet (only the floor would be left).
    warm = (idx < cfg["hang.skip_steps"]) | (baseline <= 0)
    timeouts = np.where(warm, np.maximum(learned, cfg["hang.warmup_timeout_s"]), learned)
    # A save started inside the interval: allow for it.
    return timeouts + np.where(_saving(begins, ends, launch), cfg["hang.save_allowance_s"], 0.0)


def _saving(begins: np.ndarray, ends: np.ndarray, launch: Launch) -> np.ndarray:
    """Per interval, whether a checkpoint save started inside it."""
    save_starts = np.array(
        sorted(v["started"] for v in launch.saves.values() if v.get("started") is not None)
    )
    if not len(save_starts):
        return np.zeros(len(begins), dtype=bool)
    return np.searchsorted(save_starts, ends, "left") > np.searchsorted(save_starts, begins, "left")


def _paused(begins: np.ndarray, ends: np.ndarray, launch: Launch, cfg) -> np.ndarray:
    """Per interval, the seconds of it inside the launch's announced pauses."""
    out = np.zeros(len(begins))
    for start, end in launch.pauses:
        limit = start + cfg["hang.pause_max_s"]
        stop = limit if end is None else min(end, limit)
        out += np.clip(np.minimum(ends, stop) - np.maximum(begins, start), 0.0, None)
    return out


def _chunk(s: StepsState, launch: Launch, ts: np.ndarray, numbers: np.ndarray, cfg) -> None:
    """Judge the intervals the new steps close."""
    n0 = s.n
    if n0:
        begins = np.concatenate(([s.last_ts], ts[:-1]))
        begin_steps = np.concatenate(([s.last_step], numbers[:-1]))
        idx = np.arange(n0 - 1, n0 - 1 + len(ts))
    else:
        begins, begin_steps, idx = ts[:-1], numbers[:-1], np.arange(len(ts) - 1)
    ends = ts[len(ts) - len(begins) :]
    s.n = n0 + len(ts)
    s.last_ts, s.last_step = float(ts[-1]), int(numbers[-1])
    if s.hang is not None or not len(begins):
        return  # a launch's first hang is its finding; nothing is learned after it
    gaps = ends - begins
    if launch.pauses:
        gaps = gaps - _paused(begins, ends, launch, cfg)
    # A gap with a save in it is not a step interval: learning it would stretch the
    # timeout to factor x the save for the rest of the launch (and the next ones).
    learns = (idx >= cfg["hang.skip_steps"]) & ~_saving(begins, ends, launch)
    learnable = np.where(learns, gaps, 0.0)
    learned_before = np.maximum(
        s.learned, np.concatenate(([0.0], np.maximum.accumulate(learnable)[:-1]))
    )
    timeouts = _timeouts(idx, learned_before, s.smoothed_in, begins, ends, launch, cfg)
    over = np.flatnonzero(gaps > timeouts)
    if len(over):
        i = int(over[0])
        s.hang = Hang(
            begin=float(begins[i]),
            step=int(begin_steps[i]),
            timeout=float(timeouts[i]),
            gap=float(gaps[i]),
        )
        s.learned = float(learned_before[i])
    else:
        s.learned = max(s.learned, float(learnable.max()))


def _tail(s: StepsState, launch: Launch, stop: float | None, cfg) -> tuple[Hang | None, float]:
    """The launch's hang (one read before, or its open tail's), and what it learned."""
    if s.hang is not None:
        return s.hang, s.learned
    if stop is None or launch.completed or not s.n:
        return None, s.learned
    idx = np.array([s.n - 1])
    begins, ends = np.array([s.last_ts]), np.array([stop])
    gap = stop - s.last_ts - float(_paused(begins, ends, launch, cfg)[0])
    timeout = float(
        _timeouts(idx, np.array([s.learned]), s.smoothed_in, begins, ends, launch, cfg)[0]
    )
    if gap > timeout:
        return Hang(begin=s.last_ts, step=s.last_step, timeout=timeout, gap=gap), s.learned
    learns = idx[0] >= cfg["hang.skip_steps"] and not _saving(begins, ends, launch)[0]
    return None, max(s.learned, gap if learns else 0.0)


def _detected(launch: Launch, hang: Hang, cfg) -> float:
    """When the timeout ran out: once the gap, less its paused time, exceeded it (each
    pause inside it pushes the moment on)."""
    detected = hang.begin + hang.timeout
    for _ in launch.pauses:
        paused = float(_paused(np.array([hang.begin]), np.array([detected]), launch, cfg)[0])
        if hang.begin + hang.timeout + paused == detected:
            break
        detected = hang.begin + hang.timeout + paused
    return detected


def _signal(job, launch: Launch, hang: Hang, cfg) -> Signal:
    attempt = launch.number
    detected = _detected(launch, hang, cfg)
    culprit = hang.culprit if hang.culprit is not None else _culprit(job, attempt, detected)
    return Signal(
        client_id=f"inferred:hang:{attempt}:{hang.step}",
        kind="fault",
        ts=hang.begin,
        attempt=attempt,
        node=culprit or "",
        rank=None,
        data={
            "type": "hang",
            "last_step": hang.step,
            "no_step_s": hang.gap,
            "timeout_s": hang.timeout,
        },
        detected_ts=detected,
    )


def _culprit(job, attempt: int, detected_ts: float) -> str:
    """The one node of the launch that fell silent before the hang was detected
    while the others kept sending heartbeats, if there is exactly one ("" if not)."""
    nodes = list(
        Node.objects.filter(attempts__job=job, attempts__number=attempt)
        .exclude(last_heartbeat_at=None)
        .values_list("name", "last_heartbeat_at")
    )
    silent = [name for name, last in nodes if last.timestamp() < detected_ts]
    # The stored value lags by up to the liveness granularity (see ingest): a node just
    # short of `detected_ts` is asked of the job's heartbeat buckets, which are exact.
    near = detected_ts - settings.REBOUND_NODE_LIVENESS_S
    unsure = [name for name, last in nodes if near <= last.timestamp() < detected_ts]
    if unsure:
        heard = set(
            HeartbeatBucket.objects.filter(
                job=job,
                node__in=unsure,
                bucket__gte=math.floor(detected_ts / HeartbeatBucket.BUCKET_S),
                last_ts__gte=detected_ts,
            ).values_list("node", flat=True)
        )
        silent = [name for name in silent if name not in heard]
    if len(silent) == 1 and len(nodes) > 1:
        return silent[0]
    return ""
