"""The job page's reads kept for the next reader, in the cache: the step buckets
(brought up to date with the rows stored since, see jobs.selectors.steps) and, per job
revision, the checkpoint groups and the rank heat map. The cache only saves work: a
miss reads again."""

from django.core.cache import cache

from jobs import selectors
from jobs.models import TrainingJob

# How long an entry is kept: a week (per-revision entries are never read again after
# the job's next ingest, and expire).
CACHE_S = 7 * 24 * 3600


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
    """jobs.selectors.job_rank_heatmap, cached until the job's next ingest."""
    return job_revision_cached(
        job,
        f"rank-heatmap-{attempt}-{world_size}-{max_windows}-{max_cells}-{max_rows}",
        lambda: selectors.job_rank_heatmap(
            job=job,
            attempt=attempt,
            world_size=world_size,
            max_windows=max_windows,
            max_cells=max_cells,
            max_rows=max_rows,
        ),
    )


def job_revision_cached(job: TrainingJob, name: str, read):
    """`read()`, cached until the job's next ingest (which bumps its revision): the
    pages' and the API's reads of a job that are too costly to repeat per request."""
    key = f"jobs:{name}:{job.pk}:{job.created_at.timestamp():.6f}:{job.revision}"
    value = cache.get(key)
    if value is None:
        value = read()
        cache.set(key, value, CACHE_S)
    return value
