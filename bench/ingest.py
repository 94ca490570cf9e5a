"""Ingest throughput: events/s through the real API, against COPY writing the same rows.

    .venv/bin/python bench/ingest.py [--events-per-batch 1000] [--batches 400]
        [--clients 4] [--workers 2] [--database-url postgres://...]

1. Migrates `rebound_bench`, issues an ingest token for cluster `bench`.
2. Starts gunicorn (`console.wsgi`, sync workers) on a free port of 127.0.0.1.
3. Generates each job's stream as a training job reports it (steps from rank 0,
   a rank_window per rank every 10 steps, heartbeats per node, a checkpoint
   every 100 steps), cut into batches, and posts them from client threads,
   each for its own jobs; every answer must be 202 with all events accepted.
   The first batches of each client are a warm-up, outside the timing.
4. Writes the same event rows (fresh jobs) into `jobs_event` with COPY, 1,000
   rows a transaction on one connection: the best the database can do.
5. Prints both rates, their ratio and the targets, stops the server and
   deletes the rows of this run.

Everything it talks to is on 127.0.0.1.
"""

import argparse
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime

import orjson
import requests
from common import DEFAULT_DATABASE_URL, ROOT, pg_connect, setup_django, verdict

TARGET_EVENTS_PER_S = 20_000
TARGET_RATIO = 0.3
RANKS = 8
GPUS_PER_NODE = 4
WINDOW_STEPS = 10
HEARTBEAT_EVERY_STEPS = 20
CHECKPOINT_EVERY_STEPS = 100
EVENT_COLUMNS = "job_id, client_id, kind, ts, attempt, node, rank, data, received_at"


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

    def _event(self, kind: str, ts: float, data: dict, **where) -> dict:
        self.seq += 1
        ev = {
            "id": f"{self.key}-a{self.attempt}-{self.seq:09d}",
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


# --- the server ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str, workers: int, port: int) -> subprocess.Popen:
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="console.settings")
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
            session.get(base + "/admin/login/", timeout=2)
            return
        except requests.ConnectionError:
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


# --- posting ---------------------------------------------------------------------


class Client(threading.Thread):
    def __init__(self, url, token, warmup, timed, barrier):
        super().__init__(daemon=True)
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.warmup = warmup  # [(body, n_events)]
        self.timed = timed
        self.barrier = barrier
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
            for body, n in self.warmup:
                self._post(session, body, n)
        except Exception as exc:
            self.error = f"warm-up: {exc}"
            self.barrier.abort()
            return
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            for body, n in self.timed:
                t = time.perf_counter()
                self._post(session, body, n)
                self.latencies.append(time.perf_counter() - t)
        except Exception as exc:
            self.error = str(exc)


# --- the COPY baseline -----------------------------------------------------------


def copy_rows(url: str, rows: list[tuple], chunk: int) -> float:
    """Seconds to COPY `rows` into jobs_event, `chunk` rows per transaction."""
    with pg_connect(url) as conn:
        cur = conn.cursor()
        t0 = time.perf_counter()
        for i in range(0, len(rows), chunk):
            with conn.transaction(), cur.copy(f"COPY jobs_event ({EVENT_COLUMNS}) FROM STDIN") as cp:
                for row in rows[i : i + chunk]:
                    cp.write_row(row)
        return time.perf_counter() - t0


def event_rows(events: list[dict], job_ids: dict[str, int], now: datetime) -> list[tuple]:
    """The rows ingest stores for these events, with the jobs renamed through `job_ids`."""
    dumps = orjson.dumps
    return [
        (
            job_ids[e["job"]],
            e["id"],
            e["kind"],
            float(e["ts"]),
            e.get("attempt"),
            e.get("node") or "",
            e.get("rank"),
            dumps(e["data"]).decode(),
            now,
        )
        for e in events
    ]


# --- main ------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events-per-batch", type=int, default=1000)
    p.add_argument("--batches", type=int, default=400, help="timed batches, in all")
    p.add_argument("--clients", type=int, default=4, help="client threads")
    p.add_argument("--jobs-per-client", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per client")
    p.add_argument("--workers", type=int, default=2, help="gunicorn sync workers")
    p.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL)
    p.add_argument("--keep", action="store_true", help="keep this run's rows")
    args = p.parse_args()
    size = args.events_per_batch

    setup_django(args.database_url)
    from console.services import token_issue
    from jobs.models import TrainingJob

    _, token = token_issue(scope="ingest", cluster_name="bench", name="bench-ingest")
    run = uuid.uuid4().hex[:8]
    prefix = f"bench-{run}-"

    # Each client owns its jobs; its batches alternate between them.
    n_jobs = args.clients * args.jobs_per_client
    per_job = math.ceil(args.batches / n_jobs)
    t = time.perf_counter()
    plans = []
    timed_events: list[dict] = []
    for c in range(args.clients):
        streams = [
            JobStream(f"{prefix}{c * args.jobs_per_client + j:02d}", f"gpu-{c}{j}", seed=c * 100 + j)
            for j in range(args.jobs_per_client)
        ]
        per_client = [[] for _ in range(2)]  # warm-up, timed
        for phase, count in ((0, args.warmup), (1, per_job * len(streams))):
            for i in range(count):
                batch = streams[i % len(streams)].batch(size)
                if phase:
                    timed_events.extend(batch)
                per_client[phase].append((orjson.dumps({"events": batch}), len(batch)))
        plans.append(per_client)
    n_timed = sum(len(pc[1]) for pc in plans)
    print(
        f"generated {n_timed} timed batches of {size} events ({n_jobs} jobs, {RANKS} ranks each)"
        f" + {args.warmup * args.clients} warm-up batches in {time.perf_counter() - t:.1f} s"
    )
    kinds: dict[str, int] = {}
    for e in timed_events:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print("mix: " + ", ".join(f"{k} {v / len(timed_events):.1%}" for k, v in sorted(kinds.items())))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(args.database_url, args.workers, port)
    try:
        wait_ready(server, base)
        barrier = threading.Barrier(args.clients + 1)
        clients = [
            Client(base + "/api/v1/ingest", token, warm, timed, barrier) for warm, timed in plans
        ]
        for c in clients:
            c.start()
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        t0 = time.perf_counter()
        for c in clients:
            c.join(timeout=120)
        api_s = time.perf_counter() - t0
    finally:
        stop_server(server)
    errors = [c.error for c in clients if c.error] + [
        "a client did not finish" for c in clients if c.is_alive()
    ]
    if errors:
        print("FAILED: " + "; ".join(errors))
        return 1
    api_rate = n_timed * size / api_s
    lat = sorted(x for c in clients for x in c.latencies)
    print(
        f"API:  {n_timed * size} events in {api_s:.2f} s = {api_rate:,.0f} events/s"
        f"  ({args.clients} clients, {args.workers} workers;"
        f" latency p50 {statistics.median(lat) * 1000:.0f} ms,"
        f" p95 {lat[int(len(lat) * 0.95)] * 1000:.0f} ms)"
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

    if not args.keep:
        t = time.perf_counter()
        TrainingJob.objects.filter(key__startswith=prefix).delete()
        print(f"deleted this run's rows in {time.perf_counter() - t:.1f} s")
    return 0 if ok_rate and ok_ratio else 2


if __name__ == "__main__":
    sys.exit(main())
