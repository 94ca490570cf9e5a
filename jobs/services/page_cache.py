"""The job page's reads kept for the next reader, in the cache: the step buckets
(brought up to date with the rows stored since, see jobs.selectors.steps), per job
revision the checkpoint groups, and while recent the rank heat map. The cache only
saves work: a miss reads again."""

import hashlib
import time
from collections.abc import Callable
from typing import Any

from django.core.cache import cache
from redis.exceptions import RedisError

from common.outbox import Work, outbox_enqueue
from jobs import selectors
from jobs.models import TrainingJob

# How long an entry is kept: a week (per-revision entries are never read again after
# the job's next ingest, and expire).
CACHE_S = 7 * 24 * 3600

# The reads of a running job's rank windows (the heat map, the ranks' scores: 16,384
# ranks x 20 windows take a second or two) change with every ingest, and a large job
# ingests several times a second: per revision, every read would compute them anew.
# An entry of the job's revision, or at most RECENT_S old, is served as is; one at most
# STALE_S old is served and the worker computes it anew (once at a time); past that,
# or missing, the request computes it.
RECENT_S = 10
STALE_S = 120
REFRESH_TASK = "jobs.page_cache_refresh"
_REFRESH_LOCK_S = 60  # one refresh asked for at a time (the outbox brings a lost one back)
_RECENT_READS: dict[str, Callable[..., Any]] = {}  # name -> read(job=, **params)


def recent_read(name: str):
    """Register `read(*, job, **params)` as the recent-cached read `name` (the apps to
    the right register theirs, such as the ranks' scores)."""

    def register(read):
        _RECENT_READS[name] = read
        return read

    return register


def job_recent_cached(job: TrainingJob, name: str, **params) -> Any:
    """The recent-cached read `name` of `job` with `params` (JSON values), as above."""
    key = _recent_key(job, name, params)
    entry = cache.get(key)
    if entry is not None:
        age = time.time() - entry["at"]
        if entry["revision"] == job.revision or age < RECENT_S:
            return entry["value"]
        if age < STALE_S:
            if _ask_once(f"{key}:refreshing"):
                work = Work(REFRESH_TASK, refresh_key(job.pk, name, params), [job.pk, name, params])
                outbox_enqueue([work])
            return entry["value"]
    return job_recent_refresh(job, name, params)


def _ask_once(lock: str) -> bool:
    """Whether this reader asks for the refresh: the first to add the lock (a cache that
    went away since the read asks nothing: the cache only saves work)."""
    try:
        return cache.add(lock, 1, _REFRESH_LOCK_S)
    except RedisError:
        return False


def job_recent_refresh(job: TrainingJob, name: str, params: dict) -> Any:
    """Compute the recent-cached read `name` anew and keep it."""
    revision = job.revision  # read before the rows: a newer ingest makes it stale again
    value = _RECENT_READS[name](job=job, **params)
    key = _recent_key(job, name, params)
    cache.set(key, {"revision": revision, "at": time.time(), "value": value}, CACHE_S)
    cache.delete(f"{key}:refreshing")
    return value


def refresh_key(job_id: int, name: str, params: dict) -> str:
    """The outbox's key of a refresh: the job, the read and a digest of its parameters
    (spelled out, they would not fit the key's 100 characters)."""
    args = "-".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{job_id}:{name}:{hashlib.sha256(args.encode()).hexdigest()[:16]}"


def _recent_key(job: TrainingJob, name: str, params: dict) -> str:
    at = f"{job.created_at.timestamp():.6f}"  # a job deleted and made anew starts afresh
    return f"jobs:recent:{refresh_key(job.pk, name, params)}:{at}"


def step_buckets_ensure(*, job: TrainingJob) -> selectors.StepBuckets:
    """The job's step buckets (jobs.selectors.job_step_buckets), the cached copy
    brought up to date with them."""
    buckets = selectors.job_step_buckets(job=job)
    if buckets.cache_entry is not None:
        cache.set(selectors.step_buckets_key(job), buckets.cache_entry, CACHE_S)
    return buckets


def checkpoint_groups_ensure(*, job: TrainingJob, step_width: int) -> list[dict]:
    """jobs.selectors.job_checkpoint_groups, cached until the job's next ingest."""
    return job_revision_cached(
        job,
        f"checkpoint-groups-{step_width}",
        lambda: selectors.job_checkpoint_groups(job=job, step_width=step_width),
    )


def rank_heatmap_ensure(
    *,
    job: TrainingJob,
    attempt: int,
    world_size: int | None = None,
    max_windows: int = 200,
    max_cells: int = 20_000,
    max_rows: int = 256,
) -> dict:
    """jobs.selectors.job_rank_heatmap, recent-cached (job_recent_cached)."""
    return job_recent_cached(
        job,
        "rank-heatmap",
        attempt=attempt,
        world_size=world_size,
        max_windows=max_windows,
        max_cells=max_cells,
        max_rows=max_rows,
    )


recent_read("rank-heatmap")(selectors.job_rank_heatmap)


def job_revision_cached(job: TrainingJob, name: str, read):
    """`read()`, cached until the job's next ingest (which bumps its revision): the
    pages' and the API's reads of a job that are too costly to repeat per request."""
    key = f"jobs:{name}:{job.pk}:{job.created_at.timestamp():.6f}:{job.revision}"
    value = cache.get(key)
    if value is None:
        value = read()
        cache.set(key, value, CACHE_S)
    return value
