"""Writes of the jobs app: ingest, and what it projects out of the stream.

`events_ingest` is all or nothing: one transaction stores the new events,
their projections (steps, rank windows, attempts, checkpoints, nodes) and the
jobs' summary fields, or nothing at all. Deduplication is on (job, client id):
the job rows are locked first, so two deliveries of one batch can never both
count the same event as new.
"""

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from common.outbox import Work, outbox_claim, outbox_enqueue
from common.time import dt
from jobs.accounting import compute_ledger, load_lifecycle, load_steps
from jobs.bulk import (
    insert_ignoring_conflicts,
    insert_new,
    update_rows,
    update_to_latest,
    upsert_spans,
)
from jobs.models import (
    Attempt,
    Checkpoint,
    Cluster,
    Event,
    HeartbeatBucket,
    LedgerSnapshot,
    Node,
    RankWindow,
    StepRecord,
    TrainingJob,
)
from jobs.selectors import job_step_buckets
from jobs.signals import events_stored, ledger_refreshed
from jobs.wire import WireEvent, as_float

logger = logging.getLogger(__name__)

EVENT_COLUMNS = ["job", "client_id", "kind", "ts", "attempt", "node", "rank", "data", "received_at"]
STEP_COLUMNS = ["job", "attempt", "step", "ts", "loss", "grad_norm", "tokens", "step_time_s"]
WINDOW_COLUMNS = [
    "job",
    "attempt",
    "rank",
    "node",
    "first_step",
    "last_step",
    "ts",
    "compute_s",
    "step_s",
    "comm_wait_s",
    "data_wait_s",
]


audit = logging.getLogger("rebound.audit")


class HistoryConflict(Exception):
    """A batch would rewrite a launch's history: a second start of a launch, or a new
    launch of a finished job. `conflicts`: {index, job, attempt, reason, stored} each,
    `index` the event's place in the batch."""

    def __init__(self, conflicts: list[dict]):
        super().__init__(conflicts[0]["reason"])
        self.conflicts = conflicts


class JobNotFinished(Exception):
    """Only a finished job can be reopened."""

    def __init__(self, *, job: str):
        super().__init__(f"job {job!r} is not finished; there is nothing to reopen")
        self.job = job


class JobsOfAnotherCluster(Exception):
    """A batch names jobs that belong to another cluster than the one posting it."""

    def __init__(self, *, cluster: str, keys: list[str]):
        super().__init__(f"cluster {cluster!r} does not own job(s): {', '.join(keys)}")
        self.cluster = cluster
        self.keys = keys


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int


def node_mark_suspect(*, node_id: int) -> bool:
    """An active node that stopped answering becomes suspect; other states stay."""
    changed = Node.objects.filter(pk=node_id, state=Node.State.ACTIVE).update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    return changed == 1


def node_set_state(*, node_id: int, to: str, from_states=None) -> bool:
    """Moves a node to `to` when it is in one of `from_states` (any state but `to`
    when None): a conditional update, so of two racing writers one wins."""
    nodes = Node.objects.filter(pk=node_id).exclude(state=to)
    if from_states is not None:
        nodes = nodes.filter(state__in=list(from_states))
    return nodes.update(state=to, state_changed_at=timezone.now()) == 1


def node_claim_spare(*, cluster_id: int, exclude_ids=()) -> Node | None:
    """Takes a spare node of the cluster into service (spare -> active), or None
    when none is left. Each spare is claimed by one caller only."""
    candidates = (
        Node.objects.filter(cluster_id=cluster_id, state=Node.State.SPARE)
        .exclude(pk__in=list(exclude_ids))
        .order_by("name")
        .values_list("pk", flat=True)
    )
    for pk in candidates:
        if node_set_state(node_id=pk, to=Node.State.ACTIVE, from_states=[Node.State.SPARE]):
            return Node.objects.get(pk=pk)
    return None


def cluster_get_or_create(*, name: str) -> Cluster:
    cluster, _ = Cluster.objects.get_or_create(name=name)
    return cluster


def _lock_jobs(*, cluster: Cluster, keys: set[str]) -> dict[str, TrainingJob]:
    """The batch's jobs, created on the token's cluster when new, locked for this transaction."""
    TrainingJob.objects.bulk_create(
        [TrainingJob(key=k, cluster=cluster) for k in sorted(keys)], ignore_conflicts=True
    )
    jobs = {
        j.key: j
        for j in TrainingJob.objects.select_for_update().filter(key__in=keys).order_by("id")
    }
    foreign = sorted(k for k, j in jobs.items() if j.cluster_id != cluster.id)
    if foreign:
        raise JobsOfAnotherCluster(cluster=cluster.name, keys=foreign)
    return jobs


def _insert_events(jobs: dict[str, TrainingJob], events: list[WireEvent], now) -> list[WireEvent]:
    """Store the events not stored yet, each (job, id) once (the first in the batch wins).

    Returns the events stored. The jobs are locked, so what the insert found
    already stored cannot change before this transaction ends.
    """
    job_id = {k: j.id for k, j in jobs.items()}
    firsts: dict[tuple[int, str], WireEvent] = {}
    for e in events:
        firsts.setdefault((job_id[e.job], e.client_id), e)
    batch = list(firsts.values())
    dumps = orjson.dumps
    inserted = insert_new(
        Event,
        EVENT_COLUMNS,
        [
            [job_id[e.job] for e in batch],
            [e.client_id for e in batch],
            [e.kind for e in batch],
            [e.ts for e in batch],
            [e.attempt for e in batch],
            [e.node for e in batch],
            [e.rank for e in batch],
            [dumps(e.data).decode() for e in batch],
            [now] * len(batch),
        ],
        key=("job", "client_id"),
    )
    if len(inserted) == len(batch):
        return batch
    return [e for k, e in firsts.items() if k in inserted]


def _ensure_nodes(cluster_id: int, names: set[str]) -> dict[str, int]:
    """Node ids by name, creating the missing ones: one query when all are known."""
    if not names:
        return {}
    found = dict(
        Node.objects.filter(cluster_id=cluster_id, name__in=names).values_list("name", "id")
    )
    if len(found) < len(names):
        Node.objects.bulk_create(
            [
                Node(cluster_id=cluster_id, name=n, registered=False)
                for n in sorted(names - found.keys())
            ],
            ignore_conflicts=True,
        )
        found = dict(
            Node.objects.filter(cluster_id=cluster_id, name__in=names).values_list("name", "id")
        )
    return found


def events_ingest(*, cluster: Cluster, events: list[WireEvent]) -> IngestResult:
    """Store a validated batch for jobs of `cluster`; see the module docstring."""
    now = timezone.now()
    with transaction.atomic():
        jobs = _lock_jobs(cluster=cluster, keys={e.job for e in events})
        fresh = _insert_events(jobs, events, now)
        if fresh:
            _project(cluster, jobs, fresh, now)
            touched = sorted({jobs[e.job].id for e in fresh})
            kinds: dict[int, set[str]] = defaultdict(set)
            for e in fresh:
                kinds[jobs[e.job].id].add(e.kind)
            # One outbox row per job, in this transaction: sent after the commit,
            # never at the client's expense, and kept while the broker is away.
            _follow_up(touched, kinds)
    return IngestResult(accepted=len(fresh), duplicates=len(events) - len(fresh))


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
        finished_at = _iso(dt(finished))
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
        job.status = _job_status(job)
        job.revision += 1  # the cached ledger ended at the finish: stale now
        job.save(update_fields=["reopened_finish_ts", "finished_at", "status", "revision"])
        message = (
            f"job {job.key} reopened by {actor or 'unknown'} (finished at {finished_at}):"
            f" {reason or 'no reason given'}"
        )
        transaction.on_commit(lambda: audit.info(message))
    return job


# What ingest hands on (common.outbox): per job, one `jobs.events_stored` task that
# announces the new events (the signal) and asks for a ledger refresh. A launch that
# began or ended, a fault or a saved checkpoint (a replacement may wait for it) is
# announced at once; other kinds within EVENTS_STORED_DEBOUNCE_S, all the batches
# of that window in one announcement.
EVENTS_STORED_TASK = "jobs.events_stored"
PROMPT_KINDS = frozenset(
    {"attempt_started", "attempt_ended", "fault", "checkpoint_saved", "job_finished"}
)
EVENTS_STORED_DEBOUNCE_S = 1
# A busy job sends many batches a second; one refresh per job in this window is enough.
LEDGER_REFRESH_DEBOUNCE_S = settings.REBOUND_LEDGER_DEBOUNCE_S


def _follow_up(job_ids: list[int], kinds: dict[int, set[str]]) -> None:
    outbox_enqueue(
        [
            Work(
                EVENTS_STORED_TASK,
                str(job_id),
                [job_id, sorted(kinds[job_id])],
                delay_s=0 if kinds[job_id] & PROMPT_KINDS else EVENTS_STORED_DEBOUNCE_S,
            )
            for job_id in job_ids
        ]
    )


def events_follow_up(*, job_id: int, kinds: list[str]) -> None:
    """In the worker: tell the apps to the right that `job_id` has new events of
    `kinds`, and have its ledger refreshed. The work they ask for is recorded with
    this task's claim of its outbox row, in one transaction: all of it or none."""
    with transaction.atomic():
        outbox_claim(task=EVENTS_STORED_TASK, key=str(job_id))
        outbox_enqueue(
            [Work("jobs.ledger_refresh", str(job_id), [job_id], LEDGER_REFRESH_DEBOUNCE_S)]
        )
        for receiver, result in events_stored.send_robust(
            sender=TrainingJob, job_ids=[job_id], kinds={job_id: set(kinds)}
        ):
            if isinstance(result, Exception):
                logger.error("events_stored receiver %r failed: %r", receiver, result)


def ledger_snapshot_refresh(*, job: TrainingJob) -> bool:
    """Recompute the job's cumulative ledger unless the snapshot is current; tell
    the apps that derive figures from it. Returns whether it recomputed."""
    job.refresh_from_db(fields=["revision", "last_event_ts"])
    current = LedgerSnapshot.objects.filter(job=job).values_list("revision", flat=True).first()
    if current == job.revision:
        return False
    revision = job.revision  # read before the history: a newer ingest makes it stale again
    steps = load_steps(job.id)
    ledger = compute_ledger(job.key, load_lifecycle(job.id), steps, last_event_ts=job.last_event_ts)
    LedgerSnapshot.objects.update_or_create(
        job=job, defaults={"revision": revision, "figures": ledger.as_dict()}
    )
    for receiver, result in ledger_refreshed.send_robust(
        sender=TrainingJob, job=job, ledger=ledger, steps=steps
    ):
        if isinstance(result, Exception):
            logger.error("ledger_refreshed receiver %r failed: %r", receiver, result)
    # The job page's step series: brought up to date here, off the request path, so
    # no one waits for a large job's first read (it reads only rows new since).
    job_step_buckets(job=job)
    return True


def _project(cluster: Cluster, jobs: dict[str, TrainingJob], fresh: list[WireEvent], now) -> None:
    """What the new events add to steps, rank windows, nodes, attempts, checkpoints, jobs."""
    job_id = {k: j.id for k, j in jobs.items()}

    steps = [e for e in fresh if e.kind == "step"]
    windows = [e for e in fresh if e.kind == "rank_window"]
    lifecycle = [e for e in fresh if e.kind in Event.LIFECYCLE_KINDS]
    heartbeats = [e for e in fresh if e.kind == "heartbeat"]

    node_names = {e.node for e in fresh if e.node}
    for e in lifecycle:
        if e.kind == "attempt_started":
            node_names.update(e.data.get("nodes") or ())
    node_ids = _ensure_nodes(cluster.id, node_names)

    if steps:
        insert_ignoring_conflicts(
            StepRecord,
            STEP_COLUMNS,
            [
                [job_id[e.job] for e in steps],
                [e.attempt for e in steps],
                [e.data["step"] for e in steps],
                [e.ts for e in steps],
                [as_float(e.data.get("loss")) for e in steps],
                [as_float(e.data.get("grad_norm")) for e in steps],
                [e.data.get("tokens") for e in steps],
                [as_float(e.data.get("step_time_s")) for e in steps],
            ],
        )
    if windows:
        insert_ignoring_conflicts(
            RankWindow,
            WINDOW_COLUMNS,
            [
                [job_id[e.job] for e in windows],
                [e.attempt for e in windows],
                [e.rank for e in windows],
                [node_ids.get(e.node) for e in windows],
                [e.data["first_step"] for e in windows],
                [e.data["last_step"] for e in windows],
                [e.ts for e in windows],
                [float(e.data["compute_s"]) for e in windows],
                [float(e.data["step_s"]) for e in windows],
                [as_float(e.data.get("comm_wait_s")) for e in windows],
                [as_float(e.data.get("data_wait_s")) for e in windows],
            ],
        )
    _record_heartbeats(node_ids, heartbeats, job_id, now)
    attempts = _project_lifecycle(jobs, fresh, lifecycle, node_ids)
    _update_jobs(jobs, fresh, lifecycle, attempts, now)


def _record_heartbeats(
    node_ids: dict[str, int], heartbeats: list[WireEvent], job_id: dict[str, int], now
) -> None:
    latest: dict[str, float] = {}
    spans: dict[tuple[int, str, int], list[float]] = {}
    size = HeartbeatBucket.BUCKET_S
    for e in heartbeats:
        if e.ts > latest.get(e.node, 0.0):
            latest[e.node] = e.ts
        span = spans.setdefault((job_id[e.job], e.node, int(e.ts // size)), [e.ts, e.ts])
        span[0], span[1] = min(span[0], e.ts), max(span[1], e.ts)
    if spans:
        keys = sorted(spans)
        upsert_spans(
            HeartbeatBucket,
            ["job", "node", "bucket"],
            [
                [k[0] for k in keys],
                [k[1] for k in keys],
                [k[2] for k in keys],
                [spans[k][0] for k in keys],
                [spans[k][1] for k in keys],
            ],
            "first_ts",
            "last_ts",
        )
    # One UPDATE for all the batch's nodes; a heartbeat never moves one back in time.
    update_to_latest(
        Node, "last_heartbeat_at", {node_ids[name]: dt(ts) for name, ts in latest.items()}
    )
    update_to_latest(Node, "last_heard_at", {node_ids[name]: now for name in latest})


def _earlier(current: datetime | None, ts: float) -> bool:
    return current is None or dt(ts) < current


def _project_lifecycle(jobs, fresh, lifecycle, node_ids) -> dict[tuple[int, int], Attempt]:
    """Attempt and checkpoint rows from lifecycle events, whatever order they come in.

    Returns every attempt, as now stored, of the jobs whose launches these
    events describe (locked, like the jobs themselves), by (job id, number).
    Raises HistoryConflict, before changing any, when the batch would rewrite a
    launch's history (see _history_conflicts).
    """
    job_id = {k: j.id for k, j in jobs.items()}
    numbers = {(job_id[e.job], e.attempt) for e in fresh if e.attempt is not None}
    if not numbers:
        return {}
    Attempt.objects.bulk_create(
        [Attempt(job_id=j, number=n) for j, n in sorted(numbers)], ignore_conflicts=True
    )
    finishes = _finishes(jobs, lifecycle)
    if not lifecycle and not finishes:
        return {}
    # Jobs that finished are read even for a batch of steps alone: a new launch shows
    # in its steps before its start arrives. The same one query either way.
    touched_jobs = {job_id[e.job] for e in lifecycle if e.attempt is not None}
    touched_jobs.update(jobs[k].id for k in finishes)
    attempts = {
        (a.job_id, a.number): a
        for a in Attempt.objects.select_for_update().filter(job_id__in=touched_jobs)
    }
    conflicts = _history_conflicts(jobs, fresh, lifecycle, attempts, finishes)
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
        if e.kind == "attempt_started" and _earlier(a.started_at, e.ts):
            a.started_at = dt(e.ts)
            a.world_size = d["world_size"]
            a.gpus_per_node = d.get("gpus_per_node")
            names = d.get("nodes") or []
            a.nodes.set([node_ids[n] for n in names])
            changed.add(key)
        elif e.kind == "ready" and _earlier(a.ready_at, e.ts):
            a.ready_at = dt(e.ts)
            changed.add(key)
        elif e.kind == "attempt_ended" and _earlier(a.ended_at, e.ts):
            a.ended_at = dt(e.ts)
            a.end_reason = d["reason"]
            a.exit_code = d.get("exit_code")
            changed.add(key)
        elif e.kind in ("checkpoint_save_started", "checkpoint_saved"):
            ck = checkpoints[(key[0], e.attempt, d["step"])]
            if e.kind == "checkpoint_save_started":
                if _earlier(ck.save_started_at, e.ts):
                    ck.save_started_at = dt(e.ts)
            elif _earlier(ck.saved_at, e.ts):
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
        ],
        [attempts[k] for k in sorted(changed)],
    )
    update_rows(
        Checkpoint,
        ["save_started_at", "saved_at", "blocking_s", "bytes", "uri", "tier", "durable"],
        list(checkpoints.values()),
    )
    return attempts


def _reopened(job: TrainingJob, ts: float) -> bool:
    """Whether a job_finished at `ts` is one an operator reopened (void)."""
    return job.reopened_finish_ts is not None and ts <= job.reopened_finish_ts


def _finishes(jobs: dict[str, TrainingJob], lifecycle: list[WireEvent]) -> dict[str, float]:
    """When each job of the batch finished, as stored or as this batch says: the
    earliest finish that no reopening voided."""
    out = {k: j.finished_at.timestamp() for k, j in jobs.items() if j.finished_at is not None}
    for e in lifecycle:
        if e.kind == "job_finished" and not _reopened(jobs[e.job], e.ts):
            out[e.job] = min(out.get(e.job, e.ts), e.ts)
    return out


def _history_conflicts(jobs, fresh, lifecycle, attempts, finishes) -> list[dict]:
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
                        f" {_iso(stored.started_at)} (event {event!r}); another"
                        f" attempt_started ({e.client_id!r}) would rewrite it"
                    ),
                    "stored": {"event": event, "started_at": _iso(stored.started_at)},
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
        finished_at = _iso(dt(finish))
        conflicts.append(
            {
                "index": (start or e).index,
                "job": e.job,
                "attempt": e.attempt,
                "reason": (
                    f"job {e.job!r} finished at {finished_at}; launch {e.attempt}"
                    f" ({'started' if start else 'an event'} at {_iso(dt(when))}) would be a"
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


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


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


def _update_jobs(jobs, fresh, lifecycle, attempts, now) -> None:
    per_job: dict[str, list[WireEvent]] = defaultdict(list)
    for e in fresh:
        per_job[e.job].append(e)
    lifecycle_jobs = {e.job for e in lifecycle}
    attempts_of: dict[int, list[Attempt]] = defaultdict(list)
    for (j, _), a in attempts.items():
        attempts_of[j].append(a)
    for key, evs in per_job.items():
        job = jobs[key]
        lo = min(e.ts for e in evs)
        hi = max(e.ts for e in evs)
        if job.first_event_ts is None or lo < job.first_event_ts:
            job.first_event_ts = lo
        if job.last_event_ts is None or hi > job.last_event_ts:
            job.last_event_ts = hi
        for e in evs:
            if e.kind == "step" and (job.last_step_ts is None or e.ts >= job.last_step_ts):
                job.last_step, job.last_step_ts = e.data["step"], e.ts
            elif (
                e.kind == "job_finished"
                and _earlier(job.finished_at, e.ts)
                and not _reopened(job, e.ts)
            ):
                job.finished_at = dt(e.ts)
        if key in lifecycle_jobs:
            job.status = _job_status(job, attempts_of.get(job.id))
        job.revision += 1
        job.events_count += len(evs)
        job.last_received_at = now
        job.save(
            update_fields=[
                "first_event_ts",
                "last_event_ts",
                "last_step",
                "last_step_ts",
                "finished_at",
                "status",
                "revision",
                "events_count",
                "last_received_at",
            ]
        )


def _job_status(job: TrainingJob, attempts: list[Attempt] | None = None) -> str:
    """The status the job's latest launch gives it; `attempts`, when given, are all of
    the job's attempts as stored (saves reading them again)."""
    if attempts is None:
        latest = job.attempts.exclude(started_at=None).order_by("-number").first() or (
            job.attempts.order_by("-number").first()
        )
    else:
        started = [a for a in attempts if a.started_at is not None]
        latest = max(started or attempts, key=lambda a: a.number, default=None)
    S = TrainingJob.Status
    reason = latest.end_reason if latest else ""
    if job.finished_at is not None:
        return S.COMPLETED if reason in ("", Attempt.EndReason.COMPLETED) else S.FAILED
    if latest is None:
        return S.PENDING
    if latest.ended_at is None:
        return S.RUNNING
    return S.COMPLETED if reason == Attempt.EndReason.COMPLETED else S.INTERRUPTED
