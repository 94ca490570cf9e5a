"""The simulated fleet: jobs on N nodes x 8 GPUs emitting wire-format v1 events on a
simulated clock, with faults drawn from a real mix, and the truth recorded as it is made.

Long module: one job's generation (its launches, steps, windows, heartbeats, faults and
the ledger they cause) reads best in one place; the truth is computed in the same loop
that emits the events, so the two cannot drift apart.

What a job emits follows agent/torch_hooks.py: rank 0 reports each `step` (loss,
step_time_s); every rank reports a `rank_window` every `window_steps` steps
(compute_s excludes waiting, so a slow node shows in its own compute and in the
others' comm_wait_s); each node sends a `heartbeat` every `heartbeat_s` (the agent's
default is 5 s: 15 s keeps the volume down and stays under the dead-node timeout of
30 s); the lifecycle events, checkpoint saves with `blocking_s` and restores. Every
rank of a launch reports its windows: the straggler detector judges only windows
every rank reported, so a stream thinned to a few ranks per node would never be
judged.

Faults (interruptions) arrive at `rate` per 1,000 node-days while a launch trains, by
the Llama 3 mix (54 days on 16,384 H100, 419 unexpected interruptions) folded into
what a job shows; see MIX. Stragglers come on top, at `straggler_share` of that rate.
Noise that must not open incidents: 3% step jitter, data-loader hiccups, GC pauses,
long checkpoint saves, evaluations every `eval_every` steps announced as pauses
(`pause_started` .. `pause_ended`, as `Instrument.pause()` sends them), slow first
steps after a (re)start, one rank slow for one window, all ranks slowing together for
a window or two.

The truth, kept while generating: every fault (class, job, node, launch, start, end
of what it caused), each job's ledger by category, and each interruption's figures
as the contract defines them (lost GPU-seconds, resumed and recovered times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

T0 = 1_790_000_000.0
GPUS_PER_NODE = 8
CATEGORIES = (
    "productive",
    "startup",
    "checkpoint_restore",
    "checkpoint_save",
    "wasted_progress",
    "stalled",
    "downtime",
    "other",
)

# Llama 3's interruptions by cause (share in %), folded into what the job shows:
# GPU faulty 30.1, HBM3 17.2, SRAM 4.5, GPU system processor 4.1, thermal 1.4 -> an Xid
# (a share of them a silent hang); software bug 12.9 -> a crash; switch/cable 8.4,
# NIC 1.7, NCCL watchdog 1.7 -> nccl_timeout (a share a silent hang); host maintenance
# 7.6 -> a planned stop (not a failure); SDC 1.4 -> a loss spike then NaN; the host
# failures of the rest -> a node that stops heartbeating.
MIX = {
    "gpu_xid": 57.3,
    "crash": 12.9,
    "nccl_timeout": 11.8,
    "planned": 7.6,
    "dead_node": 6.0,
    "sdc": 1.4,
}
# The classes that interrupt a launch (a failure each), and the cause each stands for in
# Llama 3's table: what a reliability report should count them as.
CAUSES = {
    "gpu_xid": "gpu",
    "crash": "software",
    "nccl_timeout": "network",
    "hang": "hang",
    "dead_node": "host",
    "sdc": "training_instability",
}
INTERRUPTING = tuple(CAUSES)
# GPU and network faults that show as a silent hang instead (no report; heartbeats go on).
HANG_SHARE = 0.15
XIDS = (79, 79, 48, 94, 95, 63, 64, 74, 119)  # fell off the bus, DBE, ECC, row remap, NVLink, GSP
NCCL_TIMEOUT_S = 600.0  # torch's default collective timeout: the watchdog's report


@dataclass
class FleetConfig:
    nodes: int = 16
    days: float = 1.0
    rate: float = 100.0  # interrupting faults per 1,000 node-days
    seed: int = 0
    step_s: float = 30.0
    window_steps: int = 10
    heartbeat_s: float = 15.0
    checkpoint_every: int = 40  # steps
    eval_every: int = 480  # steps between evaluations (announced pauses)
    eval_s: tuple[float, float] = (180.0, 600.0)  # an evaluation's length, uniform
    straggler_share: float = 0.15  # stragglers per interrupting fault
    max_job_nodes: int = 128  # 1,024 ranks
    mix: dict[str, float] | None = None  # the fault classes' weights; default MIX
    hang_share: float = HANG_SHARE
    job_nodes: tuple[int, ...] | None = None  # the jobs' sizes in nodes; default: fill the fleet


@dataclass
class TrueFault:
    """One injected fault: what it is, where, when, and until when it shows."""

    cls: str
    job: str
    node: str
    attempt: int
    ts: float
    until: float  # the end of what it caused: the launch's end, the straggler's end
    detail: dict = field(default_factory=dict)
    # An interruption's true figures (INTERRUPTING): lost_gpu_s, resumed_at, recovered_at
    figures: dict | None = None


@dataclass
class TrueJob:
    key: str
    world_size: int
    categories: dict[str, float]
    elapsed_s: float = 0.0

    @property
    def goodput(self) -> float:
        return self.categories["productive"] / self.elapsed_s if self.elapsed_s else 0.0


@dataclass
class Fleet:
    config: FleetConfig
    events: list[dict]
    faults: list[TrueFault]
    jobs: list[TrueJob]

    @property
    def node_days(self) -> float:
        return self.config.nodes * self.config.days


def job_sizes(cfg: FleetConfig) -> list[int]:
    """Jobs in nodes, halving: 16 nodes -> 8, 4, 2, 1, 1 (64 .. 8 ranks)."""
    if cfg.job_nodes:
        return list(cfg.job_nodes)
    sizes, left = [], cfg.nodes
    while left > 0:
        size = left if left <= 1 else min(cfg.max_job_nodes, 2 ** int(math.log2(left / 2)))
        sizes.append(size)
        left -= size
    return sizes


def simulate(cfg: FleetConfig) -> Fleet:
    """Every job's events (sorted by ts) and the truth: faults and ledgers."""
    rng = np.random.default_rng(cfg.seed)
    events: list[dict] = []
    faults: list[TrueFault] = []
    jobs: list[TrueJob] = []
    first = 0
    for j, size in enumerate(job_sizes(cfg)):
        nodes = [f"node-{i:04d}" for i in range(first, first + size)]
        first += size
        sim = _JobSim(cfg, rng, f"fleet-j{j:02d}", nodes, spare_base=cfg.nodes + 1000 * (j + 1))
        sim.run()
        events += sim.events
        faults += sim.faults
        jobs.append(sim.truth())
    events.sort(key=lambda e: e["ts"])
    return Fleet(cfg, events, faults, jobs)


class _JobSim:
    def __init__(self, cfg: FleetConfig, rng, key: str, nodes: list[str], spare_base: int):
        self.cfg, self.rng, self.key, self.nodes = cfg, rng, key, list(nodes)
        self.world = len(nodes) * GPUS_PER_NODE
        self.spares = iter(range(spare_base, spare_base + 10_000))
        self.events: list[dict] = []
        self.faults: list[TrueFault] = []
        self.cats = dict.fromkeys(CATEGORIES, 0.0)
        self.launch_cats: dict[int, dict[str, float]] = {}  # the same, per launch
        self.stragglers: set[str] = set()  # the nodes that were slow
        # (launch, step, its interval, its step event's ts), every execution of every launch
        self.executions: list[tuple[int, int, float, float]] = []
        self.n = 0
        per_s = len(nodes) * cfg.rate / 1000 / 86400
        self.fault_rate_s = per_s
        self.straggler_rate_s = per_s * cfg.straggler_share
        self.end = T0 + cfg.days * 86400

    # --- emitting -------------------------------------------------------------

    def count(self, attempt: int, category: str, seconds: float) -> None:
        """The truth: `seconds` of the job's time in `category`, in launch `attempt`."""
        self.cats[category] += seconds
        cats = self.launch_cats.setdefault(attempt, dict.fromkeys(CATEGORIES, 0.0))
        cats[category] += seconds

    def emit(self, kind, ts, attempt=None, node=None, rank=None, **data):
        self.n += 1
        e = {"id": f"{self.key}:{self.n}", "job": self.key, "kind": kind, "ts": round(ts, 6)}
        if attempt is not None:
            e["attempt"] = attempt
        if node is not None:
            e["node"] = node
        if rank is not None:
            e["rank"] = rank
        e["data"] = data
        self.events.append(e)

    def heartbeats(self, attempt, start, stop, silent: dict[str, float]):
        """Every node of the launch from its start to its end; a dead node from its death on."""
        hb = self.cfg.heartbeat_s
        for node in self.nodes:
            phase = float(self.rng.uniform(0, hb))
            until = min(stop, silent.get(node, stop))
            for t in np.arange(start + phase, until, hb).tolist():
                self.emit("heartbeat", t, attempt, node=node)

    # --- a job --------------------------------------------------------------------

    def run(self):
        t, attempt, restored = T0, 1, 0
        while t < self.end - 600:
            t, restored, done = self.launch(attempt, t, restored)
            if done:
                break
            attempt += 1

    def draw(self, rate_s: float) -> float:
        return float(self.rng.exponential(1 / rate_s)) if rate_s > 0 else math.inf

    def launch(self, attempt: int, start: float, restored: int):
        """One launch from `start`: returns where the next starts, its checkpoint, done."""
        rng, cfg = self.rng, self.cfg
        self.emit(
            "attempt_started",
            start,
            attempt,
            node=self.nodes[0],
            rank=0,
            world_size=self.world,
            gpus_per_node=GPUS_PER_NODE,
            nodes=list(self.nodes),
        )
        ready = start + float(rng.uniform(60, 240))
        self.emit("ready", ready, attempt, node=self.nodes[0], rank=0)
        self.count(attempt, "startup", ready - start)
        t = ready
        if restored:
            self.emit(
                "checkpoint_load_started", t, attempt, node=self.nodes[0], rank=0, step=restored
            )
            loaded = t + float(rng.uniform(30, 120))
            self.emit(
                "checkpoint_loaded", loaded, attempt, node=self.nodes[0], rank=0, step=restored
            )
            self.count(attempt, "checkpoint_restore", loaded - t)
            t = loaded
        fault_at = t + self.draw(self.fault_rate_s)
        straggler_at = t + self.draw(self.straggler_rate_s)
        straggler = None  # (node index, factor, until, its TrueFault)
        step, last_step_ts, saved = restored, t, restored
        blocking_since_step = 0.0
        slow_first = 3
        window = self._new_window()
        sdc_countdown = None
        outcome = None
        while True:
            fresh = [k for k, n in enumerate(self.nodes) if n not in self.stragglers]
            if straggler is None and t >= straggler_at and fresh:
                # A node slow again is the same fault, its incident still open: a new node.
                idx = fresh[int(rng.integers(len(fresh)))]
                self.stragglers.add(self.nodes[idx])
                factor = float(rng.uniform(1.2, 4.0))
                until = t + float(rng.uniform(30, 180)) * 60  # until someone replaces it
                slow = TrueFault(
                    "straggler", self.key, self.nodes[idx], attempt, t, until, {"factor": factor}
                )
                self.faults.append(slow)
                straggler = (idx, factor, until, slow)
            if straggler is not None and t >= straggler[2]:
                straggler = None
                straggler_at = t + self.draw(self.straggler_rate_s)
            base = cfg.step_s * (1 + 0.03 * float(rng.standard_normal()))
            if slow_first:
                base *= 3.0  # compiling, warming caches after a (re)start
                slow_first -= 1
            base *= window["all"]
            data_wait = float(rng.uniform(2, 10)) if rng.random() < 1 / 300 else 0.0
            gc = float(rng.uniform(1, 4)) if rng.random() < 1 / 200 else 0.0  # every rank
            # An evaluation before the step, announced: its time is in the step's interval.
            evaluating = step > restored and step % cfg.eval_every == 0
            pause = float(rng.uniform(*cfg.eval_s)) if evaluating else 0.0
            f = straggler[1] if straggler is not None else 1.0
            g = window["rank_factor"]
            dt = 0.8 * base * max(f, g) + 0.2 * base + data_wait + gc + pause
            if sdc_countdown is None and t + dt >= fault_at:
                outcome = self.pick_fault()
                if outcome != "sdc":
                    break
                sdc_countdown = int(rng.integers(2, 5))  # a spike, then NaN a few steps on
                self.sdc = TrueFault("sdc", self.key, self.nodes[0], attempt, t + dt, t + dt)
                self.faults.append(self.sdc)
            if t + dt >= self.end:
                outcome = "completed"
                break
            if pause:
                self.emit("pause_started", t, attempt, node=self.nodes[0], rank=0, reason="eval")
                self.emit("pause_ended", t + pause, attempt, node=self.nodes[0], rank=0)
            t += dt
            step += 1
            self.executions.append((attempt, step, dt, t))
            loss = 2.0 * math.exp(-step / 20000) + 0.5 + 0.01 * float(rng.standard_normal())
            if sdc_countdown is not None:
                loss = loss * float(rng.uniform(3, 8)) if sdc_countdown > 0 else float("nan")
            self.emit(
                "step",
                t,
                attempt,
                node=self.nodes[0],
                rank=0,
                step=step,
                loss="NaN" if math.isnan(loss) else round(loss, 6),
                step_time_s=round(dt, 6),
            )
            last_step_ts = t
            blocking_since_step = 0.0
            self._window_add(window, base, f, straggler, data_wait, dt)
            if step % cfg.window_steps == 0:
                self._window_emit(window, attempt, step, t)
                window = self._new_window()
            if sdc_countdown is not None:
                if sdc_countdown == 0:
                    outcome = "nan"
                    break
                sdc_countdown -= 1
            if step % cfg.checkpoint_every == 0:
                t = self.save(attempt, step, t)
                blocking_since_step = t - last_step_ts
                saved = step
        if straggler is not None:  # the launch ended under it: the next one runs without
            straggler[3].until = min(straggler[3].until, t)
            if straggler[3].until <= straggler[3].ts:  # ended before it slowed a step
                self.faults.remove(straggler[3])
        return self.finish(attempt, outcome, t, last_step_ts, step, saved, blocking_since_step)

    def pick_fault(self) -> str:
        mix = self.cfg.mix or MIX
        classes = list(mix)
        p = np.array([mix[c] for c in classes])
        cls = classes[int(self.rng.choice(len(classes), p=p / p.sum()))]
        if cls in ("gpu_xid", "nccl_timeout") and self.rng.random() < self.cfg.hang_share:
            return "hang"
        return cls

    def save(self, attempt, step, t, *, long_ok=True) -> float:
        blocking = float(self.rng.uniform(5, 20))
        if long_ok and self.rng.random() < 0.08:
            blocking *= float(self.rng.uniform(5, 15))  # a slow filesystem: a long save
        self.emit("checkpoint_save_started", t, attempt, node=self.nodes[0], rank=0, step=step)
        self.emit(
            "checkpoint_saved",
            t + blocking,
            attempt,
            node=self.nodes[0],
            rank=0,
            step=step,
            blocking_s=round(blocking, 6),
            bytes=int(2e9 * self.world / 8),
        )
        self.count(attempt, "checkpoint_save", round(blocking, 6))
        return t + blocking

    def finish(self, attempt, outcome, t, last_step_ts, step, saved, blocking_since_step):
        """The launch's end as `outcome` makes it; the truth of its tail and the gap after."""
        rng = self.rng
        tail_blocking = blocking_since_step  # a save after the last step is save time, not stall
        node_idx = int(rng.integers(len(self.nodes)))
        node = self.nodes[node_idx]
        rank = node_idx * GPUS_PER_NODE + int(rng.integers(GPUS_PER_NODE))
        # The fault shows once the step in flight is where it broke: just past the last step.
        tf = max(t, last_step_ts) + float(rng.uniform(0.5, 1.0) * self.cfg.step_s)
        silent: dict[str, float] = {}
        replace = False
        if outcome == "completed":
            end = t + 1.0
            self.emit(
                "attempt_ended",
                end,
                attempt,
                node=self.nodes[0],
                rank=0,
                reason="completed",
                exit_code=0,
            )
            self.emit("job_finished", end, attempt, node=self.nodes[0], rank=0)
            self.count(attempt, "other", end - last_step_ts - tail_blocking)
            self.heartbeats(attempt, self._start_of(attempt), end, silent)
            return end, saved, True
        if outcome == "planned":
            # Drained: a last save (unless the step's own was the last thing), then stop.
            t2 = t if saved == step else self.save(attempt, step, t, long_ok=False)
            tail_blocking += t2 - t
            end = t2 + 10.0
            self.emit("attempt_ended", end, attempt, node=self.nodes[0], rank=0, reason="preempted")
            self.faults.append(TrueFault("planned", self.key, node, attempt, t, end))
            saved, downtime = step, float(rng.uniform(1800, 7200))
        elif outcome == "nan":
            end = t + float(rng.uniform(5, 30))
            self.emit(
                "attempt_ended",
                end,
                attempt,
                node=self.nodes[0],
                rank=0,
                reason="failed",
                exit_code=1,
            )
            self.sdc.until = end
            downtime = float(rng.uniform(60, 300))
        else:
            if outcome == "gpu_xid":
                xid = int(rng.choice(XIDS))
                self.emit("fault", tf, attempt, node=node, rank=rank, type="gpu_xid", xid=xid)
                end, replace = tf + float(rng.uniform(5, 60)), True
                downtime, detail = float(rng.uniform(300, 1800)), {"xid": xid}
            elif outcome == "crash":
                self.emit(
                    "fault", tf, attempt, node=node, rank=rank, type="crash", exit_code=1,
                    message="RuntimeError: CUDA error: an illegal memory access was encountered",
                )  # fmt: skip
                end, downtime, detail = (
                    tf + float(rng.uniform(5, 30)),
                    float(rng.uniform(60, 300)),
                    {},
                )
            elif outcome == "nccl_timeout":
                reported = tf + NCCL_TIMEOUT_S
                for r in sorted(
                    {rank, *rng.integers(self.world, size=min(7, self.world - 1)).tolist()}
                ):
                    self.emit(
                        "fault", reported + float(rng.uniform(0, 5)), attempt,
                        node=self.nodes[r // GPUS_PER_NODE], rank=r, type="nccl_timeout",
                        message="Watchdog caught collective operation timeout",
                    )  # fmt: skip
                end = reported + float(rng.uniform(10, 30))
                downtime, detail = float(rng.uniform(120, 900)), {}
            elif outcome == "hang":
                end = tf + float(rng.uniform(1800, 3600))  # until someone kills it
                downtime, detail = float(rng.uniform(60, 300)), {}
            elif outcome == "dead_node":
                silent[node] = tf
                end, replace = tf + NCCL_TIMEOUT_S + float(rng.uniform(10, 30)), True
                downtime, detail = float(rng.uniform(300, 1800)), {}
            else:
                raise ValueError(outcome)
            reason = "killed" if outcome == "hang" else "failed"
            self.emit("attempt_ended", end, attempt, node=self.nodes[0], rank=0, reason=reason,
                      **({} if outcome == "hang" else {"exit_code": 1}))  # fmt: skip
            self.faults.append(TrueFault(outcome, self.key, node, attempt, tf, end, detail))
        self.count(attempt, "stalled", end - last_step_ts - tail_blocking)
        self.heartbeats(attempt, self._start_of(attempt), end, silent)
        nxt = min(end + downtime, self.end)
        self.count(attempt, "downtime", nxt - end)
        if replace:
            self.nodes[self.nodes.index(node)] = f"node-{next(self.spares):04d}"
        if nxt >= self.end - 600:
            # No time left for another launch: the job ends where the downtime ends.
            self.emit("job_finished", nxt, attempt, node=self.nodes[0], rank=0)
            return nxt, saved, True
        return nxt, saved, False

    def _start_of(self, attempt: int) -> float:
        for e in reversed(self.events):
            if e["kind"] == "attempt_started" and e.get("attempt") == attempt:
                return e["ts"]
        raise LookupError(attempt)

    # --- rank windows ----------------------------------------------------------------

    def _new_window(self) -> dict:
        rng = self.rng
        slow_rank = int(rng.integers(self.world)) if rng.random() < 0.01 else None
        return {
            "first": None,
            "n": 0,
            "step_s": 0.0,
            "compute": 0.0,
            "data": 0.0,
            "slow_node": None,
            "slow_compute": 0.0,
            "rank_factor": float(rng.uniform(1.5, 2.5)) if slow_rank is not None else 1.0,
            "slow_rank": slow_rank,
            "all": float(rng.uniform(1.2, 1.6)) if rng.random() < 0.01 else 1.0,
        }

    def _window_add(self, w, base, f, straggler, data_wait, dt):
        w["n"] += 1
        w["step_s"] += dt
        w["compute"] += 0.8 * base
        w["data"] += data_wait
        if straggler is not None:
            w["slow_node"] = straggler[0]
            w["slow_compute"] += 0.8 * base * f
        else:
            w["slow_compute"] += 0.8 * base

    def _window_emit(self, w, attempt, last_step, ts):
        n = w["n"]
        if not n:
            return
        compute = np.full(self.world, w["compute"] / n)
        if w["slow_node"] is not None:
            k = w["slow_node"] * GPUS_PER_NODE
            compute[k : k + GPUS_PER_NODE] = w["slow_compute"] / n
        if w["slow_rank"] is not None:
            compute[w["slow_rank"]] *= w["rank_factor"]
        step_s, data = w["step_s"] / n, w["data"] / n
        comm = np.maximum(0.0, step_s - compute - data)
        first = last_step - n + 1
        for r in range(self.world):
            self.emit(
                "rank_window",
                ts,
                attempt,
                node=self.nodes[r // GPUS_PER_NODE],
                rank=r,
                first_step=first,
                last_step=last_step,
                compute_s=round(float(compute[r]), 6),
                step_s=round(step_s, 6),
                comm_wait_s=round(float(comm[r]), 6),
                data_wait_s=round(data, 6),
            )

    # --- the truth ----------------------------------------------------------------

    def truth(self) -> TrueJob:
        """Productive: the last execution of each step; every earlier one was wasted. And
        each interruption's figures (TrueFault.figures)."""
        last: dict[int, int] = {}
        for i, (_, step, _, _) in enumerate(self.executions):
            last[step] = i
        for i, (attempt, step, interval, _) in enumerate(self.executions):
            self.count(attempt, "productive" if last[step] == i else "wasted_progress", interval)
        for f in self.faults:
            if f.cls in INTERRUPTING:
                f.figures = self._figures(f)
        starts = [e["ts"] for e in self.events if e["kind"] == "attempt_started"]
        ends = [e["ts"] for e in self.events if e["kind"] == "job_finished"]
        elapsed = (ends[-1] if ends else max(e["ts"] for e in self.events)) - starts[0]
        return TrueJob(self.key, self.world, dict(self.cats), elapsed)

    def _figures(self, f: TrueFault) -> dict:
        """What the interruption of launch `f.attempt` cost, as the contract counts it:
        its wasted progress, stall and the downtime after it, the next launch's startup
        and restore (x the world size); training resumed at the first step of a later
        launch and recovered at the first step past the highest made before the fault."""
        mine = self.launch_cats[f.attempt]
        nxt = self.launch_cats.get(f.attempt + 1, dict.fromkeys(CATEGORIES, 0.0))
        lost = mine["wasted_progress"] + mine["stalled"] + mine["downtime"]
        lost += nxt["startup"] + nxt["checkpoint_restore"]
        highest = max((s for _, s, _, ts in self.executions if ts <= f.ts), default=-1)
        later = [(ts, s) for a, s, _, ts in self.executions if a > f.attempt]
        return {
            "lost_gpu_s": lost * self.world,
            "resumed_at": min((ts for ts, _ in later), default=None),
            "recovered_at": min((ts for ts, s in later if s > highest), default=None),
        }
