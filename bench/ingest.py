"""Ingest throughput: events/s through the real API, against COPY writing the same rows.

Long module: one benchmark read top to bottom (set-up, the clients, the
worker, the COPY baseline, the report), like its siblings in bench/.

    .venv/bin/python bench/ingest.py [--events-per-batch 1000] [--batches 400]
        [--clients 4] [--workers 2] [--max-seconds 45] [--database-url postgres://...]
        [--worker [--redis-url redis://...]]
    .venv/bin/python bench/ingest.py --mix large [--ranks 16384] [--gpus-per-node 8]
        [--split jobs|one] [--no-copy-job-update] [--clients 4] [--batches 400] ...

With --worker, a Celery worker on Redis runs what ingest hands off while the
clients post (detection passes, ledger refreshes), as in production; it
prints the worker's CPU per 1,000 events and how long its queue took to
empty once posting stopped.

1. Migrates `rebound_bench` (creating it if needed), issues an ingest token for
   cluster `bench`.
2. Starts gunicorn (`console.wsgi`, sync workers, bench/gunicorn_conf.py) on a
   free port of 127.0.0.1, with a var/ of its own in a temporary folder.
3. Generates each job's stream as a training job reports it (steps from rank 0,
   a rank_window per rank every 10 steps, heartbeats per node, a checkpoint
   every 100 steps), cut into batches, and posts them from client threads, each
   with a requests.Session for its own jobs (gunicorn's sync workers close the
   connection after each answer, so sessions reconnect); every answer must be
   202 with the whole batch accepted. Each client's first batches are a warm-up,
   outside the timing; posting stops at --max-seconds, so a run stays short.
4. Prints where the CPU went while timed: the gunicorn workers, their
   PostgreSQL backends, this client, and anything else on the machine (other
   people's work makes the rate lower; the per-event CPU figures stay put).
5. Writes the same event rows (for fresh jobs) into `jobs_event` with binary
   COPY, 1,000 rows a transaction on one connection: the best the database
   can do for the raw events alone.
6. Prints both rates, their ratio and the targets, stops the server, deletes
   the rows and the token of this run. Exit status 0 when both targets pass.

With --mix large, the stream is a large job's steady state (2,048 nodes x 8 GPUs by
default): a step every 5 s from rank 0, a rank_window per rank every 10 steps, a
heartbeat per node every 10 s: per step 1 step, ~1,638 windows and ~1,024
heartbeats. `--split jobs` (the default) gives each client a job of --ranks/--clients
ranks; `--split one` gives the clients a quarter each of one job's nodes: their
batches of stream events are stored side by side (jobs.services.ingest). The
windows and buckets go to the hourly partitions storage upkeep makes ahead of the
clock, here the streams'. Its COPY baseline writes what ingest stores for the
timed batches, one transaction per batch: the events but heartbeats in
`jobs_event`, `jobs_steprecord`, `jobs_rankwindow`, and one `jobs_heartbeatbucket` row
per job, node and 10 s bucket; and (unless --no-copy-job-update) one UPDATE of each
job's summary row per transaction. Its target is the ratio alone (>= 0.5); it also
prints the ratio of events per CPU-second, which other work on the machine moves much
less (the rates' ratio moves when the load changes between the two phases). The
nodes' rows are not in it (ingest moves their last heartbeat too). The tables both
write are vacuumed first, as autovacuum would have done (a server may run without it).

Everything it talks to is on 127.0.0.1.
"""

import argparse
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
import requests
from harness import DEFAULT_DATABASE_URL, ROOT, BenchError, pg_connect, setup_django, verdict
from psycopg.types.json import set_json_dumps

TARGET_EVENTS_PER_S = 20_000
TARGET_RATIO = 0.3
TARGET_RATIO_LARGE = 0.5  # --mix large: against COPY into every table ingest writes
RANKS = 8
GPUS_PER_NODE = 4
WINDOW_STEPS = 10
HEARTBEAT_EVERY_STEPS = 20
CHECKPOINT_EVERY_STEPS = 100
EVENT_COLUMNS = "job_id, client_id, kind, ts, attempt, node, rank, data, received_at"
EVENT_TYPES = [
    "int8",
    "varchar",
    "varchar",
    "float8",
    "int4",
    "varchar",
    "int4",
    "jsonb",
    "timestamptz",
]

# --mix large: the other tables ingest writes, as COPY writes them.
HEARTBEAT_BUCKET_S = 10  # jobs.models.HeartbeatBucket.BUCKET_S
STEP_COLUMNS = "job_id, attempt, step, ts, loss, grad_norm, tokens, step_time_s"
STEP_TYPES = ["int8", "int4", "int8", "float8", "float8", "float8", "int8", "float8"]
WINDOW_COLUMNS = (
    "job_id, attempt, rank, node_id, first_step, last_step, ts,"
    " compute_s, step_s, comm_wait_s, data_wait_s"
)
WINDOW_TYPES = ["int8", "int4", "int4", "int8", "int8", "int8"] + ["float8"] * 5
BUCKET_COLUMNS = "job_id, node, bucket, first_ts, last_ts"
BUCKET_TYPES = ["int8", "varchar", "int8", "float8", "float8"]
JOB_UPDATE = (
    "UPDATE jobs_trainingjob SET first_event_ts = LEAST(first_event_ts, %s),"
    " last_event_ts = GREATEST(last_event_ts, %s), events_count = events_count + %s,"
    " revision = revision + 1, last_received_at = %s WHERE id = %s"
)

# --- the events ----------------------------------------------------------------


class JobStream:
    """One training job's reports, in the order its reporter would send them."""

    def __init__(self, key: str, node_prefix: str, seed: int):
        self.key = key
        self.rng = random.Random(seed)
        self.nodes = [f"{node_prefix}-{n:02d}" for n in range(RANKS // GPUS_PER_NODE)]
        self.attempt = 1
        self.seq = 0
        self.step = 0
        self.ts = 1_790_000_000.0 + self.rng.uniform(0, 3600)
        self.loss = 3.0
        self.pending: list[dict] = []
        self._started = False
        self.tag = ""  # in the ids: several streams of one job (LargeJobStream) differ

    def _event(self, kind: str, ts: float, data: dict, **where) -> dict:
        self.seq += 1
        ev = {
            "id": f"{self.key}-a{self.attempt}{self.tag}-{self.seq:09d}",
            "job": self.key,
            "kind": kind,
            "ts": round(ts, 6),
            "attempt": self.attempt,
            "data": data,
        }
        ev.update(where)
        return ev

    def _start(self) -> None:
        nodes = self.nodes
        self.pending.append(
            self._event(
                "attempt_started",
                self.ts,
                {"world_size": RANKS, "gpus_per_node": GPUS_PER_NODE, "nodes": nodes},
            )
        )
        self.ts += 30.0
        self.pending.append(self._event("ready", self.ts, {}))

    def _advance(self) -> None:
        rng = self.rng
        self.step += 1
        step_time = rng.gauss(1.0, 0.02)
        self.ts += step_time
        self.loss = max(0.5, self.loss * 0.9995 + rng.gauss(0, 0.005))
        self.pending.append(
            self._event(
                "step",
                self.ts,
                {
                    "step": self.step,
                    "loss": round(self.loss, 5),
                    "grad_norm": round(rng.uniform(0.5, 2.0), 4),
                    "tokens": 4_194_304,
                    "step_time_s": round(step_time, 6),
                },
                rank=0,
            )
        )
        if self.step % WINDOW_STEPS == 0:
            step_s = round(rng.gauss(1.0, 0.01), 6)
            for rank in range(RANKS):
                compute = round(step_s * rng.uniform(0.78, 0.82), 6)
                self.pending.append(
                    self._event(
                        "rank_window",
                        self.ts,
                        {
                            "first_step": self.step - WINDOW_STEPS + 1,
                            "last_step": self.step,
                            "compute_s": compute,
                            "step_s": step_s,
                            "comm_wait_s": round(step_s - compute - 0.01, 6),
                            "data_wait_s": 0.01,
                        },
                        node=self.nodes[rank // GPUS_PER_NODE],
                        rank=rank,
                    )
                )
        if self.step % HEARTBEAT_EVERY_STEPS == 0:
            for n, node in enumerate(self.nodes):
                hb = self._event("heartbeat", self.ts + 0.01 * n, {}, node=node)
                del hb["attempt"]  # heartbeats come from the node agent, not the launch
                self.pending.append(hb)
        if self.step % CHECKPOINT_EVERY_STEPS == 0:
            self.pending.append(
                self._event("checkpoint_save_started", self.ts, {"step": self.step})
            )
            self.ts += 2.0
            self.pending.append(
                self._event(
                    "checkpoint_saved",
                    self.ts,
                    {
                        "step": self.step,
                        "blocking_s": 2.0,
                        "bytes": 16_000_000_000,
                        "uri": f"s3://ckpt/{self.key}/step-{self.step:08d}",
                        "tier": "remote",
                    },
                )
            )

    def batch(self, size: int) -> list[dict]:
        if not self._started:
            self._started = True
            self._start()
        while len(self.pending) < size:
            self._advance()
        out, self.pending = self.pending[:size], self.pending[size:]
        return out


class LargeJobStream(JobStream):
    """A large job's steady stream, in the proportions of --mix large: rank 0 reports a
    step every STEP_S seconds, every rank a rank_window every WINDOW_STEPS steps (all
    ranks at the same step, as the reporter's windows end together), every node a
    heartbeat every HEARTBEAT_S seconds, the nodes' phases spread over that period.

    `nodes` and `ranks` may be a slice of the job (first node, count): the share of one
    client when several post one job's stream. Only the slice holding rank 0 reports
    the steps and the start; ids stay unique across slices."""

    STEP_S = 5.0
    HEARTBEAT_S = 10.0
    T0 = 1_790_000_000.0  # the streams start within the hour after

    def __init__(
        self,
        key: str,
        node_prefix: str,
        seed: int,
        *,
        world: int,
        gpus_per_node: int,
        first_node: int = 0,
        node_count: int | None = None,
    ):
        self.key = key
        self.rng = random.Random(seed)
        self.world = world
        self.gpus_per_node = gpus_per_node
        all_nodes = world // gpus_per_node
        self.node_names = [f"{node_prefix}-{n:05d}" for n in range(all_nodes)]
        count = all_nodes - first_node if node_count is None else node_count
        self.mine = range(first_node, first_node + count)  # the nodes this slice reports
        self.leader = first_node == 0
        self.attempt = 1
        self.seq = 0
        self.step = 0
        self.t0 = self.T0 + self.rng.uniform(0, 3600)
        self.ts = self.t0
        self.loss = 3.0
        self.pending: list[dict] = []
        self._started = False
        self.tag = f"-s{first_node}"

    def _start(self) -> None:
        if self.leader:
            data = {
                "world_size": self.world,
                "gpus_per_node": self.gpus_per_node,
                "nodes": self.node_names,
            }
            self.pending.append(self._event("attempt_started", self.ts, data))
            self.pending.append(self._event("ready", self.ts + 30.0, {}))
        self.ts += 30.0
        self.train_start = self.ts

    def _advance(self) -> None:
        rng = self.rng
        self.step += 1
        prev = self.ts
        step_time = self.STEP_S + rng.gauss(0, 0.01)
        self.ts += step_time
        self.loss = max(0.5, self.loss * 0.9995 + rng.gauss(0, 0.005))
        if self.leader:
            data = {
                "step": self.step,
                "loss": round(self.loss, 5),
                "grad_norm": round(rng.uniform(0.5, 2.0), 4),
                "tokens": 4_194_304 * self.world // 8,
                "step_time_s": round(step_time, 6),
            }
            self.pending.append(self._event("step", self.ts, data, rank=0))
        if self.step % WINDOW_STEPS == 0:
            step_s = round(rng.gauss(self.STEP_S, 0.01), 6)
            gpn = self.gpus_per_node
            for n in self.mine:
                node = self.node_names[n]
                for rank in range(n * gpn, (n + 1) * gpn):
                    compute = round(step_s * rng.uniform(0.78, 0.82), 6)
                    data = {
                        "first_step": self.step - WINDOW_STEPS + 1,
                        "last_step": self.step,
                        "compute_s": compute,
                        "step_s": step_s,
                        "comm_wait_s": round(step_s - compute - 0.01, 6),
                        "data_wait_s": 0.01,
                    }
                    self.pending.append(
                        self._event("rank_window", self.ts, data, node=node, rank=rank)
                    )
        # The heartbeats of (prev, ts]: node n beats at train_start + phase(n) + k * period.
        period, nodes = self.HEARTBEAT_S, len(self.node_names)
        beats = []
        for n in self.mine:
            phase = period * n / nodes
            k = math.floor((prev - self.train_start - phase) / period) + 1
            t = self.train_start + phase + k * period
            while t <= self.ts:
                beats.append((t, n))
                t += period
        for t, n in sorted(beats):
            hb = self._event("heartbeat", t, {}, node=self.node_names[n])
            del hb["attempt"]  # heartbeats come from the node agent, not the launch
            self.pending.append(hb)


# --- the server ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str, workers: int, port: int, var_dir: str) -> subprocess.Popen:
    # Its own var/ (Celery's filesystem broker, the file cache): the ledger refreshes it
    # queues go nowhere a real worker could pick them up, and vanish with the run.
    env = dict(
        os.environ,
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="console.settings",
        REBOUND_VAR_DIR=var_dir,
    )
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "console.wsgi:application",
        "--config",
        str(ROOT / "bench" / "gunicorn_conf.py"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env)


def wait_ready(server: subprocess.Popen, base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    session = requests.Session()
    session.trust_env = False
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"gunicorn exited with {server.returncode}")
        try:
            session.get(base + "/admin/login/", timeout=5)
            return
        except requests.RequestException:
            time.sleep(0.2)
    sys.exit("gunicorn did not answer within 30 s")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=5)


def start_worker(url: str, var_dir: str, *, beat: bool = False) -> subprocess.Popen:
    """One Celery worker process, as scripts/run starts it, on all of this run's queues
    (REBOUND_CELERY_QUEUE's, console.queues); with `beat`, the periodic work (the sweep,
    the outbox drain) runs in it too, as there."""
    env = dict(os.environ, DATABASE_URL=url, REBOUND_VAR_DIR=var_dir)
    cmd = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo"]
    cmd += ["--without-gossip", "--without-mingle", "--loglevel", "WARNING"]
    if beat:
        cmd += ["--beat", "--schedule", os.path.join(var_dir, "celerybeat-schedule")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env)


def worker_cpu(worker: subprocess.Popen | None) -> float:
    return process_cpu(worker.pid) if worker is not None else 0.0


def queued(r, prefix: str) -> int:
    """Messages waiting in the queues of `prefix` (REBOUND_CELERY_QUEUE), on Redis `r`."""
    from console.queues import queue_names

    return sum(r.llen(name) for name in queue_names(prefix))


def forget_queues(r, prefix: str) -> None:
    """Delete the queues of `prefix` and their bindings from Redis `r`: nobody will
    consume what a run's worker left in them."""
    from console.queues import queue_names

    for name in queue_names(prefix):
        r.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")


def drain(redis_url: str, queue: str, timeout: float = 120.0) -> float:
    """Seconds until the worker's queues are empty (what it had left to do)."""
    import redis

    r = redis.Redis.from_url(redis_url)
    t = time.perf_counter()
    while queued(r, queue) and time.perf_counter() - t < timeout:
        time.sleep(0.1)
    return time.perf_counter() - t


# --- posting ---------------------------------------------------------------------


class Client(threading.Thread):
    """Posts its warm-up batches, waits for the others, then its timed batches until the
    deadline; every answer must accept the whole batch."""

    def __init__(self, url, token, warmup, timed, ready, go):
        super().__init__(daemon=True)
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.warmup = warmup  # [(body, events)]
        self.timed = timed
        self.ready, self.go = ready, go
        self.deadline = math.inf
        self.posted = 0  # timed batches posted
        self.latencies: list[float] = []
        self.error: str | None = None

    def _post(self, session, body, n):
        r = session.post(self.url, data=body, headers=self.headers, timeout=60)
        if r.status_code != 202:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
        got = r.json()
        if got != {"accepted": n, "duplicates": 0}:
            raise RuntimeError(f"expected {n} accepted, got {got}")

    def run(self):
        session = requests.Session()
        session.trust_env = False  # no proxy: straight to 127.0.0.1
        try:
            for body, events in self.warmup:
                self._post(session, body, len(events))
        except Exception as exc:
            self.error = f"warm-up: {exc}"
            self.ready.abort()
            return
        try:
            self.ready.wait()
            self.go.wait()
        except threading.BrokenBarrierError:
            return
        try:
            for body, events in self.timed:
                if time.perf_counter() > self.deadline:
                    break
                t = time.perf_counter()
                self._post(session, body, len(events))
                self.latencies.append(time.perf_counter() - t)
                self.posted += 1
        except Exception as exc:
            self.error = str(exc)


# --- the COPY baseline -----------------------------------------------------------


def copy_rows(url: str, rows: list[tuple], chunk: int) -> float:
    """Seconds to COPY `rows` into jobs_event, `chunk` rows per transaction.

    Binary COPY with the column types given up front, JSON written by orjson:
    the fastest way psycopg has to put these rows in the table.
    """
    with pg_connect(url) as conn:
        set_json_dumps(orjson.dumps, context=conn)
        cur = conn.cursor()
        sql = f"COPY jobs_event ({EVENT_COLUMNS}) FROM STDIN (FORMAT BINARY)"
        t0 = time.perf_counter()
        for i in range(0, len(rows), chunk):
            with conn.transaction(), cur.copy(sql) as cp:
                cp.set_types(EVENT_TYPES)
                for row in rows[i : i + chunk]:
                    cp.write_row(row)
        return time.perf_counter() - t0


def event_rows(events: list[dict], job_ids: dict[str, int], now: datetime) -> list[tuple]:
    """The rows ingest stores for these events, with the jobs renamed through `job_ids`."""
    return [
        (
            job_ids[e["job"]],
            e["id"],
            e["kind"],
            float(e["ts"]),
            e.get("attempt"),
            e.get("node") or "",
            e.get("rank"),
            e["data"],
            now,
        )
        for e in events
    ]


def copy_all_tables(
    url: str,
    batches: list[list[dict]],
    job_ids: dict[str, int],
    node_ids: dict[str, int],
    now: datetime,
    *,
    job_update: bool,
) -> tuple[float, float]:
    """Seconds to COPY what ingest stores for `batches`, one transaction per batch:
    jobs_event (all but heartbeats), jobs_steprecord, jobs_rankwindow and
    jobs_heartbeatbucket rows (one per job, node and bucket, in the batch of the bucket's
    first heartbeat), binary, on one connection; with `job_update`, each transaction also
    moves its jobs' summary row on (one UPDATE per job), as ingest does. Also the CPU
    seconds it took: this process's and its PostgreSQL backend's."""
    size = HEARTBEAT_BUCKET_S
    buckets: dict[tuple, list] = {}  # (job, node, bucket) -> [first_ts, last_ts, batch]
    for i, batch in enumerate(batches):
        for e in batch:
            if e["kind"] == "heartbeat":
                key = (job_ids[e["job"]], e["node"], int(e["ts"] // size))
                span = buckets.setdefault(key, [e["ts"], e["ts"], i])
                span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"])
    bucket_rows: list[list[tuple]] = [[] for _ in batches]
    for (job, node, bucket), (lo, hi, i) in buckets.items():
        bucket_rows[i].append((job, node, bucket, lo, hi))
    tables = []  # (batch's events, rows) per table, prepared before the clock starts
    for i, batch in enumerate(batches):
        stored = [e for e in batch if e["kind"] != "heartbeat"]
        steps = [
            (
                job_ids[e["job"]],
                e["attempt"],
                e["data"]["step"],
                float(e["ts"]),
                e["data"].get("loss"),
                e["data"].get("grad_norm"),
                e["data"].get("tokens"),
                e["data"].get("step_time_s"),
            )
            for e in stored
            if e["kind"] == "step"
        ]
        windows = [
            (
                job_ids[e["job"]],
                e["attempt"],
                e["rank"],
                node_ids[e["node"]],
                e["data"]["first_step"],
                e["data"]["last_step"],
                float(e["ts"]),
                e["data"]["compute_s"],
                e["data"]["step_s"],
                e["data"].get("comm_wait_s"),
                e["data"].get("data_wait_s"),
            )
            for e in stored
            if e["kind"] == "rank_window"
        ]
        summary = {}
        for e in stored:
            s = summary.setdefault(job_ids[e["job"]], [e["ts"], e["ts"], 0])
            s[0], s[1], s[2] = min(s[0], e["ts"]), max(s[1], e["ts"]), s[2] + 1
        for e in batch:
            if e["kind"] == "heartbeat":
                s = summary.setdefault(job_ids[e["job"]], [e["ts"], e["ts"], 0])
                s[0], s[1] = min(s[0], e["ts"]), max(s[1], e["ts"])
        tables.append((event_rows(stored, job_ids, now), steps, windows, bucket_rows[i], summary))
    copies = [
        (f"COPY jobs_event ({EVENT_COLUMNS})", EVENT_TYPES),
        (f"COPY jobs_steprecord ({STEP_COLUMNS})", STEP_TYPES),
        (f"COPY jobs_rankwindow ({WINDOW_COLUMNS})", WINDOW_TYPES),
        (f"COPY jobs_heartbeatbucket ({BUCKET_COLUMNS})", BUCKET_TYPES),
    ]
    with pg_connect(url) as conn:
        set_json_dumps(orjson.dumps, context=conn)
        cur = conn.cursor()
        backend = conn.info.backend_pid
        cpu0 = time.process_time() + process_cpu(backend)
        t0 = time.perf_counter()
        for *per_table, summary in tables:
            with conn.transaction():
                for (sql, types), rows in zip(copies, per_table, strict=True):
                    if not rows:
                        continue
                    with cur.copy(sql + " FROM STDIN (FORMAT BINARY)") as cp:
                        cp.set_types(types)
                        for row in rows:
                            cp.write_row(row)
                if job_update:
                    for job, (lo, hi, n) in sorted(summary.items()):
                        cur.execute(JOB_UPDATE, [lo, hi, n, now, job])
        seconds = time.perf_counter() - t0
        return seconds, time.process_time() + process_cpu(backend) - cpu0


# --- where the CPU went ------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone or not ours to read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, f.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


class CpuMeter:
    """CPU used by the server's workers, their PostgreSQL backends, this process, the rest."""

    def __init__(self, url: str, server_pid: int):
        self.workers = children(server_pid)
        with pg_connect(url, autocommit=True) as conn:
            self.backends = [
                pid
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                )
            ]

    def sample(self) -> dict[str, float]:
        return {
            "workers": sum(map(process_cpu, self.workers)),
            "postgres": sum(map(process_cpu, self.backends)),
            "client": time.process_time(),
            "machine": machine_busy(),
        }

    @staticmethod
    def report(a: dict, b: dict, seconds: float, n_events: int) -> str:
        d = {k: b[k] - a[k] for k in a}
        rest = max(0.0, d["machine"] - d["workers"] - d["postgres"] - d["client"])
        cores = os.cpu_count() or 1
        per = 1000 * 1000 / n_events  # ms per 1,000 events
        return (
            f"CPU while timed ({cores} cores x {seconds:.1f} s = {cores * seconds:.1f} core-s):"
            f" gunicorn workers {d['workers']:.1f} s, their postgres {d['postgres']:.1f} s,"
            f" this client {d['client']:.1f} s, anything else on the machine {rest:.1f} s\n"
            f"      per 1,000 events: workers {d['workers'] * per:.0f} ms,"
            f" postgres {d['postgres'] * per:.0f} ms, client {d['client'] * per:.0f} ms"
        )


# --- main ------------------------------------------------------------------------


@dataclass
class Posted:
    """The timed run: its clients (with what they posted), how long it took, the CPU
    samples around it, and the worker's CPU and queue drain when there was one."""

    clients: list
    seconds: float
    cpu0: dict
    cpu1: dict
    worker_s: float = 0.0
    drain_s: float = 0.0

    def batches(self) -> list[list[dict]]:
        return [batch for c in self.clients for _, batch in c.timed[: c.posted]]


def post_timed(args, plans, token: str, var_dir: str, worker=None, ready_s=90) -> Posted:
    """Serve the API (gunicorn on a free port) and post each plan (its warm-up, then its
    timed batches) from a client thread of its own; BenchError when the run failed. The
    server, and `worker` if given, are stopped after."""
    base = f"http://127.0.0.1:{free_port()}"
    server = start_server(args.database_url, args.workers, int(base.rsplit(":", 1)[1]), var_dir)
    clients: list[Client] = []
    try:
        wait_ready(server, base)
        ready = threading.Barrier(args.clients + 1)
        go = threading.Barrier(args.clients + 1)
        clients = [
            Client(base + "/api/v1/ingest", token, warm, timed, ready, go) for warm, timed in plans
        ]
        for c in clients:
            c.start()
        ready.wait(timeout=ready_s)  # every client has had its warm-up answered
        meter = CpuMeter(args.database_url, server.pid)
        cpu0 = meter.sample()
        t0 = time.perf_counter()
        for c in clients:
            c.deadline = t0 + args.max_seconds
        go.wait(timeout=10)
        worker_cpu0 = worker_cpu(worker)
        for c in clients:
            c.join(timeout=args.max_seconds + 60)
        posted = Posted(clients, time.perf_counter() - t0, cpu0, meter.sample())
        posted.worker_s = worker_cpu(worker) - worker_cpu0
        if worker is not None:
            posted.drain_s = drain(args.redis_url, os.environ["REBOUND_CELERY_QUEUE"])
    except threading.BrokenBarrierError:
        raise BenchError("the clients' warm-up did not finish in time") from None
    finally:
        stop_server(server)
        if worker is not None:
            stop_server(worker)
    errors = [c.error for c in clients if c.error] + [
        "a client did not finish" for c in clients if c.is_alive()
    ]
    if errors:
        raise BenchError("; ".join(errors))
    return posted


def print_api(args, posted: Posted) -> tuple[int, float]:
    """Print the mix, the API's rate and latency, and where the CPU went; the number of
    events timed and their rate."""
    events = [e for batch in posted.batches() for e in batch]
    n_events = len(events)
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print("mix: " + ", ".join(f"{k} {v / n_events:.2%}" for k, v in sorted(kinds.items())))
    api_rate = n_events / posted.seconds
    lat = sorted(x for c in posted.clients for x in c.latencies)
    print(
        f"API:  {n_events} events in {posted.seconds:.2f} s = {api_rate:,.0f} events/s"
        f"  ({args.clients} clients, {args.workers} workers;"
        f" latency p50 {statistics.median(lat) * 1000:.0f} ms,"
        f" p95 {lat[int(len(lat) * 0.95)] * 1000:.0f} ms)"
    )
    print("      " + CpuMeter.report(posted.cpu0, posted.cpu1, posted.seconds, n_events))
    return n_events, api_rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events-per-batch", type=int, default=1000)
    p.add_argument("--batches", type=int, default=400, help="timed batches, in all")
    p.add_argument("--clients", type=int, default=4, help="client threads")
    p.add_argument("--jobs-per-client", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per client")
    p.add_argument("--workers", type=int, default=2, help="gunicorn sync workers")
    p.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    p.add_argument(
        "--max-seconds", type=float, default=45, help="stop posting timed batches after this"
    )
    p.add_argument("--keep", action="store_true", help="keep this run's rows")
    p.add_argument(
        "--worker",
        action="store_true",
        help="run a Celery worker (Redis) doing the ingest's detection and ledger work meanwhile",
    )
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument(
        "--mix",
        choices=["small", "large"],
        default="small",
        help="small: 8-rank jobs, COPY into jobs_event alone (the default); large: one"
        " large job's steady stream (--ranks, --gpus-per-node), COPY into every table"
        " ingest writes",
    )
    p.add_argument("--ranks", type=int, default=16384, help="--mix large: the world size")
    p.add_argument("--gpus-per-node", type=int, default=8, help="--mix large")
    p.add_argument(
        "--split",
        choices=["one", "jobs"],
        default="jobs",
        help="--mix large: one job whose nodes are shared out among the clients (their"
        " batches queue on the job's row lock), or one job per client of --ranks/--clients"
        " ranks each",
    )
    p.add_argument(
        "--copy-job-update",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--mix large: the COPY baseline moves its jobs' summary row once per"
        " transaction, as ingest does",
    )
    args = p.parse_args()
    size = args.events_per_batch
    if args.mix == "large":
        return main_large(args)

    setup_django(args.database_url)
    from django.db import connection

    from console.services import token_issue
    from jobs.models import TrainingJob

    api_token, token = token_issue(scope="ingest", cluster_name="bench", name="bench-ingest")
    run = uuid.uuid4().hex[:8]
    prefix = f"bench-{run}-"

    # Each client owns its jobs; its batches alternate between them.
    n_jobs = args.clients * args.jobs_per_client
    per_job = math.ceil(args.batches / n_jobs)
    t = time.perf_counter()
    plans = []
    for c in range(args.clients):
        streams = [
            JobStream(
                f"{prefix}{c * args.jobs_per_client + j:02d}", f"gpu-{c}{j}", seed=100 * c + j
            )
            for j in range(args.jobs_per_client)
        ]
        per_client = [[] for _ in range(2)]  # warm-up, timed
        for phase, count in ((0, args.warmup), (1, per_job * len(streams))):
            for i in range(count):
                batch = streams[i % len(streams)].batch(size)
                per_client[phase].append((orjson.dumps({"events": batch}), batch))
        plans.append(per_client)
    print(
        f"generated {sum(len(pc[1]) for pc in plans)} timed batches of {size} events"
        f" ({n_jobs} jobs, {RANKS} ranks each) + {args.warmup * args.clients} warm-up batches"
        f" in {time.perf_counter() - t:.1f} s"
    )

    var_dir = tempfile.mkdtemp(prefix="rebound-bench-")
    connection.close()  # this process's own connection stays out of the CPU figures
    worker = None
    if args.worker:  # the server queues its tasks on Redis, to queues of this run's own
        os.environ.update(REDIS_URL=args.redis_url, REBOUND_CELERY_QUEUE=f"bench-ingest-{run}")
        worker = start_worker(args.database_url, var_dir)
    try:
        try:
            posted = post_timed(args, plans, token, var_dir, worker)
        except BenchError as exc:
            print(f"FAILED: {exc}")
            return 1
        finally:
            shutil.rmtree(var_dir, ignore_errors=True)
        timed_events = [e for batch in posted.batches() for e in batch]
        n_events, api_rate = print_api(args, posted)
        if worker is not None:
            worker_s = posted.worker_s
            print(
                f"      Celery worker (detection passes, ledger refreshes): {worker_s:.1f} s CPU"
                f" while timed, {worker_s * 1e6 / n_events:.0f} ms per 1,000 events;"
                f" its queue was empty {posted.drain_s:.1f} s after posting stopped"
            )

        # The same rows, for fresh jobs so nothing conflicts with what the API stored.
        bench_cluster = TrainingJob.objects.get(key=f"{prefix}00").cluster
        copy_jobs = TrainingJob.objects.bulk_create(
            [TrainingJob(key=f"{prefix}copy-{i:02d}", cluster=bench_cluster) for i in range(n_jobs)]
        )
        job_ids = {f"{prefix}{i:02d}": j.id for i, j in enumerate(copy_jobs)}
        rows = event_rows(timed_events, job_ids, datetime.now(tz=UTC))
        copy_s = copy_rows(args.database_url, rows, size)
        copy_rate = len(rows) / copy_s
        print(f"COPY: {len(rows)} rows in {copy_s:.2f} s = {copy_rate:,.0f} rows/s (1 connection)")

        ratio = api_rate / copy_rate
        ok_rate = api_rate >= TARGET_EVENTS_PER_S
        ok_ratio = ratio >= TARGET_RATIO
        print(f"ratio API/COPY: {ratio:.2f}")
        print(f"target >= {TARGET_EVENTS_PER_S:,} events/s: {verdict(ok_rate)} ({api_rate:,.0f})")
        print(f"target ratio >= {TARGET_RATIO}: {verdict(ok_ratio)} ({ratio:.2f})")
        return 0 if ok_rate and ok_ratio else 2
    finally:
        api_token.delete()
        if not args.keep:
            t = time.perf_counter()
            TrainingJob.objects.filter(key__startswith=prefix).delete()
            print(f"deleted this run's rows in {time.perf_counter() - t:.1f} s")


def large_plans(args, prefix: str, node_prefix: str) -> tuple[list, int, str]:
    """Each client's warm-up and timed batches of --mix large; the number of jobs and
    what they are, in words."""
    clients, size = args.clients, args.events_per_batch
    gpn = args.gpus_per_node
    if args.split == "one":
        nodes = args.ranks // gpn
        share = math.ceil(nodes / clients)
        streams = [
            LargeJobStream(
                f"{prefix}00",
                node_prefix,
                seed=1,
                world=args.ranks,
                gpus_per_node=gpn,
                first_node=c * share,
                node_count=min(share, nodes - c * share),
            )
            for c in range(clients)
        ]
        what = f"1 job of {args.ranks} ranks, {share} of its {nodes} nodes per client"
        n_jobs = 1
    else:
        world = args.ranks // clients
        streams = [
            LargeJobStream(
                f"{prefix}{c:02d}", f"{node_prefix}{c}", seed=c, world=world, gpus_per_node=gpn
            )
            for c in range(clients)
        ]
        what = f"{clients} jobs of {world} ranks, one per client"
        n_jobs = clients
    per_client = math.ceil(args.batches / clients)
    plans = []
    for stream in streams:
        phases = []
        for count in (args.warmup, per_client):
            batches = [stream.batch(size) for _ in range(count)]
            phases.append([(orjson.dumps({"events": b}), b) for b in batches])
        plans.append(phases)
    return plans, n_jobs, what


INGEST_TABLES = [
    "jobs_trainingjob",
    "jobs_node",
    "jobs_attempt",
    "jobs_event",
    "jobs_steprecord",
    "jobs_rankwindow",
    "jobs_heartbeatbucket",
    "common_outboxentry",
]


def vacuum(url: str) -> None:
    """What autovacuum would have done (a server may run with it off): earlier runs'
    deleted rows and rewritten node rows out of the way of both contestants."""
    with pg_connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM (ANALYZE) {', '.join(INGEST_TABLES)}")


def main_large(args) -> int:
    """--mix large: the API against COPY into every table ingest writes, in one run."""
    size = args.events_per_batch
    setup_django(args.database_url)
    from django.db import connection

    from console.services import token_issue
    from jobs.models import Node, TrainingJob

    api_token, token = token_issue(scope="ingest", cluster_name="bench", name="bench-ingest")
    run = uuid.uuid4().hex[:8]
    prefix = f"bench-{run}-"
    node_prefix = f"lg{run}"  # this run's nodes: new, as a new job's are, and deleted after

    t = time.perf_counter()
    vacuum(args.database_url)
    plans, n_jobs, what = large_plans(args, prefix, node_prefix)
    # The hourly partitions storage upkeep keeps ahead of the clock, here the streams'
    # (a day on), as a console that runs upkeep has them: rows go to their hour.
    from jobs.partitions import BEATS, WINDOWS, hours_ensure

    for table in (WINDOWS, BEATS):
        hours_ensure(table, LargeJobStream.T0, 24)
    print(
        f"generated {sum(len(pc[1]) for pc in plans)} timed batches of {size} events ({what})"
        f" + {args.warmup * args.clients} warm-up batches in {time.perf_counter() - t:.1f} s"
    )

    var_dir = tempfile.mkdtemp(prefix="rebound-bench-")
    connection.close()
    try:
        try:
            posted = post_timed(args, plans, token, var_dir, ready_s=120)
        except BenchError as exc:
            print(f"FAILED: {exc}")
            return 1
        finally:
            shutil.rmtree(var_dir, ignore_errors=True)
        timed = posted.batches()
        n_events, api_rate = print_api(args, posted)
        cpu0, cpu1 = posted.cpu0, posted.cpu1

        # The same rows for fresh jobs (nothing conflicts with what the API stored), on the
        # nodes the API created: the batches the API was timed on, one transaction each.
        bench_cluster = TrainingJob.objects.get(key=f"{prefix}00").cluster
        copy_jobs = TrainingJob.objects.bulk_create(
            [TrainingJob(key=f"{prefix}copy-{i:02d}", cluster=bench_cluster) for i in range(n_jobs)]
        )
        job_ids = {f"{prefix}{i:02d}": j.id for i, j in enumerate(copy_jobs)}
        node_ids = dict(
            Node.objects.filter(cluster=bench_cluster, name__startswith=node_prefix).values_list(
                "name", "id"
            )
        )
        connection.close()
        copy_s, copy_cpu = copy_all_tables(
            args.database_url,
            timed,
            job_ids,
            node_ids,
            datetime.now(tz=UTC),
            job_update=args.copy_job_update,
        )
        copy_rate = n_events / copy_s
        print(
            f"COPY: {n_events} events in {copy_s:.2f} s = {copy_rate:,.0f} events/s"
            f" (jobs_event, jobs_steprecord, jobs_rankwindow, jobs_heartbeatbucket, binary;"
            f" {len(timed)} transactions on 1 connection;"
            f" job summary row {'updated' if args.copy_job_update else 'not updated'}"
            " once per transaction)"
        )
        # Other work on the cores moves the rates, not what an event costs: the ratio of
        # events per CPU-second (the server's workers and their backends, against COPY's
        # client and backend) says the same without it.
        api_cpu = sum(cpu1[k] - cpu0[k] for k in ("workers", "postgres"))
        print(
            f"      COPY's CPU per 1,000 events: {copy_cpu * 1e6 / n_events:.0f} ms"
            f" (client and its postgres), the API's {api_cpu * 1e6 / n_events:.0f} ms"
            f" (workers and their postgres): ratio of events per CPU-second"
            f" {copy_cpu / api_cpu:.2f}"
        )
        ratio = api_rate / copy_rate
        ok = ratio >= TARGET_RATIO_LARGE
        print(f"ratio API/COPY: {ratio:.2f}")
        print(f"target ratio >= {TARGET_RATIO_LARGE}: {verdict(ok)} ({ratio:.2f})")
        return 0 if ok else 2
    finally:
        api_token.delete()
        if not args.keep:
            t = time.perf_counter()
            TrainingJob.objects.filter(key__startswith=prefix).delete()
            Node.objects.filter(name__startswith=node_prefix).delete()
            print(f"deleted this run's rows in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
