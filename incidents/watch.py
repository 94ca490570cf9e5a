"""What the detectors have read of a job so far, so that a pass reads only what is new.

Hangs, loss trouble, dead nodes and stragglers are found from a job's steps,
rank windows and heartbeats. Re-reading the whole history on every pass would
make detection cost grow with the job's length; instead a pass reads the rows
stored since the last one and carries each detector's running state in the
job's DetectorState.

Rows are picked by id: with the job's lock taken for a moment no ingest of
this job is in flight, so every row of the job with an id up to the table's
highest is stored, and rows stored later get higher ids. Rows that land behind
what was already read (a late batch, a resent spill), a changed setting, or a
launch boundary that moved make the pass rebuild the state from every row.
Either way the result is what one pass over the whole history gives, whatever
the order the events arrived in.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
from django.db import connection, transaction
from django.db.models import F

from incidents.models import DetectorState
from jobs.accounting import Launch, Steps, build_launches
from jobs.columns import FLOAT, INT, load_columns
from jobs.models import Attempt, Event, HeartbeatBucket, Node, RankWindow, StepRecord, TrainingJob

VERSION = 1
SLOW = 0.75  # a rank scoring below this is slow (NVIDIA's resiliency extension's threshold)
BASELINE_WINDOWS = 64  # the straggler cost's baseline: the median of this many normal windows
EVIDENCE_WINDOWS = 100  # slow windows named in a straggler's evidence (the count is kept)
SETTINGS = (
    "hang.factor",
    "hang.floor_s",
    "hang.skip_steps",
    "hang.save_allowance_s",
    "hang.warmup_timeout_s",
    "hang.smoothing",
    "loss.window",
    "loss.mad_factor",
    "loss.min_rel",
    "loss.warmup_steps",
    "straggler.windows",
    "dead_node.timeout_s",
)


@dataclass
class Signal:
    client_id: str  # the event's id, or "inferred:..." for what a detector inferred
    kind: str
    ts: float
    attempt: int | None
    node: str
    rank: int | None
    data: dict
    detected_ts: float | None = None  # when an inferred fault's condition was met


@dataclass
class Straggler:
    node: str
    first_ts: float  # the end of the first window of its first slow streak
    detected_ts: float  # the end of the window that completed the streak
    first_step: int
    ranks: list[int] = field(default_factory=list)
    windows: int = 0  # slow windows in streaks
    worst_peer: float = 1.0
    worst_own: float = 1.0
    excess_gpu_s: float = 0.0  # step time above the job's baseline, x world size
    evidence: list[str] = field(default_factory=list)


@dataclass
class Watch:
    """What the detectors found in a job's steps, windows and heartbeats."""

    hangs: list[Signal]
    losses: list[Signal]
    dead_nodes: list[Signal]
    stragglers: list[Straggler]
    rebuilt: bool = False
    rows_read: int = 0


class Rebuild(Exception):
    """The state no longer matches what is stored: start over from every row."""


# --- reading -------------------------------------------------------------------

_STEP_COLUMNS = [
    ("attempt", INT),
    ("step", INT),
    ("ts", FLOAT),
    ("id", INT),
    ("CASE WHEN loss IS NULL THEN 0 ELSE 1 END", INT),
    ("COALESCE(loss, 0)", FLOAT),
]
_WINDOW_COLUMNS = [
    ("attempt", INT),
    ("first_step", INT),
    ("last_step", INT),
    ("rank", INT),
    ("COALESCE(node_id, -1)", INT),
    ("ts", FLOAT),
    ("compute_s", FLOAT),
    ("step_s", FLOAT),
]
_STREAMS = {"step": StepRecord, "window": RankWindow, "beat": HeartbeatBucket, "event": Event}


def _bounds(job: TrainingJob) -> dict[str, int]:
    """The highest id of each stream table, read while no ingest of the job is in flight."""
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).values_list("pk").first()
        with connection.cursor() as cursor:
            bounds = {}
            for name, model in _STREAMS.items():
                cursor.execute(f"SELECT max(id) FROM {model._meta.db_table}")
                bounds[name] = cursor.fetchone()[0] or 0
    return bounds


def _rows(table: str, columns, job_id: int, after: int, upto: int):
    if not after:  # everything: the job's rows
        return load_columns(table, columns, "job_id = %s AND id <= %s", [job_id, upto])
    # What was stored since: an id range (`job_id + 0` keeps the planner off the
    # job's index, which would read all of the job's rows to intersect with it).
    return load_columns(
        table, columns, "id > %s AND id <= %s AND job_id + 0 = %s", [after, upto, job_id]
    )


# --- the pass --------------------------------------------------------------------


def watch_job(job: TrainingJob, cfg: dict, *, clock: float | None = None) -> Watch:
    """Advance the job's detector state over what was stored since the last pass.

    `clock` (the sweep's) is where the job's clock would be had it gone on: the
    open tail of a running launch is judged up to it."""
    cfg = {k: float(cfg[k]) for k in SETTINGS}
    if clock is not None and (job.last_event_ts is None or clock > job.last_event_ts):
        job = copy.copy(job)
        job.last_event_ts = clock  # on this copy only: open tails run to it
    bounds = _bounds(job)
    with transaction.atomic():
        DetectorState.objects.get_or_create(job=job)
        row = DetectorState.objects.select_for_update().get(job=job)
        was_empty = not row.data
        try:
            watch = _advance(job, row.data, cfg, bounds)
            watch.rebuilt = was_empty
        except Rebuild:
            row.data = {}
            watch = _advance(job, row.data, cfg, bounds)
            watch.rebuilt = True
        row.save(update_fields=["data", "updated_at"])
    return watch


def _fresh(cfg: dict) -> dict:
    return {
        "v": VERSION,
        "cfg": cfg,
        "cursor": dict.fromkeys(_STREAMS, 0),
        "launches": {},
        "beats": {},
        "stragglers": {},
        "baseline": [],
        "undecided": {},
        "order": [],
        "splits": {},
    }


def _lifecycle(job: TrainingJob, since: float):
    """The job's launch events, and the save starts from `since` on: older saves are
    behind every interval still to be judged, and a long job has thousands."""
    columns = ("kind", "ts", "attempt", "data", "id")
    rows = list(Event.objects.filter(job=job, kind__in=Event.LAUNCH_KINDS).values_list(*columns))
    rows += Event.objects.filter(
        job=job, kind="checkpoint_save_started", ts__gte=since
    ).values_list(*columns)
    rows.sort(key=lambda r: (r[1], r[4]))
    return [r[:4] for r in rows]


def _advance(job, state: dict, cfg: dict, bounds: dict) -> Watch:
    if not state:
        state.update(_fresh(cfg))
    elif state.get("v") != VERSION or state.get("cfg") != cfg:
        raise Rebuild
    cursor = state["cursor"]
    upto = {k: max(bounds[k], cursor[k]) for k in bounds}
    launch_state = state["launches"]

    steps = _rows("jobs_steprecord", _STEP_COLUMNS, job.id, cursor["step"], upto["step"])
    windows = _rows("jobs_rankwindow", _WINDOW_COLUMNS, job.id, cursor["window"], upto["window"])
    for number, ts in zip(steps[0].tolist(), steps[2].tolist(), strict=True):
        first = launch_state.setdefault(str(number), {"first_ts": ts})
        first["first_ts"] = min(first["first_ts"], ts)
    for number, ts in zip(windows[0].tolist(), windows[5].tolist(), strict=True):
        first = launch_state.setdefault(str(number), {"first_ts": ts})
        first["first_ts"] = min(first["first_ts"], ts)

    # Save starts matter from the oldest interval still to be judged on.
    heads = [
        ls["steps"]["last_ts"]
        for ls in launch_state.values()
        if ls.get("steps") and ls["steps"]["n"] and "closed" not in ls["steps"]
    ]
    new_first = [float(steps[2].min())] if len(steps[2]) else []
    since = min([*heads, *new_first], default=math.inf)
    lifecycle = _lifecycle(job, since)

    # The launches as the lifecycle and the first rows seen of each place them.
    seen = sorted((int(n), s["first_ts"]) for n, s in launch_state.items())
    anchor = Steps(
        attempt=np.array([n for n, _ in seen], dtype=np.int64),
        step=np.zeros(len(seen), dtype=np.int64),
        ts=np.array([t for _, t in seen], dtype=np.float64),
        seq=np.zeros(len(seen), dtype=np.int64),
    )
    launches, finished = build_launches(lifecycle, anchor)
    order = [launch.number for launch in launches]
    done = [n for n in state["order"] if launch_state.get(str(n), {}).get("started")]
    if [n for n in order if n in done] != done:
        raise Rebuild  # a launch with rows read moved in the order
    state["order"] = order
    _check_late_lifecycle(job, state, upto["event"])

    hangs = _advance_steps(job, state, launches, finished, steps, cfg)
    losses = _advance_losses(state, steps, cfg)
    stragglers = _advance_windows(job, state, launches, windows, cfg)
    dead = _advance_beats(job, state, launches, finished, upto["beat"], cfg)
    state["cursor"] = upto
    rows = len(steps[0]) + len(windows[0])
    return Watch(hangs, losses, dead, stragglers, rows_read=rows)


def _check_late_lifecycle(job, state: dict, upto: int) -> None:
    """A save start behind the steps already read changes the allowance of an
    interval already judged. (Launch starts and ends only move the open tail,
    which every pass judges anew, or the launches' order, checked above.)"""
    after = state["cursor"]["event"]
    if not after:
        return  # a fresh state: nothing read yet
    late = (
        Event.objects.filter(id__gt=after, id__lte=upto, kind="checkpoint_save_started")
        .annotate(job_plus=F("job_id") + 0)  # by id range, see _rows
        .filter(job_plus=job.id)
        .values_list("attempt", "ts")
    )
    for attempt, ts in late:
        s = state["launches"].get(str(attempt), {}).get("steps")
        if s and s["n"] and ts < s["last_ts"]:
            raise Rebuild


def _stop(job, launches: list[Launch], k: int, finished: float | None) -> float | None:
    launch = launches[k]
    if launch.end is not None:
        return launch.end
    nxt = launches[k + 1].start if k + 1 < len(launches) else None
    return nxt or finished or job.last_event_ts


def _by_launch(attempts: np.ndarray):
    for number in np.unique(attempts).tolist():
        yield number, np.flatnonzero(attempts == number)


# --- hangs ---------------------------------------------------------------------


def _advance_steps(job, state, launches, finished, steps, cfg) -> list[Signal]:
    """Per launch: the steps read so far, the longest interval learned, its hang if any.

    timeout = max(floor, factor x the longest step interval learned so far),
    where the longest interval is this launch's own so far (its first steps
    skipped: warm-up is slow) or, when larger, the smoothed longest of earlier
    launches; a gap with a checkpoint save started in it gets an allowance more.
    An interval found to be a hang is not learned from. A running launch's
    open tail runs to the job's latest event.
    """
    attempt, number, ts, seq = steps[0], steps[1], steps[2], steps[3]
    new = dict(_by_launch(attempt))
    smoothed = 0.0
    alpha = cfg["hang.smoothing"]
    found = []
    for k, launch in enumerate(launches):
        ls = state["launches"].setdefault(str(launch.number), {"first_ts": launch.start})
        s = ls.get("steps")
        if s is None:
            s = ls["steps"] = {
                "n": 0,
                "last_ts": None,
                "last_step": None,
                "learned": 0.0,
                "hang": None,
                "smoothed_in": smoothed,
            }
        elif s["n"] and not math.isclose(s["smoothed_in"], smoothed, rel_tol=1e-9, abs_tol=1e-9):
            raise Rebuild  # an earlier launch's intervals changed after this one was read
        s["smoothed_in"] = smoothed
        rows = new.get(launch.number)
        stop = _stop(job, launches, k, finished)
        if "closed" in s:  # judged to its end already
            if rows is not None or s["closed"]["stop"] != stop:
                raise Rebuild  # its steps or its end moved after it was closed
            hang, learned = s["closed"]["hang"], s["closed"]["learned"]
        else:
            if rows is not None:
                o = rows[np.lexsort((seq[rows], ts[rows]))]
                if s["n"] and ts[o[0]] < s["last_ts"]:
                    raise Rebuild  # a step landed behind the ones read
                ls["started"] = True
                _hang_chunk(s, launch, ts[o], number[o], cfg)
            hang, learned = _hang_tail(s, launch, stop, cfg)
            # Once a later launch trains, this one's end is settled: keep its verdict.
            if any(x.number in new or _trained(state, x) for x in launches[k + 1 :]):
                s["closed"] = {"stop": stop, "hang": hang, "learned": learned}
        if hang is not None:
            found.append(_hang_signal(job, launch.number, hang))
        smoothed = learned if smoothed == 0 else alpha * learned + (1 - alpha) * smoothed
    return found


def _trained(state, launch: Launch) -> bool:
    s = state["launches"].get(str(launch.number), {}).get("steps")
    return bool(s and s["n"])


def _timeouts(idx, learned_before, smoothed, begins, ends, launch, cfg):
    baseline = np.maximum(learned_before, smoothed)
    timeouts = np.where(
        (baseline > 0) | (idx >= cfg["hang.skip_steps"]),
        np.maximum(cfg["hang.floor_s"], cfg["hang.factor"] * baseline),
        max(cfg["hang.floor_s"], cfg["hang.warmup_timeout_s"]),  # compiling takes minutes
    )
    save_starts = np.array(
        sorted(v["started"] for v in launch.saves.values() if v.get("started") is not None)
    )
    if len(save_starts):  # a save started inside the interval: allow for it
        inside = np.searchsorted(save_starts, ends, "left") > np.searchsorted(
            save_starts, begins, "left"
        )
        timeouts = timeouts + np.where(inside, cfg["hang.save_allowance_s"], 0.0)
    return timeouts


def _hang_chunk(s: dict, launch: Launch, ts: np.ndarray, numbers: np.ndarray, cfg) -> None:
    """Judge the intervals the new steps close."""
    n0 = s["n"]
    if n0:
        begins = np.concatenate(([s["last_ts"]], ts[:-1]))
        begin_steps = np.concatenate(([s["last_step"]], numbers[:-1]))
        idx = np.arange(n0 - 1, n0 - 1 + len(ts))
    else:
        begins, begin_steps, idx = ts[:-1], numbers[:-1], np.arange(len(ts) - 1)
    ends = ts[len(ts) - len(begins) :]
    s["n"] = n0 + len(ts)
    s["last_ts"], s["last_step"] = float(ts[-1]), int(numbers[-1])
    if s["hang"] is not None or not len(begins):
        return  # a launch's first hang is its finding; nothing is learned after it
    gaps = ends - begins
    learnable = np.where(idx >= cfg["hang.skip_steps"], gaps, 0.0)
    learned_before = np.maximum(
        s["learned"], np.concatenate(([0.0], np.maximum.accumulate(learnable)[:-1]))
    )
    timeouts = _timeouts(idx, learned_before, s["smoothed_in"], begins, ends, launch, cfg)
    over = np.flatnonzero(gaps > timeouts)
    if len(over):
        i = int(over[0])
        s["hang"] = {
            "begin": float(begins[i]),
            "step": int(begin_steps[i]),
            "timeout": float(timeouts[i]),
            "gap": float(gaps[i]),
        }
        s["learned"] = float(learned_before[i])
    else:
        s["learned"] = max(s["learned"], float(learnable.max()))


def _hang_tail(s: dict, launch: Launch, stop: float | None, cfg) -> tuple[dict | None, float]:
    """The launch's hang (one read before, or its open tail's), and what it learned."""
    if s["hang"] is not None:
        return s["hang"], s["learned"]
    if stop is None or launch.completed or not s["n"]:
        return None, s["learned"]
    idx = np.array([s["n"] - 1])
    begins, ends = np.array([s["last_ts"]]), np.array([stop])
    gap = stop - s["last_ts"]
    timeout = float(
        _timeouts(idx, np.array([s["learned"]]), s["smoothed_in"], begins, ends, launch, cfg)[0]
    )
    if gap > timeout:
        hang = {"begin": s["last_ts"], "step": s["last_step"], "timeout": timeout, "gap": gap}
        return hang, s["learned"]
    learnable = gap if idx[0] >= cfg["hang.skip_steps"] else 0.0
    return None, max(s["learned"], learnable)


def _hang_signal(job, attempt: int, hang: dict) -> Signal:
    detected = hang["begin"] + hang["timeout"]
    return Signal(
        client_id=f"inferred:hang:{attempt}:{hang['step']}",
        kind="fault",
        ts=hang["begin"],
        attempt=attempt,
        node=_hang_culprit(job, attempt, detected) or "",
        rank=None,
        data={
            "type": "hang",
            "last_step": hang["step"],
            "no_step_s": hang["gap"],
            "timeout_s": hang["timeout"],
        },
        detected_ts=detected,
    )


def _hang_culprit(job, attempt: int, detected_ts: float) -> str | None:
    """The one node of the launch that fell silent before the hang was detected
    while the others kept sending heartbeats, if there is exactly one."""
    nodes = list(
        Node.objects.filter(attempts__job=job, attempts__number=attempt)
        .exclude(last_heartbeat_at=None)
        .values_list("name", "last_heartbeat_at")
    )
    silent = [name for name, last in nodes if last.timestamp() < detected_ts]
    if len(silent) == 1 and len(nodes) > 1:
        return silent[0]
    return None


# --- loss ------------------------------------------------------------------------


def _advance_losses(state, steps, cfg) -> list[Signal]:
    """Per launch, its first non-finite loss (NaN or infinity) and its first spike:
    a loss above the rolling median of the previous `loss.window` losses by more
    than `loss.mad_factor` robust deviations (1.4826 x MAD) and at least
    `loss.min_rel` of the median, past the first `loss.warmup_steps` losses.
    Only rises count: a falling loss is progress. A spike counts only before the
    launch's first non-finite loss."""
    attempt, number, ts, has_loss, loss = steps[0], steps[1], steps[2], steps[4], steps[5]
    for launch_number, rows in _by_launch(attempt):
        rows = rows[has_loss[rows] == 1]
        if not len(rows):
            continue
        ls = state["launches"][str(launch_number)]
        s = ls.setdefault("loss", {"n": 0, "tail": [], "nan": None, "spike": None})
        o = rows[np.lexsort((number[rows], ts[rows]))]
        _loss_chunk(s, number[o], ts[o], loss[o], cfg)
    found = []
    for launch_number, ls in state["launches"].items():
        s = ls.get("loss") or {}
        for kind in ("nan", "spike"):
            if s.get(kind):
                found.append(_loss_signal(int(launch_number), s[kind]))
    return found


def _loss_chunk(s: dict, numbers, ts, x, cfg) -> None:
    if s["nan"] is not None:
        return
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.argmax(bad))
        s["nan"] = {"type": "nan", "step": int(numbers[i]), "ts": float(ts[i]), "loss": str(x[i])}
        numbers, ts, x = numbers[:i], ts[:i], x[:i]
    window = int(cfg["loss.window"])
    start = max(window, int(cfg["loss.warmup_steps"]))  # the first position judged
    tail = np.array(s["tail"], dtype=np.float64)
    n0 = s["n"]
    s["n"] = n0 + len(x)
    s["tail"] = np.concatenate((tail, x))[-window:].tolist()
    if s["spike"] is not None or not len(x) or n0 + len(x) <= start:
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
            s["spike"] = {
                "type": "loss_spike",
                "step": int(numbers[i]),
                "ts": float(ts[i]),
                "loss": float(x[i]),
                "median": med,
                "robust_sd": mad,
            }
            return


def _loss_signal(attempt: int, found: dict) -> Signal:
    data = {k: v for k, v in found.items() if k != "ts"}
    return Signal(
        client_id=f"inferred:{found['type']}:{attempt}:{found['step']}",
        kind="fault",
        ts=found["ts"],
        attempt=attempt,
        node="",
        rank=None,
        data={**data, "inferred": True},
    )


# --- stragglers --------------------------------------------------------------------


def _advance_windows(job, state, launches, windows, cfg) -> list[Straggler]:
    """Per complete window (every rank of the launch reported it), each rank gets
    two scores: `peer` = the median compute time of all ranks / this rank's, and
    `own` = (its best compute time so far / this one) relative to the median
    rank's same ratio, which catches a rank that degrades alone while a
    slowdown of every rank scores 1. A node is slow in a window when one of
    its ranks is; it is a straggler after `straggler.windows` slow windows in
    a row of one launch. The finding stays tied to the node across launches."""
    worlds = {launch.number: launch.world_size for launch in launches}
    position = {launch.number: k for k, launch in enumerate(launches)}
    attempt = windows[0]
    newest = state.get("window_launch")
    for number, rows in sorted(_by_launch(attempt), key=lambda x: position.get(x[0], 0)):
        if newest is not None and position.get(number, 0) < position.get(newest, 0):
            raise Rebuild  # windows of an earlier launch after a later one's
        if newest != number and newest is not None:
            _close_launch_windows(state, state["launches"][str(newest)])
        newest = state["window_launch"] = number
        ls = state["launches"][str(number)]
        world = int(worlds.get(number) or 0)
        ws = ls.setdefault("win", {"head": None, "best": None, "runs": {}, "world": world})
        pending = ls.get("pending") or [[] for _ in windows]
        columns = [
            np.concatenate((np.array(p, dtype=c.dtype), c[rows]))
            for p, c in zip(pending, windows, strict=True)
        ]
        if not world:
            world = int(columns[3].max()) + 1
        if ws["world"] != world:
            if ws["head"] is not None:
                raise Rebuild  # the launch's size is known now, and differs
            ws["world"] = world
        first = columns[1]
        if ws["head"] is not None and (first <= ws["head"]).any():
            raise Rebuild  # a rank's window behind the windows judged
        o = np.lexsort((columns[3], first))
        columns = [c[o] for c in columns]
        starts, counts = np.unique(columns[1], return_counts=True)
        complete = starts[counts == world]
        if len(complete):
            keep = np.isin(columns[1], complete)
            _window_chunk(job, state, ws, number, [c[keep] for c in columns], cfg)
            ws["head"] = int(complete[-1])
            later = columns[1] > ws["head"]
        else:
            later = np.ones(len(columns[1]), dtype=bool)
        ls["pending"] = [c[later].tolist() for c in columns]
    found = sorted(state["stragglers"].values(), key=lambda s: s["first_ts"])
    return [Straggler(**s) for s in found]


def _close_launch_windows(state, ls: dict) -> None:
    """A later launch reports windows: this one's incomplete windows will never
    complete, and its streaks too short to count end."""
    ls.pop("pending", None)
    runs = ls.get("win", {}).get("runs", {})
    for nid, run in runs.items():
        if not run["confirmed"]:
            for held in run["windows"]:
                _release(state, held, nid)
    runs.clear()


def _window_chunk(job, state, ws: dict, number: int, columns, cfg) -> None:
    _, first, last, rank, node_id, ts, compute, step_s = columns
    world = ws["world"]
    shape = (len(first) // world, world)
    c = compute.reshape(shape)
    nodes = node_id.reshape(shape)
    ranks = rank.reshape(shape)
    window_first = first.reshape(shape)[:, 0]
    window_last = last.reshape(shape)[:, 0]
    window_ts = ts.reshape(shape).max(axis=1)
    window_step = step_s.reshape(shape).mean(axis=1)

    safe = np.where(c > 0, c, np.nan)
    peer = np.median(c, axis=1)[:, None] / safe
    best0 = np.array(ws["best"] if ws["best"] is not None else c[0], dtype=np.float64)
    best = np.minimum.accumulate(np.vstack((best0[None, :], c)), axis=0)[1:]
    ws["best"] = best[-1].tolist()
    own_ratio = best / safe
    own = own_ratio / np.median(own_ratio, axis=1)[:, None]
    slow_rank = (np.nan_to_num(peer, nan=1.0) < SLOW) | (np.nan_to_num(own, nan=1.0) < SLOW)
    # Per window and node: any of its ranks slow (one slow GPU makes the node the one
    # to replace; the streak of windows, not a vote of its ranks, rules out blips).
    ids = np.unique(nodes)
    slow_node = np.zeros((shape[0], len(ids)), dtype=bool)
    for j, nid in enumerate(ids.tolist()):
        on = nodes == nid
        slow_node[:, j] = (slow_rank & on).any(axis=1)
    names = dict(Node.objects.filter(id__in=ids.tolist()).values_list("id", "name"))
    streak = int(cfg["straggler.windows"])
    runs = ws["runs"]  # node id -> the slow windows of its current streak (or "confirmed")
    pending = state.setdefault("undecided", {})  # window key -> [step_s, holders]
    for w in range(shape[0]):
        key = f"{number}:{int(window_first[w])}"
        steps = int(window_last[w] - window_first[w] + 1)
        info = {
            "key": key,
            "first": int(window_first[w]),
            "ts": float(window_ts[w]),
            "step_s": float(window_step[w]),
            "steps": steps,
        }
        slow_ids = {int(ids[j]) for j in np.flatnonzero(slow_node[w])}
        for nid in list(runs):
            if int(nid) not in slow_ids:  # its streak ends
                run = runs.pop(nid)
                if not run["confirmed"]:
                    for held in run["windows"]:
                        _release(state, held, nid)
        straggling = False
        for nid in sorted(slow_ids):
            on = nodes[w] == nid
            detail = {
                **info,
                "ranks": sorted(int(r) for r in ranks[w][on & slow_rank[w]]),
                "peer": float(np.nanmin(peer[w][on])),
                "own": float(np.nanmin(own[w][on])),
            }
            run = runs.setdefault(str(nid), {"confirmed": False, "windows": []})
            name = names.get(nid, f"node-{nid}")
            if run["confirmed"]:
                _count_slow(state, name, detail, world)
                straggling = True
                continue
            run["windows"].append(detail)
            pending.setdefault(key, [info["step_s"], []])[1].append(str(nid))
            if len(run["windows"]) >= streak:  # the streak counts: all of it is straggling
                first_w, last_w = run["windows"][0], run["windows"][-1]
                s = state["stragglers"].get(name)
                if s is None:
                    state["stragglers"][name] = {
                        "node": name,
                        "first_ts": first_w["ts"],
                        "detected_ts": last_w["ts"],
                        "first_step": first_w["first"],
                    }
                for held in run["windows"]:
                    pending.pop(held["key"], None)  # straggling: never a normal window
                    _count_slow(state, name, held, world)
                run["confirmed"], run["windows"] = True, []
                straggling = True
        if straggling:
            pending.pop(key, None)
        elif not slow_ids:
            _add_baseline(state, info["step_s"])


def _release(state, held: dict, nid: str) -> None:
    """A window of a streak too short to count: normal once no streak holds it."""
    entry = state["undecided"].get(held["key"])
    if entry is None:
        return
    if nid in entry[1]:
        entry[1].remove(nid)
    if not entry[1]:
        del state["undecided"][held["key"]]
        _add_baseline(state, entry[0])


def _add_baseline(state, step_s: float) -> None:
    state["baseline"] = ([*state["baseline"], step_s])[-BASELINE_WINDOWS:]


def _count_slow(state, name: str, detail: dict, world: int) -> None:
    s = state["stragglers"][name]
    baseline = float(np.median(state["baseline"])) if state["baseline"] else 0.0
    s["ranks"] = sorted(set(s.get("ranks", [])) | set(detail["ranks"]))
    s["windows"] = s.get("windows", 0) + 1
    s["worst_peer"] = min(s.get("worst_peer", 1.0), detail["peer"])
    s["worst_own"] = min(s.get("worst_own", 1.0), detail["own"])
    excess = max(0.0, detail["step_s"] - baseline) * detail["steps"] * world
    s["excess_gpu_s"] = s.get("excess_gpu_s", 0.0) + excess
    evidence = s.setdefault("evidence", [])
    if len(evidence) < EVIDENCE_WINDOWS:
        evidence.append(f"window:{detail['key']}")


# --- dead nodes ------------------------------------------------------------------

OPEN_BUCKETS = 2  # a node's latest buckets may still fill (its ranks report out of step)


def _advance_beats(job, state, launches, finished, upto: int, cfg) -> list[Signal]:
    """A node of a launch that had been sending heartbeats and stopped for longer
    than `dead_node.timeout_s` while the launch went on (on the job's clock).
    Nodes that never sent a heartbeat in the launch are not expected to.

    Per node the state keeps every silence longer than the timeout between
    buckets that can no longer change, and its latest buckets, which it re-reads
    each pass.
    """
    timeout = max(cfg["dead_node.timeout_s"], HeartbeatBucket.BUCKET_S)
    beats = state["beats"]
    heads = [o[0] for b in beats.values() for o in b["open"]]
    columns = ("id", "node", "bucket", "first_ts", "last_ts")
    after = state["cursor"]["beat"]
    if after:  # the buckets stored since, by id range (see _rows), and the open ones
        rows = list(
            HeartbeatBucket.objects.filter(id__gt=after, id__lte=upto)
            .annotate(job_plus=F("job_id") + 0)
            .filter(job_plus=job.id)
            .values_list(*columns)
        )
        rows += HeartbeatBucket.objects.filter(id__in=heads, job=job).values_list(*columns)
    else:
        rows = HeartbeatBucket.objects.filter(job=job, id__lte=upto).values_list(*columns)
    by_node: dict[str, list] = {}
    for row in rows:
        by_node.setdefault(row[1], []).append(row)
    for node, node_rows in by_node.items():
        b = beats.setdefault(node, {"open": [], "silences": [], "closed_last": None})
        buckets = {o[1]: list(o) for o in b["open"]}
        for id_, _, bucket, first, last in node_rows:
            if b["open"] and bucket < b["open"][0][1]:
                raise Rebuild  # a heartbeat behind the buckets read
            buckets[bucket] = [id_, bucket, first, last]
        ordered = sorted(buckets.values(), key=lambda o: o[1])
        for o in ordered[:-OPEN_BUCKETS]:  # these can no longer change
            if b["closed_last"] is not None and o[2] - b["closed_last"] > timeout:
                b["silences"].append([b["closed_last"], o[2]])
            b["closed_last"] = o[3]
        b["open"] = ordered[-OPEN_BUCKETS:]

    found = []
    attempts = {
        a.number: a
        for a in Attempt.objects.filter(job=job, number__in=[x.number for x in launches])
        .exclude(started_at=None)
        .prefetch_related("nodes")
    }
    for k, launch in enumerate(launches):
        attempt = attempts.get(launch.number)
        stop = _stop(job, launches, k, finished)
        if attempt is None or stop is None:
            continue
        start = attempt.started_at.timestamp()
        for node in attempt.nodes.all():
            b = beats.get(node.name)
            if b is None:
                continue
            silences = list(b["silences"])
            last = b["closed_last"]
            for o in b["open"]:
                if last is not None and o[2] - last > timeout:
                    silences.append([last, o[2]])
                last = o[3]
            gaps = [(a, min(z, stop) - a) for a, z in silences] + [(last, stop - last)]
            over = [(a, gap) for a, gap in gaps if start <= a <= stop and gap > timeout]
            if not over:
                continue
            silent_from, gap = over[0]
            found.append(
                Signal(
                    client_id=f"inferred:dead_node:{launch.number}:{node.name}",
                    kind="fault",
                    ts=silent_from,
                    attempt=launch.number,
                    node=node.name,
                    rank=None,
                    data={"type": "dead_node", "silent_s": float(gap)},
                    detected_ts=silent_from + timeout,
                )
            )
    return found


# --- episodes ---------------------------------------------------------------------


def steps_between(job: TrainingJob, attempt: int, t0: float, t1: float, enough: int) -> int:
    """How many steps the launch made between two times, counting up to `enough`.

    Asked only of launches with two different faults; the answer is kept once
    it can no longer change (enough steps, or steps read past t1)."""
    state = DetectorState.objects.filter(job=job).values_list("data", flat=True).first() or {}
    key = f"{attempt}:{t0!r}:{t1!r}:{enough}"
    known = state.get("splits", {}).get(key)
    if known is not None:
        return known
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT 1 FROM jobs_steprecord WHERE job_id = %s"
            " AND attempt = %s AND ts > %s AND ts < %s LIMIT %s) s",
            [job.id, attempt, t0, t1, enough],
        )
        count = cursor.fetchone()[0]
    s = state.get("launches", {}).get(str(attempt), {}).get("steps") or {}
    if count >= enough or (s.get("last_ts") or -math.inf) >= t1:
        with transaction.atomic():
            row = DetectorState.objects.select_for_update().filter(job=job).first()
            if row is not None and row.data:
                row.data.setdefault("splits", {})[key] = count
                row.save(update_fields=["data", "updated_at"])
    return count
