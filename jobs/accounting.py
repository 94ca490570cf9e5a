"""Goodput accounting: every second of a job's elapsed time in exactly one category.

The rules are those of the design contract (Goodput accounting). How they are
applied here:

* Launches come from `attempt_started` (a launch without one starts at its
  first event). A launch ends at its `attempt_ended`, at the next launch's
  start if that comes first, or, still running, at the job's last event.
* Inside a launch, intervals are painted by priority so they never overlap:
  save blocking > steps > restore > startup > the tail after the last step.
  What no interval covers is `other`. Time between launches is `downtime`;
  after the last launch it is `downtime` unless that launch completed.
* The steps' share is split per step: an execution of step k is productive
  when it is the last execution of step k in the job (by time, ties by
  arrival), wasted otherwise. Restarts are never inferred from step numbers.
* A window [start, end] clips the same ledger: the categories of just that
  window, judged with everything known now.
* Planned interruptions (`planned_*`, a view over the categories, not one more):
  a launch that did not complete and ended inside a maintenance window covering one
  of its nodes (or its whole cluster) was interrupted by plan. The badput it caused
  (its wasted progress and stalled time, the downtime after it, the next launch's
  startup and restore: an incident's lost GPU-seconds) is taken out of the
  denominator of `goodput_excluding_planned` and `gpu_goodput_excluding_planned`.
  Without windows they equal `goodput` and `gpu_goodput`.

Markers (a few per launch) are handled in Python; steps, which can number in
the millions, are handled as numpy arrays.

Long module: the one ledger, its categories and its planned view, read together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from jobs.columns import FLOAT, INT, load_columns
from jobs.models import Event, TrainingJob

CATEGORIES = (
    "productive",
    "startup",
    "checkpoint_restore",
    "checkpoint_save",
    "wasted_progress",
    "stalled",
    "downtime",
    "other",
)

# Painting priorities inside a launch; higher wins where intervals overlap.
_SAVE, _STEPS, _RESTORE, _STARTUP, _TAIL, _NONE = 5, 4, 3, 2, 1, 0


def _zero() -> dict[str, float]:
    return dict.fromkeys(CATEGORIES, 0.0)


@dataclass
class Launch:
    number: int
    start: float
    world_size: int | None = None
    end: float | None = None  # attempt_ended, as reported
    reason: str = ""
    nodes: tuple[str, ...] = ()  # as its attempt_started named them
    ready: float | None = None
    load_started: float | None = None
    loaded: float | None = None
    saves: dict[int, dict] = field(default_factory=dict)  # step -> {started, saved, blocking}
    # Announced pauses (pause_started .. pause_ended, paired in time order): [start, end];
    # end None while one is open. The hang detector leaves them out of its gaps.
    pauses: list[list] = field(default_factory=list)
    # Set by the ledger:
    stop: float = 0.0  # effective end, clipped to the next launch and the job's end
    categories: dict[str, float] = field(default_factory=_zero)
    gap_after_s: float = 0.0  # downtime (or other) after this launch, before the next
    gap_s: float = 0.0  # the part of that gap inside the ledger's [start, end]

    @property
    def completed(self) -> bool:
        return self.reason == "completed"


@dataclass
class Ledger:
    job: str
    elapsed_s: float
    categories: dict[str, float]
    gpu_seconds: dict[str, float]
    goodput: float | None
    gpu_goodput: float | None
    slowdown_s: float
    as_of: float | None
    start: float | None
    end: float | None
    launches: list[Launch]
    # Badput of interruptions inside maintenance windows (a view over the categories).
    planned_s: float = 0.0
    planned_gpu_seconds: float = 0.0
    planned_launches: list[int] = field(default_factory=list)

    @property
    def goodput_excluding_planned(self) -> float | None:
        rest = self.elapsed_s - self.planned_s
        return self.categories["productive"] / rest if rest > 0 else None

    @property
    def gpu_goodput_excluding_planned(self) -> float | None:
        rest = math.fsum(self.gpu_seconds.values()) - self.planned_gpu_seconds
        return self.gpu_seconds["productive"] / rest if rest > 0 else None

    def as_dict(self) -> dict:
        return {
            "job": self.job,
            "elapsed_s": self.elapsed_s,
            "categories": self.categories,
            "gpu_seconds": self.gpu_seconds,
            "goodput": self.goodput,
            "gpu_goodput": self.gpu_goodput,
            "slowdown_s": self.slowdown_s,
            "as_of": _iso(self.as_of),
            "planned_s": self.planned_s,
            "planned_gpu_seconds": self.planned_gpu_seconds,
            "goodput_excluding_planned": (
                self.goodput if not self.planned_launches else self.goodput_excluding_planned
            ),
            "gpu_goodput_excluding_planned": (
                self.gpu_goodput
                if not self.planned_launches
                else self.gpu_goodput_excluding_planned
            ),
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Steps:
    """All step executions of a job, column-wise."""

    attempt: np.ndarray
    step: np.ndarray
    ts: np.ndarray
    seq: np.ndarray


# --- loading -----------------------------------------------------------------


def load_steps(job_id: int) -> Steps:
    return Steps(
        *load_columns(
            "jobs_steprecord",
            [("attempt", INT), ("step", INT), ("ts", FLOAT), ("id", INT)],
            "job_id = %s",
            [job_id],
        )
    )


def load_lifecycle(job_id: int) -> list[tuple[str, float, int | None, dict]]:
    return list(
        Event.objects.filter(job_id=job_id, kind__in=Event.TIMELINE_KINDS)
        .order_by("ts", "id")
        .values_list("kind", "ts", "attempt", "data")
    )


def job_ledger(job: TrainingJob, *, start: float | None = None, end: float | None = None) -> Ledger:
    """The job's ledger, cumulative or over [start, end] (unix seconds)."""
    return compute_ledger(
        job.key,
        load_lifecycle(job.id),
        load_steps(job.id),
        last_event_ts=job.last_event_ts,
        start=start,
        end=end,
        spans=load_spans(job),
    )


def load_spans(job: TrainingJob) -> list:
    """The maintenance windows over the job's time (one small indexed query)."""
    # Imported here: jobs.selectors reads this module's ledger when it loads.
    from jobs.selectors.maintenance import maintenance_spans

    if job.first_event_ts is None:
        return []
    return maintenance_spans(
        cluster_id=job.cluster_id, start=job.first_event_ts, end=job.last_event_ts
    )


# --- the ledger proper -------------------------------------------------------


def build_launches(
    lifecycle: list[tuple[str, float, int | None, dict]], steps: Steps
) -> tuple[list[Launch], float | None]:
    """Launches in start order, and the job_finished time if any."""
    launches: dict[int, Launch] = {}
    finished: float | None = None
    first_seen: dict[int, float] = {}

    def earliest(cur, ts):
        return ts if cur is None or ts < cur else cur

    reopened = -math.inf  # an operator reopened the job: finishes up to then are void
    for kind, ts, attempt, data in lifecycle:  # sorted by (ts, arrival)
        if kind == "job_finished":
            if ts > reopened:
                finished = earliest(finished, ts)
            continue
        if kind == "job_reopened":
            reopened, finished = ts, None
            continue
        if attempt is None:
            continue
        first_seen[attempt] = min(first_seen.get(attempt, ts), ts)
        launch = launches.get(attempt)
        if kind == "attempt_started":
            if launch is None or launch.start > ts:
                ws = data.get("world_size")
                if launch is None:
                    launch = launches[attempt] = Launch(number=attempt, start=ts, world_size=ws)
                launch.start, launch.world_size = ts, ws
                named = data.get("nodes")
                if isinstance(named, list):
                    launch.nodes = tuple(n for n in named if isinstance(n, str))
            continue
        if launch is None:
            launch = launches[attempt] = Launch(number=attempt, start=math.inf)
        if kind == "ready":
            launch.ready = earliest(launch.ready, ts)
        elif kind == "checkpoint_load_started":
            launch.load_started = earliest(launch.load_started, ts)
        elif kind == "checkpoint_loaded":
            launch.loaded = earliest(launch.loaded, ts)
        elif kind == "attempt_ended":
            if launch.end is None or ts < launch.end:
                launch.end, launch.reason = ts, data.get("reason", "")
        elif kind == "pause_started":
            if not launch.pauses or launch.pauses[-1][1] is not None:
                launch.pauses.append([ts, None])  # a second start while open: one pause
        elif kind == "pause_ended":
            if launch.pauses and launch.pauses[-1][1] is None:
                launch.pauses[-1][1] = ts  # an end with no start open: nothing to close
        elif kind in ("checkpoint_save_started", "checkpoint_saved"):
            save = launch.saves.setdefault(data["step"], {})
            if kind == "checkpoint_save_started":
                save["started"] = earliest(save.get("started"), ts)
            elif save.get("saved") is None or ts < save["saved"]:
                save["saved"] = ts
                save["blocking"] = data.get("blocking_s")

    if len(steps.attempt):
        for number in np.unique(steps.attempt).tolist():
            t0 = float(steps.ts[steps.attempt == number].min())
            first_seen[number] = min(first_seen.get(number, t0), t0)
            if number not in launches:
                launches[number] = Launch(number=number, start=math.inf)

    ordered = []
    for number, launch in launches.items():
        if launch.start == math.inf:  # no attempt_started: start at its first event
            launch.start = first_seen[number]
        ordered.append(launch)
    ordered.sort(key=lambda launch: (launch.start, launch.number))
    previous_ws = None
    for launch in ordered:  # a launch whose size was never reported keeps its predecessor's
        if launch.world_size is None:
            launch.world_size = previous_ws or 1
        previous_ws = launch.world_size
    return ordered, finished


def save_blocking(
    started: float | None, saved: float | None, blocking_s: float | None
) -> tuple[float, float] | None:
    """When a save blocked training, from what its events tell: its reported blocking
    seconds from its start (or back from its end), else start to end; None when that
    is not known (an unfinished save without its blocking seconds)."""
    if blocking_s is not None and started is not None:
        return started, started + blocking_s
    if blocking_s is not None and saved is not None:
        return saved - blocking_s, saved
    if started is not None and saved is not None:
        return started, saved
    return None


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of the intervals, as disjoint intervals in order."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _paint(intervals: list[tuple[float, float, int]], lo: float, hi: float) -> dict[int, float]:
    """Seconds of [lo, hi] won by each priority; uncovered time goes to _NONE.

    A sweep over the interval ends, keeping a count of open intervals per
    priority: O(n log n) in the number of intervals.
    """
    out = dict.fromkeys(range(_SAVE + 1), 0.0)
    if hi <= lo:
        return out
    edges = []
    for a, b, p in intervals:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            edges.append((a, 1, p))
            edges.append((b, -1, p))
    edges.sort()
    open_count = [0] * (_SAVE + 1)
    at = lo
    for x, delta, p in edges:
        if x > at:
            best = next((q for q in range(_SAVE, 0, -1) if open_count[q]), _NONE)
            out[best] += x - at
            at = x
        open_count[p] += delta
    out[_NONE] += hi - at
    return out


def _launch_intervals(launch: Launch, stop: float, step_ts: np.ndarray, running: bool):
    """Painted intervals of one launch, the training start and the merged save blocking.

    A restore or a save that never finished counts as such only while the
    launch still runs (it is in flight); in a launch that ended, that time is
    a hang like any other: the stalled tail.
    """
    s = launch.start
    first_step = float(step_ts[0]) if len(step_ts) else None
    save_starts = [v["started"] for v in launch.saves.values() if v.get("started") is not None]
    train_start = launch.loaded or launch.ready or s
    train_start = min(max(train_start, s), stop)

    if launch.ready is not None:
        startup_end = launch.ready
    else:
        candidates = [launch.load_started, launch.loaded, first_step, *save_starts, stop]
        startup_end = min(x for x in candidates if x is not None and x >= s)

    intervals: list[tuple[float, float, int]] = [(s, startup_end, _STARTUP)]

    restore_start = launch.load_started if launch.load_started is not None else launch.ready
    if launch.loaded is not None and restore_start is not None:
        intervals.append((restore_start, launch.loaded, _RESTORE))
    elif (
        launch.load_started is not None
        and running
        and not len(step_ts[step_ts > launch.load_started])
    ):
        intervals.append((launch.load_started, stop, _RESTORE))

    blocking = []
    for v in launch.saves.values():
        started, saved, b = v.get("started"), v.get("saved"), v.get("blocking")
        span = save_blocking(started, saved, b)
        if span is not None:
            blocking.append(span)
        elif started is not None:  # never finished: blocked until steps resumed, or in flight
            later = step_ts[step_ts > started]
            if len(later):
                blocking.append((started, float(later[0])))
            elif running:
                blocking.append((started, stop))
    blocking = [
        (max(a, s), min(b, stop)) for a, b in merge_intervals(blocking) if min(b, stop) > max(a, s)
    ]

    last = float(step_ts[-1]) if len(step_ts) else train_start
    tail_start = max(last, train_start)
    if len(step_ts):
        intervals.append((train_start, tail_start, _STEPS))
    intervals.append((tail_start, stop, _TAIL))
    intervals.extend((a, b, _SAVE) for a, b in blocking)
    return intervals, train_start, blocking


def _step_durations(prev, ts, blocking, lo, hi) -> np.ndarray:
    """Each step's seconds inside [lo, hi], less save blocking inside its interval."""
    a = np.clip(prev, lo, hi)
    b = np.clip(ts, lo, hi)
    dur = b - a
    for u, v in blocking:
        u, v = max(u, lo), min(v, hi)
        if v <= u:
            continue
        i = int(np.searchsorted(b, u, side="right"))
        while i < len(b) and a[i] < v:
            overlap = min(b[i], v) - max(a[i], u)
            if overlap > 0:
                dur[i] -= overlap
            i += 1
    return np.maximum(dur, 0.0)


def compute_ledger(
    job_key: str,
    lifecycle: list[tuple[str, float, int | None, dict]],
    steps: Steps,
    *,
    last_event_ts: float | None,
    start: float | None = None,
    end: float | None = None,
    spans: list | None = None,
) -> Ledger:
    """`spans`: the maintenance windows over the job's time (jobs.selectors.Span, or
    anything with `covers(ts, names)`), for the planned figures."""
    launches, finished = build_launches(lifecycle, steps)
    cats = _zero()
    gpu = _zero()
    if not launches:
        return Ledger(job_key, 0.0, cats, gpu, None, None, 0.0, None, start, end, [])

    t0 = launches[0].start
    t_end = finished if finished is not None else max(last_event_ts or t0, t0)
    if finished is None:
        t_end = max(t_end, max(launch.start for launch in launches))
    lo = t0 if start is None else max(start, t0)
    hi = t_end if end is None else min(end, t_end)

    # Kept or thrown away: the last execution of each step number (by ts, then arrival).
    keep = steps.ts <= t_end
    st = Steps(steps.attempt[keep], steps.step[keep], steps.ts[keep], steps.seq[keep])
    kept = np.zeros(len(st.ts), dtype=bool)
    if len(st.ts):
        order = np.lexsort((st.seq, st.ts, st.step))
        s_sorted = st.step[order]
        last_of_group = np.ones(len(order), dtype=bool)
        last_of_group[:-1] = s_sorted[:-1] != s_sorted[1:]
        kept[order[last_of_group]] = True
    by_launch = np.lexsort((st.seq, st.ts, st.attempt))
    attempt_sorted = st.attempt[by_launch]

    kept_full: list[np.ndarray] = []  # full durations of kept steps, for the median
    kept_in_window: list[np.ndarray] = []  # the same, for steps that ended inside the window

    for k, launch in enumerate(launches):
        nxt = launches[k + 1].start if k + 1 < len(launches) else None
        stop = launch.end if launch.end is not None else (nxt if nxt is not None else t_end)
        if nxt is not None:
            stop = min(stop, nxt)
        stop = max(min(stop, t_end), launch.start)
        launch.stop = stop

        i0 = int(np.searchsorted(attempt_sorted, launch.number, side="left"))
        i1 = int(np.searchsorted(attempt_sorted, launch.number, side="right"))
        idx = by_launch[i0:i1]
        raw_ts = st.ts[idx]
        running = launch.end is None and nxt is None and finished is None
        intervals, train_start, blocking = _launch_intervals(
            launch, stop, np.clip(raw_ts, launch.start, stop), running
        )
        ts_c = np.clip(raw_ts, train_start, stop)
        prev = np.empty_like(ts_c)
        if len(ts_c):
            prev[0] = train_start
            prev[1:] = ts_c[:-1]

        painted = _paint(intervals, max(lo, launch.start), min(hi, stop))
        c = launch.categories
        c["startup"] += painted[_STARTUP]
        c["checkpoint_restore"] += painted[_RESTORE]
        c["checkpoint_save"] += painted[_SAVE]
        c["stalled" if not launch.completed else "other"] += painted[_TAIL]
        c["other"] += painted[_NONE]

        if len(ts_c):
            kept_here = kept[idx]
            dur = _step_durations(prev, ts_c, blocking, max(lo, train_start), min(hi, stop))
            c["productive"] += float(dur[kept_here].sum())
            c["wasted_progress"] += float(dur[~kept_here].sum())
            full = _step_durations(prev, ts_c, blocking, train_start, stop)
            kept_full.append(full[kept_here])
            in_window = kept_here & (ts_c > lo) & (ts_c <= hi)
            kept_in_window.append(full[in_window])

        # The gap to the next launch (or to the job's end) keeps the capacity reserved.
        gap_end = nxt if nxt is not None else t_end
        gap = max(0.0, min(gap_end, hi) - max(stop, lo))
        gap_cat = "other" if nxt is None and launch.completed else "downtime"
        launch.gap_after_s = max(0.0, gap_end - stop)
        launch.gap_s = gap
        for name, secs in c.items():
            cats[name] += secs
            gpu[name] += secs * launch.world_size
        cats[gap_cat] += gap
        gpu[gap_cat] += gap * launch.world_size

    slowdown = 0.0
    if kept_full:
        all_kept = np.concatenate(kept_full)
        if len(all_kept):
            median = float(np.median(all_kept))
            window_kept = np.concatenate(kept_in_window)
            slowdown = float(np.maximum(window_kept - median, 0.0).sum())

    elapsed = max(0.0, hi - lo)
    gpu_total = math.fsum(gpu.values())
    planned = _planned(launches, finished, spans) if spans else []
    planned_s = planned_gpu = 0.0
    for k in planned:
        for launch, secs in _interruption_badput(launches, k):
            planned_s += secs
            planned_gpu += secs * launch.world_size
    return Ledger(
        job=job_key,
        elapsed_s=elapsed,
        categories=cats,
        gpu_seconds=gpu,
        goodput=cats["productive"] / elapsed if elapsed > 0 else None,
        gpu_goodput=gpu["productive"] / gpu_total if gpu_total > 0 else None,
        slowdown_s=slowdown,
        as_of=hi if elapsed > 0 or end is None else None,
        start=lo,
        end=hi,
        launches=launches,
        planned_s=planned_s,
        planned_gpu_seconds=planned_gpu,
        planned_launches=[launches[k].number for k in planned],
    )


def _planned(launches: list[Launch], finished: float | None, spans: list) -> list[int]:
    """Indexes of the launches interrupted by plan: ended without completing inside a
    window covering one of their nodes or their cluster. A launch still running (no
    end, none after it, the job not finished) was not interrupted."""
    out = []
    for k, launch in enumerate(launches):
        ended = launch.end is not None or k + 1 < len(launches) or finished is not None
        if not ended or launch.completed:
            continue
        if any(span.covers(launch.stop, launch.nodes) for span in spans):
            out.append(k)
    return out


def _interruption_badput(launches: list[Launch], k: int):
    """(launch, seconds) of the badput launch k's interruption caused, as an incident's
    lost GPU-hours count it: its wasted progress and stalled time, the downtime after
    it (weighted by its size), the next launch's startup and restore."""
    launch = launches[k]
    c = launch.categories
    yield launch, c["wasted_progress"] + c["stalled"] + launch.gap_s
    if k + 1 < len(launches):
        n = launches[k + 1].categories
        yield launches[k + 1], n["startup"] + n["checkpoint_restore"]
