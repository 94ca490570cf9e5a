"""Console page server times on a large installation: every page's p95 under 300 ms.

    .venv/bin/python bench/pages.py [--reseed] [--only SUBSTR] [--n 30] [--warmup 3]
        [--sql] [--max-page-s 60] [--reliability-query QS] [--database-url postgres://...]

Seeds its own PostgreSQL database (`rebound_bench_pages`, or DATABASE_URL or
--database-url; created and migrated when missing) with an installation at
scale, then asks each console page for itself, in this process, through
Django's test Client signed in as an operator (`bench-pages-operator`), and
times the server's work.

The installation, anchored at the time it was first seeded (a rerun reuses
what is there and finishes any part a run cut short; --reseed drops the
database and seeds it anew):
- 4 clusters of 500 nodes of 8 GPUs: mostly active, some spare, suspect,
  cordoned, draining, in repair or retired, each with its last heartbeat;
- 100 training jobs, most running, each with a few launches on those nodes
  (attempts), its lifecycle and step events, its step records, durable
  checkpoints, the rank windows of its latest launch, and its cached ledger
  (jobs.selectors.job_goodput over those rows). One, `pages-1m`, has
  1,000,000 step executions in six launches on 128 ranks (a GPU Xid, a hang, a
  loss spike rolled back past its latest checkpoint, an NCCL timeout, a
  preemption, then the running one). Steps and rank windows go in as ingest
  writes them (jobs.bulk: numpy-encoded binary arrays, up to 250,000 rows a
  statement); the step events are then built from the step records inside the
  database. Rank-window and heartbeat events are not kept in jobs_event (their
  projection, the rank windows, is);
- 500 incidents over the last 60 days: one per failed launch, and stragglers in
  running launches, with their timelines, times to resume and recover, and lost
  GPU-seconds; some nodes are in several (repeat offenders);
- recovery actions: 30 awaiting approval (answering open incidents, holding no
  lease), 300 finished (succeeded, failed, rejected, expired, cancelled) and 4
  running, each with its audit trail and its entries on the incident's
  timeline.

Then, per page: --warmup requests, one more counted with CaptureQueriesContext
(its SQL queries and their time; --sql prints the three slowest), then --n
timed requests, with DEBUG off as in production, until --max-page-s. Prints
p50, p95 and max in ms and PASS/FAIL against p95 < 300 ms;
a page that answers anything but 200 FAILs with its status (and is not
repeated). Exit status 0 when every page passes.
"""

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import orjson
import psycopg
from harness import setup_django, verdict

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_pages"
TARGET_P95_MS = 300.0
SEED = 2026
DAY = 86_400.0

CLUSTERS = ("pages-east", "pages-west", "pages-north", "pages-south")
NODES_PER_CLUSTER = 500
RACK = 20  # nodes a rack, for the names
GPUS_PER_NODE = 8
# Nodes of each cluster not active (the rest are).
NODE_STATES = {
    "spare": 40,
    "suspect": 10,
    "cordoned": 14,
    "draining": 6,
    "in_repair": 16,
    "retired": 4,
}
BAD_NODES = 30  # per cluster: where faults happen more often than elsewhere

N_JOBS = 100
JOB_STATUSES = {"running": 74, "completed": 12, "failed": 7, "interrupted": 7}
BIG_KEY = "pages-1m"
BIG_STEPS = 1_000_000
BIG_NODES = 16
# resume, last step, fault, Xid, end reason: the big job's six launches.
BIG_LAUNCHES = [
    (0, 180_050, "gpu_xid", 79, "failed"),
    (180_000, 390_030, "hang", None, "failed"),
    (390_000, 520_075, "loss_spike", None, "killed"),  # rolled back to 500,000
    (500_000, 700_020, "nccl_timeout", None, "failed"),
    (700_000, 850_010, "preempted", None, "preempted"),
    (850_000, None, None, None, None),  # running: the rest of the 1,000,000
]
N_INCIDENTS = 500
N_STRAGGLERS = 40
N_AWAITING, N_FINISHED, N_RUNNING = 30, 300, 4
OPERATOR = "bench-pages-operator"

FAULTS = {  # type: (weight, end reason)
    "gpu_xid": (20, "failed"),
    "ecc": (6, "failed"),
    "crash": (14, "failed"),
    "oom": (6, "failed"),
    "hang": (10, "failed"),
    "nccl_timeout": (10, "failed"),
    "network": (5, "failed"),
    "dead_node": (6, "failed"),
    "loss_spike": (5, "killed"),
    "nan": (3, "killed"),
    "preempted": (10, "preempted"),
    "other": (5, "failed"),
}
XIDS = (79, 48, 94, 63, 74, 13, 31, 43)
ROLLBACK_FAULTS = ("loss_spike", "nan")  # the next launch goes back further
INFERRED_FAULTS = ("hang", "dead_node")  # Rebound infers them: no fault event
HANG_TIMEOUT_S = 600.0
CHUNK = 250_000  # rows a statement


# --- the plan: everything decided from SEED and the anchor, nothing stored -----------


@dataclass
class Launch:
    number: int
    nodes: list[str]
    resume: int  # the checkpoint step it restarts from (0: the beginning)
    last: int  # its last step
    fault: str | None = None  # what ended it
    xid: int | None = None
    reason: str | None = None  # attempt_ended's reason; None while it runs
    rank: int = 0  # the rank the fault was reported on
    # Times (unix seconds), set by simulate()
    start: float = 0.0
    ready: float = 0.0
    load_started: float | None = None
    loaded: float | None = None
    fault_ts: float | None = None
    detected_ts: float | None = None
    end_ts: float | None = None
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0))
    dur: np.ndarray = field(default_factory=lambda: np.zeros(0))
    save_block_s: float = 4.0

    @property
    def world_size(self) -> int:
        return len(self.nodes) * GPUS_PER_NODE

    @property
    def last_step_ts(self) -> float:
        return float(self.ends[-1]) if len(self.ends) else self.ready


@dataclass
class JobPlan:
    index: int
    key: str
    cluster: str
    status: str
    step_s: float
    ckpt_every: int
    window_every: int
    launches: list[Launch]
    end_at: float  # its last step (running) or its end (finished)
    span_s: float  # how long it has run, at least (the launches fill it)
    straggler_rank: int | None = None
    straggler_from: int = 0  # the first window index the straggler is slow in
    finished_ts: float | None = None


@dataclass
class NodePlan:
    cluster: str
    name: str
    state: str
    last_heard_s: float  # seconds before the anchor
    state_changed_s: float


@dataclass
class Plan:
    anchor: float
    nodes: list[NodePlan]
    jobs: list[JobPlan]


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([SEED, *key])


@dataclass
class Pools:
    """Per cluster: every node, those a running launch may take, and those that fail more."""

    names: dict[str, list[str]] = field(default_factory=dict)
    usable: dict[str, list[str]] = field(default_factory=dict)
    bad: dict[str, list[str]] = field(default_factory=dict)


def plan_nodes(rng) -> tuple[list[NodePlan], Pools]:
    nodes, pools = [], Pools()
    heard = {  # seconds since the last heartbeat, by state
        "active": (1, 20),
        "spare": (1, 30),
        "suspect": (60, 900),
        "cordoned": (1, 60),
        "draining": (1, 20),
        "in_repair": (3_600, 5 * DAY),
        "retired": (20 * DAY, 80 * DAY),
    }
    for cluster in CLUSTERS:
        short = cluster.split("-", 1)[1]
        names = [f"{short}-r{k // RACK:02d}-n{k % RACK:02d}" for k in range(NODES_PER_CLUSTER)]
        pools.names[cluster] = names
        states = ["active"] * NODES_PER_CLUSTER
        order = rng.permutation(NODES_PER_CLUSTER)
        at = 0
        for state, count in NODE_STATES.items():
            for k in order[at : at + count]:
                states[k] = state
            at += count
        # Draining nodes first: they are draining because a running job is on them.
        pools.usable[cluster] = [names[k] for k in order if states[k] == "draining"] + [
            names[k] for k in order if states[k] in ("active", "suspect")
        ]
        # The nodes out of service now, and a few active ones, fail more often.
        out = [names[k] for k in order if states[k] in ("suspect", "cordoned", "in_repair")]
        pools.bad[cluster] = (out + [names[k] for k in order[-BAD_NODES:]])[:BAD_NODES]
        for name, state in zip(names, states, strict=True):
            last_heard_s = float(rng.uniform(*heard[state]))
            nodes.append(
                NodePlan(
                    cluster=cluster,
                    name=name,
                    state=state,
                    last_heard_s=last_heard_s,
                    state_changed_s=last_heard_s + float(rng.uniform(0, 30 * DAY)),
                )
            )
    return nodes, pools


def pick_fault(rng) -> tuple[str, int | None, str]:
    kinds = list(FAULTS)
    weights = np.array([FAULTS[k][0] for k in kinds], float)
    fault = kinds[rng.choice(len(kinds), p=weights / weights.sum())]
    xid = int(rng.choice(XIDS)) if fault == "gpu_xid" else None
    return fault, xid, FAULTS[fault][1]


def plan_small_job(index, cluster, status, failures, pools: Pools, anchor) -> JobPlan:
    rng = rng_for(1, index)
    n_nodes = int(rng.choice([1, 2, 4, 8, 16, 32], p=[0.15, 0.2, 0.25, 0.2, 0.12, 0.08]))
    if status == "running":
        nodes = [pools.usable[cluster].pop() for _ in range(n_nodes)]
    else:
        nodes = [str(n) for n in rng.choice(pools.names[cluster], n_nodes, replace=False)]
    ckpt_every = int(rng.choice([50, 100, 200]))
    n_launches = failures + (status in ("running", "completed"))
    total = int(rng.integers(1_500, 6_000))
    launches, resume = [], 0
    for n in range(1, n_launches + 1):
        is_last = n == n_launches
        executed = max(30, int(total / n_launches * rng.uniform(0.5, 1.5)))
        launch = Launch(number=n, nodes=list(nodes), resume=resume, last=resume + executed)
        launch.save_block_s = float(rng.uniform(2, 6))
        if not is_last or status in ("failed", "interrupted"):
            launch.fault, launch.xid, launch.reason = pick_fault(rng)
            launch.rank = int(rng.integers(0, launch.world_size))
            # The node the fault hit: a bad one more often than not.
            culprit = str(rng.choice(pools.bad[cluster])) if rng.random() < 0.6 else None
            slot = launch.rank // GPUS_PER_NODE
            if culprit and culprit not in launch.nodes:
                launch.nodes[slot] = culprit
        elif status == "completed":
            launch.reason = "completed"
        launches.append(launch)
        # The next launch restarts from the latest checkpoint (further back after a
        # loss spike or NaN: a rollback).
        resume = launch.last // ckpt_every * ckpt_every
        if launch.fault in ROLLBACK_FAULTS:
            resume = max(0, resume - 2 * ckpt_every)
    if status == "running":
        end_at = anchor - float(rng.uniform(2, 60))
        span = min(55 * DAY, n_launches * float(rng.uniform(0.3, 5)) * DAY)
    else:
        ago = float(rng.uniform(1, 50)) * DAY
        end_at = anchor - ago
        span = min(58 * DAY - ago, n_launches * float(rng.uniform(0.2, 2)) * DAY)
    return JobPlan(
        index=index,
        key=f"pages-job-{index:03d}",
        cluster=cluster,
        status=status,
        step_s=float(rng.uniform(1.5, 8)),
        ckpt_every=ckpt_every,
        window_every=50,
        launches=launches,
        end_at=end_at,
        span_s=span,
    )


def plan_big_job(pools: Pools, anchor) -> JobPlan:
    rng = rng_for(1, 0)
    cluster = CLUSTERS[0]
    nodes = [pools.usable[cluster].pop() for _ in range(BIG_NODES)]
    launches, executed = [], 0
    for n, (resume, last, fault, xid, reason) in enumerate(BIG_LAUNCHES, start=1):
        if last is None:
            last = resume + BIG_STEPS - executed
        executed += last - resume
        launch = Launch(n, list(nodes), resume, last, fault, xid, reason)
        launch.rank = int(rng.integers(0, launch.world_size)) if fault else 0
        launches.append(launch)
    return JobPlan(
        index=0,
        key=BIG_KEY,
        cluster=cluster,
        status="running",
        step_s=2.5,
        ckpt_every=1_000,
        window_every=100,
        launches=launches,
        end_at=anchor - 3.0,
        span_s=0.0,  # its compute fills 29 days; the gaps between launches are short
    )


def plan(anchor: float) -> Plan:
    rng = rng_for(0)
    nodes, pools = plan_nodes(rng)
    statuses = [s for s, n in JOB_STATUSES.items() for _ in range(n)]
    statuses.remove("running")  # the big job is one of the running ones
    statuses = list(rng.permutation(statuses))
    # Failed launches: 500 incidents less the stragglers and the big job's five.
    small_failures = N_INCIDENTS - N_STRAGGLERS - sum(1 for b in BIG_LAUNCHES if b[2])
    at_least = np.array([int(s in ("failed", "interrupted")) for s in statuses])
    failures = at_least + rng.multinomial(
        small_failures - at_least.sum(), [1 / len(statuses)] * len(statuses)
    )
    jobs = [plan_big_job(pools, anchor)]
    for i, status in enumerate(statuses, start=1):
        cluster = CLUSTERS[i % len(CLUSTERS)]
        jobs.append(plan_small_job(i, cluster, status, int(failures[i - 1]), pools, anchor))
    for job in jobs:
        simulate(job, rng_for(2, job.index))
    # Stragglers in the latest launch of the running jobs with the most windows.
    running = [j for j in jobs if j.status == "running" and windows(j)[0].size >= 2]
    running.sort(key=lambda j: (-windows(j)[0].size, j.index))
    for job in running[:N_STRAGGLERS]:
        r = rng_for(3, job.index)
        job.straggler_rank = int(r.integers(0, job.launches[-1].world_size))
        job.straggler_from = int(windows(job)[0].size * r.uniform(0.4, 0.8))
    return Plan(anchor=anchor, nodes=nodes, jobs=jobs)


def simulate(job: JobPlan, rng) -> None:
    """Every launch's times and steps, laid out so the job ends at `end_at`."""
    for launch in job.launches:  # first each launch on its own clock (0: its start)
        ts = float(rng.uniform(40, 150))
        launch.ready = ts
        if launch.resume:
            launch.load_started = ts
            ts += float(rng.uniform(20, 90))
            launch.loaded = ts
        steps = np.arange(launch.resume + 1, launch.last + 1, dtype=np.int64)
        dur = rng.normal(job.step_s, job.step_s * 0.03, len(steps)).clip(job.step_s * 0.5)
        blocked = np.zeros(len(steps))
        blocked[1:] = np.where(steps[:-1] % job.ckpt_every == 0, launch.save_block_s, 0.0)
        launch.steps, launch.dur = steps, dur
        launch.ends = ts + np.cumsum(dur + blocked)
        last = launch.last_step_ts
        if launch.reason is None:
            launch.end_ts = None
        elif launch.fault in INFERRED_FAULTS:
            launch.fault_ts = last
            launch.detected_ts = last + (HANG_TIMEOUT_S if launch.fault == "hang" else 45.0)
            launch.end_ts = launch.detected_ts + 20.0
        elif launch.fault:
            launch.fault_ts = launch.detected_ts = last + float(rng.uniform(2, 30))
            launch.end_ts = launch.fault_ts + 20.0
        else:
            launch.end_ts = last + 10.0
    # The gaps between launches fill the job's span (the queue, a node being fixed).
    busy = sum((la.end_ts or la.last_step_ts) for la in job.launches)
    n_gaps = len(job.launches) - 1
    spare_s = max(0.0, job.span_s - busy)
    gaps = rng.dirichlet(np.ones(n_gaps)) * spare_s if n_gaps else np.zeros(0)
    gaps = gaps + rng.uniform(120, 1_800, n_gaps)
    offset = 0.0
    for k, launch in enumerate(job.launches):
        _shift(launch, offset)
        if k < n_gaps:
            offset = launch.end_ts + float(gaps[k])
    final = job.launches[-1]
    if job.status in ("completed", "failed"):
        job.finished_ts = final.end_ts + 1.0
    tail = job.finished_ts or final.end_ts or final.last_step_ts
    for launch in job.launches:  # now on the job's clock
        _shift(launch, job.end_at - tail)
    if job.finished_ts is not None:
        job.finished_ts += job.end_at - tail


def _shift(launch: Launch, by: float) -> None:
    for name in ("start", "ready", "load_started", "loaded", "fault_ts", "detected_ts", "end_ts"):
        value = getattr(launch, name)
        if value is not None:
            setattr(launch, name, value + by)
    launch.ends = launch.ends + by


def windows(job: JobPlan):
    """The latest launch's rank windows: each one's index of its last step, its first step."""
    launch = job.launches[-1]
    closes = np.flatnonzero(launch.steps % job.window_every == 0)
    firsts = np.concatenate([[launch.resume + 1], launch.steps[closes[:-1]] + 1])
    return closes, firsts


def dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


# --- writing the plan ----------------------------------------------------------------


def rows_lifecycle(job: JobPlan) -> list[tuple]:
    """(client id, kind, ts, attempt, node, rank, data) of the job's lifecycle events."""
    out = []

    def event(cid, kind, ts, attempt, data, node="", rank=None):
        out.append((cid, kind, ts, attempt, node, rank, data))

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
            event(f"saved-{n}-{step}", "checkpoint_saved", end + la.save_block_s, n, saved)
        if la.fault and la.fault not in INFERRED_FAULTS:
            data = {"type": la.fault} | ({"xid": la.xid} if la.xid is not None else {})
            node = la.nodes[la.rank // GPUS_PER_NODE]
            event(f"fault-{n}", "fault", la.fault_ts, n, data, node=node, rank=la.rank)
        if la.end_ts is not None:
            data = {"reason": la.reason} | ({"exit_code": 1} if la.fault else {})
            event(f"end-{n}", "attempt_ended", la.end_ts, n, data)
    if job.finished_ts is not None:
        event("finished", "job_finished", job.finished_ts, job.launches[-1].number, {})
    return out


def received(ts: float) -> datetime:
    return dt(ts + 0.05)  # when the console got it


def write_streams(job: JobPlan, job_id: int, node_ids: dict[str, int]) -> int:
    """The job's lifecycle events, step records and rank windows; returns its event count
    (with the step events, which `write_step_events` derives from the step records)."""
    from jobs.bulk import insert_ignoring_conflicts
    from jobs.models import Event, RankWindow, StepRecord

    lifecycle = rows_lifecycle(job)
    cid, kind, ts, attempt, node, rank, data = (list(c) for c in zip(*lifecycle, strict=True))
    ts = [float(t) for t in ts]
    insert_ignoring_conflicts(
        Event,
        ["job", "client_id", "kind", "ts", "attempt", "node", "rank", "data", "received_at"],
        [
            [job_id] * len(lifecycle),
            cid,
            kind,
            ts,
            attempt,
            node,
            rank,
            [orjson.dumps(d).decode() for d in data],  # JSON goes in as text
            [received(t) for t in ts],
        ],
    )
    n_events = len(lifecycle)
    rng = rng_for(4, job.index)
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
        for at in range(0, n, CHUNK):
            insert_ignoring_conflicts(StepRecord, names, [c[at : at + CHUNK] for c in columns])
        n_events += n
    names = ["job", "attempt", "rank", "node", "first_step", "last_step", "ts", "compute_s"]
    names += ["step_s", "comm_wait_s", "data_wait_s"]
    columns = rank_windows(job, job_id, node_ids, rng)
    for at in range(0, len(columns[0]), CHUNK):
        insert_ignoring_conflicts(RankWindow, names, [c[at : at + CHUNK] for c in columns])
    return n_events


def rank_windows(job: JobPlan, job_id: int, node_ids: dict[str, int], rng) -> list[list]:
    """The latest launch's rank windows, column-wise; one rank is a straggler in some jobs."""
    la = job.launches[-1]
    closes, firsts = windows(job)
    starts = np.concatenate([[0], closes[:-1] + 1])
    total = np.concatenate([[0.0], np.cumsum(la.dur)])
    step_s = (total[closes + 1] - total[starts]) / (closes - starts + 1)
    nw, ws = closes.size, la.world_size
    compute = step_s[:, None] * rng.uniform(0.72, 0.78, (nw, ws))
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


def write_step_events(job_ids: list[int]) -> None:
    """Each step record's `step` event, as the job reported it: built in the database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_event"
            " (job_id, client_id, kind, ts, attempt, node, rank, data, received_at)"
            " SELECT job_id, 's' || attempt || '-' || step, 'step', ts, attempt, '', 0,"
            " jsonb_build_object('step', step, 'loss', loss, 'grad_norm', grad_norm,"
            " 'tokens', tokens, 'step_time_s', step_time_s), to_timestamp(ts + 0.05)"
            " FROM jobs_steprecord WHERE job_id = ANY(%s) ON CONFLICT DO NOTHING",
            [job_ids],
        )
        for table in ("jobs_event", "jobs_steprecord", "jobs_rankwindow"):
            cursor.execute(f"ANALYZE {table}")


# --- the seed, stage by stage --------------------------------------------------------


def bench_clusters():
    from jobs.models import Cluster

    return Cluster.objects.filter(name__in=CLUSTERS)


def clear(*, nodes: bool = False, jobs=None) -> None:
    """Delete the bench's actions and incidents; with `jobs` (a queryset) those jobs
    too; with `nodes`, everything it seeded."""
    from incidents.models import Incident
    from jobs.models import Node, TrainingJob
    from recovery.models import Action

    clusters = bench_clusters()
    Action.objects.filter(cluster__in=clusters).delete()
    Incident.objects.filter(cluster__in=clusters).delete()
    if nodes:
        jobs = TrainingJob.objects.filter(cluster__in=clusters)
    if jobs is not None:
        jobs.delete()
    if nodes:
        Node.objects.filter(cluster__in=clusters).delete()


def anchor_of_seed() -> float | None:
    """The anchor the installation was seeded at (in its clusters' descriptions)."""
    from jobs.models import Node

    if Node.objects.filter(cluster__in=bench_clusters()).count() != len(CLUSTERS) * (
        NODES_PER_CLUSTER
    ):
        return None
    description = bench_clusters().values_list("description", flat=True).first() or ""
    try:
        return float(description.rsplit(" ", 1)[-1])
    except ValueError:
        return None


def seed_nodes(p: Plan) -> None:
    from jobs.models import Cluster, Node

    clear(nodes=True)
    description = f"seeded by bench/pages.py, anchored at {p.anchor!r}"
    ids = {}
    for name in CLUSTERS:
        cluster, _ = Cluster.objects.update_or_create(
            name=name, defaults={"description": description}
        )
        ids[name] = cluster.pk
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
        created_at=[dt(p.anchor - 90 * DAY)] * len(objs),
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


def done_jobs() -> set[str]:
    from jobs.models import TrainingJob

    return set(
        TrainingJob.objects.filter(
            cluster__in=bench_clusters(), events_count__gt=0, ledger__isnull=False
        ).values_list("key", flat=True)
    )


def seed_jobs(p: Plan) -> int:
    """Write the jobs not written yet (a job cut short is written again); returns how many."""
    from django.db import transaction

    from jobs import selectors
    from jobs.models import Attempt, Checkpoint, Node, TrainingJob

    done = done_jobs()
    todo = [j for j in p.jobs if j.key not in done]
    if not todo:
        return 0
    clear(jobs=TrainingJob.objects.filter(key__in=[j.key for j in todo]))
    clusters = dict(bench_clusters().values_list("name", "id"))
    node_ids = {
        (c, n): pk
        for c, n, pk in Node.objects.filter(cluster__in=clusters.values()).values_list(
            "cluster__name", "name", "id"
        )
    }
    rows = TrainingJob.objects.bulk_create(
        [TrainingJob(key=j.key, cluster_id=clusters[j.cluster]) for j in todo]
    )
    ids = {r.key: r.pk for r in rows}

    t = time.perf_counter()
    counts = {}
    for job in todo:
        names = {n: node_ids[(job.cluster, n)] for la in job.launches for n in la.nodes}
        counts[job.key] = write_streams(job, ids[job.key], names)
    print(f"  lifecycle events, steps and rank windows in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    write_step_events(list(ids.values()))
    print(f"  step events in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    attempts, attempt_nodes, checkpoints = [], [], []
    for job in todo:
        for la in job.launches:
            attempts.append(
                Attempt(
                    job_id=ids[job.key],
                    number=la.number,
                    world_size=la.world_size,
                    gpus_per_node=GPUS_PER_NODE,
                    started_at=dt(la.start),
                    ready_at=dt(la.ready),
                    ended_at=dt(la.end_ts),
                    end_reason=la.reason or "",
                    exit_code=1 if la.fault else (0 if la.reason == "completed" else None),
                )
            )
            attempt_nodes.append([node_ids[(job.cluster, n)] for n in la.nodes])
            saves = np.flatnonzero(la.steps % job.ckpt_every == 0)
            for step, end in zip(la.steps[saves].tolist(), la.ends[saves].tolist(), strict=True):
                checkpoints.append(
                    Checkpoint(
                        job_id=ids[job.key],
                        attempt=la.number,
                        step=step,
                        save_started_at=dt(end),
                        saved_at=dt(end + la.save_block_s),
                        blocking_s=la.save_block_s,
                        bytes=2_000_000 * la.world_size,
                        uri=f"s3://ckpt/{job.key}/step-{step:09d}",
                        tier="remote",
                        durable=True,
                    )
                )
    with transaction.atomic():
        Attempt.objects.bulk_create(attempts, batch_size=2_000)
        through = Attempt.nodes.through
        through.objects.bulk_create(
            [
                through(attempt_id=a.pk, node_id=n)
                for a, ns in zip(attempts, attempt_nodes, strict=True)
                for n in ns
            ],
            batch_size=5_000,
        )
        Checkpoint.objects.bulk_create(checkpoints, batch_size=5_000)
    jobs = {j.key: j for j in TrainingJob.objects.filter(pk__in=ids.values())}
    for job in todo:
        row, final = jobs[job.key], job.launches[-1]
        row.status = job.status
        row.first_event_ts = job.launches[0].start
        row.last_event_ts = job.finished_ts or final.end_ts or final.last_step_ts
        row.finished_at = dt(job.finished_ts)
        row.last_step = final.last
        row.last_step_ts = final.last_step_ts
        row.last_received_at = dt(row.last_event_ts + 0.05)
        row.revision = 1
        row.events_count = counts[job.key]  # with the ledger below: a finished job
    stamp(
        TrainingJob,
        [jobs[j.key] for j in todo],
        created_at=[dt(j.launches[0].start) for j in todo],
        **{
            f: [getattr(jobs[j.key], f) for j in todo]
            for f in (
                "status",
                "first_event_ts",
                "last_event_ts",
                "finished_at",
                "last_step",
                "last_step_ts",
                "last_received_at",
                "revision",
                "events_count",
            )
        },
    )
    for job in todo:  # the cached ledger each page reads, computed from the rows
        selectors.job_goodput(job=TrainingJob.objects.get(pk=ids[job.key]))
    print(f"  attempts, checkpoints and ledgers in {time.perf_counter() - t:.1f} s")
    return len(todo)


def incident_rows(p: Plan) -> list[dict]:
    """The incidents of the plan: a failed launch's, or a straggler's."""
    from incidents.services import fault_cause

    out = []
    anchor = p.anchor
    for job in p.jobs:
        rng = rng_for(5, job.index)
        for k, la in enumerate(job.launches):
            if not la.fault:
                continue
            later = job.launches[k + 1 :]
            nxt = later[0] if later else None
            node = la.nodes[la.rank // GPUS_PER_NODE]
            resumed = float(nxt.ends[0]) if nxt is not None and len(nxt.ends) else None
            recovered = None
            for lt in later:
                past = np.flatnonzero(lt.steps > la.last)
                if past.size:
                    recovered = float(lt.ends[past[0]])
                    break
            ws = la.world_size
            breakdown = {
                "wasted_progress": (la.last - nxt.resume) * job.step_s * ws if nxt else 0.0,
                "stalled": (la.end_ts - la.last_step_ts) * ws,
                "downtime": (nxt.start - la.end_ts) * ws if nxt else 0.0,
                "startup": (nxt.ready - nxt.start) * nxt.world_size if nxt else 0.0,
                "checkpoint_restore": (nxt.loaded - nxt.load_started) * nxt.world_size
                if nxt and nxt.loaded
                else 0.0,
            }
            cause, severity = fault_cause(la.fault, la.xid)
            xid = f" (Xid {la.xid})" if la.xid is not None else ""
            summary = f"{la.fault}{xid} on {node} rank {la.rank}"
            if la.fault == "hang":
                summary = (
                    f"hang: no step for {HANG_TIMEOUT_S:.0f} s after step {la.last}"
                    f" (timeout {HANG_TIMEOUT_S:.0f} s)"
                )
            fault_cid = (
                f"inferred:{la.fault}:{la.number}:{node}"
                if la.fault in INFERRED_FAULTS
                else f"fault-{la.number}"
            )
            out.append(
                {
                    "job": job,
                    "detector": "launch_fault",
                    "episode": f"launch-{la.number}",
                    "attempt": la.number,
                    "cause": cause,
                    "fault_type": la.fault,
                    "xid": la.xid,
                    "severity": severity,
                    "summary": summary,
                    "nodes": [node],
                    "ranks": [la.rank],
                    "evidence": [fault_cid, f"end-{la.number}"],
                    "fault_at": la.fault_ts if la.fault != "hang" else la.last_step_ts,
                    "detected_at": la.detected_ts,
                    "end_ts": la.end_ts,
                    "resumed_at": resumed,
                    "recovered_at": recovered,
                    "lost_breakdown": breakdown,
                    "opened_after": float(rng.uniform(0.2, 1.5)),
                    "resolve_after": float(rng.uniform(1_800, 36 * 3_600)),
                    "noted": rng.random() < 0.4,
                    "anchor": anchor,
                }
            )
        if job.straggler_rank is not None:
            la = job.launches[-1]
            closes, firsts = windows(job)
            w = job.straggler_from
            node = la.nodes[job.straggler_rank // GPUS_PER_NODE]
            slow_steps = int(la.last - firsts[w])
            excess = 0.2 * job.step_s * slow_steps * la.world_size
            first_ts = float(la.ends[closes[w]])
            out.append(
                {
                    "job": job,
                    "detector": "straggler",
                    "episode": f"node-{node}",
                    "attempt": None,
                    "cause": "straggler",
                    "fault_type": "straggler",
                    "xid": None,
                    "severity": "major",
                    "summary": (
                        f"straggler {node}: ranks {job.straggler_rank} slow for"
                        f" {closes.size - w} windows from step {firsts[w]} (peer score 0.77,"
                        " own 0.78)"
                    ),
                    "nodes": [node],
                    "ranks": [job.straggler_rank],
                    "evidence": [f"window:{la.number}:{job.straggler_rank}:{firsts[w]}"],
                    "fault_at": first_ts,
                    "detected_at": float(la.ends[closes[min(w + 3, closes.size - 1)]]),
                    "end_ts": None,
                    "resumed_at": None,
                    "recovered_at": None,
                    "lost_breakdown": {"slowdown": excess},
                    "opened_after": 0.5,
                    "resolve_after": None,
                    "noted": False,
                    "anchor": anchor,
                }
            )
    return out


def incident_state(row: dict) -> tuple[str, float | None]:
    """Its state now, and when it was resolved."""
    old = row["anchor"] - row["fault_at"] > 3 * DAY
    if row["recovered_at"] is not None:
        resolved = row["recovered_at"] + row["resolve_after"]
        if old and resolved < row["anchor"]:
            return "resolved", resolved
        return "recovered", None
    if old and row["resolve_after"] is not None:  # the job went away: closed by a person
        return "resolved", row["detected_at"] + row["resolve_after"]
    return "open", None


def seed_incidents(p: Plan) -> None:
    from django.db import transaction

    from incidents.models import Incident, TimelineEntry
    from jobs.models import Node, TrainingJob

    clear()
    rows = incident_rows(p)
    assert len(rows) == N_INCIDENTS, len(rows)
    clusters = dict(bench_clusters().values_list("name", "id"))
    jobs = dict(TrainingJob.objects.filter(cluster__in=clusters.values()).values_list("key", "id"))
    node_ids = {
        (c, n): pk
        for c, n, pk in Node.objects.filter(cluster__in=clusters.values()).values_list(
            "cluster__name", "name", "id"
        )
    }
    incidents, timelines = [], []
    for row in rows:
        job = row["job"]
        state, resolved = incident_state(row)
        lost = row["lost_breakdown"]
        incidents.append(
            Incident(
                job_id=jobs[job.key],
                cluster_id=clusters[job.cluster],
                detector=row["detector"],
                episode=row["episode"],
                attempt=row["attempt"],
                cause=row["cause"],
                fault_type=row["fault_type"],
                xid=row["xid"],
                severity=row["severity"],
                state=state,
                summary=row["summary"][:300],
                ranks=row["ranks"],
                evidence=row["evidence"],
                fault_at=dt(row["fault_at"]),
                detected_at=dt(row["detected_at"]),
                resumed_at=dt(row["resumed_at"]),
                recovered_at=dt(row["recovered_at"]),
                resolved_at=dt(resolved),
                lost_gpu_seconds=sum(lost.values()),
                lost_breakdown=lost,
                root_cause=f"{row['fault_type']} on {row['nodes'][0]}" if resolved else "",
                postmortem="Node sent for diagnostics; job resumed from its last checkpoint."
                if resolved and row["noted"]
                else "",
            )
        )
        timelines.append(timeline(row, state, resolved))
    with transaction.atomic():
        Incident.objects.bulk_create(incidents, batch_size=1_000)
        stamp(
            Incident,
            incidents,
            opened_at=[dt(r["detected_at"] + r["opened_after"]) for r in rows],
        )
        through = Incident.nodes.through
        through.objects.bulk_create(
            [
                through(incident_id=i.pk, node_id=node_ids[(r["job"].cluster, n)])
                for i, r in zip(incidents, rows, strict=True)
                for n in r["nodes"]
            ]
        )
        entries = [
            TimelineEntry(incident_id=i.pk, **e)
            for i, es in zip(incidents, timelines, strict=True)
            for e in es
        ]
        TimelineEntry.objects.bulk_create(entries, batch_size=2_000)
        stamp(TimelineEntry, entries, recorded_at=[e.at for e in entries])


def timeline(row: dict, state: str, resolved: float | None) -> list[dict]:
    """The incident's timeline entries as the detectors and people would have left them."""
    key = row["job"].key
    entries = []

    def add(kind, ts, actor, source, message, data=None):
        entries.append(
            {
                "kind": kind,
                "at": dt(ts),
                "actor": actor,
                "source": source,
                "message": message,
                "data": data or {},
            }
        )

    where = f" ({row['nodes'][0]} rank {row['ranks'][0]})"
    add("signal", row["fault_at"], f"job:{key}", "fault", row["fault_type"] + where)
    if row["end_ts"] is not None:
        add(
            "signal",
            row["end_ts"],
            f"job:{key}",
            "attempt_ended",
            f"launch {row['attempt']} ended",
            {"event": f"end-{row['attempt']}"},
        )
    add(
        "detection",
        row["detected_at"],
        f"detector:{row['detector']}",
        "rebound",
        f"Opened: {row['summary']} ({row['cause']}, {row['severity']})",
    )
    if row["recovered_at"] is not None:
        add(
            "state_change",
            row["recovered_at"],
            "rebound",
            "rebound",
            "open → recovered: training passed the highest step reached before the fault",
            {"from": "open", "to": "recovered"},
        )
    if resolved is not None:
        if row["noted"]:
            add("note", resolved - 60, OPERATOR, "console", "Postmortem written.")
        frm = "recovered" if row["recovered_at"] is not None else "open"
        add(
            "state_change",
            resolved,
            OPERATOR,
            "rebound",
            f"{frm} → resolved: closed",
            {"from": frm, "to": "resolved"},
        )
    return entries


# The audit trails of the actions, by how they went.
ENDINGS = {  # outcome: (mode, the states after proposed)
    "auto_succeeded": ("auto", ("queued", "running", "succeeded")),
    "auto_failed": ("auto", ("queued", "running", "failed")),
    "approved": ("approval", ("awaiting_approval", "approved", "queued", "running", "succeeded")),
    "rejected": ("approval", ("awaiting_approval", "rejected")),
    "expired": ("approval", ("awaiting_approval", "expired")),
    "cancelled": ("approval", ("awaiting_approval", "cancelled")),
}
OUTCOME_WEIGHTS = {
    "auto_succeeded": 0.5,
    "auto_failed": 0.07,
    "approved": 0.25,
    "rejected": 0.08,
    "expired": 0.06,
    "cancelled": 0.04,
}
APPROVAL_STATES = ("awaiting_approval", "approved", "rejected", "expired")
DELAY_S = {  # how long after the state before an action moved to this one
    "awaiting_approval": (0.05, 0.1),
    "approved": (120, 2_400),
    "rejected": (120, 2_400),
    "expired": (1_800, 1_800),
    "cancelled": (60, 1_200),
    "queued": (0.05, 0.1),
    "running": (0.3, 1),
    "succeeded": (20, 600),
    "failed": (20, 600),
}
MOVED_BY = {  # who moved it there, and why (else the requester, naming the state)
    "awaiting_approval": ("rebound", "needs approval"),
    "queued": ("rebound", "automatic"),
    "approved": (OPERATOR, "ok"),
    "rejected": (OPERATOR, "the job resumed by itself"),
    "cancelled": (OPERATOR, "moot"),
    "running": ("rebound", "running"),
    "succeeded": ("rebound", "succeeded"),
    "failed": ("rebound", "driver failed"),
    "expired": ("rebound", "no decision in time"),
}
STAMPS = {"approved": "approved_at", "rejected": "approved_at", "queued": "queued_at"}
STAMPS["running"] = "started_at"
# What waits for approval: about a straggler, or about a node that failed lately.
STRAGGLER_KINDS = ("replace_at_next_checkpoint", "replace_node", "cordon_node", "drain_node")
FAULT_KINDS = ("replace_node", "cordon_node", "rollback", "drain_node", "scale_down")


def seed_actions(p: Plan) -> None:
    """Actions answering the incidents (read back from the database), their audit
    trails and their timeline entries."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from incidents.models import Incident, TimelineEntry
    from jobs.models import Attempt, Node
    from recovery.models import Action, ActionAudit

    clusters = bench_clusters()
    Action.objects.filter(cluster__in=clusters).delete()
    TimelineEntry.objects.filter(
        incident__cluster__in=clusters, source="recovery"
    ).delete()  # those of a run cut short
    rng = rng_for(6)
    operator = get_user_model().objects.get(username=OPERATOR)
    incidents = list(
        Incident.objects.filter(cluster__in=clusters)
        .select_related("job", "cluster")
        .prefetch_related("nodes")
        .order_by("fault_at", "id")
    )
    latest = {
        job_id: n
        for job_id, n in Attempt.objects.filter(job__cluster__in=clusters)
        .order_by("job_id", "number")
        .values_list("job_id", "number")
    }
    anchor = p.anchor
    plans = []  # (incident, kind, node, job, params, outcome, created ts)
    # Waiting: what to do about a straggler, or about a node that failed lately.
    unresolved = [i for i in reversed(incidents) if i.state != "resolved"]
    stragglers = [i for i in unresolved if i.cause == "straggler"]
    others = [i for i in unresolved if i.cause != "straggler"]
    waiting = (stragglers[:20] + others + stragglers[20:])[:N_AWAITING]
    for n, incident in enumerate(waiting):
        node = incident.nodes.all()[0]
        if incident.cause == "straggler":
            kind = STRAGGLER_KINDS[n % len(STRAGGLER_KINDS)]
        else:
            kind = FAULT_KINDS[n % len(FAULT_KINDS)]
        job = incident.job if kind not in ("cordon_node", "drain_node") else None
        params = {}
        if kind == "rollback":
            params["step"] = max(0, (incident.job.last_step or 0) // 1_000 * 1_000 - 1_000)
        if kind == "scale_down":
            params["nodes"] = [node.name]
        if kind == "replace_at_next_checkpoint":
            params["after_step"] = incident.job.last_step
        target = node if kind not in ("restart_job", "rollback") else None
        created = anchor - float(rng.uniform(60, 1_500))
        plans.append((incident, kind, target, job, params, "awaiting", created))
    answered = {i.pk for i in waiting}
    done = [i for i in incidents if i.state in ("recovered", "resolved") and i.pk not in answered]
    picks = rng.choice(len(done), min(N_FINISHED, len(done)), replace=False)
    outcomes = list(OUTCOME_WEIGHTS)
    weights = np.array(list(OUTCOME_WEIGHTS.values()))
    for k in sorted(picks.tolist()):
        incident = done[k]
        node = incident.nodes.all()[0]
        outcome = outcomes[rng.choice(len(outcomes), p=weights / weights.sum())]
        kind = str(rng.choice(["restart_job", "replace_node", "cordon_node", "validate_node"]))
        if ENDINGS[outcome][0] == "auto":
            kind = "restart_job" if kind == "replace_node" else kind
        target = None if kind == "restart_job" else node
        job = incident.job if kind in ("restart_job", "replace_node") else None
        created = incident.detected_at.timestamp() + float(rng.uniform(1, 5))
        plans.append((incident, kind, target, job, {}, outcome, created))
    in_repair = list(
        Node.objects.filter(cluster__in=clusters, state="in_repair").order_by("name")[:N_RUNNING]
    )
    for node in in_repair:
        created = anchor - float(rng.uniform(120, 900))
        plans.append((None, "validate_node", node, None, {}, "running", created))

    actions, audits = [], []
    for incident, kind, node, job, params, outcome, created in plans:
        mode = "approval" if outcome in ("awaiting", "running") else ENDINGS[outcome][0]
        if outcome == "running":
            mode, path = "auto", ("queued", "running")
        elif outcome == "awaiting":
            path = ("awaiting_approval",)
        else:
            path = ENDINGS[outcome][1]
        policy = f"default:{incident.cause}" if incident is not None else "default:validate"
        cluster_id = incident.cluster_id if incident else node.cluster_id
        snapshot = {}
        if node is not None:
            snapshot["node_state"] = node.state
        if job is not None:
            snapshot["job_attempt"] = latest.get(job.pk)
        action = Action(
            kind=kind,
            state=path[-1],
            mode=mode,
            cluster_id=cluster_id,
            node=node,
            job=job,
            params=params,
            reason=f"{incident.summary}" if incident is not None else "node back from repair",
            incident=incident,
            policy=policy,
            requested_by=f"policy:{policy}",
            target_snapshot=snapshot,
            spare=None,
        )
        t = created
        trail = [("", "proposed", t, action.requested_by, action.reason)]
        for frm, to in zip(("proposed", *path[:-1]), path, strict=True):
            t = min(t + float(rng.uniform(*DELAY_S[to])), anchor - 1.0)
            actor, why = MOVED_BY.get(to, (action.requested_by, to))
            trail.append((frm, to, t, actor, why))
            if to in STAMPS:
                setattr(action, STAMPS[to], dt(t))
            if to in Action.TERMINAL_STATES:
                action.finished_at = dt(t)
        if action.approved_at is not None:
            action.approved_by, action.approved_by_user = OPERATOR, operator
            action.comment = trail[-1][4] if action.state == "rejected" else "ok"
        if action.started_at is not None:
            action.attempts = 1
            action.deadline = dt(action.started_at.timestamp() + 3_600)
        if action.state == "awaiting_approval":
            action.blocked_reason = "needs approval"
            action.expires_at = dt(anchor + 7 * DAY)
        if action.state == "succeeded":
            action.output = {"driver": "slurm", "called_at": action.started_at.timestamp()}
        if action.state == "failed":
            action.error = "driver: scontrol exited 1 (node busy)"
        actions.append((action, trail, created))
    with transaction.atomic():
        rows = [a for a, _, _ in actions]
        Action.objects.bulk_create(rows, batch_size=1_000)
        stamp(
            Action,
            rows,
            created_at=[dt(c) for _, _, c in actions],
            updated_at=[dt(trail[-1][2]) for _, trail, _ in actions],
        )
        entries = []
        for action, trail, _ in actions:
            for frm, to, t, actor, why in trail:
                audits.append(
                    ActionAudit(
                        action_id=action.pk,
                        at=dt(t),
                        actor=actor,
                        from_state=frm,
                        to_state=to,
                        reason=why,
                    )
                )
                if action.incident_id is None:
                    continue
                target = ", ".join(
                    x
                    for x in (
                        f"node {action.node.name}" if action.node else "",
                        f"job {action.job.key}" if action.job else "",
                    )
                    if x
                )
                move = f"{frm} → {to}" if frm else to
                entries.append(
                    TimelineEntry(
                        incident_id=action.incident_id,
                        kind="approval" if to in APPROVAL_STATES else "action",
                        at=dt(t),
                        actor=actor,
                        source="recovery",
                        message=f"action #{action.pk} {action.kind} ({target or 'cluster'}):"
                        f" {move}: {why}",
                        data={"action": action.pk, "kind": action.kind, "from": frm, "to": to},
                    )
                )
        ActionAudit.objects.bulk_create(audits, batch_size=2_000)
        TimelineEntry.objects.bulk_create(entries, batch_size=2_000)
        stamp(TimelineEntry, entries, recorded_at=[e.at for e in entries])


def ensure_operator():
    from django.contrib.auth import get_user_model

    from console.services import user_set_role

    user, _ = get_user_model().objects.get_or_create(username=OPERATOR)
    user_set_role(user=user, role="operator")
    return user


def seed() -> tuple[Plan, str]:
    """The installation, written where missing; the plan and a line on what was done."""
    from incidents.models import Incident
    from recovery.models import Action

    t0 = time.perf_counter()
    timings = []
    anchor = anchor_of_seed()
    fresh = anchor is None
    anchor = time.time() if fresh else anchor
    t = time.perf_counter()
    p = plan(anchor)
    timings.append(f"plan {time.perf_counter() - t:.1f} s")
    ensure_operator()
    if fresh:
        t = time.perf_counter()
        seed_nodes(p)
        timings.append(f"nodes {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    written = seed_jobs(p)
    if written:
        timings.append(f"{written} jobs {time.perf_counter() - t:.1f} s")
    clusters = bench_clusters()
    if written or Incident.objects.filter(cluster__in=clusters).count() != N_INCIDENTS:
        t = time.perf_counter()
        seed_incidents(p)
        timings.append(f"incidents {time.perf_counter() - t:.1f} s")
    expected = N_AWAITING + N_FINISHED + N_RUNNING
    if written or Action.objects.filter(cluster__in=clusters).count() != expected:
        t = time.perf_counter()
        seed_actions(p)
        timings.append(f"actions {time.perf_counter() - t:.1f} s")
    total = time.perf_counter() - t0
    if len(timings) == 1:
        return p, f"installation already seeded (checked in {total:.1f} s; --reseed to redo)"
    return p, f"seeded in {total:.1f} s ({', '.join(timings)})"


def drop_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name.startswith("rebound_bench"):
        sys.exit(f"--reseed drops the database: only a rebound_bench* one, not {name!r}")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the measurement -----------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (as bench/detect.py and bench/recovery.py)."""
    s = sorted(values)
    return s[max(0, round(q * len(s)) - 1)]


def pages(p: Plan, reliability_query: str) -> list[tuple[str, str]]:
    """(label, URL) of each page, with the rows worth showing picked from the seed."""
    from django.db.models import Count

    from incidents.models import Incident
    from jobs.models import Node

    clusters = bench_clusters()
    incidents = Incident.objects.filter(cluster__in=clusters)
    cause = (incidents.values("cause").annotate(n=Count("id")).order_by("-n").first() or {}).get(
        "cause", "gpu"
    )
    busiest = incidents.annotate(n=Count("timeline")).order_by("-n", "id").first()
    node = (
        Node.objects.filter(cluster__in=clusters)
        .annotate(n=Count("incidents"))
        .order_by("-n", "id")
        .select_related("cluster")
        .first()
    )
    small = next(j for j in p.jobs if j.status == "running" and j.key != BIG_KEY)
    query = reliability_query or "range=90d"
    return [
        ("overview", "/"),
        ("jobs", "/jobs/"),
        ("job, 1M steps", f"/jobs/{BIG_KEY}/"),
        ("job, small", f"/jobs/{small.key}/"),
        ("incidents", "/incidents/"),
        (f"incidents, cause={cause}", f"/incidents/?cause={cause}"),
        ("incident", f"/incidents/{busiest.pk if busiest else 1}/"),
        ("approvals", "/approvals/"),
        ("nodes", "/nodes/"),
        ("node", f"/nodes/{node.cluster.name}/{node.name}/" if node else "/nodes/x/y/"),
        ("reliability", "/reliability/"),
        ("reliability, 90 days", f"/reliability/?{query}"),
        ("status, nodes=all", "/status.json?nodes=all"),
    ]


@dataclass
class Result:
    label: str
    url: str
    status: int
    queries: int | None = None
    sql_ms: float | None = None  # the counted request's time in the database
    slowest_sql: list[tuple[float, str]] = field(default_factory=list)
    times_ms: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.times_ms) and self.p95 < TARGET_P95_MS

    @property
    def p95(self) -> float:
        return pct(self.times_ms, 0.95) if self.times_ms else float("nan")


def measure(client, label: str, url: str, *, n: int, warmup: int, max_s: float) -> Result:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def get():
        t = time.perf_counter()
        response = client.get(url)
        return response, (time.perf_counter() - t) * 1000.0

    response, ms = get()
    result = Result(label, url, response.status_code)
    if response.status_code != 200:  # failing: once is enough to say so
        exc = getattr(response, "exc_info", None)
        if exc:
            result.note = f"{exc[0].__name__}: {str(exc[1])[:120]}"
        elif response.status_code in (301, 302):
            result.note = f"-> {response.headers.get('Location')}"
        result.times_ms = [ms]
        return result
    for _ in range(max(0, warmup - 1)):
        get()
    with CaptureQueriesContext(connection) as queries:
        get()
    result.queries = len(queries)
    timed = sorted(
        ((float(q["time"]) * 1000.0, q["sql"]) for q in queries.captured_queries), reverse=True
    )
    result.sql_ms = sum(ms for ms, _ in timed)
    result.slowest_sql = timed[:3]
    started = time.perf_counter()
    for _ in range(n):
        response, ms = get()
        result.times_ms.append(ms)
        if response.status_code != 200:
            result.status = response.status_code
            break
        if time.perf_counter() - started > max_s:
            result.note = f"stopped after {len(result.times_ms)} requests ({max_s:.0f} s)"
            break
    return result


def row(r: Result) -> str:
    if r.times_ms and r.status == 200:
        p50 = pct(r.times_ms, 0.5)
        figures = f"{p50:>8.1f} {r.p95:>8.1f} {max(r.times_ms):>8.1f}"
    else:
        figures = f"{'':>8} {'':>8} {max(r.times_ms or [0]):>8.1f}"
    queries = "" if r.queries is None else str(r.queries)
    sql = "" if r.sql_ms is None else f"{r.sql_ms:.1f}"
    verdict_ = verdict(r.ok) + ("" if r.status == 200 else f" ({r.status})")
    line = f"{r.label:<24} {figures} {queries:>7} {sql:>7}  {verdict_:<11} {r.url}"
    return line + (f"  [{r.note}]" if r.note else "")


HEADER = (
    f"{'page':<24} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'queries':>7} {'sql ms':>7}"
    f"  {'verdict':<11} url"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reseed", action="store_true", help="drop the database and seed anew")
    ap.add_argument("--only", default="", help="measure the pages whose label or URL has this")
    ap.add_argument("--n", type=int, default=30, help="timed requests per page")
    ap.add_argument("--warmup", type=int, default=3, help="requests first, not timed")
    ap.add_argument("--sql", action="store_true", help="print each page's 3 slowest queries")
    ap.add_argument("--max-page-s", type=float, default=60.0, help="time limit of a page's runs")
    ap.add_argument(
        "--reliability-query",
        default="",
        help="the 90-day reliability page's query (default: range=90d)",
    )
    ap.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    args = ap.parse_args()

    if args.reseed:
        drop_database(args.database_url)
    t = time.perf_counter()
    setup_django(args.database_url)
    print(f"database {urlsplit(args.database_url).path.lstrip('/')} ready", end="")
    print(f" (created/migrated as needed) in {time.perf_counter() - t:.1f} s")
    from django.conf import settings
    from django.test import Client

    p, seeded = seed()
    print(seeded)

    # Production's settings for what the pages cost: no query log, no template debug.
    settings.DEBUG = False
    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client(raise_request_exception=False)
    client.force_login(ensure_operator())
    todo = [
        (label, url)
        for label, url in pages(p, args.reliability_query)
        if args.only in label or args.only in url
    ]
    if not todo:
        sys.exit(f"no page matches --only {args.only!r}")
    load = os.getloadavg()[0]
    print(f"{len(todo)} pages, {args.warmup} warm-up and {args.n} timed requests each")
    print(HEADER)
    results = []
    for label, url in todo:
        r = measure(client, label, url, n=args.n, warmup=args.warmup, max_s=args.max_page_s)
        results.append(r)
        print(row(r), flush=True)
        for ms, sql in r.slowest_sql if args.sql else ():
            print(f"    {ms:8.1f} ms  {sql[:300]}")

    print()
    print(f"target p95 < {TARGET_P95_MS:.0f} ms per page, server time in this process:")
    print(HEADER)
    for r in results:
        print(row(r))
    passed = sum(r.ok for r in results)
    timed = [r for r in results if r.times_ms and r.status == 200]
    slowest = max(timed, key=lambda r: r.p95, default=None)
    worst = f"; slowest {slowest.label} p95 {slowest.p95:.0f} ms" if slowest else ""
    print(
        f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end,"
        f" on {os.cpu_count()} CPUs"
    )
    print(
        f"summary: {passed}/{len(results)} pages PASS (p95 < {TARGET_P95_MS:.0f} ms){worst};"
        f" {seeded}: {verdict(passed == len(results))}"
    )
    return 0 if passed == len(results) else 2


if __name__ == "__main__":
    sys.exit(main())
