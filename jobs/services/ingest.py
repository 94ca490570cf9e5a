"""Ingest: a validated batch of events stored, and what it projects out of the stream.

`events_ingest` is all or nothing: one transaction stores the new events,
their projections (steps, rank windows, attempts, checkpoints, nodes) and the
jobs' summary fields, or nothing at all. Deduplication is on (job, client id).
The job rows are locked first:

- a batch of stream events alone (steps, rank windows, heartbeats: what a large
  job sends thousands of a second, from many clients) takes them FOR KEY SHARE, so
  such batches of one job are stored side by side; the unique keys arbitrate their
  rows (two deliveries of one batch never both count an event as new), and each
  moves its jobs' summary fields by a relative UPDATE;
- any other batch (a launch's lifecycle, checkpoints, faults, a finish) takes them
  FOR UPDATE: it runs alone, reads what is stored to check what it may not rewrite
  (`jobs.services.history`), and skips stored keys by looking them up.

Either way, a reader that takes a job's row FOR UPDATE (detection reading its
tables' highest ids, storage upkeep) finds no batch of that job half-stored. The
follow-up work is handed on in `jobs.services.follow_up`.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from common.errors import PermissionDenied
from common.time import dt
from common.vocabulary import UNSTORED_KINDS
from jobs.bulk import (
    ids_by,
    insert_ignoring_conflicts,
    insert_new,
    update_to_latest,
    upsert_spans,
)
from jobs.models import (
    Attempt,
    Cluster,
    Event,
    HeartbeatBucket,
    Node,
    RankWindow,
    StepRecord,
    StreamRollup,
    TrainingJob,
)
from jobs.selectors import job_status
from jobs.services.follow_up import events_follow_up_enqueue
from jobs.services.history import finish_reopened
from jobs.services.lifecycle import earlier, lifecycle_project
from jobs.wire import WireEvent, as_float

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


class JobsOfAnotherCluster(PermissionDenied):
    """A batch names jobs that belong to another cluster than the one posting it."""

    code = "forbidden_job"

    def __init__(self, *, cluster: str, keys: list[str]):
        super().__init__(
            f"This token's cluster '{cluster}' does not own job(s): {', '.join(keys)}.",
            jobs=keys,
        )
        self.cluster = cluster
        self.keys = keys


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int


# The kinds a batch may carry and still be stored beside other batches of its jobs.
STREAM_KINDS = frozenset({"step", "rank_window", "heartbeat"})
DEADLOCK = "40P01"
DEADLOCK_RETRIES = 3


def _lock_jobs(*, cluster: Cluster, keys: set[str], shared: bool) -> dict[str, TrainingJob]:
    """The batch's jobs, created on the token's cluster when new, locked for this
    transaction: FOR KEY SHARE when `shared`, FOR UPDATE otherwise (see the module's
    docstring). Either way, every write of a job's stream rows happens under it."""
    jobs = _locked(keys, shared)
    if len(jobs) < len(keys):  # new jobs: created, then all of them locked again, in order
        TrainingJob.objects.bulk_create(
            [TrainingJob(key=k, cluster=cluster) for k in sorted(keys)], ignore_conflicts=True
        )
        jobs = _locked(keys, shared)
    foreign = sorted(k for k, j in jobs.items() if j.cluster_id != cluster.id)
    if foreign:
        raise JobsOfAnotherCluster(cluster=cluster.name, keys=foreign)
    return jobs


def _locked(keys: set[str], shared: bool) -> dict[str, TrainingJob]:
    if shared:  # a lock Django's select_for_update does not take
        rows = TrainingJob.objects.raw(
            f"SELECT * FROM {TrainingJob._meta.db_table} WHERE key = ANY(%s)"
            " ORDER BY id FOR KEY SHARE",
            [sorted(keys)],
        )
    else:
        rows = TrainingJob.objects.select_for_update().filter(key__in=keys).order_by("id")
    return {j.key: j for j in rows}


def _insert_events(
    jobs: dict[str, TrainingJob], events: list[WireEvent], now, *, shared: bool
) -> list[WireEvent]:
    """Store the events not stored yet, each (job, id) once (the first in the batch wins).

    Returns the events stored, and the plain heartbeats: those are not stored raw (their
    buckets take a heartbeat twice the same as once), so every one counts as new. Under
    the jobs' exclusive lock what is stored is looked up; under the shared one the
    unique key arbitrates, the rows in key order (two deliveries of one batch at once
    wait on each other, never in a cycle).
    """
    job_id = {k: j.id for k, j in jobs.items()}
    firsts: dict[tuple[int, str], WireEvent] = {}
    unstored: list[WireEvent] = []
    for e in events:
        if e.kind in UNSTORED_KINDS and not e.data:
            unstored.append(e)
        else:
            firsts.setdefault((job_id[e.job], e.client_id), e)
    if not firsts:
        return unstored
    batch = [firsts[k] for k in sorted(firsts)] if shared else list(firsts.values())
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
        locked=not shared,
    )
    if len(inserted) == len(batch):
        return list(firsts.values()) + unstored
    return [e for k, e in firsts.items() if k in inserted] + unstored


def _ensure_nodes(cluster_id: int, names: set[str]) -> dict[str, int]:
    """Node ids by name, creating the missing ones: one query when all are known."""
    if not names:
        return {}
    found = ids_by(Node, "name", sorted(names), cluster_id=cluster_id)
    if len(found) < len(names):
        Node.objects.bulk_create(
            [
                Node(cluster_id=cluster_id, name=n, registered=False)
                for n in sorted(names - found.keys())
            ],
            ignore_conflicts=True,
        )
        found = ids_by(Node, "name", sorted(names), cluster_id=cluster_id)
    return found


def events_ingest(
    *, cluster: Cluster, events: list[WireEvent], received_at: datetime | None = None
) -> IngestResult:
    """Store a validated batch for jobs of `cluster`; see the module docstring.

    `received_at` stands for the server's clock (the events' `received_at`, the jobs'
    last_received_at, the nodes' last_heard_at) in a replay on a simulated clock
    (bench/fleetsim); the API never passes it."""
    # Batches stored side by side may still meet in a cycle on rows no key orders (a
    # node two of them beat for): PostgreSQL refuses one, which is then stored again.
    for retry in range(DEADLOCK_RETRIES + 1):
        try:
            return _ingest(cluster, events, received_at or timezone.now())
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK or retry == DEADLOCK_RETRIES:
                raise
    raise AssertionError("unreachable")


def _ingest(cluster: Cluster, events: list[WireEvent], now: datetime) -> IngestResult:
    shared = connection.vendor == "postgresql" and all(e.kind in STREAM_KINDS for e in events)
    with transaction.atomic():
        jobs = _lock_jobs(cluster=cluster, keys={e.job for e in events}, shared=shared)
        fresh = _insert_events(jobs, events, now, shared=shared)
        if fresh:
            _project(cluster, jobs, fresh, now, shared=shared)
            touched = sorted({jobs[e.job].id for e in fresh})
            kinds: dict[int, set[str]] = defaultdict(set)
            for e in fresh:
                kinds[jobs[e.job].id].add(e.kind)
            # One outbox row per job, in this transaction: sent after the commit,
            # never at the client's expense, and kept while the broker is away.
            events_follow_up_enqueue(touched, kinds)
    return IngestResult(accepted=len(fresh), duplicates=len(events) - len(fresh))


def _project(
    cluster: Cluster, jobs: dict[str, TrainingJob], fresh: list[WireEvent], now, *, shared: bool
) -> None:
    """What the new events add to steps, rank windows, nodes, attempts, checkpoints, jobs."""
    job_id = {k: j.id for k, j in jobs.items()}

    # One row per key, the first in the batch (as ON CONFLICT would keep): under the
    # jobs' exclusive locks the inserts below look the keys up rather than arbitrate
    # conflicts; under shared ones they arbitrate them, in key order.
    steps = _first_per_key((e for e in fresh if e.kind == "step"), shared)
    windows = _windows_not_rolled_up(
        jobs, _first_per_key((e for e in fresh if e.kind == "rank_window"), shared)
    )
    lifecycle = [e for e in fresh if e.kind in Event.TIMELINE_KINDS]
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
            locked_key=() if shared else ("job", "attempt", "step"),
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
            # A window sent again carries its `ts`: the key the table holds unique.
            locked_key=() if shared else ("job", "attempt", "rank", "first_step", "ts"),
        )
    _record_heartbeats(node_ids, heartbeats, job_id, now)
    attempts = lifecycle_project(jobs, fresh, lifecycle, node_ids, shared=shared)
    if shared:
        _move_jobs(jobs, fresh, now)
    else:
        _update_jobs(jobs, fresh, lifecycle, attempts, now)


def _first_per_key(events, by_key: bool) -> list[WireEvent]:
    """Steps or rank windows, the first of each launch's step or rank's window, in the
    batch's order or (`by_key`) in the order of their keys."""
    firsts: dict[tuple, WireEvent] = {}
    for e in events:
        d = e.data
        key = (
            (e.job, e.attempt, d["step"])
            if e.kind == "step"
            else (e.job, e.attempt, e.rank, d["first_step"])
        )
        firsts.setdefault(key, e)
    return [firsts[k] for k in sorted(firsts)] if by_key else list(firsts.values())


def _windows_not_rolled_up(jobs, windows: list[WireEvent]) -> list[WireEvent]:
    """The windows behind what storage upkeep rolled up are not stored again: their raw
    event is gone, so a resend arrives as new, and its hour is counted already."""
    if not windows:
        return windows
    rolled = dict(
        StreamRollup.objects.filter(job_id__in={jobs[e.job].id for e in windows})
        .exclude(windows_rolled={})
        .values_list("job_id", "windows_rolled")
    )
    if not rolled:
        return windows
    return [
        e
        for e in windows
        if e.data["first_step"] > rolled.get(jobs[e.job].id, {}).get(str(e.attempt), -1)
    ]


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
    # One UPDATE for all the batch's nodes; a heartbeat never moves one back in time,
    # and rewrites a node only once it is the liveness granularity behind (a row
    # version per node and batch, at thousands of nodes, is mostly dead rows).
    update_to_latest(
        Node,
        ["last_heartbeat_at", "last_heard_at"],
        {node_ids[name]: [dt(ts), now] for name, ts in latest.items()},
        timedelta(seconds=settings.REBOUND_NODE_LIVENESS_S),
    )


def _stored_count(events: list[WireEvent]) -> int:
    """How many of the new events jobs_event holds (what a job's events_count counts)."""
    return sum(1 for e in events if e.kind not in UNSTORED_KINDS or e.data)


def _move_jobs(jobs, fresh, now) -> None:
    """The jobs' summary fields moved on by a batch of stream events, relative to what
    is stored (other batches of these jobs may be moving them at the same time)."""
    for key, job in sorted(jobs.items(), key=lambda kv: kv[1].id):
        evs = [e for e in fresh if e.job == key]
        if not evs:
            continue
        lo = min(e.ts for e in evs)
        hi = max(e.ts for e in evs)
        moved = {
            "first_event_ts": Least("first_event_ts", Value(lo)),  # PostgreSQL's skip NULLs
            "last_event_ts": Greatest("last_event_ts", Value(hi)),
            "revision": F("revision") + 1,
            "events_count": F("events_count") + _stored_count(evs),
            "last_received_at": Greatest("last_received_at", Value(now)),  # batches overlap
        }
        steps = [e for e in evs if e.kind == "step"]
        if steps:
            last = steps[0]
            for e in steps:  # the latest; of those stamped alike, the batch's last
                if e.ts >= last.ts:
                    last = e
            newer = Q(last_step_ts__isnull=True) | Q(last_step_ts__lte=last.ts)
            moved["last_step"] = Case(
                When(newer, then=Value(last.data["step"])),
                default=F("last_step"),
                output_field=TrainingJob._meta.get_field("last_step"),
            )
            moved["last_step_ts"] = Greatest("last_step_ts", Value(last.ts))
        TrainingJob.objects.filter(pk=job.pk).update(**moved)


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
                and earlier(job.finished_at, e.ts)
                and not finish_reopened(job, e.ts)
            ):
                job.finished_at = dt(e.ts)
        if key in lifecycle_jobs:
            job.status = job_status(job, attempts_of.get(job.id))
        job.revision += 1
        job.events_count += _stored_count(evs)
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
