"""Reads of the jobs app: jobs with their summary, and the cached ledger."""

from datetime import UTC, datetime

import numpy as np
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Max, Min, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from jobs.accounting import Ledger, job_ledger, merge_intervals, save_blocking
from jobs.models import (
    Attempt,
    Checkpoint,
    LedgerSnapshot,
    RankWindow,
    StepRecord,
    TrainingJob,
)


def attempts_latest_first(job) -> QuerySet[Attempt]:
    """A job's launches, newest first; `job` is a job, its id or an `OuterRef` (for a
    subquery per job of an outer query)."""
    return Attempt.objects.filter(job=job).order_by("-number")


def job_latest_attempt(job, *, started: bool = False) -> Attempt | None:
    """The job's newest launch; with `started`, its newest launch that has started,
    falling back to the newest at all."""
    attempts = attempts_latest_first(job)
    if started:
        return attempts.exclude(started_at=None).first() or attempts.first()
    return attempts.first()


def checkpoints_durable_latest_first(
    job, *, saved_by=None, attempt: int | None = None
) -> QuerySet[Checkpoint]:
    """A job's durable checkpoints, newest first (by save time, then step); `job` as in
    `attempts_latest_first`; `saved_by` keeps those saved at or before a time,
    `attempt` those of one launch."""
    qs = Checkpoint.objects.filter(job=job, durable=True).exclude(saved_at=None)
    if saved_by is not None:
        qs = qs.filter(saved_at__lte=saved_by)
    if attempt is not None:
        qs = qs.filter(attempt=attempt)
    return qs.order_by("-saved_at", "-step")


def job_latest_durable_checkpoint(
    job, *, saved_by=None, attempt: int | None = None
) -> Checkpoint | None:
    """The checkpoint a relaunch of the job would restore (see
    `checkpoints_durable_latest_first`)."""
    return checkpoints_durable_latest_first(job, saved_by=saved_by, attempt=attempt).first()


def job_list(*, cluster: str | None = None, status: str | None = None) -> QuerySet[TrainingJob]:
    latest_attempt = Attempt.objects.filter(job=OuterRef("pk")).order_by("-number")
    last_durable = Checkpoint.objects.filter(job=OuterRef("pk"), durable=True).order_by(
        "-saved_at", "-step"
    )
    qs = (
        TrainingJob.objects.select_related("cluster", "ledger")
        .annotate(
            current_attempt_id=Subquery(latest_attempt.values("id")[:1]),
            last_durable_checkpoint_id=Subquery(last_durable.values("id")[:1]),
        )
        .order_by("-created_at", "-id")
    )
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if status:
        qs = qs.filter(status=status)
    return qs


def attach_summaries(jobs: list[TrainingJob]) -> None:
    """Set `current_attempt` and `last_durable_checkpoint` on each job in two queries."""
    attempts = Attempt.objects.in_bulk([j.current_attempt_id for j in jobs if j.current_attempt_id])
    checkpoints = Checkpoint.objects.in_bulk(
        [j.last_durable_checkpoint_id for j in jobs if j.last_durable_checkpoint_id]
    )
    for j in jobs:
        j.current_attempt = attempts.get(j.current_attempt_id)
        j.last_durable_checkpoint = checkpoints.get(j.last_durable_checkpoint_id)


def job_attempts(*, job: TrainingJob) -> QuerySet[Attempt]:
    return job.attempts.prefetch_related(Prefetch("nodes")).order_by("number")


def job_checkpoints(*, job: TrainingJob) -> QuerySet[Checkpoint]:
    return job.checkpoints.order_by("saved_at", "step", "attempt")


def job_goodput(
    *,
    job: TrainingJob,
    start: float | None = None,
    end: float | None = None,
    allow_stale: bool = False,
) -> dict:
    """The ledger's figures; the cumulative one is cached per job revision.

    Lists pass `allow_stale`: they show the last snapshot (ingest has a
    refresh on its way, see services) rather than recompute every job.
    """
    if start is not None or end is not None:
        return job_ledger(job, start=start, end=end).as_dict()
    snapshot = getattr(job, "ledger", None) if _has_cached_ledger(job) else None
    if snapshot is not None and (allow_stale or snapshot.revision == job.revision):
        return snapshot.figures
    figures = job_ledger(job).as_dict()
    try:
        with transaction.atomic():
            LedgerSnapshot.objects.update_or_create(
                job=job, defaults={"revision": job.revision, "figures": figures}
            )
    except IntegrityError:
        pass  # a concurrent reader stored the same figures first
    return figures


def _has_cached_ledger(job: TrainingJob) -> bool:
    try:
        job.ledger  # noqa: B018
    except LedgerSnapshot.DoesNotExist:
        return False
    return True


# --- goodput of the last hour, for many running jobs at once --------------------------
# The exact figure is job_ledger(job, start=last event - 1 h); it reads every step of
# the job (a 1,000,000-step job takes about a second), far too much for a page that
# lists 100 jobs. This reads instead what the current launch's rows already tell:
# its first step (an index lookup), the job's latest step and the launch's
# checkpoints saved in the hour. When the current launch was already training at
# the window's start, the launch's step time in the window, less checkpoint blocking,
# IS the ledger's productive time there (its steps are the latest execution of their
# numbers); otherwise the time before its first step counts as lost, so the figure
# is a lower bound and says so (`lower_bound`). Not counted, as the ledger would: a
# save reported without its end, and a step number run twice within the launch.


def _merged_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merge_intervals(intervals))


def jobs_recent_goodput(*, jobs: list[TrainingJob], window_s: float = 3600.0) -> dict[int, dict]:
    """Per job id: `goodput` (time) over the job's last `window_s` seconds on its own
    clock, `lower_bound`, `start` and `end` (unix seconds). Two queries for any number
    of jobs. Jobs with no events are left out."""
    jobs = [j for j in jobs if j.last_event_ts is not None]
    if not jobs:
        return {}
    latest = Attempt.objects.filter(job=OuterRef("pk")).order_by("-number")
    first_step = StepRecord.objects.filter(job=OuterRef("pk"), attempt=OuterRef("launch"))
    rows = (
        TrainingJob.objects.filter(pk__in=[j.pk for j in jobs])
        .annotate(
            launch=Subquery(latest.values("number")[:1]),
            launch_started_at=Subquery(latest.values("started_at")[:1]),
        )
        .annotate(first_step_ts=Subquery(first_step.order_by("step").values("ts")[:1]))
        .values_list("pk", "launch", "launch_started_at", "first_step_ts")
    )
    launch = {pk: (number, started, first) for pk, number, started, first in rows}
    windows: dict[int, tuple[float, float]] = {}
    by_hour: dict[int, list[int]] = {}  # jobs by the hour their window starts in
    for j in jobs:
        end = j.last_event_ts
        start = max(end - window_s, j.first_event_ts if j.first_event_ts is not None else end)
        windows[j.pk] = (start, end)
        if launch.get(j.pk, (None,))[0] is not None:
            by_hour.setdefault(int(start // 3600), []).append(j.pk)
    # The saves that ended in the windows: one condition per hour the windows start
    # in (jobs report on about the same clock, so usually one or two), the exact
    # window and the current launch picked here.
    match = Q()
    for hour, ids in by_hour.items():
        match |= Q(job_id__in=ids, saved_at__gte=datetime.fromtimestamp(hour * 3600, tz=UTC))
    blocking: dict[int, list[tuple[float, float]]] = {}
    if match:
        for job_id, attempt, started, saved, b in Checkpoint.objects.filter(match).values_list(
            "job_id", "attempt", "save_started_at", "saved_at", "blocking_s"
        ):
            saved = saved.timestamp()
            if attempt != launch[job_id][0] or saved < windows[job_id][0]:
                continue
            span = save_blocking(started.timestamp() if started else None, saved, b)
            if span is not None:
                blocking.setdefault(job_id, []).append(span)
    out = {}
    for j in jobs:
        start, end = windows[j.pk]
        elapsed = end - start
        _, launched, first = launch.get(j.pk, (None, None, None))
        stepping = 0.0
        if first is not None and j.last_step_ts is not None and elapsed > 0:
            lo, hi = max(start, first), min(end, j.last_step_ts)
            if hi > lo:
                stepping = (hi - lo) - _merged_length(blocking.get(j.pk, []), lo, hi)
        out[j.pk] = {
            "goodput": stepping / elapsed if elapsed > 0 else None,
            # Exact when the launch was stepping at the window's start, or began
            # before it and has made no step since (a hang: nothing productive).
            "lower_bound": first > start
            if first is not None
            else launched is None or launched.timestamp() > start,
            "start": start,
            "end": end,
        }
    return out


# --- the job page: step series reduced to buckets, launches, checkpoints, ranks ------
# A job's steps, reduced to buckets of (launch, 2^j steps, 3600 x 2^k seconds of the
# job's clock): per bucket the count, the step and time range, the loss's min, max
# and sum, the step time's max and sum. Min and max per bucket keep a spike, a dip
# and a step back. One pass over a 1,000,000-step job takes about a second on
# PostgreSQL, too slow for a page, so the buckets are cached and brought up to date
# with the rows stored since: ingest writes a job's rows under the job's lock, so a
# row read later never has a smaller id than one already read. A bucket of 2^(j+1)
# steps is two buckets of 2^j, so as the job grows the cached buckets coarsen in
# memory and are never read from the table again.

STEP_BUCKETS = 1000  # about this many step buckets across the job, at most
TIME_BUCKETS = 1500  # and time buckets across its elapsed time
BUCKET_ROWS_MAX = 50_000  # coarsen further past this (steps out of time order)
_HOUR = 3600.0
_MIN_BUCKET_S = _HOUR / 64
_BUCKETS_CACHE_S = 7 * 24 * 3600
BUCKET_COLUMNS = (
    "attempt",
    "sb",  # step // step_width
    "tb",  # floor(ts / time_width)
    "n",
    "step_lo",
    "step_hi",
    "ts_lo",
    "ts_hi",
    "loss_min",
    "loss_max",
    "loss_sum",
    "loss_n",
    "st_max",  # step_time_s
    "st_sum",
    "st_n",
)
_COL = {name: i for i, name in enumerate(BUCKET_COLUMNS)}
_ADD, _MIN, _MAX = "add", "min", "max"
_MERGE = {
    "n": _ADD,
    "step_lo": _MIN,
    "step_hi": _MAX,
    "ts_lo": _MIN,
    "ts_hi": _MAX,
    "loss_min": _MIN,
    "loss_max": _MAX,
    "loss_sum": _ADD,
    "loss_n": _ADD,
    "st_max": _MAX,
    "st_sum": _ADD,
    "st_n": _ADD,
}


class StepBuckets:
    """The bucketed steps of a job: `rows` is a float array, one column per
    BUCKET_COLUMNS (NaN where a bucket has no loss or step time)."""

    def __init__(self, step_width: int, time_width: float, rows: np.ndarray):
        self.step_width = step_width
        self.time_width = time_width
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def col(self, name: str) -> np.ndarray:
        return self.rows[:, _COL[name]]

    def grouped(self, *by: str) -> tuple[np.ndarray, np.ndarray]:
        """group_rows by these columns, computed once per instance."""
        cache = self.__dict__.setdefault("_grouped", {})
        if by not in cache:
            cache[by] = group_rows(self.rows, self.rows[:, [_COL[c] for c in by]])
        return cache[by]


def _bucket_widths(job: TrainingJob) -> tuple[int, float]:
    steps = max(1, (job.last_step or 0) + 1)
    step_width = 1
    while steps / step_width > STEP_BUCKETS:
        step_width *= 2
    span = max(0.0, (job.last_event_ts or 0.0) - (job.first_event_ts or 0.0))
    time_width = _MIN_BUCKET_S
    while span / time_width > TIME_BUCKETS:
        time_width *= 2
    return step_width, time_width


def group_rows(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bucket rows merged per distinct row of `keys` (n x k): the distinct keys in
    sorted order (first column first), and one merged row each (its first three
    columns meaningless)."""
    if not len(rows):
        return keys[:0], rows[:0]
    order = np.lexsort(keys.T[::-1])
    keys, rows = keys[order], rows[order]
    starts = np.concatenate([[0], np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1])
    out = np.empty((len(starts), len(BUCKET_COLUMNS)))
    for name, how in _MERGE.items():
        i = _COL[name]
        if how == _ADD:
            out[:, i] = np.add.reduceat(np.nan_to_num(rows[:, i]), starts)
        else:  # fmin and fmax skip NaN (no value), and give NaN where all are
            out[:, i] = (np.fmin if how == _MIN else np.fmax).reduceat(rows[:, i], starts)
    return keys[starts], out


def _regroup(rows: np.ndarray) -> np.ndarray:
    """Rows with the same (attempt, sb, tb) merged into one."""
    if len(rows) == 0:
        return rows.reshape(0, len(BUCKET_COLUMNS))
    keys, out = group_rows(rows, rows[:, :3])
    if len(keys) == len(rows):
        return rows[np.lexsort(rows[:, 2::-1].T)]
    out[:, :3] = keys
    return out


def _coarsen(rows: np.ndarray, step_factor: int, time_factor: int) -> np.ndarray:
    if step_factor == 1 and time_factor == 1:
        return rows
    rows = rows.copy()
    rows[:, 1] = np.floor(rows[:, 1] / step_factor)
    rows[:, 2] = np.floor(rows[:, 2] / time_factor)
    return _regroup(rows)


def _read_buckets(job_id: int, step_width: int, time_width: float, since_id: int):
    """The job's step rows with id > since_id, bucketed in SQL; and the largest id read."""
    table = StepRecord._meta.db_table
    # Both widths are computed here (never user input); as literals, the division is
    # an integer one on both databases and the time bucket a float one.
    if connection.vendor == "postgresql":
        tb = f"floor(ts / {float(time_width)!r})::bigint"
    else:
        tb = f"CAST(ts / {float(time_width)!r} AS INTEGER)"  # ts > 0: truncation is floor
    sql = (
        f"SELECT attempt, step / {int(step_width)}, {tb}, count(*), min(step), max(step),"
        " min(ts), max(ts), min(loss), max(loss), sum(loss), count(loss),"
        " max(step_time_s), sum(step_time_s), count(step_time_s), max(id)"
        f" FROM {table} WHERE job_id = %s AND id > %s GROUP BY 1, 2, 3"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id, since_id])
        fetched = cursor.fetchall()
    if not fetched:
        return np.empty((0, len(BUCKET_COLUMNS))), since_id
    values = np.array(
        [[np.nan if v is None else float(v) for v in row] for row in fetched], dtype=float
    )
    return values[:, :-1], max(since_id, int(values[:, -1].max()))


def job_step_buckets(*, job: TrainingJob) -> StepBuckets:
    """The job's steps in at most about STEP_BUCKETS x TIME_BUCKETS buckets (in practice
    a few thousand: steps and time advance together), up to date with the job's rows.
    Reads only the rows stored since the cached buckets were made."""
    key = f"jobs:step-buckets:v1:{job.pk}:{job.created_at.timestamp():.6f}"
    step_width, time_width = _bucket_widths(job)
    cached = cache.get(key)
    changed = True
    if cached is None:
        rows, max_id = _read_buckets(job.pk, step_width, time_width, 0)
        rows = _regroup(rows)
    else:
        step_width = max(step_width, cached["step_width"])
        time_width = max(time_width, cached["time_width"])
        rows = _coarsen(
            cached["rows"],
            step_width // cached["step_width"],
            round(time_width / cached["time_width"]),
        )
        max_id = cached["max_id"]
        changed = rows is not cached["rows"]
        if cached["revision"] != job.revision:
            new, max_id = _read_buckets(job.pk, step_width, time_width, max_id)
            rows = _regroup(np.concatenate([rows, new]))
            changed = True
    while len(rows) > BUCKET_ROWS_MAX:
        step_width, time_width = step_width * 2, time_width * 2
        rows = _coarsen(rows, 2, 2)
    if changed:
        cache.set(
            key,
            {
                "revision": job.revision,
                "max_id": max_id,
                "step_width": step_width,
                "time_width": time_width,
                "rows": rows,
            },
            _BUCKETS_CACHE_S,
        )
    return StepBuckets(step_width, time_width, rows)


def launch_order(buckets: StepBuckets) -> list[tuple[int, int, int]]:
    """(attempt, first step, last step) of each launch that made steps, in time order."""
    if not len(buckets):
        return []
    keys, per = buckets.grouped("attempt")
    order = np.argsort(per[:, _COL["ts_lo"]], kind="stable")
    return [
        (int(keys[k, 0]), int(per[k, _COL["step_lo"]]), int(per[k, _COL["step_hi"]])) for k in order
    ]


def kept_ranges(launches: list[tuple[int, int, int]]) -> dict[int, list[tuple[int, int]]]:
    """Per launch, the step ranges whose execution there is the last one in the job:
    its steps less those a later launch ran again. A launch runs its steps in one
    stretch (it resumes at a checkpoint and goes forward), which is what makes a range
    per launch enough."""
    out: dict[int, list[tuple[int, int]]] = {}
    for k, (attempt, lo, hi) in enumerate(launches):
        pieces = [(lo, hi)]
        for _, b_lo, b_hi in launches[k + 1 :]:
            cut = []
            for p_lo, p_hi in pieces:
                if b_hi < p_lo or b_lo > p_hi:
                    cut.append((p_lo, p_hi))
                    continue
                if p_lo < b_lo:
                    cut.append((p_lo, b_lo - 1))
                if b_hi < p_hi:
                    cut.append((b_hi + 1, p_hi))
            pieces = cut
        out[attempt] = pieces
    return out


def kept_shares(
    kept: dict[int, list[tuple[int, int]]], attempt: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Per bucket (its launch and step range lo..hi), the share of its steps whose
    execution there is kept (see kept_ranges)."""
    inside = np.zeros(len(attempt))
    for a, ranges in kept.items():
        mine = attempt == a
        for r_lo, r_hi in ranges:
            inside[mine] += np.clip(
                np.minimum(hi[mine], r_hi) - np.maximum(lo[mine], r_lo) + 1, 0, None
            )
    return inside / np.maximum(hi - lo + 1, 1)


def job_goodput_timeline(
    *, buckets: StepBuckets, figures: dict, window_s: float = _HOUR
) -> dict | None:
    """Goodput (time) over the job's clock: cumulative, and over a sliding window.

    Per time bucket, the time its kept step executions took: within a launch, the
    steps ending in a bucket took the time from the previous bucket's last step to
    this one's (a telescoping sum, exact), times the share of those steps that no
    later launch ran again. Save blocking inside steps is then taken out evenly (the
    sum is scaled to the ledger's productive seconds), so the cumulative curve ends
    exactly at the ledger's goodput. None when the ledger has no elapsed time yet.
    """
    elapsed = figures.get("elapsed_s") or 0.0
    if elapsed <= 0 or not figures.get("as_of"):
        return None
    t_end = datetime.fromisoformat(figures["as_of"].replace("Z", "+00:00")).timestamp()
    t0 = t_end - elapsed
    width = buckets.time_width
    first_tb, last_tb = int(np.floor(t0 / width)), int(np.floor(t_end / width))
    raw = np.zeros(last_tb - first_tb + 1)
    if len(buckets):
        # Per (launch, time bucket), in time order within each launch.
        keys, per = buckets.grouped("attempt", "tb")
        attempt, tb = keys[:, 0], keys[:, 1]
        n, ts_lo, ts_hi = (per[:, _COL[c]] for c in ("n", "ts_lo", "ts_hi"))
        several = n > 1
        gaps = (n[several] - 1).sum()
        mean_step = (ts_hi - ts_lo)[several].sum() / gaps if gaps else 0.0
        first = np.ones(len(keys), dtype=bool)
        first[1:] = attempt[1:] != attempt[:-1]
        previous = np.roll(ts_hi, 1)
        span = np.where(first, ts_hi - ts_lo + mean_step, ts_hi - previous)
        share = kept_shares(
            kept_ranges(launch_order(buckets)),
            attempt,
            per[:, _COL["step_lo"]],
            per[:, _COL["step_hi"]],
        )
        at = tb.astype(np.int64) - first_tb
        inside = at < len(raw)  # steps after the ledger's end (a snapshot a little stale)
        raw = np.bincount(
            np.clip(at[inside], 0, None),
            weights=(np.maximum(span, 0.0) * share)[inside],
            minlength=len(raw),
        )
    total = raw.sum()
    productive = raw * (figures["categories"]["productive"] / total if total > 0 else 0.0)
    ends = np.minimum((np.arange(first_tb, last_tb + 1) + 1) * width, t_end)
    cumulative = np.cumsum(productive) / np.maximum(ends - t0, 1e-9)
    k = max(1, round(max(window_s, width) / width))
    csum = np.concatenate([[0.0], np.cumsum(productive)])
    idx = np.arange(len(productive))
    in_window = csum[idx + 1] - csum[np.maximum(idx + 1 - k, 0)]
    starts = np.maximum(ends - k * width, t0)
    sliding = in_window / np.maximum(ends - starts, 1e-9)
    return {
        "ts": ends,
        "cumulative": np.clip(cumulative, 0.0, 1.0),
        "sliding": np.clip(sliding, 0.0, 1.0),
        "window_s": k * width,
        "bucket_s": width,
        "t0": t0,
        "t_end": t_end,
    }


FAILED_ENDS = ("failed", "killed", "preempted")


def job_launches(*, job: TrainingJob, limit: int = 200) -> dict:
    """The latest `limit` launches (oldest first) as dicts, how many there are, and
    the numbers of those that ended without completing. Three queries."""
    qs = Attempt.objects.filter(job=job)
    rows = list(
        qs.order_by("-number").values(
            "id", "number", "world_size", "started_at", "ready_at", "ended_at", "end_reason"
        )[:limit]
    )
    rows.reverse()
    total = len(rows) if len(rows) < limit else qs.count()
    failed = list(qs.filter(end_reason__in=FAILED_ENDS).values_list("number", flat=True))
    return {"rows": rows, "total": total, "failed": failed}


def launch_node_names(*, attempt_ids: list[int], per_launch: int = 8) -> dict[int, dict]:
    """Per launch id: up to `per_launch` node names and how many nodes it had. One query."""
    through = Attempt.nodes.through
    out: dict[int, dict] = {a: {"names": [], "count": 0} for a in attempt_ids}
    for attempt_id, name in (
        through.objects.filter(attempt_id__in=attempt_ids)
        .order_by("attempt_id", "node__name")
        .values_list("attempt_id", "node__name")
    ):
        entry = out[attempt_id]
        entry["count"] += 1
        if len(entry["names"]) < per_launch:
            entry["names"].append(name)
    return out


def _per_revision(job: TrainingJob, name: str, read):
    """`read()`, cached until the job's next ingest (which bumps its revision)."""
    key = f"jobs:{name}:{job.pk}:{job.created_at.timestamp():.6f}:{job.revision}"
    value = cache.get(key)
    if value is None:
        value = read()
        cache.set(key, value, _BUCKETS_CACHE_S)
    return value


def job_checkpoint_groups(*, job: TrainingJob, step_width: int) -> list[dict]:
    """The job's checkpoints grouped by (launch, step // step_width, durable): how many,
    the first and latest step, the latest time, the finished saves with their first
    and last time, the blocking seconds reported and by how many saves. Bounded by the
    step buckets and launches, whatever the number of checkpoints. One query, cached
    per job revision."""
    return _per_revision(
        job, f"checkpoint-groups-{step_width}", lambda: _checkpoint_groups(job, step_width)
    )


def _checkpoint_groups(job: TrainingJob, step_width: int) -> list[dict]:
    return list(
        Checkpoint.objects.filter(job=job)
        .annotate(bucket=F("step") / step_width)
        .values("attempt", "bucket", "durable")
        .annotate(
            n=Count("id"),
            first_step=Min("step"),
            step=Max("step"),
            at=Max(Coalesce("saved_at", "save_started_at")),
            saved=Count("saved_at"),
            first_saved_at=Min("saved_at"),
            last_saved_at=Max("saved_at"),
            blocking_sum=Sum("blocking_s"),
            blocking_n=Count("blocking_s"),
        )
        .order_by("attempt", "bucket", "durable")
    )


def job_recent_checkpoints(*, job: TrainingJob, limit: int = 50) -> list[Checkpoint]:
    """The latest `limit` checkpoints: of the latest launches, the highest steps first
    (the unique index on (job, attempt, step) read backwards)."""
    return list(Checkpoint.objects.filter(job=job).order_by("-attempt", "-step")[:limit])


def job_rank_heatmap(
    *,
    job: TrainingJob,
    attempt: int,
    world_size: int | None = None,
    max_windows: int = 200,
    max_cells: int = 20_000,
) -> dict:
    """Compute seconds per (rank, window) of one launch, for its latest windows: at most
    `max_windows` windows, fewer when there are many ranks (about `max_cells` cells,
    the first 1,024 ranks). Four queries at most, each an index range of (job, attempt,
    rank, first_step); cached per job revision."""
    return _per_revision(
        job,
        f"rank-heatmap-{attempt}-{world_size}-{max_windows}-{max_cells}",
        lambda: _rank_heatmap(job, attempt, world_size, max_windows, max_cells),
    )


def _rank_heatmap(job, attempt, world_size, max_windows, max_cells) -> dict:
    windows = RankWindow.objects.filter(job=job, attempt=attempt)
    empty = {"attempt": attempt, "ranks": [], "first_steps": [], "cells": [], "rank_count": 0}
    first_rank = windows.order_by("rank", "first_step").values_list("rank", flat=True).first()
    if first_rank is None:
        return empty
    if world_size:
        ranks = list(range(world_size))
    else:
        last = windows.order_by("-rank", "-first_step").values_list("rank", flat=True).first()
        ranks = list(range(first_rank, last + 1))
    rank_count = len(ranks)
    ranks = ranks[:1024]
    n = max(10, min(max_windows, max_cells // len(ranks)))
    # The n-th latest window of the first rank: one backward index range.
    edge = (
        windows.filter(rank=first_rank)
        .order_by("-first_step")
        .values_list("first_step", flat=True)[n - 1 : n]
    )
    cells = windows.filter(rank__in=ranks)
    if edge:
        cells = cells.filter(first_step__gte=edge[0])
    rows = list(
        cells.order_by("rank", "first_step").values_list(
            "rank", "first_step", "last_step", "compute_s", "node__name"
        )[: 2 * max(max_cells, 10 * len(ranks))]
    )
    first_steps = sorted({r[1] for r in rows})[-n:]
    return {
        "attempt": attempt,
        "ranks": sorted({r[0] for r in rows}),
        "first_steps": first_steps,
        "cells": [r for r in rows if r[1] >= first_steps[0]] if first_steps else [],
        "rank_count": rank_count,
    }


__all__ = [
    "BUCKET_COLUMNS",
    "Ledger",
    "StepBuckets",
    "attach_summaries",
    "group_rows",
    "job_attempts",
    "job_checkpoint_groups",
    "job_checkpoints",
    "job_goodput",
    "job_goodput_timeline",
    "job_launches",
    "job_list",
    "job_rank_heatmap",
    "job_recent_checkpoints",
    "job_step_buckets",
    "jobs_recent_goodput",
    "kept_ranges",
    "kept_shares",
    "launch_node_names",
    "launch_order",
]
