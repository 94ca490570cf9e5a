"""Writes of the ledger: a job's snapshot (its cumulative figures at a revision),
recomputed off the request path after ingest (`ledger_snapshot_refresh`, in the
worker) or by a reader that found none current (`ledger_snapshot_ensure`)."""

import logging

from django.db import IntegrityError, transaction

from jobs import selectors
from jobs.accounting import compute_ledger, job_ledger, load_lifecycle, load_spans, load_steps
from jobs.models import LedgerSnapshot, TrainingJob
from jobs.services.page_cache import step_buckets_ensure
from jobs.signals import ledger_refreshed

logger = logging.getLogger(__name__)


def ledger_snapshot_refresh(*, job: TrainingJob) -> bool:
    """Recompute the job's cumulative ledger unless the snapshot is current; tell
    the apps that derive figures from it. Returns whether it recomputed."""
    job.refresh_from_db(fields=["revision", "first_event_ts", "last_event_ts"])
    told = LedgerSnapshot.objects.filter(job=job).values_list("announced_revision", flat=True)
    if told.first() == job.revision:
        return False  # current, and announced (a reader's snapshot is not)
    revision = job.revision  # read before the history: a newer ingest makes it stale again
    steps = load_steps(job.id)
    ledger = compute_ledger(
        job.key,
        load_lifecycle(job.id),
        steps,
        last_event_ts=job.last_event_ts,
        spans=load_spans(job),
    )
    _snapshot_store(job=job, revision=revision, figures=ledger.as_dict(), announced=True)
    for receiver, result in ledger_refreshed.send_robust(
        sender=TrainingJob, job=job, ledger=ledger, steps=steps
    ):
        if isinstance(result, Exception):
            logger.error("ledger_refreshed receiver %r failed: %r", receiver, result)
    # The job page's step series: brought up to date here, off the request path, so
    # no one waits for a large job's first read (it reads only rows new since).
    step_buckets_ensure(job=job)
    return True


def ledger_snapshot_ensure(*, job: TrainingJob, allow_stale: bool = False) -> LedgerSnapshot:
    """The job's snapshot, computed and stored when it has none current (any, with
    `allow_stale`), and set on `job` so that a read of its figures finds it."""
    snapshot = selectors.job_ledger_snapshot(job)
    if selectors.snapshot_usable(job, snapshot, allow_stale=allow_stale):
        return snapshot
    return _snapshot_store(job=job, revision=job.revision, figures=job_ledger(job).as_dict())


def job_goodput(
    *,
    job: TrainingJob,
    start: float | None = None,
    end: float | None = None,
    allow_stale: bool = False,
) -> dict:
    """`jobs.selectors.job_goodput` for a reader whose computed cumulative figures are
    worth keeping: the snapshot is made current first (ledger_snapshot_ensure)."""
    if start is None and end is None:
        ledger_snapshot_ensure(job=job, allow_stale=allow_stale)
    return selectors.job_goodput(job=job, start=start, end=end, allow_stale=allow_stale)


def _snapshot_store(
    *, job: TrainingJob, revision: int, figures: dict, announced: bool = False
) -> LedgerSnapshot:
    defaults = {"revision": revision, "figures": figures}
    if announced:
        defaults["announced_revision"] = revision
    try:
        with transaction.atomic():
            snapshot, _ = LedgerSnapshot.objects.update_or_create(job=job, defaults=defaults)
    except IntegrityError:  # a concurrent reader stored the same figures first
        snapshot = LedgerSnapshot(job=job, revision=revision, figures=figures)
    job.ledger = snapshot
    return snapshot
