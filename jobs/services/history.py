"""What a batch may not rewrite, and the one way past it.

A launch's history is never rewritten: a second start of a launch, or a new launch of
a job that finished, refuses the whole batch (`HistoryConflict`, 409). An operator
may reopen a finished job (`job_reopen`): the stream keeps the finish, and a
`job_reopened` event voids every finish up to it.
"""

import logging
import uuid
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from common.errors import Conflict
from common.time import dt
from jobs.models import Event, TrainingJob
from jobs.selectors import job_status
from jobs.wire import WireEvent

audit = logging.getLogger("rebound.audit")


class HistoryConflict(Conflict):
    """A batch would rewrite a launch's history: a second start of a launch, or a new
    launch of a finished job. `conflicts`: {index, job, attempt, reason, stored} each,
    `index` the event's place in the batch. The detail names the first, and how to
    reopen the job when it is a finish that refuses."""

    code = "history_conflict"

    def __init__(self, conflicts: list[dict]):
        first = conflicts[0]
        more = len(conflicts) - 1
        detail = first["reason"] + (f"; and {more} more" if more else "")
        if "finished_at" in first["stored"]:
            detail += f" (POST /api/v1/jobs/{first['job']}/reopen)"
        super().__init__(detail + ". Nothing of this request was stored.", conflicts=conflicts)
        self.conflicts = conflicts


class JobNotFinished(Conflict):
    """Only a finished job can be reopened."""

    code = "not_finished"

    def __init__(self, *, job: str):
        super().__init__(f"job {job!r} is not finished; there is nothing to reopen.", job=job)
        self.job = job


def job_reopen(*, job: TrainingJob, actor: str, reason: str = "") -> TrainingJob:
    """Lets a finished job take new launches again; audited.

    The stream keeps the finish: a `job_reopened` event, stamped at the job's latest
    finish and naming who and why, voids every finish up to it, for the ledger (which
    runs on to the next finish, or the last event, the gap to the next launch being
    downtime) and for ingest (a late copy of a voided finish closes nothing).
    """
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.finished_at is None:
            raise JobNotFinished(job=job.key)
        finished = Event.objects.filter(job=job, kind=Event.Kind.JOB_FINISHED).aggregate(
            ts=Max("ts")
        )["ts"]
        finished_at = iso(dt(finished))
        Event.objects.create(
            job=job,
            client_id=f"rebound:reopen:{uuid.uuid4().hex}",  # apart from any client's ids
            kind=Event.Kind.JOB_REOPENED,
            ts=finished,
            data={"by": actor, "reason": reason, "finished_at": finished_at},
            received_at=timezone.now(),
        )
        job.reopened_finish_ts = finished
        job.finished_at = None
        job.status = job_status(job)
        job.revision += 1  # the cached ledger ended at the finish: stale now
        job.save(update_fields=["reopened_finish_ts", "finished_at", "status", "revision"])
        message = (
            f"job {job.key} reopened by {actor or 'unknown'} (finished at {finished_at}):"
            f" {reason or 'no reason given'}"
        )
        transaction.on_commit(lambda: audit.info(message))
    return job


def finish_reopened(job: TrainingJob, ts: float) -> bool:
    """Whether a job_finished at `ts` is one an operator reopened (void)."""
    return job.reopened_finish_ts is not None and ts <= job.reopened_finish_ts


def batch_finishes(jobs: dict[str, TrainingJob], lifecycle: list[WireEvent]) -> dict[str, float]:
    """When each job of the batch finished, as stored or as this batch says: the
    earliest finish that no reopening voided."""
    out = {k: j.finished_at.timestamp() for k, j in jobs.items() if j.finished_at is not None}
    for e in lifecycle:
        if e.kind == "job_finished" and not finish_reopened(jobs[e.job], e.ts):
            out[e.job] = min(out.get(e.job, e.ts), e.ts)
    return out


def batch_history_conflicts(jobs, fresh, lifecycle, attempts, finishes) -> list[dict]:
    """What of the batch would rewrite history (nothing queried unless something would).

    1. A second start of a launch: an attempt_started for a launch that already
       started (with another id: a resend of the same id is a duplicate, not fresh),
       or two starts of one launch in the batch.
    2. A new launch of a finished job: of a launch not started before the batch,
       its attempt_started stamped after the job's finish, or (while no start of it is
       known) any of its events stamped after the finish. A launch that started before
       the finish is history arriving late, in whatever order.
    """
    job_id = {k: j.id for k, j in jobs.items()}
    conflicts: list[dict] = []
    starts: dict[tuple[int, int], WireEvent] = {}
    for e in lifecycle:
        if e.kind != "attempt_started":
            continue
        key = (job_id[e.job], e.attempt)
        stored = attempts[key]
        if stored.started_at is not None:
            event = _stored_start(key, exclude={x.client_id for x in lifecycle})
            conflicts.append(
                {
                    "index": e.index,
                    "job": e.job,
                    "attempt": e.attempt,
                    "reason": (
                        f"job {e.job!r}: launch {e.attempt} already started at"
                        f" {iso(stored.started_at)} (event {event!r}); another"
                        f" attempt_started ({e.client_id!r}) would rewrite it"
                    ),
                    "stored": {"event": event, "started_at": iso(stored.started_at)},
                }
            )
        elif key in starts:
            first = starts[key]
            conflicts.append(
                {
                    "index": e.index,
                    "job": e.job,
                    "attempt": e.attempt,
                    "reason": (
                        f"job {e.job!r}: launch {e.attempt} is started twice in this batch"
                        f" ({first.client_id!r} and {e.client_id!r})"
                    ),
                    "stored": {},
                }
            )
        else:
            starts[key] = e
    if not finishes:
        return conflicts
    refused: set[tuple[int, int]] = {(c["job"], c["attempt"]) for c in conflicts}
    for e in fresh:
        finish = finishes.get(e.job)
        if finish is None or e.attempt is None or (e.job, e.attempt) in refused:
            continue
        key = (job_id[e.job], e.attempt)
        if attempts[key].started_at is not None:
            continue  # a launch that started: its events are history, late or not
        start = starts.get(key)
        when = start.ts if start is not None else e.ts
        if when <= finish:
            continue
        refused.add((e.job, e.attempt))
        finished_at = iso(dt(finish))
        conflicts.append(
            {
                "index": (start or e).index,
                "job": e.job,
                "attempt": e.attempt,
                "reason": (
                    f"job {e.job!r} finished at {finished_at}; launch {e.attempt}"
                    f" ({'started' if start else 'an event'} at {iso(dt(when))}) would be a"
                    " new launch after it; an operator may reopen the job"
                ),
                "stored": {"finished_at": finished_at},
            }
        )
    return conflicts


def _stored_start(key: tuple[int, int], exclude: set[str]) -> str | None:
    """The id of the stored attempt_started of launch `key` (a query only to name it
    in a refusal; the batch's own, inserted already, are excluded)."""
    return (
        Event.objects.filter(job_id=key[0], attempt=key[1], kind="attempt_started")
        .exclude(client_id__in=exclude)
        .order_by("ts", "id")
        .values_list("client_id", flat=True)
        .first()
    )


def iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
