"""Load run: a 16,384-rank job and its fleet's heartbeats, posted at the real rate for
minutes, against a real gunicorn server, Redis and one Celery worker on this machine.
Do ingest, detection and the sweep keep up, how fast are faults found, and how much
faster could the stream come before the worker falls behind?

Long module: one benchmark read top to bottom (the stream, the clients, the
monitor, the report), like its siblings in bench/.

    .venv/bin/python bench/fleet_load.py [--minutes 15] [--burst-s 60] [--step-s 5]
        [--ranks 16384] [--nodes 2048] [--clients 8] [--workers 2] [--fault-every-s 60]
        [--database-url postgres://...] [--redis-url redis://...] [--json PATH]

The stream, at the real rate (defaults; seconds are wall seconds, and the events'
`ts` is the wall clock):
- the big job: 16,384 ranks on 2,048 nodes x 8 GPUs. Its launch (`attempt_started`
  with world_size 16384, gpus_per_node 8 and the 2,048 node names, then `ready`) is
  posted before the clock starts. Rank 0 reports a `step` every --step-s (5 s:
  0.2 events/s); every rank a `rank_window` every 10 steps (16,384 windows per 50 s,
  327.7/s), each rank at its own fixed offset within the 50 s after the window ends,
  so the windows are spread evenly and a window is complete (every rank reported)
  up to 50 s after its last step; every node a `heartbeat` every 10 s (204.8/s, the
  nodes at spread offsets); a checkpoint save (`checkpoint_save_started` and
  `checkpoint_saved`) every 100 steps. 532.7 events/s in all.
- a slow node (node 60% of the way along, 1.6x compute time on its 8 ranks) for 8
  windows from minute 3 on: a straggler (found after `straggler.windows`, 3, complete
  slow windows). The step cadence stays --step-s throughout (the ranks' reported
  step_s rises with the slow node's compute, as it would).
- side jobs: every --fault-every-s (60 s) a fresh 8-rank job on a spare node of its
  own (`spare-NNN`), with its launch, steps, windows and heartbeats, reports a
  `fault` (gpu_xid, xid 79) 55 s after it started (posted alone, in its own
  request), then `attempt_ended` (failed). About 0.5 events/s more.
- Posting: --clients threads (8), each owning a contiguous slice of the nodes (their
  heartbeats and their ranks' windows; the first also the job's steps and
  checkpoints), post once a second what their nodes produced since their last post:
  batches of about 67 events (26 heartbeats in the first 50 s, before the first
  windows end), 8 POSTs a second. One more thread posts the side jobs. Events come
  from dict templates, bodies from orjson.

The server is `console.wsgi` under gunicorn (--workers sync workers,
bench/gunicorn_conf.py), the worker is one Celery process (solo pool) with beat in it,
as scripts/run starts it, on Redis queues of this run's own; the run's cluster has
the `noop` recovery driver, so the incidents' actions are proposed and run without
touching anything.

Measured every --report-s (30 s) and at the end: events/s posted against the
needed rate, POST latency p50/p95, the worker's Redis queue depth (LLEN, most in
the interval), the outbox backlog (rows past their due time: work asked for that has
not started), the big job's detection lag (how long ago the oldest event its
detection has not read yet arrived), the sweep's age (how long ago it last ran; beat
sends it every 15 s), and the CPU of the gunicorn workers, PostgreSQL (the backends
of this database), the Celery worker and the machine.

At the end:
- drain: seconds until the worker's queue is empty once posting stops (target
  <= 10 s), and until the big job's detection has read every event ("caught up");
- fault -> incident: each side job's incident `opened_at` (server clock) less the
  wall time its fault's POST was answered 202 (accepted); p50/p95/max (target p95 <
  2 s), and the same from when the POST was sent;
- the straggler: its incident's `opened_at` less when the window that completed its
  evidence (the 3rd slow window) was complete, i.e. when the last of its 16,384
  ranks' reports of it was accepted;
- headroom: after the real-rate phase (and the drain), --burst-s (60 s) of the same
  stream (the big job and its heartbeats; no side jobs) posted as fast as the clients
  can, each POST one second of its slice's stream. The rate the worker sustains is
  the rate at which the big job's detection advanced through the stream (the slope
  of its read position, in event ids, against wall time), or the posted rate when
  detection kept pace with it (its slope at least 95% of the posting's): then it is
  a lower bound, set by ingest on these cores. headroom = that rate / the needed rate.

Checks: every event accepted (every answer 202 with all of its batch new), each side
job's Xid incident opened, the straggler found on the slow node, no other incident on
the big job, ingest kept the real rate (a client's batch accepted, p95, within 1 s of
the end of the second it covers), the sweep never more than 2 periods old (these two
judged on runs of 45 s or more, headroom on bursts of 30 s or more). Exit
status 0 when targets and checks pass. Deletes its jobs (and their outbox rows), its
cluster (nodes, incidents, actions), token and Redis queue at the end (--keep keeps
the rows).
"""

import argparse
import bisect
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import orjson
import requests
from harness import pg_connect, setup_django, verdict
from ingest import (
    CpuMeter,
    children,
    drain,
    forget_queues,
    free_port,
    process_cpu,
    queued,
    start_server,
    start_worker,
    stop_server,
    wait_ready,
)
from ranks_scale import pct

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_load"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
TARGET_DRAIN_S = 10.0
TARGET_FAULT_P95_S = 2.0
SWEEP_EVERY_S = 15.0  # console.settings' beat schedule (incidents.services.SWEEP_EVERY_S)
WINDOW_STEPS = 10
HEARTBEAT_S = 10.0
CHECKPOINT_EVERY_STEPS = 100
COMPUTE_SHARE = 0.8  # of a step, the rest waiting on collectives and data
NOISE = 0.02
SLOW_FACTOR = 1.6
SLOW_WINDOWS = 8
SIDE_RANKS = 8
SIDE_FIRST_S = 5.0
GOLDEN = 0.6180339887498949
KEPT_RATE_S = 1.0  # a client's batch accepted this soon after its second ended (p95)
KEEPS_PACE = 0.95
MIN_BURST_S = 30.0  # detection's slope against the posting's: it kept up


def spread(i: int, period: float) -> float:
    """The i-th of evenly spread offsets in [0, period) (the golden-ratio sequence)."""
    return ((i * GOLDEN) % 1.0) * period


def due(offsets: list[float], period: float, a: float, b: float, first_cycle: int = 0):
    """(cycle, index) of every event at cycle * period + offsets[index] in (a, b],
    cycle >= first_cycle; `offsets` sorted, in [0, period)."""
    c = max(first_cycle, math.floor((a - offsets[-1]) / period))
    while c * period <= b:
        base = c * period
        lo = bisect.bisect_right(offsets, a - base)
        hi = bisect.bisect_right(offsets, b - base)
        for k in range(lo, hi):
            yield c, k
        c += 1


# --- the stream ------------------------------------------------------------------


class Plan:
    """The run's shape: the big job, its slow node and windows, and the rates."""

    def __init__(self, args, prefix: str):
        self.ranks, self.nodes = args.ranks, args.nodes
        if self.ranks % self.nodes:
            sys.exit("--ranks must be a multiple of --nodes")
        self.gpus = self.ranks // self.nodes
        self.step_s = args.step_s
        self.window_s = WINDOW_STEPS * self.step_s
        self.key = f"{prefix}big"
        self.node_names = [f"n{i:04d}" for i in range(self.nodes)]
        self.slow_node = int(self.nodes * 0.6)
        self.first_slow = max(0, math.ceil(args.slow_from_s / self.window_s) - 1)
        self.slow_windows = range(self.first_slow, self.first_slow + SLOW_WINDOWS)
        self.t0 = 0.0  # the launch's wall time, set when it is posted
        self.fault_every = args.fault_every_s
        self.fault_after = max(1.0, self.fault_every - 5.0)

    def needed(self) -> float:
        """Events/s the stream produces at the real rate (the side jobs included)."""
        big = 1 / self.step_s + self.ranks / self.window_s + self.nodes / HEARTBEAT_S
        big += 2 / (CHECKPOINT_EVERY_STEPS * self.step_s)
        side_s = self.fault_after  # one side job at a time, alive this long of every period
        side = side_s / self.step_s + SIDE_RANKS * side_s / self.window_s + side_s / HEARTBEAT_S
        return big + (side + 4) / self.fault_every  # + its launch, fault and end

    def launch(self) -> list[dict]:
        ts = round(self.t0, 6)
        data = {"world_size": self.ranks, "gpus_per_node": self.gpus, "nodes": self.node_names}
        return [
            {
                "id": "start",
                "job": self.key,
                "kind": "attempt_started",
                "ts": ts,
                "attempt": 1,
                "data": data,
            },
            {"id": "ready", "job": self.key, "kind": "ready", "ts": ts, "attempt": 1},
        ]


class Slice:
    """One client's share of the big job: its nodes' heartbeats and its ranks' windows;
    the lead slice also the job's steps and checkpoints. `events(a, b)` is what they
    produced in (a, b] of the job's clock (seconds since the launch)."""

    def __init__(self, plan: Plan, lo: int, hi: int, lead: bool, seed: int):
        self.plan, self.lead = plan, lead
        self.rng = random.Random(seed)
        p = plan
        key = p.key
        self.beats = sorted((spread(n, HEARTBEAT_S), n) for n in range(lo, hi))
        self.beat_offsets = [o for o, _ in self.beats]
        self.beat_tmpl = [
            {"job": key, "kind": "heartbeat", "node": p.node_names[n]} for _, n in self.beats
        ]
        ranks = range(lo * p.gpus, hi * p.gpus)
        self.reports = sorted((spread(r, p.window_s), r) for r in ranks)
        self.report_offsets = [o for o, _ in self.reports]
        self.window_tmpl = [
            {
                "job": key,
                "kind": "rank_window",
                "attempt": 1,
                "node": p.node_names[r // p.gpus],
                "rank": r,
            }
            for _, r in self.reports
        ]
        self.slow_ranks = range(p.slow_node * p.gpus, (p.slow_node + 1) * p.gpus)

    def events(self, a: float, b: float) -> tuple[list[dict], set[int]]:
        """The events, and the windows they hold."""
        p, rng, out, windows = self.plan, self.rng, [], set()
        t0 = p.t0
        if self.lead:
            for step, _ in due([0.0], p.step_s, a, b, first_cycle=1):
                ts = round(t0 + step * p.step_s, 6)
                loss = 2.0 + 1.0 / (1 + step / 100) + rng.gauss(0, 0.002)
                data = {
                    "step": step,
                    "loss": round(loss, 5),
                    "grad_norm": 1.0,
                    "tokens": 4_194_304,
                    "step_time_s": p.step_s,
                }
                out.append(
                    {
                        "id": f"s{step}",
                        "job": p.key,
                        "kind": "step",
                        "ts": ts,
                        "attempt": 1,
                        "rank": 0,
                        "data": data,
                    }
                )
                if step % CHECKPOINT_EVERY_STEPS == 0:
                    d = {"step": step}
                    out.append(
                        {
                            "id": f"c{step}a",
                            "job": p.key,
                            "ts": ts,
                            "attempt": 1,
                            "kind": "checkpoint_save_started",
                            "data": d,
                        }
                    )
                    saved = {
                        "step": step,
                        "blocking_s": 0.2,
                        "bytes": 16_000_000_000,
                        "uri": f"s3://ckpt/{p.key}/{step:08d}",
                        "tier": "remote",
                    }
                    out.append(
                        {
                            "id": f"c{step}b",
                            "job": p.key,
                            "ts": round(ts + 0.2, 6),
                            "attempt": 1,
                            "kind": "checkpoint_saved",
                            "data": saved,
                        }
                    )
        for cycle, k in due(self.beat_offsets, HEARTBEAT_S, a, b):
            ev = dict(self.beat_tmpl[k])
            ev["id"] = f"h{self.beats[k][1]}-{cycle}"
            ev["ts"] = round(t0 + cycle * HEARTBEAT_S + self.beat_offsets[k], 6)
            out.append(ev)
        step_s = p.step_s
        compute = step_s * COMPUTE_SHARE
        for cycle, k in due(self.report_offsets, p.window_s, a, b, first_cycle=1):
            w = cycle - 1  # window w: steps 10w+1 .. 10w+10, ended at cycle * window_s
            windows.add(w)
            rank = self.reports[k][1]
            slow = w in p.slow_windows
            c = compute * (1 + rng.uniform(-NOISE, NOISE))
            if slow and rank in self.slow_ranks:
                c *= SLOW_FACTOR
            # Every rank waits for the slowest at each step: the slow node sets step_s.
            s = compute * SLOW_FACTOR * (1 + NOISE) + 0.05 if slow else step_s
            ev = dict(self.window_tmpl[k])
            ev["id"] = f"w{w}-{rank}"
            ev["ts"] = round(t0 + cycle * p.window_s, 6)
            ev["data"] = {
                "first_step": w * WINDOW_STEPS + 1,
                "last_step": cycle * WINDOW_STEPS,
                "compute_s": round(c, 6),
                "step_s": round(s, 6),
                "comm_wait_s": round(max(0.0, s - c - 0.01), 6),
                "data_wait_s": 0.01,
            }
            out.append(ev)
        return out, windows


class SideJobs:
    """Small jobs on spare nodes, each reporting a GPU Xid `fault` `fault_after` seconds
    after it started; one starts every `fault_every` seconds."""

    def __init__(self, plan: Plan, prefix: str, end_s: float):
        self.plan = plan
        self.jobs = []  # (key, node, start)
        i = 0
        while SIDE_FIRST_S + i * plan.fault_every + plan.fault_after < end_s:
            start = SIDE_FIRST_S + i * plan.fault_every
            self.jobs.append((f"{prefix}side-{i:03d}", f"spare-{i:03d}", start))
            i += 1

    def events(self, a: float, b: float) -> tuple[list[dict], list[dict]]:
        """(what the side jobs produced in (a, b], their faults in it: each posted alone)."""
        p, out, faults = self.plan, [], []
        for key, node, start in self.jobs:
            fault_at = start + p.fault_after
            if not (start - 1 < b and a < fault_at + 1):
                continue
            lo, hi = a - start, min(b, fault_at) - start  # (lo, hi] on the job's clock

            def ts(t, start=start):
                return round(p.t0 + start + t, 6)

            if lo < 0 <= hi:
                data = {"world_size": SIDE_RANKS, "gpus_per_node": SIDE_RANKS, "nodes": [node]}
                out += [
                    {
                        "id": "start",
                        "job": key,
                        "kind": "attempt_started",
                        "ts": ts(0),
                        "attempt": 1,
                        "data": data,
                    },
                    {"id": "ready", "job": key, "kind": "ready", "ts": ts(0.1), "attempt": 1},
                ]
            if hi > lo:
                for step, _ in due([0.0], p.step_s, lo, hi, first_cycle=1):
                    out.append(
                        {
                            "id": f"s{step}",
                            "job": key,
                            "kind": "step",
                            "attempt": 1,
                            "ts": ts(step * p.step_s),
                            "rank": 0,
                            "data": {"step": step, "loss": 2.5},
                        }
                    )
                for beat, _ in due([0.0], HEARTBEAT_S, lo, hi):
                    out.append(
                        {
                            "id": f"h{beat}",
                            "job": key,
                            "kind": "heartbeat",
                            "node": node,
                            "ts": ts(beat * HEARTBEAT_S),
                        }
                    )
                for cycle, _ in due([0.0], p.window_s, lo, hi, first_cycle=1):
                    s = p.step_s
                    for rank in range(SIDE_RANKS):
                        data = {
                            "first_step": (cycle - 1) * WINDOW_STEPS + 1,
                            "last_step": cycle * WINDOW_STEPS,
                            "compute_s": s * 0.8,
                            "step_s": s,
                            "comm_wait_s": s * 0.19,
                        }
                        out.append(
                            {
                                "id": f"w{cycle}-{rank}",
                                "job": key,
                                "attempt": 1,
                                "kind": "rank_window",
                                "node": node,
                                "rank": rank,
                                "ts": ts(cycle * p.window_s),
                                "data": data,
                            }
                        )
            if a < fault_at <= b:
                faults.append(
                    {
                        "id": "fault",
                        "job": key,
                        "kind": "fault",
                        "ts": ts(p.fault_after),
                        "attempt": 1,
                        "node": node,
                        "rank": 3,
                        "data": {"type": "gpu_xid", "xid": 79},
                    }
                )
            if a < fault_at + 1 <= b:
                out.append(
                    {
                        "id": "end",
                        "job": key,
                        "kind": "attempt_ended",
                        "attempt": 1,
                        "ts": ts(p.fault_after + 1),
                        "data": {"reason": "failed", "exit_code": 1},
                    }
                )
        return out, faults


# --- posting -----------------------------------------------------------------------


class Poster(threading.Thread):
    """Posts its stream once a second up to `end_s` of the job's clock (the real rate);
    then, once `burst` is set, one second of it per POST as fast as it can until
    `burst_until` (wall, monotonic). Every answer must be 202 with all of its batch new."""

    def __init__(self, url: str, token: str, source, plan: Plan, end_s: float, offset: float):
        super().__init__(daemon=True)
        self.url, self.source, self.plan = url, source, plan
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.end_s, self.offset = end_s, offset
        self.burst = threading.Event()
        self.lockstep: Lockstep | None = None  # set with `burst`
        self.late: list[float] = []  # real rate: batches accepted this long after their second
        self.phase = "real"
        self.real_done = False
        self.posted = {"real": 0, "burst": 0}  # events
        self.latencies: list[tuple[str, float]] = []  # (phase, seconds)
        self.window_done: dict[int, float] = {}  # window -> when its last batch was accepted
        self.faults: dict[str, tuple[float, float]] = {}  # side job -> (sent, accepted)
        self.error: str | None = None
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy: straight to 127.0.0.1

    def post(self, events: list[dict]) -> float:
        """Posts a batch; the wall time it was accepted."""
        t = time.perf_counter()
        r = self.session.post(
            self.url, data=orjson.dumps({"events": events}), headers=self.headers, timeout=60
        )
        done = time.time()
        if r.status_code != 202:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
        got = r.json()
        if got != {"accepted": len(events), "duplicates": 0}:
            raise RuntimeError(f"expected {len(events)} accepted, got {got}")
        self.latencies.append((self.phase, time.perf_counter() - t))
        self.posted[self.phase] += len(events)
        return done

    def send(self, a: float, b: float) -> None:
        if isinstance(self.source, SideJobs):
            events, faults = self.source.events(a, b)
            if events:
                self.post(events)
            for fault in faults:
                sent = time.time()
                self.faults[fault["job"]] = (sent, self.post([fault]))
            return
        events, windows = self.source.events(a, b)
        if events:
            done = self.post(events)
            for w in windows:
                self.window_done[w] = done

    def run(self):
        try:
            a, k = 0.0, 0
            while a < self.end_s:
                k += 1
                b = min(self.end_s, k + self.offset)
                pause = self.plan.t0 + b - time.time()
                if pause > 0:
                    time.sleep(pause)
                self.send(a, b)
                self.late.append(time.time() - self.plan.t0 - b)
                a = b
            self.real_done = True
            if isinstance(self.source, SideJobs):
                return
            self.burst.wait()
            lockstep = self.lockstep
            if lockstep is None:
                return
            self.phase = "burst"
            while True:
                self.send(a, a + 1.0)
                a += 1.0
                if lockstep.wait():
                    return
        except threading.BrokenBarrierError:
            self.error = f"{self.phase}: stopped with another client"
        except Exception as exc:
            self.error = f"{self.phase}: {exc}"
            if self.lockstep is not None:
                self.lockstep.barrier.abort()


class Lockstep:
    """The burst's clients post the same second of the job's clock before any goes on to
    the next: as fast as the slowest of them, the job's stream stays whole (no node's
    heartbeats or windows left behind the others')."""

    def __init__(self, clients: int, until: float):
        self.until, self.stop = until, False
        self.barrier = threading.Barrier(clients, action=self._check)

    def _check(self) -> None:
        self.stop = time.monotonic() >= self.until

    def wait(self) -> bool:
        """After a second is posted: True when the burst is over."""
        self.barrier.wait(timeout=60)
        return self.stop


# --- watching the server side ----------------------------------------------------------


class Probe:
    """What the worker has left to do, read from Redis and the database."""

    def __init__(self, database_url: str, redis_url: str, queue: str, job_id: int):
        import redis

        self.redis = redis.Redis.from_url(redis_url)
        self.queue, self.job_id = queue, job_id
        self.db = pg_connect(database_url, autocommit=True)

    def depth(self) -> int:
        return queued(self.redis, self.queue)

    def one(self, sql: str, params=()):
        return self.db.execute(sql, params).fetchone()

    def sample(self) -> dict:
        cursor, pass_s = self.one(
            "SELECT (data->'cursor'->>'event')::bigint, last_pass_s"
            " FROM incidents_detectorstate WHERE job_id = %s",
            [self.job_id],
        ) or (0, 0.0)
        cursor = cursor or 0
        (top,) = self.one("SELECT max(id) FROM jobs_event")
        (lag,) = self.one(
            "SELECT extract(epoch FROM now() - received_at) FROM jobs_event"
            " WHERE id > %s AND job_id + 0 = %s ORDER BY id LIMIT 1",
            [cursor, self.job_id],
        ) or (0.0,)
        overdue, oldest = self.one(
            "SELECT count(*), extract(epoch FROM now() - min(due_at))"
            " FROM common_outboxentry WHERE due_at <= now()"
        )
        (sweep_age,) = self.one(
            "SELECT extract(epoch FROM now() - at) FROM incidents_sweepstate WHERE id = 1"
        ) or (None,)
        return {
            "t": time.monotonic(),
            "cursor": cursor,
            "top": top or 0,
            "lag_s": float(lag),
            "pass_s": float(pass_s),
            "outbox_due": overdue,
            "outbox_oldest_s": float(oldest or 0.0),
            "sweep_age_s": None if sweep_age is None else float(sweep_age),
        }

    def caught_up(self, top: int, since: float, timeout: float) -> float | None:
        """Seconds from `since` (monotonic) until the big job's detection has read up to
        event id `top`; None when it has not within `timeout` of now."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sample()["cursor"] >= top:
                return time.monotonic() - since
            time.sleep(0.2)
        return None


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the worker and its beat)."""
    return process_cpu(pid) + sum(process_cpu(c) for c in children(pid))


class Monitor:
    """Samples the clients, the queue, the database and the CPU; prints a line per
    --report-s and keeps the figures."""

    def __init__(self, probe, posters, meter, worker, report_s: float, needed: float):
        self.probe, self.posters, self.meter, self.worker = probe, posters, meter, worker
        self.report_s, self.needed = report_s, needed
        self.samples: list[dict] = []  # database samples, every second
        self.depths: list[tuple[float, int]] = []  # (t, LLEN), every second
        self.lines: list[dict] = []
        self.pg_total, self.pg_seen = 0.0, {}

    def _backends(self) -> None:
        """Adds what the database's backends used since the last look. Connections are
        reopened every minute (REBOUND_DB_CONN_MAX_AGE): the backends are read anew
        each time, a new one counted whole (it started since)."""
        pids = [
            pid
            for (pid,) in self.probe.db.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ]
        now = {pid: process_cpu(pid) for pid in pids}
        self.pg_total += sum(max(0.0, v - self.pg_seen.get(pid, 0.0)) for pid, v in now.items())
        self.pg_seen = now

    def cpu(self) -> dict:
        s = self.meter.sample()
        self._backends()
        s["postgres"] = self.pg_total
        s["worker"] = tree_cpu(self.worker.pid)
        s["t"] = time.monotonic()
        return s

    def posted(self, phase: str) -> int:
        return sum(p.posted[phase] for p in self.posters)

    def watch(self, phase: str, until) -> None:
        """Samples until `until()` is true, printing a line every report_s."""
        began = time.monotonic()
        last = {"cpu": self.cpu(), "posted": self.posted(phase), "lat": self._lat_count()}
        next_line = began + self.report_s
        while not until():
            time.sleep(1.0)
            self.depths.append((time.monotonic(), self.probe.depth()))
            self._backends()
            sample = self.probe.sample()
            sample["phase"] = phase
            self.samples.append(sample)
            if time.monotonic() >= next_line:
                last = self._line(phase, began, last)
                next_line += self.report_s
        self._line(phase, began, last)

    def _lat_count(self) -> list[int]:
        return [len(p.latencies) for p in self.posters]

    def _line(self, phase: str, began: float, last: dict) -> dict:
        now = {"cpu": self.cpu(), "posted": self.posted(phase), "lat": self._lat_count()}
        dt = now["cpu"]["t"] - last["cpu"]["t"]
        if dt < 0.5:
            return last
        lat = sorted(
            x
            for p, lo, hi in zip(self.posters, last["lat"], now["lat"], strict=True)
            for _, x in p.latencies[lo:hi]
        )
        since = last["cpu"]["t"]
        depths = [d for t, d in self.depths if t >= since] or [0]
        samples = [s for s in self.samples if s["t"] >= since] or [self.probe.sample()]
        c0, c1 = last["cpu"], now["cpu"]

        def share(k):
            return (c1[k] - c0[k]) / dt

        sweep = [s["sweep_age_s"] for s in samples if s["sweep_age_s"] is not None]
        line = {
            "phase": phase,
            "at_s": round(now["cpu"]["t"] - began, 1),
            "posted_per_s": (now["posted"] - last["posted"]) / dt,
            "post_p50_ms": statistics.median(lat) * 1000 if lat else None,
            "post_p95_ms": pct(lat, 0.95) * 1000 if lat else None,
            "queue_max": max(depths),
            "outbox_due_max": max(s["outbox_due"] for s in samples),
            "outbox_oldest_s_max": max(s["outbox_oldest_s"] for s in samples),
            "detection_lag_s_max": max(s["lag_s"] for s in samples),
            "pass_s": samples[-1]["pass_s"],
            "sweep_age_s_max": max(sweep) if sweep else None,
            "cpu": {k: share(k) for k in ("workers", "postgres", "worker", "client", "machine")},
            "load": os.getloadavg()[0],
        }
        self.lines.append(line)
        cpu = line["cpu"]
        ms = "-" if not lat else f"{line['post_p50_ms']:.0f}/{line['post_p95_ms']:.0f} ms"
        sweep_s = "-" if line["sweep_age_s_max"] is None else f"{line['sweep_age_s_max']:.0f} s"
        print(
            f"[{phase} {line['at_s']:5.0f} s] posted {line['posted_per_s']:,.0f}/s"
            f" (needed {self.needed:,.0f}) POST p50/p95 {ms} | queue max {line['queue_max']}"
            f" | outbox due {line['outbox_due_max']} (oldest {line['outbox_oldest_s_max']:.1f} s)"
            f" | detection lag max {line['detection_lag_s_max']:.1f} s (pass {line['pass_s']:.2f}"
            f" s) | sweep age max {sweep_s} | CPU % of a core: gunicorn {cpu['workers']:.0%},"
            f" postgres {cpu['postgres']:.0%}, worker {cpu['worker']:.0%}, clients"
            f" {cpu['client']:.0%}, machine {cpu['machine']:.0%} | load {line['load']:.1f}",
            flush=True,
        )
        return now


# --- the results -------------------------------------------------------------------


def fault_latencies(side: SideJobs, posters: list[Poster]) -> list[dict]:
    """Each side job's fault: its incident's opening against the POST's."""
    from incidents.models import Incident

    posted = {k: v for p in posters for k, v in p.faults.items()}
    out = []
    for key, _, _ in side.jobs:
        if key not in posted:
            continue
        sent, accepted = posted[key]
        incident = Incident.objects.filter(job__key=key, xid=79).order_by("opened_at").first()
        opened = incident.opened_at.timestamp() if incident else None
        out.append(
            {
                "job": key,
                "opened": opened is not None,
                "from_accepted_s": None if opened is None else opened - accepted,
                "from_sent_s": None if opened is None else opened - sent,
            }
        )
    return out


def straggler_latency(plan: Plan, posters: list[Poster], streak: int) -> dict:
    """The straggler's incident against when its evidence was complete."""
    from incidents.models import Incident

    done: dict[int, float] = {}
    for p in posters:
        for w, t in p.window_done.items():
            done[w] = max(done.get(w, 0.0), t)
    big = Incident.objects.filter(job__key=plan.key)
    found = big.filter(detector="straggler").order_by("opened_at").first()
    others = [f"{i.detector}: {i.summary}" for i in big.exclude(detector="straggler")]
    out = {"found": found is not None, "other_incidents": others}
    if found is None:
        return out
    node = plan.node_names[plan.slow_node]
    first = int(found.evidence[streak - 1].rsplit(":", 1)[1])  # "window:<attempt>:<first step>"
    window = (first - 1) // WINDOW_STEPS
    out.update(
        on_slow_node=node in found.summary,
        summary=found.summary,
        window=window,
        latency_s=found.opened_at.timestamp() - done[window] if window in done else None,
    )
    return out


def slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = zip(*points, strict=True)
    return statistics.linear_regression(xs, ys).slope


def stats_s(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "p50": statistics.median(v), "p95": pct(v, 0.95), "max": v[-1]}


# --- main ----------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=15.0, help="of posting at the real rate")
    ap.add_argument("--burst-s", type=float, default=60.0, help="of posting as fast as it can")
    ap.add_argument("--step-s", type=float, default=5.0)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--clients", type=int, default=8, help="posting threads (+1 for side jobs)")
    ap.add_argument("--workers", type=int, default=2, help="gunicorn sync workers")
    ap.add_argument("--fault-every-s", type=float, default=60.0, help="a side job's Xid this often")
    ap.add_argument("--slow-from-s", type=float, default=180.0, help="the slow node's start")
    ap.add_argument("--report-s", type=float, default=30.0)
    ap.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL") or "")
    ap.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    ap.add_argument("--var-dir", default="", help="the server's and worker's var/ (default: new)")
    ap.add_argument("--json", default="", help="write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep this run's rows")
    args = ap.parse_args()
    url = args.database_url or DEFAULT_DATABASE_URL
    run = uuid.uuid4().hex[:8]
    queue = f"bench-load-{run}"
    # Before Django: the server, the worker and this process share the broker's Redis.
    os.environ.update(REDIS_URL=args.redis_url, REBOUND_CELERY_QUEUE=queue)
    setup_django(url)
    from django.db import connection

    from common.models import OutboxEntry
    from console.services import token_issue
    from incidents.settings import DEFAULTS as DETECTOR_DEFAULTS
    from jobs.models import Cluster, TrainingJob
    from recovery.models import Action, ClusterRecoverySettings

    prefix = f"load-{run}-"
    plan = Plan(args, prefix)
    end_s = args.minutes * 60.0
    side = SideJobs(plan, prefix, end_s)
    needed = plan.needed()
    token_obj, token = token_issue(scope="ingest", cluster_name=f"bench-load-{run}")
    cluster = token_obj.cluster
    ClusterRecoverySettings.objects.create(cluster=cluster, driver="noop", driver_options={})
    var_dir = args.var_dir or tempfile.mkdtemp(prefix="rebound-bench-load-")
    os.makedirs(var_dir, exist_ok=True)
    connection.close()  # this process's own connection stays out of the CPU figures
    print(
        f"{plan.ranks:,} ranks on {plan.nodes:,} nodes x {plan.gpus}, a step every"
        f" {plan.step_s:g} s, {len(side.jobs)} side jobs with an Xid every"
        f" {plan.fault_every:g} s: {needed:,.1f} events/s for {args.minutes:g} min,"
        f" then {args.burst_s:g} s as fast as {args.clients} clients can;"
        f" load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker = start_worker(url, var_dir, beat=True)
    server = start_server(url, args.workers, port, var_dir)
    posters: list[Poster] = []
    figures: dict = {"args": vars(args), "needed_per_s": needed}
    probe = None
    failed: list[str] = []
    try:
        wait_ready(server, base)
        plan.t0 = time.time()
        launcher = Poster(base + "/api/v1/ingest", token, None, plan, 0, 0)
        launcher.post(plan.launch())
        job_id = TrainingJob.objects.get(key=plan.key).id
        connection.close()
        per = math.ceil(plan.nodes / args.clients)
        for c in range(args.clients):
            lo, hi = c * per, min(plan.nodes, (c + 1) * per)
            source = Slice(plan, lo, hi, lead=c == 0, seed=c)
            posters.append(
                Poster(base + "/api/v1/ingest", token, source, plan, end_s, c / args.clients)
            )
        posters.append(Poster(base + "/api/v1/ingest", token, side, plan, end_s, 0.5))
        meter = CpuMeter(url, server.pid)
        probe = Probe(url, args.redis_url, queue, job_id)
        monitor = Monitor(probe, posters, meter, worker, args.report_s, needed)
        for p in posters:
            p.start()
        load0 = os.getloadavg()[0]

        # 1. The real rate.
        cpu0 = monitor.cpu()
        monitor.watch(
            "real",
            lambda: all(p.real_done or p.error for p in posters) or any(p.error for p in posters),
        )
        stopped = time.monotonic()
        cpu1 = monitor.cpu()
        real_s = cpu1["t"] - cpu0["t"]
        failed += [p.error for p in posters if p.error]
        top = probe.sample()["top"]
        drain_s = drain(args.redis_url, queue, timeout=20) + (time.monotonic() - stopped)
        caught_s = probe.caught_up(top, stopped, timeout=20)
        real_lat = sorted(x for p in posters for ph, x in p.latencies if ph == "real")
        real_samples = [s for s in monitor.samples if s["phase"] == "real"]
        # A sweep stored before this run (an earlier run's, in a reused database) is not
        # this run's: judged from the first sweep of the run on.
        sweep_ages = [
            s["sweep_age_s"]
            for s in real_samples
            if s["sweep_age_s"] is not None
            and s["t"] - s["sweep_age_s"] >= cpu0["t"] - 2 * SWEEP_EVERY_S
        ]
        posted_real = monitor.posted("real")
        d = {k: cpu1[k] - cpu0[k] for k in ("workers", "postgres", "worker", "client", "machine")}
        figures["real"] = {
            "seconds": real_s,
            "events": posted_real,
            "per_s": posted_real / real_s,
            "post_ms": {k: v * 1000 for k, v in stats_s(real_lat).items() if k != "n"},
            "posts": len(real_lat),
            "late_s": stats_s([x for p in posters for x in p.late]),
            "queue_max": max((q for _, q in monitor.depths), default=0),
            "outbox_due_max": max((s["outbox_due"] for s in real_samples), default=0),
            "outbox_oldest_s_max": max((s["outbox_oldest_s"] for s in real_samples), default=0),
            "detection_lag_s_max": max((s["lag_s"] for s in real_samples), default=0),
            "pass_s": stats_s(sorted({s["pass_s"] for s in real_samples})),
            "sweep_age_s_max": max(sweep_ages, default=None),
            "cpu_core_s": d,
            "cpu_share": {k: v / real_s for k, v in d.items()},
            "load": [load0, os.getloadavg()[0]],
            "drain_s": drain_s,
            "caught_up_s": caught_s,
        }

        # 2. As fast as the clients can.
        if args.burst_s > 0 and not failed:
            until = time.monotonic() + args.burst_s
            b0 = monitor.cpu()
            n_depths = len(monitor.depths)
            lockstep = Lockstep(args.clients, until)
            for p in posters[:-1]:
                p.lockstep = lockstep
                p.burst.set()
            monitor.watch("burst", lambda: time.monotonic() >= until)
            for p in posters[:-1]:
                p.join(timeout=60)
            stopped = time.monotonic()
            b1 = monitor.cpu()
            burst_s = b1["t"] - b0["t"]
            failed += [p.error for p in posters if p.error]
            top = probe.sample()["top"]
            bdrain = drain(args.redis_url, queue, timeout=60) + (time.monotonic() - stopped)
            bcaught = probe.caught_up(top, stopped, timeout=60)
            samples = [s for s in monitor.samples if s["phase"] == "burst"]
            post_slope = slope([(s["t"], s["top"]) for s in samples])
            read_slope = slope([(s["t"], s["cursor"]) for s in samples])
            posted = monitor.posted("burst")
            rate = posted / burst_s
            kept_pace = read_slope >= KEEPS_PACE * post_slope
            sustained = rate if kept_pace else rate * read_slope / post_slope
            lat = sorted(x for p in posters for ph, x in p.latencies if ph == "burst")
            bd = {k: b1[k] - b0[k] for k in ("workers", "postgres", "worker", "client", "machine")}
            figures["burst"] = {
                "seconds": burst_s,
                "events": posted,
                "per_s": rate,
                "post_ms": {k: v * 1000 for k, v in stats_s(lat).items() if k != "n"},
                "ids_posted_per_s": post_slope,
                "ids_read_per_s": read_slope,
                "kept_pace": kept_pace,
                "sustained_per_s": sustained,
                "headroom": sustained / needed,
                "queue_max": max((q for _, q in monitor.depths[n_depths:]), default=0),
                "outbox_due_max": max((s["outbox_due"] for s in samples), default=0),
                "detection_lag_s_max": max((s["lag_s"] for s in samples), default=0),
                "cpu_share": {k: v / burst_s for k, v in bd.items()},
                "drain_s": bdrain,
                "caught_up_s": bcaught,
            }

        # 3. What was found.
        streak = int(DETECTOR_DEFAULTS["straggler.windows"])
        figures["faults"] = fault_latencies(side, posters)
        figures["straggler"] = straggler_latency(plan, posters, streak)
        # Its evidence complete: the streak's last window ended and every rank reported it.
        evidence_s = (plan.first_slow + streak + 1) * plan.window_s
        figures["straggler"]["expected"] = evidence_s + 10 < end_s
    finally:
        for p in posters:
            p.burst.set()  # those still waiting for it end (no lockstep)
        stop_server(server)
        stop_server(worker)
        if probe is not None:
            # What the worker held (its debounced tasks) went back to the queue: nobody
            # will consume it; the queue and its bindings go.
            forget_queues(probe.redis, queue)
            probe.db.close()
        if not args.var_dir:
            shutil.rmtree(var_dir, ignore_errors=True)
        if not args.keep:
            t = time.perf_counter()
            Action.objects.filter(cluster=cluster).delete()
            jobs = TrainingJob.objects.filter(cluster=cluster)
            # The work the worker still held when it stopped, asked for in the outbox
            # (rows keyed by job id): the next run's worker would find it past due.
            OutboxEntry.objects.filter(
                key__in=[str(pk) for pk in jobs.values_list("pk", flat=True)]
            ).delete()
            jobs.delete()
            Cluster.objects.filter(pk=cluster.pk).delete()  # nodes, incidents, the token
            print(f"deleted this run's rows in {time.perf_counter() - t:.1f} s")
        else:
            token_obj.delete()

    return report(figures, failed, needed)


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def report(figures: dict, failed: list[str], needed: float) -> int:
    r = figures["real"]
    cpu, late = r["cpu_share"], r["late_s"]
    judged_sweep = r["seconds"] >= 3 * SWEEP_EVERY_S  # beat's first sweeps come late
    print(
        f"\nreal rate: {r['events']:,} events in {r['seconds']:.0f} s = {r['per_s']:,.1f}/s"
        f" (needed {needed:,.1f}); {r['posts']:,} POSTs, p50 {r['post_ms'].get('p50', 0):.0f} ms,"
        f" p95 {r['post_ms'].get('p95', 0):.0f} ms, max {r['post_ms'].get('max', 0):.0f} ms;"
        f" each client's batch accepted p50 {late.get('p50', 0):.2f} s, p95"
        f" {late.get('p95', 0):.2f} s, max {late.get('max', 0):.2f} s after its second ended\n"
        f"  worker's queue at most {r['queue_max']}; outbox past due at most"
        f" {r['outbox_due_max']} (oldest {r['outbox_oldest_s_max']:.1f} s); detection lag at"
        f" most {r['detection_lag_s_max']:.1f} s (the big job's full pass p50"
        f" {r['pass_s'].get('p50', 0):.2f} s, max {r['pass_s'].get('max', 0):.2f} s);"
        f" sweep age at most"
        f" {secs(r['sweep_age_s_max'])}\n"
        f"  CPU, % of one core: gunicorn {cpu['workers']:.0%}, postgres {cpu['postgres']:.0%},"
        f" worker {cpu['worker']:.0%}, clients {cpu['client']:.0%}, machine {cpu['machine']:.0%}"
        f" (load {r['load'][0]:.1f} -> {r['load'][1]:.1f})\n"
        f"  queue empty {r['drain_s']:.1f} s after posting stopped; detection caught up"
        f" {secs(r['caught_up_s'])}"
    )
    faults = figures.get("faults", [])
    acc = stats_s([f["from_accepted_s"] for f in faults if f["opened"]])
    sent = stats_s([f["from_sent_s"] for f in faults if f["opened"]])
    opened = sum(f["opened"] for f in faults)
    figures["fault_latency_s"] = {"from_accepted": acc, "from_sent": sent}
    if acc["n"]:
        print(
            f"fault -> incident, {opened}/{len(faults)} side jobs: from the POST's 202"
            f" p50 {acc['p50']:.2f} s, p95 {acc['p95']:.2f} s, max {acc['max']:.2f} s;"
            f" from its send p50 {sent['p50']:.2f}, p95 {sent['p95']:.2f}, max {sent['max']:.2f} s"
        )
    st = figures.get("straggler", {})
    if st.get("found"):
        lat = st.get("latency_s")
        print(
            f"straggler: {st['summary']}; opened"
            f" {secs(lat)} after window {st['window']} was complete"
        )
    b = figures.get("burst")
    if b:
        print(
            f"burst: {b['events']:,} events in {b['seconds']:.0f} s = {b['per_s']:,.0f}/s"
            f" (POST p50 {b['post_ms'].get('p50', 0):.0f} ms); detection read"
            f" {b['ids_read_per_s']:,.0f} ids/s of the {b['ids_posted_per_s']:,.0f} posted"
            f" ({'kept pace' if b['kept_pace'] else 'fell behind'}); sustained"
            f" {b['sustained_per_s']:,.0f} events/s = headroom {b['headroom']:.1f}x"
            f"{' (at least: ingest-bound)' if b['kept_pace'] else ''}\n"
            f"  queue at most {b['queue_max']}, outbox past due at most {b['outbox_due_max']},"
            f" detection lag at most {b['detection_lag_s_max']:.1f} s; CPU: gunicorn"
            f" {b['cpu_share']['workers']:.0%}, postgres {b['cpu_share']['postgres']:.0%},"
            f" worker {b['cpu_share']['worker']:.0%}; queue empty {b['drain_s']:.1f} s after,"
            f" caught up {secs(b['caught_up_s'])}"
        )

    checks = [
        (f"every event accepted{'' if not failed else ': ' + '; '.join(failed)}", not failed),
        (
            f"each side job's Xid incident opened ({opened}/{len(faults)})",
            bool(faults) and opened == len(faults),
        ),
        (
            "the straggler found on the slow node"
            + ("" if st.get("expected") else " (not expected: the run ends before its evidence)"),
            bool(st.get("on_slow_node")) or not st.get("expected"),
        ),
        (
            f"no other incident on the big job {st.get('other_incidents') or ''}",
            "other_incidents" in st and not st["other_incidents"],
        ),
        (
            f"ingest kept the real rate: batches accepted p95 < {KEPT_RATE_S:.0f} s after"
            f" their second ended ({late.get('p95', 0):.2f} s)"
            + ("" if judged_sweep else " (not judged: a run this short, its warm-up most of it)"),
            not judged_sweep or (late.get("n", 0) > 0 and late["p95"] < KEPT_RATE_S),
        ),
        (
            "the sweep ran every period (its age at most 2 x 15 s)"
            + ("" if judged_sweep else " (not judged: a run this short)"),
            not judged_sweep
            or (r["sweep_age_s_max"] is not None and r["sweep_age_s_max"] <= 2 * SWEEP_EVERY_S),
        ),
    ]
    targets = [
        (
            f"queue empty <= {TARGET_DRAIN_S:.0f} s after posting stopped ({r['drain_s']:.1f} s)",
            r["drain_s"] <= TARGET_DRAIN_S,
        ),
        (
            f"fault -> incident p95 < {TARGET_FAULT_P95_S:.0f} s ({acc['p95']:.2f} s)"
            if acc["n"]
            else "fault -> incident: none measured",
            bool(acc["n"]) and acc["p95"] < TARGET_FAULT_P95_S,
        ),
    ]
    if b:
        # Passes come at least 5 s apart: a shorter burst cannot show detection's pace.
        judged = b["seconds"] >= MIN_BURST_S
        targets.append(
            (
                f"headroom > 1 ({b['headroom']:.1f}x)"
                + ("" if judged else f" (not judged: a burst under {MIN_BURST_S:.0f} s)"),
                b["headroom"] > 1 or not judged,
            )
        )
    ok = True
    for what, good in checks:
        print(f"check {verdict(good)}: {what}")
        ok &= good
    for what, good in targets:
        print(f"target {verdict(good)}: {what}")
        ok &= good
    figures["ok"] = ok
    path = figures["args"].get("json")
    if path:
        with open(path, "wb") as f:
            f.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
