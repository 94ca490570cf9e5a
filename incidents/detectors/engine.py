"""The incremental pass: what the detectors have read of a job so far, so that a pass
reads only what is new.

Hangs, loss trouble, dead nodes and stragglers are found from a job's steps,
rank windows and heartbeats. Re-reading the whole history on every pass would
make detection cost grow with the job's length; instead a pass reads the rows
stored since the last one and carries each detector's running state
(incidents.detectors.state) in the job's DetectorState.

Rows are picked by id: with the job's lock taken for a moment no ingest of
this job is in flight, so every row of the job with an id up to the table's
highest is stored, and rows stored later get higher ids. Rows that land behind
what was already read (a late batch, a resent spill), a changed setting, a
launch boundary that moved, or a stored state of another version make the
pass rebuild the state from every row. Heartbeats are the exception: a node's
view depends on its own buckets only, so one that lands behind them makes the
pass read that node's buckets again (Watch.nodes_reread), not rebuild the job.
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

from incidents.detectors import dead_node, hang, loss, straggler
from incidents.detectors.base import Signal
from incidents.detectors.state import STREAMS, EngineState, Rebuild, Straggler
from incidents.models import DetectorState
from jobs.accounting import Steps, build_launches
from jobs.columns import FLOAT, INT, load_columns
from jobs.models import (
    Event,
    HeartbeatBucket,
    RankWindow,
    StepRecord,
    StreamRollup,
    TrainingJob,
)

# The settings the engine's detectors read; the state remembers their values.
SETTINGS = (
    "hang.factor",
    "hang.floor_s",
    "hang.skip_steps",
    "hang.save_allowance_s",
    "hang.warmup_timeout_s",
    "hang.smoothing",
    "hang.pause_max_s",
    "loss.window",
    "loss.mad_factor",
    "loss.min_rel",
    "loss.warmup_steps",
    "straggler.windows",
    "dead_node.timeout_s",
)


@dataclass
class Watch:
    """What the detectors found in a job's steps, windows and heartbeats."""

    hangs: list[Signal]
    losses: list[Signal]
    dead_nodes: list[Signal]
    stragglers: list[Straggler]
    rebuilt: bool = False
    rows_read: int = 0
    # Nodes whose heartbeats were read again (one landed behind them), in place of a rebuild.
    nodes_reread: list[str] = field(default_factory=list)
    partial: bool = False  # see EngineState.partial


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
    ("id", INT),
]
_TABLES = {"step": StepRecord, "window": RankWindow, "beat": HeartbeatBucket, "event": Event}
assert tuple(_TABLES) == STREAMS


def _bounds(job: TrainingJob) -> dict[str, int]:
    """The highest id of each stream table, read while no ingest of the job is in flight.

    The job's lock is let go as soon as they are read (rolled back to a savepoint:
    PostgreSQL releases the row locks taken since), not when the caller's transaction
    ends: a pass runs in one (incidents_detect_pass), and ingest of the job waits on
    this lock (at 16,384 ranks a pass takes most of a second)."""
    with transaction.atomic():
        held = transaction.savepoint()
        TrainingJob.objects.select_for_update().filter(pk=job.pk).values_list("pk").first()
        with connection.cursor() as cursor:
            bounds = {}
            for name, model in _TABLES.items():
                cursor.execute(f"SELECT max(id) FROM {model._meta.db_table}")
                bounds[name] = cursor.fetchone()[0] or 0
        transaction.savepoint_rollback(held)  # only the lock to undo: nothing was written
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

    `cfg`: the job's detector settings (read once for the pass). `clock` (the
    sweep's) is where the job's clock would be had it gone on: the open tail of a
    running launch is judged up to it."""
    cfg = {k: float(cfg[k]) for k in SETTINGS}
    if clock is not None and (job.last_event_ts is None or clock > job.last_event_ts):
        job = copy.copy(job)
        job.last_event_ts = clock  # on this copy only: open tails run to it
    bounds = _bounds(job)
    with transaction.atomic():
        DetectorState.objects.get_or_create(job=job)
        row = DetectorState.objects.select_for_update().get(job=job)
        try:
            if not row.data:
                raise Rebuild  # nothing read yet
            state = EngineState.from_dict(row.data)
            if state.cfg != cfg:
                raise Rebuild
            watch = _advance(job, state, bounds)
        except Rebuild:
            rolled = StreamRollup.objects.filter(job=job).exclude(windows_rolled={}).exists()
            state = EngineState(cfg=cfg, partial=rolled)
            watch = _advance(job, state, bounds)
            watch.rebuilt = True
        watch.partial = state.partial
        row.data = state.to_dict()
        row.save(update_fields=["data", "updated_at"])
    return watch


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


def _advance(job, state: EngineState, bounds: dict) -> Watch:
    cfg = state.cfg
    cursor = state.cursor
    upto = {k: max(bounds[k], cursor[k]) for k in bounds}

    steps = _rows("jobs_steprecord", _STEP_COLUMNS, job.id, cursor["step"], upto["step"])
    windows = _rows("jobs_rankwindow", _WINDOW_COLUMNS, job.id, cursor["window"], upto["window"])
    for number, ts in zip(steps[0].tolist(), steps[2].tolist(), strict=True):
        ls = state.launch(number, ts)
        ls.first_ts = min(ls.first_ts, ts)
    for number, ts in zip(windows[0].tolist(), windows[5].tolist(), strict=True):
        ls = state.launch(number, ts)
        ls.first_ts = min(ls.first_ts, ts)

    # Save starts matter from the oldest interval still to be judged on.
    heads = [
        ls.steps.last_ts
        for ls in state.launches.values()
        if ls.steps is not None and ls.steps.n and ls.steps.closed is None
    ]
    new_first = [float(steps[2].min())] if len(steps[2]) else []
    since = min([*heads, *new_first], default=math.inf)
    lifecycle = _lifecycle(job, since)

    # The launches as the lifecycle and the first rows seen of each place them.
    seen = sorted((n, ls.first_ts) for n, ls in state.launches.items())
    anchor = Steps(
        attempt=np.array([n for n, _ in seen], dtype=np.int64),
        step=np.zeros(len(seen), dtype=np.int64),
        ts=np.array([t for _, t in seen], dtype=np.float64),
        seq=np.zeros(len(seen), dtype=np.int64),
    )
    launches, finished = build_launches(lifecycle, anchor)
    order = [launch.number for launch in launches]
    done = [n for n in state.order if n in state.launches and state.launches[n].started]
    if [n for n in order if n in done] != done:
        raise Rebuild  # a launch with rows read moved in the order
    state.order = order
    _check_late_lifecycle(job, state, upto["event"])

    _pending_read(job, state, cursor["window"])
    hangs = hang.advance(job, state, launches, finished, steps, cfg)
    losses = loss.advance(state, steps, cfg)
    stragglers = straggler.advance(state, launches, windows, cfg)
    beats = dead_node.advance(job, state, launches, finished, upto["beat"], cfg)
    state.cursor = upto
    rows = len(steps[0]) + len(windows[0])
    return Watch(hangs, losses, beats.dead, stragglers, rows_read=rows, nodes_reread=beats.reread)


def _pending_read(job, state: EngineState, read_upto: int) -> None:
    """Read back the windows not complete yet of the launches that have some: the rows
    from the lowest id among them to what earlier passes read, of that launch, past
    its last complete window."""
    for number, ls in state.launches.items():
        if ls.pending is not None or ls.pending_from is None:
            continue
        rows = _rows("jobs_rankwindow", _WINDOW_COLUMNS, job.id, ls.pending_from - 1, read_upto)
        head = ls.windows.head if ls.windows is not None else None
        keep = rows[0] == number
        if head is not None:
            keep &= rows[1] > head
        ls.pending = [c[keep].tolist() for c in rows]


def _check_late_lifecycle(job, state: EngineState, upto: int) -> None:
    """A save start behind the steps already read changes the allowance of an
    interval already judged. (Launch starts and ends only move the open tail,
    which every pass judges anew, or the launches' order, checked above.)"""
    after = state.cursor["event"]
    if not after:
        return  # a fresh state: nothing read yet
    late = (
        Event.objects.filter(id__gt=after, id__lte=upto, kind="checkpoint_save_started")
        .annotate(job_plus=F("job_id") + 0)  # by id range, see _rows
        .filter(job_plus=job.id)
        .values_list("attempt", "ts")
    )
    for attempt, ts in late:
        ls = state.launches.get(attempt)
        s = ls.steps if ls is not None else None
        if s is not None and s.n and ts < s.last_ts:
            raise Rebuild


# --- episodes ---------------------------------------------------------------------


def steps_between(job: TrainingJob, attempt: int, t0: float, t1: float, enough: int) -> int:
    """How many steps the launch made between two times, counting up to `enough`.

    Asked only of launches with two different faults; the answer is kept once
    it can no longer change (enough steps, or steps read past t1)."""
    data = DetectorState.objects.filter(job=job).values_list("data", flat=True).first()
    try:
        state = EngineState.from_dict(data or {})
    except Rebuild:
        state = None  # nothing kept (yet) that can be trusted
    key = f"{attempt}:{t0!r}:{t1!r}:{enough}"
    known = state.splits.get(key) if state is not None else None
    if known is not None:
        return known
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT 1 FROM jobs_steprecord WHERE job_id = %s"
            " AND attempt = %s AND ts > %s AND ts < %s LIMIT %s) s",
            [job.id, attempt, t0, t1, enough],
        )
        count = cursor.fetchone()[0]
    ls = state.launches.get(attempt) if state is not None else None
    last_ts = ls.steps.last_ts if ls is not None and ls.steps is not None else None
    if count >= enough or (last_ts if last_ts is not None else -math.inf) >= t1:
        with transaction.atomic():
            row = DetectorState.objects.select_for_update().filter(job=job).first()
            if row is not None and row.data:
                try:
                    kept = EngineState.from_dict(row.data)
                except Rebuild:
                    return count
                kept.splits[key] = count
                row.data = kept.to_dict()
                row.save(update_fields=["data", "updated_at"])
    return count
