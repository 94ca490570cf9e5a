"""Ingest's launch and checkpoint rows: what a batch's lifecycle events (a launch's
start, readiness and end, checkpoint saves) make of them, whatever order they come
in, under the jobs' locks ingest holds (jobs.services.ingest); what a batch may not
rewrite is refused first (jobs.services.history)."""

from collections import defaultdict
from datetime import datetime

from django.db.models import Q

from common.time import dt
from jobs.bulk import update_rows
from jobs.models import Attempt, Checkpoint
from jobs.selectors.prices import nodes_by_pool
from jobs.services.history import HistoryConflict, batch_finishes, batch_history_conflicts


def earlier(current: datetime | None, ts: float) -> bool:
    return current is None or dt(ts) < current


def lifecycle_project(
    jobs, fresh, lifecycle, node_ids, *, shared: bool
) -> dict[tuple[int, int], Attempt]:
    """Attempt and checkpoint rows from lifecycle events, whatever order they come in.

    Returns every attempt, as now stored, of the jobs whose launches these
    events describe (locked, like the jobs themselves; under `shared` locks of the
    jobs, a batch without lifecycle events, only read: what moves them takes the
    jobs' exclusive ones), by (job id, number).
    Raises HistoryConflict, before changing any, when the batch would rewrite a
    launch's history (see jobs.services.history).
    """
    job_id = {k: j.id for k, j in jobs.items()}
    numbers = {(job_id[e.job], e.attempt) for e in fresh if e.attempt is not None}
    if not numbers:
        return {}
    Attempt.objects.bulk_create(
        [Attempt(job_id=j, number=n) for j, n in sorted(numbers)], ignore_conflicts=True
    )
    finishes = batch_finishes(jobs, lifecycle)
    if not lifecycle and not finishes:
        return {}
    # Jobs that finished are read even for a batch of steps alone: a new launch shows
    # in its steps before its start arrives. The same one query either way.
    touched_jobs = {job_id[e.job] for e in lifecycle if e.attempt is not None}
    touched_jobs.update(jobs[k].id for k in finishes)
    stored = Attempt.objects.filter(job_id__in=touched_jobs)
    attempts = {(a.job_id, a.number): a for a in (stored if shared else stored.select_for_update())}
    conflicts = batch_history_conflicts(jobs, fresh, lifecycle, attempts, finishes)
    if conflicts:
        raise HistoryConflict(conflicts)
    checkpoints = _lock_checkpoints(
        {
            (job_id[e.job], e.attempt, e.data["step"])
            for e in lifecycle
            if e.attempt is not None and e.kind in ("checkpoint_save_started", "checkpoint_saved")
        }
    )
    changed: set[tuple[int, int]] = set()
    for e in sorted(lifecycle, key=lambda e: e.ts):
        if e.attempt is None:
            continue
        key = (job_id[e.job], e.attempt)
        a = attempts[key]
        d = e.data
        if e.kind == "attempt_started" and earlier(a.started_at, e.ts):
            a.started_at = dt(e.ts)
            a.world_size = d["world_size"]
            a.gpus_per_node = d.get("gpus_per_node")
            ids = [node_ids[n] for n in d.get("nodes") or []]
            a.nodes.set(ids)
            a.pool_counts = nodes_by_pool(ids)
            changed.add(key)
        elif e.kind == "ready" and earlier(a.ready_at, e.ts):
            a.ready_at = dt(e.ts)
            changed.add(key)
        elif e.kind == "attempt_ended" and earlier(a.ended_at, e.ts):
            a.ended_at = dt(e.ts)
            a.end_reason = d["reason"]
            a.exit_code = d.get("exit_code")
            changed.add(key)
        elif e.kind in ("checkpoint_save_started", "checkpoint_saved"):
            ck = checkpoints[(key[0], e.attempt, d["step"])]
            if e.kind == "checkpoint_save_started":
                if earlier(ck.save_started_at, e.ts):
                    ck.save_started_at = dt(e.ts)
            elif earlier(ck.saved_at, e.ts):
                ck.saved_at = dt(e.ts)
                ck.blocking_s = d.get("blocking_s")
                ck.bytes = d.get("bytes")
                ck.uri = d.get("uri") or ""
                ck.tier = d.get("tier") or ""
                ck.durable = ck.tier not in Checkpoint.NON_DURABLE_TIERS
    update_rows(
        Attempt,
        [
            "started_at",
            "ready_at",
            "ended_at",
            "end_reason",
            "exit_code",
            "world_size",
            "gpus_per_node",
            "pool_counts",
        ],
        [attempts[k] for k in sorted(changed)],
    )
    update_rows(
        Checkpoint,
        ["save_started_at", "saved_at", "blocking_s", "bytes", "uri", "tier", "durable"],
        list(checkpoints.values()),
    )
    return attempts


def _lock_checkpoints(keys: set[tuple[int, int, int]]) -> dict[tuple[int, int, int], Checkpoint]:
    """The checkpoint rows of these (job, attempt, step) keys, created when new, locked."""
    if not keys:
        return {}
    Checkpoint.objects.bulk_create(
        [Checkpoint(job_id=j, attempt=a, step=s) for j, a, s in sorted(keys)],
        ignore_conflicts=True,
    )
    steps: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j, a, s in keys:
        steps[(j, a)].append(s)
    match = Q()
    for (j, a), ss in steps.items():
        match |= Q(job_id=j, attempt=a, step__in=ss)
    return {
        (c.job_id, c.attempt, c.step): c
        for c in Checkpoint.objects.select_for_update().filter(match).order_by("id")
    }
