"""The ledger of a 1,000,000-event job: how long `jobs.accounting.job_ledger` takes, cold.

    .venv/bin/python bench/accounting.py [--rebuild] [--repeat 5] [--database-url ...]

The job (`bench-accounting-1m`, cluster `bench`) is written straight into the
tables with COPY, as ingest would have left them: every event in `jobs_event`,
the steps in `jobs_steprecord`, the rank windows in `jobs_rankwindow`, and its
attempts, checkpoints and summary fields. About 40% steps, 55% rank windows
(16 ranks, a window of 12 steps), 3% heartbeats (4 nodes), a checkpoint every
100 steps, and five launches: a crash, a hang, a loss spike rolled back to an
older checkpoint, another crash, then a completed run. It is built once and
reused; --rebuild builds it again.

Each repetition opens a new database connection and computes the ledger from
the tables (no cached snapshot). Prints min and median against the 2 s target,
and checks that the categories sum to the elapsed time.
"""

import argparse
import io
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
from harness import DEFAULT_DATABASE_URL, pg_connect, setup_django, verdict

TARGET_S = 2.0
JOB_KEY = "bench-accounting-1m"
RANKS = 16
GPUS_PER_NODE = 4
WINDOW_STEPS = 12
HEARTBEAT_EVERY_STEPS = 60
CHECKPOINT_EVERY_STEPS = 100
CHECKPOINT_BLOCKING_S = 3.0
T0 = 1_790_000_000.0
STARTUP_S = 60.0  # attempt_started -> ready
RESTORE_S = 30.0  # checkpoint_load_started -> checkpoint_loaded
FAULT_NOTICED_S = (5.0, 300.0)  # last step -> fault event: a crash, a hang
ENDED_AFTER_S = 20.0  # the fault (or the last step) -> attempt_ended
DOWNTIME_S = 120.0  # attempt_ended -> the next attempt_started


def events_per_step(world_size: int) -> float:
    """Events per step executed: the step, its share of rank windows, heartbeats, checkpoints."""
    nodes = world_size // GPUS_PER_NODE
    return (
        1 + world_size / WINDOW_STEPS + nodes / HEARTBEAT_EVERY_STEPS + 2 / CHECKPOINT_EVERY_STEPS
    )


def plan(events: int) -> list[dict]:
    """The five launches: world size, where each resumes, where it stops and how."""
    launches = [
        {"ws": RANKS, "resume": 0, "last": 90_050, "fault": "gpu_xid", "reason": "failed"},
        {"ws": RANKS, "resume": 90_000, "last": 180_030, "fault": "hang", "reason": "failed"},
        # A loss spike: killed, and rolled back past the latest checkpoint (250,000).
        {
            "ws": RANKS,
            "resume": 180_000,
            "last": 250_075,
            "fault": "loss_spike",
            "reason": "killed",
        },
        # No spare node left after this crash: one launch on a node fewer.
        {
            "ws": RANKS - GPUS_PER_NODE,
            "resume": 240_000,
            "last": 330_020,
            "fault": "crash",
            "reason": "failed",
        },
        {"ws": RANKS, "resume": 330_000, "last": None, "fault": None, "reason": "completed"},
    ]
    done = sum((p["last"] - p["resume"]) * events_per_step(p["ws"]) for p in launches[:-1])
    launches[-1]["last"] = 330_000 + round((events - done) / events_per_step(RANKS))
    return launches


class Writer:
    """COPY text for the three stream tables, and the rows of the summary tables."""

    def __init__(self, job_id: int, node_ids: list[int], nodes: list[str]):
        self.job_id = job_id
        self.node_ids = node_ids
        self.nodes = nodes
        self.events = io.StringIO()
        self.steps = io.StringIO()
        self.windows = io.StringIO()
        self.n_events = 0
        self.kinds: dict[str, int] = {}
        self.seq = 0
        self.attempts: list[dict] = []
        self.checkpoints: list[dict] = []

    def event(self, kind, ts, attempt, data, node="", rank=None):
        self.seq += 1
        self.n_events += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.events.write(
            f"{self.job_id}\t{JOB_KEY}-{self.seq:09d}\t{kind}\t{ts!r}\t"
            f"{NULL if attempt is None else attempt}\t{node}\t{NULL if rank is None else rank}\t"
            f"{orjson.dumps(data).decode()}\t{RECEIVED_AT}\n"
        )


RECEIVED_AT = "2026-09-21 00:00:00+00"
NULL = "\\N"  # COPY's NULL


def build(w: Writer, launches: list[dict], rng: np.random.Generator) -> dict:
    """Write the job's stream; returns its summary fields."""
    ts = T0
    last_step = last_step_ts = None
    for n, p in enumerate(launches, start=1):
        ws = p["ws"]
        nodes = w.nodes[: ws // GPUS_PER_NODE]
        attempt = {"number": n, "world_size": ws, "started_at": ts, "nodes": nodes}
        w.event("attempt_started", ts, n, {"world_size": ws, "gpus_per_node": 4, "nodes": nodes})
        ts += STARTUP_S
        attempt["ready_at"] = ts
        w.event("ready", ts, n, {})
        if p["resume"]:
            w.event("checkpoint_load_started", ts, n, {"step": p["resume"]})
            ts += RESTORE_S
            w.event("checkpoint_loaded", ts, n, {"step": p["resume"]})
        steps = np.arange(p["resume"] + 1, p["last"] + 1)
        dur = rng.normal(1.0, 0.02, len(steps)).clip(0.5)
        if n == 1:  # a straggler on rank 13 slows every step a little until the crash
            dur += 0.05
        # A blocking save after every checkpoint step delays the next step's end.
        blocked = np.zeros(len(steps))
        blocked[1:] = np.where(steps[:-1] % CHECKPOINT_EVERY_STEPS == 0, CHECKPOINT_BLOCKING_S, 0)
        ends = ts + np.cumsum(dur + blocked)
        loss = 3.0 * np.exp(-steps / 400_000) + rng.normal(0, 0.01, len(steps))
        if p["fault"] == "loss_spike":
            loss[-60:] += np.linspace(0, 5, 60)
        grad = rng.uniform(0.5, 2.0, len(steps))
        window_start = None
        for i, (step, end) in enumerate(zip(steps.tolist(), ends.tolist(), strict=True)):
            data = {
                "step": step,
                "loss": round(float(loss[i]), 5),
                "grad_norm": round(float(grad[i]), 4),
                "tokens": 4_194_304,
                "step_time_s": round(float(dur[i]), 6),
            }
            w.event("step", end, n, data, rank=0)
            w.steps.write(
                f"{w.job_id}\t{n}\t{step}\t{end!r}\t{data['loss']}\t{data['grad_norm']}\t"
                f"4194304\t{data['step_time_s']}\n"
            )
            window_start = window_start or step
            if step % WINDOW_STEPS == 0:
                mean = float(dur[max(0, i - (step - window_start)) : i + 1].mean())
                for rank in range(ws):
                    slow = n == 1 and rank == 13
                    compute = mean * (0.8 if slow else 0.75)
                    comm = mean - compute - 0.01
                    node = rank // GPUS_PER_NODE
                    win = {
                        "first_step": window_start,
                        "last_step": step,
                        "compute_s": round(compute, 6),
                        "step_s": round(mean, 6),
                        "comm_wait_s": round(comm, 6),
                        "data_wait_s": 0.01,
                    }
                    w.event("rank_window", end, n, win, node=w.nodes[node], rank=rank)
                    w.windows.write(
                        f"{w.job_id}\t{n}\t{rank}\t{w.node_ids[node]}\t{window_start}\t{step}\t"
                        f"{end!r}\t{win['compute_s']}\t{win['step_s']}\t{win['comm_wait_s']}\t0.01\n"
                    )
                window_start = None
            if step % HEARTBEAT_EVERY_STEPS == 0:
                for node in nodes:
                    w.event("heartbeat", end, None, {}, node=node)
            if step % CHECKPOINT_EVERY_STEPS == 0:
                w.event("checkpoint_save_started", end, n, {"step": step})
                saved = end + CHECKPOINT_BLOCKING_S
                w.event(
                    "checkpoint_saved",
                    saved,
                    n,
                    {"step": step, "blocking_s": CHECKPOINT_BLOCKING_S, "tier": "remote"},
                )
                w.checkpoints.append({"attempt": n, "step": step, "started": end, "saved": saved})
        ts = float(ends[-1])
        last_step, last_step_ts = int(steps[-1]), ts
        if p["fault"]:
            ts += FAULT_NOTICED_S[p["fault"] == "hang"]  # a hang is noticed late
            w.event("fault", ts, n, {"type": p["fault"]}, node=nodes[-1])
        ts += ENDED_AFTER_S
        w.event("attempt_ended", ts, n, {"reason": p["reason"]})
        attempt.update(ended_at=ts, end_reason=p["reason"])
        w.attempts.append(attempt)
        ts += DOWNTIME_S if p["reason"] != "completed" else 0.0  # before the next launch
    w.event("job_finished", ts, len(launches), {})
    return {
        "first_event_ts": T0,
        "last_event_ts": ts,
        "last_step": last_step,
        "last_step_ts": last_step_ts,
        "finished_at": ts,
    }


def copy_tables(url: str, tables: list[tuple[str, str, io.StringIO]]) -> None:
    """COPY each (table, columns, text) in its own transaction, then ANALYZE it."""
    chunk = 8 << 20
    with pg_connect(url, autocommit=True) as conn:
        for table, columns, buf in tables:
            with (
                conn.transaction(),
                conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as cp,
            ):
                data = buf.getvalue()
                for i in range(0, len(data), chunk):
                    cp.write(data[i : i + chunk])
            conn.execute(f"ANALYZE {table}")


def build_job(url: str, events: int):
    """Delete any previous build, write a new one; returns the TrainingJob."""
    from datetime import UTC, datetime

    from jobs.models import Attempt, Checkpoint, Node, TrainingJob
    from jobs.services import cluster_get_or_create

    TrainingJob.objects.filter(key=JOB_KEY).delete()
    cluster = cluster_get_or_create(name="bench")
    names = [f"acct-node-{k:02d}" for k in range(RANKS // GPUS_PER_NODE)]
    Node.objects.bulk_create([Node(cluster=cluster, name=n) for n in names], ignore_conflicts=True)
    node_ids = dict(Node.objects.filter(cluster=cluster, name__in=names).values_list("name", "id"))
    job = TrainingJob.objects.create(key=JOB_KEY, cluster=cluster)

    t = time.perf_counter()
    w = Writer(job.id, [node_ids[n] for n in names], names)
    summary = build(w, plan(events), np.random.default_rng(7))
    print(f"generated {w.n_events:,} events in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    # Two connections at once (the events; the steps and windows): the server does the work.
    with ThreadPoolExecutor(2) as pool:
        done = [
            pool.submit(
                copy_tables,
                url,
                [
                    (
                        "jobs_event",
                        "job_id, client_id, kind, ts, attempt, node, rank, data, received_at",
                        w.events,
                    )
                ],
            ),
            pool.submit(
                copy_tables,
                url,
                [
                    (
                        "jobs_steprecord",
                        "job_id, attempt, step, ts, loss, grad_norm, tokens, step_time_s",
                        w.steps,
                    ),
                    (
                        "jobs_rankwindow",
                        "job_id, attempt, rank, node_id, first_step, last_step, ts,"
                        " compute_s, step_s, comm_wait_s, data_wait_s",
                        w.windows,
                    ),
                ],
            ),
        ]
        for f in done:
            f.result()
    print(
        "copied into jobs_event, jobs_steprecord, jobs_rankwindow"
        f" in {time.perf_counter() - t:.1f} s"
    )

    def at(ts):
        return datetime.fromtimestamp(ts, tz=UTC)

    for a in w.attempts:
        row = Attempt.objects.create(
            job=job,
            number=a["number"],
            world_size=a["world_size"],
            gpus_per_node=GPUS_PER_NODE,
            started_at=at(a["started_at"]),
            ready_at=at(a["ready_at"]),
            ended_at=at(a["ended_at"]),
            end_reason=a["end_reason"],
        )
        row.nodes.set([node_ids[n] for n in a["nodes"]])
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                job=job,
                attempt=c["attempt"],
                step=c["step"],
                save_started_at=at(c["started"]),
                saved_at=at(c["saved"]),
                blocking_s=CHECKPOINT_BLOCKING_S,
                tier="remote",
                durable=True,
            )
            for c in w.checkpoints
        ],
        batch_size=2000,
    )
    TrainingJob.objects.filter(pk=job.pk).update(
        status=TrainingJob.Status.COMPLETED,
        first_event_ts=summary["first_event_ts"],
        last_event_ts=summary["last_event_ts"],
        last_step=summary["last_step"],
        last_step_ts=summary["last_step_ts"],
        finished_at=at(summary["finished_at"]),
        revision=1,
        events_count=w.n_events,  # set last: a build cut short is never reused
    )
    mix = ", ".join(f"{k} {v / w.n_events:.1%}" for k, v in sorted(w.kinds.items()))
    print(f"mix: {mix}")
    return TrainingJob.objects.get(pk=job.pk)


def expected(launches: list[dict]) -> dict[str, float]:
    """The categories the build fixes exactly (productive and wasted depend on step times)."""
    out = dict.fromkeys(["startup", "checkpoint_restore", "checkpoint_save"], 0.0)
    out.update(stalled=0.0, downtime=0.0, other=0.0)
    for p in launches:
        out["startup"] += STARTUP_S
        out["checkpoint_restore"] += RESTORE_S if p["resume"] else 0.0
        saves = p["last"] // CHECKPOINT_EVERY_STEPS - p["resume"] // CHECKPOINT_EVERY_STEPS
        out["checkpoint_save"] += CHECKPOINT_BLOCKING_S * saves
        # After the last step: the fault being noticed, the end; less a save right then.
        tail = ENDED_AFTER_S + (FAULT_NOTICED_S[p["fault"] == "hang"] if p["fault"] else 0.0)
        if p["last"] % CHECKPOINT_EVERY_STEPS == 0:
            tail -= CHECKPOINT_BLOCKING_S
        if p["reason"] == "completed":
            out["other"] += tail
        else:
            out["stalled"] += tail
            out["downtime"] += DOWNTIME_S
    return out


def existing_job(events: int):
    from jobs.models import Event, TrainingJob

    job = TrainingJob.objects.filter(key=JOB_KEY).first()
    if job is None or abs(job.events_count - events) > events * 0.01:
        return None
    if Event.objects.filter(job=job).count() != job.events_count:
        return None
    return job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rebuild", action="store_true", help="build the job again")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    args = p.parse_args()

    setup_django(args.database_url)
    from django.db import connection

    from jobs import accounting
    from jobs.models import StepRecord, TrainingJob

    job = None if args.rebuild else existing_job(args.events)
    if job is None:
        job = build_job(args.database_url, args.events)
    else:
        print(f"reusing {JOB_KEY} (--rebuild to build it again)")
    n_steps = StepRecord.objects.filter(job=job).count()
    print(f"job {job.key}: {job.events_count:,} events, {n_steps:,} step executions")

    times, parts = [], []
    ledger = None
    for _ in range(args.repeat):
        connection.close()  # a new connection each time: nothing cached on it
        connection.ensure_connection()
        job = TrainingJob.objects.get(pk=job.pk)
        t0 = time.perf_counter()
        ledger = accounting.job_ledger(job)
        times.append(time.perf_counter() - t0)
        # Where the time goes, measured apart (the same work again).
        t1 = time.perf_counter()
        lifecycle = accounting.load_lifecycle(job.id)
        t2 = time.perf_counter()
        steps = accounting.load_steps(job.id)
        t3 = time.perf_counter()
        accounting.compute_ledger(job.key, lifecycle, steps, last_event_ts=job.last_event_ts)
        t4 = time.perf_counter()
        parts.append((t2 - t1, t3 - t2, t4 - t3))

    print(
        "job_ledger: "
        + ", ".join(f"{t:.3f}" for t in times)
        + f" s; min {min(times):.3f} s, median {statistics.median(times):.3f} s"
    )
    lc, ls, cl = (statistics.median(x) for x in zip(*parts, strict=True))
    print(f"  median parts: load_lifecycle {lc:.3f} s, load_steps {ls:.3f} s, compute {cl:.3f} s")

    cats = ledger.categories
    total = math.fsum(cats.values())
    print(
        f"elapsed {ledger.elapsed_s:,.3f} s; goodput {ledger.goodput:.4f},"
        f" by GPU {ledger.gpu_goodput:.4f}"
    )
    for name, secs in cats.items():
        print(f"  {name:<19} {secs:>14,.3f} s  {ledger.gpu_seconds[name]:>16,.3f} GPU-s")
    print(f"  slowdown_s {ledger.slowdown_s:,.3f}")
    diff = total - ledger.elapsed_s
    ok_sum = abs(diff) <= 1e-6 * max(1.0, ledger.elapsed_s)
    print(
        f"sum-check: categories sum to {total:,.6f} s, elapsed {ledger.elapsed_s:,.6f} s"
        f" (difference {diff:.2e}): {verdict(ok_sum)}"
    )
    launches = plan(args.events)
    launches[-1]["last"] = job.last_step  # as built
    want = expected(launches)
    misses = {k: (cats[k], v) for k, v in want.items() if abs(cats[k] - v) > 1e-6}
    print(
        "expected from the build: "
        + ", ".join(f"{k} {v:,.1f}" for k, v in want.items())
        + f": {verdict(not misses)}"
        + (f" (got {misses})" if misses else "")
    )
    ok_time = statistics.median(times) <= TARGET_S
    print(f"target median <= {TARGET_S} s: {verdict(ok_time)} ({statistics.median(times):.3f} s)")
    return 0 if ok_sum and not misses and ok_time else 2


if __name__ == "__main__":
    sys.exit(main())
