"""Storage upkeep of the stream tables: what each keeps, and for how long (README,
"Storage").

- Plain heartbeats (no data) are never stored raw: ingest folds them into
  HeartbeatBucket rows. Buckets older than REBOUND_KEEP_HEARTBEAT_BUCKETS_S (job clock)
  are merged into spans: a node's consecutive buckets no further apart than a gap
  (never more than the dead-node timeout) become one row, so every longer silence stays
  exactly as it was. On PostgreSQL an hour's partition of buckets is replaced by its
  spans (jobs.partitions); elsewhere the merged buckets are deleted.
- Rank windows stay raw for REBOUND_KEEP_RANK_WINDOWS_S (job clock), then are rolled up
  per launch, node and hour (RankWindowHour); the windows an incident names as
  evidence are copied to EvidenceWindow first. On PostgreSQL the raw windows then go
  with their hour's partition, once every job's windows in it are rolled up
  (jobs.partitions); elsewhere they are deleted. A window rolled up that is sent again is
  not stored again (ingest reads StreamRollup.windows_rolled).
- The raw events of rank windows in jobs_event stay REBOUND_KEEP_WINDOW_EVENTS_S (server
  clock): their client ids tell a resend meanwhile; after that the window's own key
  does (launch, rank and first step), and the rolled-up frontier.
- Steps (their raw events too), launches, faults and checkpoints are kept.

The caller says how far each job may go (`Limits`): never past what detection has
read (incidents.upkeep). A job is rolled up holding its lock, which ingest takes first.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from common.vocabulary import BRIEFLY_KEPT_KINDS
from jobs import partitions
from jobs.bulk import delete_ids, upsert_spans
from jobs.columns import FLOAT, INT, load_columns
from jobs.models import (
    Event,
    EvidenceWindow,
    HeartbeatBucket,
    RankWindow,
    RankWindowHour,
    StreamRollup,
    TrainingJob,
    UpkeepRun,
)

# Ids read per statement: a job's rows are found by id range (what was stored since),
# a bounded range at a time.
ID_RANGE = 200_000
RUNS_KEPT_S = 30 * 86400  # upkeep's own reports


@dataclass(frozen=True)
class Limits:
    """How far upkeep may go in one job: what detection has read and still needs."""

    beats_upto_id: int  # the heartbeat buckets read by detection
    beats_held: frozenset[int]  # buckets it may still read again (a node's latest)
    span_gap_s: float  # buckets this close are merged (at most the dead-node timeout)
    windows_upto_id: int  # the rank windows read, below the first one it waits on
    window_heads: dict[int, int]  # per launch, the last complete window judged
    ended: frozenset[int]  # launches over before the windows' cutoff: all may go
    evidence: frozenset[tuple[int, int, int]]  # (launch, first step, node id)


@dataclass
class UpkeepTotals:
    jobs: int = 0
    heartbeat_buckets_merged: int = 0
    rank_windows_rolled: int = 0
    rank_window_hours: int = 0
    evidence_windows: int = 0
    stream_events_dropped: int = 0
    waiting_for_detection: list[str] = field(default_factory=list)
    window_hours_made: int = 0
    window_hours_dropped: int = 0
    beat_hours_made: int = 0
    beat_hours_rolled: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def storage_upkeep(
    *, limits_of: Callable[[TrainingJob], Limits], now: datetime | None = None
) -> UpkeepRun:
    """Roll up and drop what each stream no longer needs, in every job with something
    new since the last run; the run's report is stored and returned."""
    now = now or timezone.now()
    run = UpkeepRun.objects.create(
        started_at=now,
        event_id_at_start=Event.objects.aggregate(m=Max("id"))["m"] or 0,
    )
    totals = UpkeepTotals()
    if partitions.partitioned():
        ahead = int(settings.REBOUND_PARTITIONS_AHEAD_S // partitions.HOUR_S)
        made = partitions.hours_ensure(partitions.WINDOWS, now.timestamp(), ahead)
        totals.window_hours_made = len(made)
        totals.beat_hours_made = len(
            partitions.hours_ensure(partitions.BEATS, now.timestamp(), ahead)
        )
    for job in _jobs_to_visit():
        totals.jobs += 1
        _job_upkeep(job, limits_of, totals)
    if partitions.partitioned():
        # An hour of windows goes once every job's windows in it are rolled up.
        dropped = partitions.window_hours_drop(
            dict(StreamRollup.objects.values_list("job_id", "windows_upto_id")),
            before_ts=now.timestamp() - settings.REBOUND_KEEP_RANK_WINDOWS_S,
        )
        totals.window_hours_dropped = len(dropped)
        _roll_beat_hours(now, limits_of, totals)
    totals.stream_events_dropped = _drop_stream_events(run, now)
    UpkeepRun.objects.filter(started_at__lt=now - timedelta(seconds=RUNS_KEPT_S)).exclude(
        pk=run.pk
    ).delete()
    run.finished_at = timezone.now()
    run.report = totals.as_dict()
    run.save(update_fields=["finished_at", "report", "events_dropped_upto"])
    return run


def _jobs_to_visit():
    rolled = dict(StreamRollup.objects.filter(waiting=False).values_list("job_id", "revision"))
    for job in TrainingJob.objects.exclude(last_event_ts=None).order_by("id").iterator():
        if rolled.get(job.id) != job.revision:
            yield job


def _job_upkeep(job: TrainingJob, limits_of, totals: UpkeepTotals) -> None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        rollup, _ = StreamRollup.objects.get_or_create(job=job)
        limits = limits_of(job)
        beats_waiting = _roll_heartbeats(job, rollup, limits, totals)
        windows_waiting = _roll_windows(job, rollup, limits, totals)
        rollup.revision = job.revision
        rollup.waiting = beats_waiting or windows_waiting
        if rollup.waiting:
            totals.waiting_for_detection.append(job.key)
        rollup.save()


# --- heartbeats ----------------------------------------------------------------------


def _roll_heartbeats(job, rollup: StreamRollup, limits: Limits, totals) -> bool:
    """Merge the job's buckets past the horizon into spans; True if some wait for
    detection to read them. On PostgreSQL only those in the default partition: the
    others are merged when their hour's partition goes (_roll_beat_hours)."""
    size = HeartbeatBucket.BUCKET_S
    cutoff = math.floor((job.last_event_ts - settings.REBOUND_KEEP_HEARTBEAT_BUCKETS_S) / size)
    table = partitions.BEATS.default if partitions.partitioned() else partitions.BEATS.table
    lo = rollup.beats_upto_id
    while lo < limits.beats_upto_id:
        hi = min(lo + ID_RANGE, limits.beats_upto_id)
        rows = _bucket_rows(table, job.id, lo, hi)
        # The first bucket inside the horizon stops the run: the next one starts there.
        stop = next((r[0] for r in rows if r[2] >= cutoff and r[0] not in limits.beats_held), None)
        keep, gone = spans_of(
            [r for r in rows if stop is None or r[0] < stop], limits.span_gap_s, limits.beats_held
        )
        if gone:
            upsert_spans(
                HeartbeatBucket,
                ["job", "node", "bucket"],
                [[job.id] * len(keep), *[[r[k] for r in keep] for k in (1, 2, 3, 4)]],
                "first_ts",
                "last_ts",
            )
            delete_ids(table, gone)
            totals.heartbeat_buckets_merged += len(gone)
        if stop is not None:
            rollup.beats_upto_id = stop - 1
            return False
        lo = rollup.beats_upto_id = hi
    return any(r[2] < cutoff for r in _bucket_rows(table, job.id, lo, lo + ID_RANGE))


def _bucket_rows(table: str, job_id: int, lo: int, hi: int) -> list[tuple]:
    """(id, node, bucket, first_ts, last_ts) of the job's buckets with ids in (lo, hi]."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, node, bucket, first_ts, last_ts FROM {table}"
            " WHERE id > %s AND id <= %s AND job_id + 0 = %s ORDER BY id",
            [lo, hi, job_id],
        )
        return cur.fetchall()


def spans_of(rows, gap_s: float, held: frozenset[int]) -> tuple[list[list], list[int]]:
    """Runs of a node's buckets no more than `gap_s` apart, each as its first row widened
    ([id, node, bucket, first_ts, last_ts]), and the ids of the rows merged into them.
    A row detection holds to read again (`held`) stays as it is."""
    by_node: dict[str, list] = defaultdict(list)
    keep, gone = [], []
    for r in rows:
        if r[0] in held:
            keep.append(list(r))
        else:
            by_node[r[1]].append(r)
    for node, node_rows in by_node.items():
        node_rows.sort(key=lambda r: r[2])
        run = None
        for id_, _, bucket, first, last in node_rows:
            if run is not None and first - run[4] <= gap_s:
                run[4] = max(run[4], last)
                run[3] = min(run[3], first)
                gone.append(id_)
                continue
            run = [id_, node, bucket, first, last]
            keep.append(run)
    return keep, gone


def _roll_beat_hours(now: datetime, limits_of, totals: UpkeepTotals) -> None:
    """On PostgreSQL: each hour's partition of buckets past the horizon, once detection
    has read it, goes; the spans of its buckets stay (in the default partition), under
    their first bucket's id, so that detection sees nothing new."""
    cutoff = now.timestamp() - settings.REBOUND_KEEP_HEARTBEAT_BUCKETS_S
    cache: dict[int, Limits] = {}

    def limits(job_id: int) -> Limits:
        if job_id not in cache:
            cache[job_id] = limits_of(TrainingJob.objects.get(pk=job_id))
        return cache[job_id]

    def roll(rows) -> list[list] | None:
        by_job: dict[int, list] = defaultdict(list)
        for r in rows:
            by_job[r[1]].append((r[0], *r[2:]))
        spans = []
        for job_id, job_rows in by_job.items():
            lim = limits(job_id)
            if max(r[0] for r in job_rows) > lim.beats_upto_id:
                key = TrainingJob.objects.get(pk=job_id).key
                if key not in totals.waiting_for_detection:
                    totals.waiting_for_detection.append(key)
                return None  # not read by detection yet: the next run
            keep, gone = spans_of(job_rows, lim.span_gap_s, lim.beats_held)
            spans += [[job_id, *r] for r in keep]
            totals.heartbeat_buckets_merged += len(gone)
        return spans

    for _ in partitions.beat_hours_roll(cutoff, roll):
        totals.beat_hours_rolled += 1


# --- rank windows --------------------------------------------------------------------

_COLUMNS = [
    ("id", INT),
    ("attempt", INT),
    ("rank", INT),
    ("COALESCE(node_id, -1)", INT),
    ("first_step", INT),
    ("ts", FLOAT),
    ("compute_s", FLOAT),
    ("step_s", FLOAT),
]


def _roll_windows(job, rollup: StreamRollup, limits: Limits, totals) -> bool:
    """Roll the job's windows past the horizon up per launch, node and hour; True if
    some wait for detection to read them."""
    cutoff = job.last_event_ts - settings.REBOUND_KEEP_RANK_WINDOWS_S
    lo = rollup.windows_upto_id
    while lo < limits.windows_upto_id:
        hi = min(lo + ID_RANGE, limits.windows_upto_id)
        cols = load_columns(
            "jobs_rankwindow",
            _COLUMNS,
            "id > %s AND id <= %s AND job_id + 0 = %s",
            [lo, hi, job.id],
        )
        order = np.argsort(cols[0])
        ids, attempt, rank, node, first, ts, compute, step = (c[order] for c in cols)
        roll = np.zeros(len(ids), dtype=bool)
        for number in np.unique(attempt).tolist():
            mine = attempt == number
            # Whole windows only: the first one with a rank inside the horizon, and
            # the ones after it, stay (and, in a running launch, the ones not judged).
            recent = first[mine & (ts >= cutoff)]
            cut = int(recent.min()) - 1 if len(recent) else int(first[mine].max())
            if number not in limits.ended:
                cut = min(cut, limits.window_heads.get(number, -1))
            roll |= mine & (first <= cut)
        columns = [c[roll] for c in (ids, attempt, rank, node, first, ts, compute, step)]
        _roll_up(job, rollup, limits, totals, *columns)
        if not roll.all():
            rollup.windows_upto_id = int(ids[~roll].min()) - 1
            return False
        lo = rollup.windows_upto_id = hi
    return _of_job(RankWindow, job, lo, lo + ID_RANGE).filter(ts__lt=cutoff).exists()


def _of_job(model, job, lo: int, hi: int):
    """The job's rows with ids in (lo, hi], found by id range (`job_id + 0` keeps the
    planner off the job's index, which would read all of the job's rows)."""
    return (
        model.objects.filter(id__gt=lo, id__lte=hi)
        .annotate(job_plus=F("job_id") + 0)
        .filter(job_plus=job.id)
    )


def _roll_up(job, rollup, limits, totals, ids, attempt, rank, node, first, ts, compute, step):
    if not len(ids):
        return
    _keep_evidence(job, limits, totals, ids, attempt, node, first)
    hour = np.floor(ts / partitions.HOUR_S).astype(np.int64)
    o = np.lexsort((compute, hour, node, attempt))
    attempt, rank, node, hour, compute, step = (
        a[o] for a in (attempt, rank, node, hour, compute, step)
    )
    edge = np.ones(len(o), dtype=bool)
    edge[1:] = (attempt[1:] != attempt[:-1]) | (node[1:] != node[:-1]) | (hour[1:] != hour[:-1])
    starts = np.flatnonzero(edge)
    ends = np.append(starts[1:], len(o))
    existing = {
        (h.attempt, h.node_id if h.node_id is not None else -1, h.hour): h
        for h in RankWindowHour.objects.filter(job=job, hour__in=np.unique(hour).tolist())
    }
    new, changed = [], []
    for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
        key = (int(attempt[a]), int(node[a]), int(hour[a]))
        low, high, slowest = float(compute[a]), float(compute[z - 1]), int(rank[z - 1])
        h = existing.get(key)
        if h is None:
            new.append(
                RankWindowHour(
                    job=job,
                    attempt=key[0],
                    node_id=key[1] if key[1] >= 0 else None,
                    hour=key[2],
                    windows=z - a,
                    compute_min_s=low,
                    compute_mean_s=float(compute[a:z].mean()),
                    compute_max_s=high,
                    step_mean_s=float(step[a:z].mean()),
                    slowest_rank=slowest,
                )
            )
            continue
        # More of an hour rolled up already (a run rolls what passed the horizon since
        # the last): the means weighted by the windows.
        n = z - a
        total = h.windows + n
        h.compute_mean_s = (h.compute_mean_s * h.windows + float(compute[a:z].sum())) / total
        h.step_mean_s = (h.step_mean_s * h.windows + float(step[a:z].sum())) / total
        h.windows = total
        h.compute_min_s = min(h.compute_min_s, low)
        if high > h.compute_max_s:
            h.compute_max_s, h.slowest_rank = high, slowest
        changed.append(h)
    RankWindowHour.objects.bulk_create(new)
    RankWindowHour.objects.bulk_update(
        changed,
        [
            "windows",
            "compute_min_s",
            "compute_mean_s",
            "compute_max_s",
            "step_mean_s",
            "slowest_rank",
        ],
    )
    # On PostgreSQL the rows in an hour's partition go with it (jobs.partitions).
    where = partitions.WINDOWS.default if partitions.partitioned() else partitions.WINDOWS.table
    delete_ids(where, ids.tolist())
    rolled = dict(rollup.windows_rolled)
    for number in np.unique(attempt).tolist():
        top = int(first[o][attempt == number].max())
        rolled[str(number)] = max(rolled.get(str(number), top), top)
    rollup.windows_rolled = rolled
    totals.rank_windows_rolled += len(ids)
    totals.rank_window_hours += len(new)


def _keep_evidence(job, limits, totals, ids, attempt, node, first) -> None:
    if not limits.evidence:
        return
    named = [
        i
        for i, a, n, f in zip(
            ids.tolist(), attempt.tolist(), node.tolist(), first.tolist(), strict=True
        )
        if (a, f, n) in limits.evidence
    ]
    fields = [
        f.attname for f in EvidenceWindow._meta.concrete_fields if f.name not in ("id", "job")
    ]
    kept = [
        EvidenceWindow(job=job, **{f: getattr(w, f) for f in fields})
        for w in RankWindow.objects.filter(id__in=named)
    ]
    EvidenceWindow.objects.bulk_create(kept, ignore_conflicts=True)
    totals.evidence_windows += len(kept)


# --- raw events ------------------------------------------------------------------------


def _drop_stream_events(run: UpkeepRun, now: datetime) -> int:
    """Drop the raw events of rank windows stored before the latest run that
    is REBOUND_KEEP_WINDOW_EVENTS_S old (by id: what a run saw as the highest)."""
    keep = timedelta(seconds=settings.REBOUND_KEEP_WINDOW_EVENTS_S)
    due = (
        UpkeepRun.objects.filter(started_at__lte=now - keep)
        .exclude(pk=run.pk)
        .order_by("-started_at", "-id")
        .first()
    )
    lo = UpkeepRun.objects.aggregate(m=Max("events_dropped_upto"))["m"] or 0
    run.events_dropped_upto = lo
    if due is None or due.event_id_at_start <= lo:
        return 0
    dropped = 0
    while lo < due.event_id_at_start:
        hi = min(lo + ID_RANGE, due.event_id_at_start)
        dropped += Event.objects.filter(
            id__gt=lo, id__lte=hi, kind__in=BRIEFLY_KEPT_KINDS
        ).delete()[0]
        lo = run.events_dropped_upto = hi
    return dropped
