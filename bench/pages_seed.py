"""Writes bench/pages_plan's installation into the database, through the apps' own
services wherever a rule lives, so the seed cannot drift from the product:

- nodes: plain rows (registering a node has no rule);
- jobs: each job's lifecycle events (launches, readiness, restores, saves, faults,
  ends, the finish) and the last step of each launch go through the ingest service
  (jobs.services.events_ingest: attempts, checkpoints, the job's status and
  counters); the bulk of the steps, their step events and the rank windows go in as
  ingest's own bulk writer writes them (jobs.bulk), which the ingest service would
  take minutes for at this scale; the cached ledger through
  jobs.services.ledger_snapshot_refresh;
- incidents: Rebound's detectors open them from what the jobs reported
  (incidents.services.incidents_detect_pass), with their timelines, times and lost
  compute; people resolve the old ones and write their notes
  (incidents.services.incident_resolve, incident_update_notes);
- actions: proposed, decided and ended through recovery.services (action_propose,
  action_approve, action_reject, action_cancel, approvals_expire, and
  action_transition for a run's start and end, as the worker records them, without
  a driver: a driver would change the planned node states). Their audit trails and
  timeline entries are the state machine's own.

History is written at its own time: `clock(ts)` sets the server clock the services
read (django.utils.timezone.now) while each step is taken. The only stamp set
afterwards is an incident's `opened_at` (the server time its pass ran): the seed runs
one detection pass per job, and stamps each incident opened a moment after it was
detected, as live detection would have.

No worker runs on the bench's database: Celery is pointed at an in-memory broker, so
the tasks the services send (detection, proposals, executions) go nowhere.
"""

import logging
import time
from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import numpy as np
import pages_plan as P
from pages_plan import GPUS_PER_NODE, INFERRED_FAULTS, ROLLBACK_FAULTS, JobPlan, Plan, dt, windows

CONTEXT = "bench/pages.py"
OPENED_AFTER_S = 0.8  # an incident's row is created this long after its detection
RESOLVED_AFTER_S = (1_800, 36 * 3_600)  # a person closes an old incident this long after
OLD_S = 3 * P.DAY  # incidents older than this are closed


def quiet() -> None:
    """Tasks the services send go to an in-memory broker that nothing reads, and their
    audit log lines (one per action transition) are not printed."""
    from console.celery import app

    logging.getLogger("rebound.audit").setLevel(logging.WARNING)
    app.conf.broker_url = "memory://localhost/"
    app.conf.broker_transport = "memory"
    app.conf.broker_transport_options = {}


@contextmanager
def clock(ts: float):
    """The server clock (django.utils.timezone.now) reads `ts` meanwhile."""
    with mock.patch("django.utils.timezone.now", return_value=dt(ts)):
        yield


# --- nodes ----------------------------------------------------------------------------


def bench_clusters():
    from jobs.models import Cluster

    return Cluster.objects.filter(name__in=P.CLUSTERS)


def clear(*, nodes: bool = False, jobs=None) -> None:
    """Delete the bench's actions and incidents (and what detection read of its jobs);
    with `jobs` (a queryset) those jobs too; with `nodes`, everything it seeded."""
    from incidents.models import DetectorState, Incident
    from jobs.models import Node, TrainingJob
    from recovery.models import Action

    clusters = bench_clusters()
    Action.objects.filter(cluster__in=clusters).delete()
    Incident.objects.filter(cluster__in=clusters).delete()
    DetectorState.objects.filter(job__cluster__in=clusters).delete()
    if nodes:
        jobs = TrainingJob.objects.filter(cluster__in=clusters)
    if jobs is not None:
        jobs.delete()
    if nodes:
        Node.objects.filter(cluster__in=clusters).delete()


def seed_state() -> tuple[float | None, bool]:
    """The anchor the installation was seeded at and whether its seed ran to the end
    (both in its clusters' descriptions)."""
    from jobs.models import Node

    nodes = Node.objects.filter(cluster__in=bench_clusters()).count()
    if nodes != len(P.CLUSTERS) * P.NODES_PER_CLUSTER:
        return None, False
    description = bench_clusters().values_list("description", flat=True).first() or ""
    anchor, _, done = description.partition(" anchored at ")[2].partition(";")
    try:
        return float(anchor), done.strip() == "complete"
    except ValueError:
        return None, False


def mark(anchor: float, *, complete: bool) -> None:
    bench_clusters().update(
        description=f"seeded by {CONTEXT}, anchored at {anchor!r}" + ("; complete" * complete)
    )


def seed_nodes(p: Plan) -> None:
    from jobs.models import Cluster, Node

    clear(nodes=True)
    ids = {}
    for name in P.CLUSTERS:
        cluster, _ = Cluster.objects.get_or_create(name=name)
        ids[name] = cluster.pk
    mark(p.anchor, complete=False)
    objs = [
        Node(
            cluster_id=ids[n.cluster],
            name=n.name,
            state=n.state,
            gpus=GPUS_PER_NODE,
            last_heartbeat_at=dt(p.anchor - n.last_heard_s - 0.3),
            last_heard_at=dt(p.anchor - n.last_heard_s),
        )
        for n in p.nodes
    ]
    Node.objects.bulk_create(objs, batch_size=2_000)
    stamp(
        Node,
        objs,
        created_at=[dt(p.anchor - 90 * P.DAY)] * len(objs),
        state_changed_at=[dt(p.anchor - n.state_changed_s) for n in p.nodes],
    )


def stamp(model, objs, **columns) -> None:
    """Set auto_now(_add) columns that bulk_create overwrote: one UPDATE per model."""
    from jobs.bulk import update_rows

    for name, values in columns.items():
        for obj, value in zip(objs, values, strict=True):
            setattr(obj, name, value)
    for start in range(0, len(objs), 5_000):
        update_rows(model, list(columns), objs[start : start + 5_000])


# --- jobs -----------------------------------------------------------------------------


def lifecycle_events(job: JobPlan) -> list[dict]:
    """The job's events as it reported them, on the wire, but for the steps: only each
    launch's last one (the rest go in in bulk, see write_bulk)."""
    out = []

    def event(cid, kind, ts, attempt, data, node=None, rank=None):
        e = {"id": cid, "job": job.key, "kind": kind, "ts": float(ts), "attempt": attempt}
        e.update({"data": data} | ({"node": node} if node else {}))
        out.append(e | ({"rank": rank} if rank is not None else {}))

    for la in job.launches:
        n = la.number
        started = {"world_size": la.world_size, "gpus_per_node": GPUS_PER_NODE, "nodes": la.nodes}
        event(f"start-{n}", "attempt_started", la.start, n, started)
        event(f"ready-{n}", "ready", la.ready, n, {})
        if la.resume:
            event(f"load-{n}", "checkpoint_load_started", la.load_started, n, {"step": la.resume})
            event(f"loaded-{n}", "checkpoint_loaded", la.loaded, n, {"step": la.resume})
        saves = np.flatnonzero(la.steps % job.ckpt_every == 0)
        for step, end in zip(la.steps[saves].tolist(), la.ends[saves].tolist(), strict=True):
            event(f"save-{n}-{step}", "checkpoint_save_started", end, n, {"step": step})
            saved = {"step": step, "blocking_s": la.save_block_s, "tier": "remote"}
            saved["uri"] = f"s3://ckpt/{job.key}/step-{step:09d}"
            saved["bytes"] = 2_000_000 * la.world_size
            event(f"saved-{n}-{step}", "checkpoint_saved", end + la.save_block_s, n, saved)
        if len(la.steps):  # the launch's last step (the same id as its bulk copy)
            step = {"step": int(la.steps[-1]), "step_time_s": round(float(la.dur[-1]), 6)}
            event(f"s{n}-{step['step']}", "step", la.ends[-1], n, step, rank=0)
        if la.fault and la.fault not in INFERRED_FAULTS:
            data = {"type": la.fault} | ({"xid": la.xid} if la.xid is not None else {})
            node = la.nodes[la.rank // GPUS_PER_NODE]
            event(f"fault-{n}", "fault", la.fault_ts, n, data, node=node, rank=la.rank)
        if la.end_ts is not None:
            data = {"reason": la.reason} | ({"exit_code": 1} if la.fault else {})
            event(f"end-{n}", "attempt_ended", la.end_ts, n, data)
    if job.finished_ts is not None:
        event("finished", "job_finished", job.finished_ts, job.launches[-1].number, {})
    return sorted(out, key=lambda e: e["ts"])


def ingest(cluster, job: JobPlan) -> None:
    """The job's lifecycle through the ingest service, received as it happened."""
    from jobs.services import events_ingest
    from jobs.wire import validate_events

    raw = lifecycle_events(job)
    for at in range(0, len(raw), 5_000):
        batch = raw[at : at + 5_000]
        events, errors = validate_events(batch, 5_000)
        if errors:
            raise SystemExit(f"{job.key}: the plan's events are refused: {errors[:3]}")
        with clock(batch[-1]["ts"] + 0.05):
            events_ingest(cluster=cluster, events=events)


def write_bulk(job: JobPlan, job_id: int, node_ids: dict[str, int]) -> int:
    """The job's step records and rank windows, as ingest's bulk writer writes them;
    returns how many step records."""
    from jobs.bulk import insert_ignoring_conflicts
    from jobs.models import RankWindow, StepRecord

    rng = P.rng_for(4, job.index)
    n_steps = 0
    for la in job.launches:
        n = len(la.steps)
        loss = 3.0 * np.exp(-la.steps / max(job.launches[-1].last / 3, 1)) + 0.9
        loss += rng.normal(0, 0.01, n)
        if la.fault in ROLLBACK_FAULTS:
            tail = min(60, n)
            loss[n - tail :] += np.linspace(0, 6, tail)
        columns = [
            [job_id] * n,
            [la.number] * n,
            la.steps.tolist(),
            la.ends.tolist(),
            np.round(loss, 5).tolist(),
            np.round(rng.uniform(0.5, 2.0, n), 4).tolist(),
            [4096 * la.world_size] * n,
            np.round(la.dur, 6).tolist(),
        ]
        names = ["job", "attempt", "step", "ts", "loss", "grad_norm", "tokens", "step_time_s"]
        for at in range(0, n, P.CHUNK):
            insert_ignoring_conflicts(StepRecord, names, [c[at : at + P.CHUNK] for c in columns])
        n_steps += n
    names = ["job", "attempt", "rank", "node", "first_step", "last_step", "ts", "compute_s"]
    names += ["step_s", "comm_wait_s", "data_wait_s"]
    columns = rank_windows(job, job_id, node_ids, rng)
    for at in range(0, len(columns[0]), P.CHUNK):
        insert_ignoring_conflicts(RankWindow, names, [c[at : at + P.CHUNK] for c in columns])
    return n_steps


def rank_windows(job: JobPlan, job_id: int, node_ids: dict[str, int], rng) -> list[list]:
    """The latest launch's rank windows, column-wise; one rank is a straggler in some jobs."""
    la = job.launches[-1]
    closes, firsts = windows(job)
    starts = np.concatenate([[0], closes[:-1] + 1])
    total = np.concatenate([[0.0], np.cumsum(la.dur)])
    step_s = (total[closes + 1] - total[starts]) / (closes - starts + 1)
    nw, ws = closes.size, la.world_size
    # Computing about 63% of each step; a straggler 97%, which the detector's scores
    # (the peers' median, and its own earlier time, over its time now) put near 0.65.
    compute = step_s[:, None] * rng.uniform(0.60, 0.66, (nw, ws))
    if job.straggler_rank is not None:  # it computes longer; the others wait for it
        compute[job.straggler_from :, job.straggler_rank] = step_s[job.straggler_from :] * 0.97
    data_wait = rng.uniform(0.005, 0.02, (nw, ws))
    comm = np.maximum(step_s[:, None] - compute - data_wait, 0.0)
    rank_node = np.array([node_ids[la.nodes[r // GPUS_PER_NODE]] for r in range(ws)])
    rows = nw * ws
    return [
        [job_id] * rows,
        [la.number] * rows,
        np.tile(np.arange(ws), nw).tolist(),
        np.tile(rank_node, nw).tolist(),
        np.repeat(firsts, ws).tolist(),
        np.repeat(la.steps[closes], ws).tolist(),
        np.repeat(la.ends[closes], ws).tolist(),
        np.round(compute, 6).ravel().tolist(),
        np.repeat(np.round(step_s, 6), ws).tolist(),
        np.round(comm, 6).ravel().tolist(),
        np.round(data_wait, 6).ravel().tolist(),
    ]


def write_step_events(job_ids: list[int]) -> dict[int, int]:
    """Each step record's `step` event, as the job reported it: built in the database
    (a launch's last one is already there, from ingest). Returns how many per job."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "WITH added AS (INSERT INTO jobs_event"
            " (job_id, client_id, kind, ts, attempt, node, rank, data, received_at)"
            " SELECT job_id, 's' || attempt || '-' || step, 'step', ts, attempt, '', 0,"
            " jsonb_build_object('step', step, 'loss', loss, 'grad_norm', grad_norm,"
            " 'tokens', tokens, 'step_time_s', step_time_s), to_timestamp(ts + 0.05)"
            " FROM jobs_steprecord WHERE job_id = ANY(%s) ON CONFLICT DO NOTHING"
            " RETURNING job_id) SELECT job_id, count(*) FROM added GROUP BY job_id",
            [job_ids],
        )
        added = dict(cursor.fetchall())
        for table in ("jobs_event", "jobs_steprecord", "jobs_rankwindow"):
            cursor.execute(f"ANALYZE {table}")
    return added


def done_jobs() -> set[str]:
    from jobs.models import TrainingJob

    return set(
        TrainingJob.objects.filter(
            cluster__in=bench_clusters(), events_count__gt=0, ledger__isnull=False
        ).values_list("key", flat=True)
    )


def seed_jobs(p: Plan) -> int:
    """Write the jobs not written yet (a job cut short is written again); returns how many."""
    from django.db.models import F

    from jobs.models import Node, TrainingJob
    from jobs.services import ledger_snapshot_refresh

    done = done_jobs()
    todo = [j for j in p.jobs if j.key not in done]
    if not todo:
        return 0
    clear(jobs=TrainingJob.objects.filter(key__in=[j.key for j in todo]))
    clusters = {c.name: c for c in bench_clusters()}
    node_ids = {
        (c, n): pk
        for c, n, pk in Node.objects.filter(cluster__in=clusters.values()).values_list(
            "cluster__name", "name", "id"
        )
    }
    t = time.perf_counter()
    for job in todo:
        ingest(clusters[job.cluster], job)
    ids = dict(TrainingJob.objects.filter(key__in=[j.key for j in todo]).values_list("key", "id"))
    print(f"  lifecycle events through ingest in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    for job in todo:
        names = {n: node_ids[(job.cluster, n)] for la in job.launches for n in la.nodes}
        write_bulk(job, ids[job.key], names)
    added = write_step_events(list(ids.values()))
    for job_id, n in added.items():  # what ingest would have counted, had they come through it
        TrainingJob.objects.filter(pk=job_id).update(
            events_count=F("events_count") + n, revision=F("revision") + 1
        )
    print(f"  steps, step events and rank windows in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    for job in todo:  # the cached ledger each page reads
        ledger_snapshot_refresh(job=TrainingJob.objects.get(pk=ids[job.key]))
    print(f"  ledgers in {time.perf_counter() - t:.1f} s")
    return len(todo)


# --- incidents ------------------------------------------------------------------------


def pass_time(job: JobPlan, anchor: float) -> float:
    """When the job's detection pass runs: a running job's now, a finished one's end."""
    final = job.launches[-1]
    if job.status == "running":
        return anchor
    return (job.finished_ts or final.end_ts or final.last_step_ts) + 1.0


def seed_incidents(p: Plan) -> None:
    """Rebound's detectors open the jobs' incidents, one pass per job at its time."""
    from django.db.models import F

    from incidents.models import Incident
    from incidents.services import incidents_detect_pass
    from jobs.models import TrainingJob

    rows = {j.key: j for j in TrainingJob.objects.filter(cluster__in=bench_clusters())}
    for job in p.jobs:
        at = pass_time(job, p.anchor)
        with clock(at):
            incidents_detect_pass(job=rows[job.key], clock=at)
    # Opened (server clock) a moment after detected, as live detection would have.
    Incident.objects.filter(cluster__in=bench_clusters()).update(
        opened_at=F("detected_at") + timedelta(seconds=OPENED_AFTER_S)
    )


def closings(anchor: float) -> dict[int, tuple[float, bool]]:
    """The incidents people closed: id -> (when, whether they wrote a postmortem). An
    incident older than OLD_S is closed a while after it recovered (or after it was
    detected, when its job went away without recovering); newer ones stay open."""
    from incidents.models import Incident

    out = {}
    incidents = Incident.objects.filter(cluster__in=bench_clusters()).order_by("fault_at", "id")
    for i in incidents.only("id", "fault_at", "detected_at", "recovered_at"):
        rng = P.rng_for(5, i.pk)
        after, noted = float(rng.uniform(*RESOLVED_AFTER_S)), bool(rng.random() < 0.4)
        if anchor - i.fault_at.timestamp() <= OLD_S:
            continue
        since = i.recovered_at or i.detected_at
        if since.timestamp() + after < anchor:
            out[i.pk] = (since.timestamp() + after, noted)
    return out


def resolve_incidents(closing: dict[int, tuple[float, bool]]) -> None:
    """People write the root cause (and sometimes a postmortem), then close."""
    from incidents import services
    from incidents.models import Incident

    for incident in Incident.objects.filter(pk__in=closing).prefetch_related("nodes"):
        at, noted = closing[incident.pk]
        node = next(iter(incident.nodes.all()), None)
        with clock(at - 60):
            services.incident_update_notes(
                incident=incident,
                actor=P.OPERATOR,
                root_cause=f"{incident.fault_type} on {node.name if node else 'the job'}",
                postmortem="Node sent for diagnostics; job resumed from its last checkpoint."
                if noted
                else None,
            )
        with clock(at):
            services.incident_resolve(incident=incident, actor=P.OPERATOR, note="closed")
