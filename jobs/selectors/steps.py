"""Reads of a job's step series for the job page: steps reduced to buckets (brought up
to date from a cached copy with the rows stored since), the launches' kept step ranges,
and goodput over the job's clock."""

from datetime import datetime

import numpy as np
from django.core.cache import cache
from django.db import connection

from jobs.models import StepRecord, TrainingJob

# --- the job page: step series reduced to buckets, launches, checkpoints, ranks ------
# A job's steps, reduced to buckets of (launch, 2^j steps, 3600 x 2^k seconds of the
# job's clock): per bucket the count, the step and time range, the loss's min, max
# and sum, the step time's max and sum. Min and max per bucket keep a spike, a dip
# and a step back. One pass over a 1,000,000-step job takes about a second on
# PostgreSQL, too slow for a page, so the buckets are cached and brought up to date
# with the rows stored since: ingest writes a job's rows under the job's lock, so a
# row read later never has a smaller id than one already read. A bucket of 2^(j+1)
# steps is two buckets of 2^j, so as the job grows the cached buckets coarsen in
# memory and are never read from the table again. This module only reads the cache:
# jobs.services.step_buckets_ensure stores what it brought up to date.

STEP_BUCKETS = 1000  # about this many step buckets across the job, at most
TIME_BUCKETS = 1500  # and time buckets across its elapsed time
BUCKET_ROWS_MAX = 50_000  # coarsen further past this (steps out of time order)
_HOUR = 3600.0
_MIN_BUCKET_S = _HOUR / 64
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
    BUCKET_COLUMNS (NaN where a bucket has no loss or step time). `cache_entry` is
    what would bring the cached copy up to date with them (None when it is)."""

    def __init__(
        self, step_width: int, time_width: float, rows: np.ndarray, cache_entry: dict | None = None
    ):
        self.step_width = step_width
        self.time_width = time_width
        self.rows = rows
        self.cache_entry = cache_entry

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
    Reads only the rows stored since the cached buckets were made; stores nothing."""
    step_width, time_width = _bucket_widths(job)
    cached = cache.get(step_buckets_key(job))
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
    entry = None
    if changed:
        entry = {
            "revision": job.revision,
            "max_id": max_id,
            "step_width": step_width,
            "time_width": time_width,
            "rows": rows,
        }
    return StepBuckets(step_width, time_width, rows, cache_entry=entry)


def step_buckets_key(job: TrainingJob) -> str:
    """The cache key of the job's step buckets (a job made again under its key starts
    afresh)."""
    return f"jobs:step-buckets:v1:{job.pk}:{job.created_at.timestamp():.6f}"


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
