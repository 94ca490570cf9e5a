"""The installation bench/pages.py measures, planned: everything decided from SEED and
the anchor (the time it was first seeded), nothing stored. bench/pages_seed.py
writes it.

- 4 clusters of 500 nodes of 8 GPUs: mostly active, some spare, suspect,
  cordoned, draining, in repair or retired, each with its last heartbeat;
- 100 training jobs, most running, each with a few launches on those nodes, its
  steps, checkpoints every so many steps, rank windows of its latest launch; a
  launch that did not complete ended by a fault (reported, or one Rebound infers:
  a hang, a dead node). One, `pages-1m`, has 1,000,000 step executions in six
  launches on 128 ranks (a GPU Xid, a hang, a loss spike rolled back past its
  latest checkpoint, an NCCL timeout, a preemption, then the running one);
- stragglers: one slow rank in the latest launch of 40 running jobs;
- about 500 failed launches and stragglers in all (Rebound's detectors make the
  incidents of them), and the actions answering them: 30 awaiting approval, 300
  finished, 4 running.

`small()` scales it down (for a quick run: --small).
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

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


def small() -> None:
    """A small installation of the same kind: 4 clusters of 100 nodes, 20 jobs, the
    big one of 50,000 steps on 4 nodes, about 60 incidents, 38 actions."""
    g = globals()
    g.update(
        NODES_PER_CLUSTER=100,
        NODE_STATES={
            "spare": 8,
            "suspect": 2,
            "cordoned": 3,
            "draining": 2,
            "in_repair": 4,
            "retired": 1,
        },
        BAD_NODES=8,
        JOB_STATUSES={"running": 14, "completed": 3, "failed": 2, "interrupted": 1},
        BIG_STEPS=50_000,
        BIG_NODES=4,
        BIG_LAUNCHES=[
            (0, 9_050, "gpu_xid", 79, "failed"),
            (9_000, 19_530, "hang", None, "failed"),
            (19_500, 26_075, "loss_spike", None, "killed"),
            (25_000, 35_020, "nccl_timeout", None, "failed"),
            (35_000, 42_510, "preempted", None, "preempted"),
            (42_500, None, None, None, None),
        ],
        N_INCIDENTS=60,
        N_STRAGGLERS=6,
        N_AWAITING=6,
        N_FINISHED=30,
        N_RUNNING=2,
    )
