"""A rank's death to the first step of the next launch: torchrun restarting the worker
group by itself, beside Rebound's recovery restarting the job through the local driver.

    .venv/bin/python bench/restart.py [--runs 5] [--keep] [--database-url postgres://...]
        [--redis-url redis://127.0.0.1:6379/0]

The same 2-rank job both ways: the demo job (agent.demo_train: the live demo's model
and batch, CPU, gloo, a checkpoint every 20 steps, resumed from the latest one), run
--runs times each, the two ways alternating so a drift in the machine's load falls on
both. Per run, once the job is past its first checkpoint, rank 1 is SIGKILLed and the
wall time noted; the figure is that kill -> the first step the next launch reports.

1. torchrun: `python -m agent.launch -- torchrun --standalone --nproc-per-node 2
   --max-restarts 1 -m agent.demo_train ...` (the launcher wrapper, as a user runs it;
   it gives torchrun TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). The ranks write their
   events to a file (no console: under torchrun the demo job's fixed launch number
   cannot be reported twice); torchrun sees the dead worker (--monitor-interval 0.1 s),
   stops the group, runs a new rendezvous round and starts two new workers, which
   restore the checkpoint and step. First step = the first `step` event stamped after
   the new launch's `attempt_started`.
2. Rebound: a LocalCluster of four 1-slot nodes (n1..n4, node agents) whose ranks post
   to a gunicorn console; one Celery worker (solo pool) on Redis queues of this run's
   own with the cluster's recovery driver `local` on that cluster. The launch runs on
   n1, n2; after the kill the supervisor reports the crash, the worker's detection
   opens the incident, the default crash policy proposes `restart_job` (automatic),
   the guardrails pass it and the local driver relaunches from the latest durable
   checkpoint (LocalCluster.relaunch). Nothing of the bench takes part: it only
   waits for launch 2's first `step` in the database. Its parts are printed: the
   incident open, the action's driver call, launch 2's start, ready, restore.

Columns, in seconds from the kill: total (the next launch's first step), started (its
`attempt_started` stamp: for torchrun the new workers' start, after its rendezvous; for
Rebound the relaunch's plan, before its processes start), ready (its processes
up: torch imported, the process group formed), restore (loading the checkpoint, after
ready); for Rebound also the incident open and the driver's start. Prints
every run, the medians and the ratio (2) / (1), against the target: (2) within 1.2x
of (1). Uses its own database (`rebound_bench`); deletes this run's jobs and
token at the end (unless --keep). Exit status 0 when the target passes, 2 when it
fails, 1 when a run broke.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from harness import DEFAULT_DATABASE_URL, ROOT, BenchError, setup_django, until, verdict
from ingest import forget_queues, free_port, start_server, start_worker, stop_server, wait_ready

sys.path.insert(0, str(ROOT))  # ahead of bench/ (bench/agent.py would shadow `agent`)

from agent.cluster import LocalCluster
from agent.cluster.procs import child_env
from agent.demo import TRAIN as DEMO

TARGET_RATIO = 1.2
CKPT_EVERY = 20
# The demo's model and batch; the recovery runs' cadence (bench/agent.py's RECOVERY_TRAIN).
TRAIN = {
    **{k: DEMO[k] for k in ("d_model", "layers", "seq_len", "global_batch", "micro_batch")},
    "steps": 100_000,
    "ckpt_every": CKPT_EVERY,
}


# --- 1. torchrun restarts by itself --------------------------------------------------------


def read_events(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def workers(pid: int) -> dict[int, int]:
    """torchrun's workers: rank -> pid, from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids = [int(p) for p in f.read().split()]
            for kid in kids:
                with open(f"/proc/{kid}/environ", "rb") as f:
                    env = dict(
                        item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item
                    )
                if b"RANK" in env:
                    out[int(env[b"RANK"])] = kid
    return out


def child_of(pid: int) -> int | None:
    """The one child of `pid` (the wrapper's: torchrun)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
    return None


def torchrun_run(work: str, job: str) -> dict:
    events = os.path.join(work, f"{job}.jsonl")
    cmd = [sys.executable, "-m", "agent.launch", "--state-dir", os.path.join(work, job), "--"]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.1"]
    cmd += ["-m", "agent.demo_train", "--job", job, "--events", events]
    cmd += ["--ckpt-dir", os.path.join(work, job + "-ckpt"), "--heartbeat-s", "0.5"]
    for key, value in TRAIN.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    env = child_env()
    for name in [k for k in env if k.startswith(("REBOUND_", "TORCHELASTIC_"))]:
        del env[name]
    log = open(os.path.join(work, job + ".log"), "wb")  # noqa: SIM115 (closed below)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def past_checkpoint():
            evs = read_events(events)
            saved = [e for e in evs if e["kind"] == "checkpoint_saved"]
            steps = [e["data"]["step"] for e in evs if e["kind"] == "step"]
            return saved and steps and max(steps) >= CKPT_EVERY + 5

        until(past_checkpoint, f"{job}: steps past its first checkpoint", 90)
        torchrun = until(lambda: child_of(p.pid), "torchrun", 10)
        victim = until(lambda: workers(torchrun).get(1), "rank 1's pid", 10)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()

        def restarted():
            evs = read_events(events)
            starts = [
                e["ts"] for e in evs if e["kind"] == "attempt_started" and e["ts"] > killed_at
            ]
            if not starts:
                return None
            later = [e for e in evs if e["ts"] > starts[0]]
            step = next((e for e in later if e["kind"] == "step"), None)
            if step is None:
                return None
            first = {k: next((e for e in later if e["kind"] == k), None) for k in KINDS}
            return {"start": starts[0], "step": step, **first}

        got = until(restarted, f"{job}: the restarted group's first step", 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)  # the wrapper forwards it to torchrun
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
    start = got.pop("start")
    return phases(killed_at, start, got, got["step"]["data"].get("step"))


KINDS = ("ready", "checkpoint_load_started", "checkpoint_loaded")


def phases(killed_at: float, started: float, ev: dict, first_step: int | None) -> dict:
    ts = {k: (v["ts"] if isinstance(v, dict) else v.ts) for k, v in ev.items() if v}
    return {
        "total": ts["step"] - killed_at,
        "started": started - killed_at,
        "ready": ts.get("ready", started) - killed_at,
        "restore": ts.get("checkpoint_loaded", 0) - ts.get("checkpoint_load_started", 0),
        "first_step": first_step,
    }


# --- 2. Rebound's recovery restarts it -----------------------------------------------------


def rebound_run(cluster: LocalCluster, job: str) -> dict:
    from incidents.models import Incident
    from jobs.models import Event, StepRecord, TrainingJob
    from recovery.models import Action

    cluster.launch(job, nodes=["n1", "n2"], heartbeat_s=0.5, **TRAIN)
    job_pk = until(
        lambda: TrainingJob.objects.filter(key=job).values_list("pk", flat=True).first(),
        f"{job} in the database",
        60,
    )

    def past_checkpoint():
        saved = Event.objects.filter(job_id=job_pk, kind="checkpoint_saved").exists()
        top = StepRecord.objects.filter(job_id=job_pk, attempt=1).order_by("-step").first()
        return saved and top is not None and top.step >= CKPT_EVERY + 5

    until(past_checkpoint, f"{job}: steps past its first checkpoint in the database", 90)
    cluster.kill_rank(job, 1)
    killed_at = time.time()

    def first(kind):
        return Event.objects.filter(job_id=job_pk, attempt=2, kind=kind).order_by("ts").first()

    step = until(lambda: first("step"), f"{job}: launch 2's first step (recovery's)", 120, 0.05)
    ev = {k: first(k) for k in KINDS}
    started = first("attempt_started")
    incident = Incident.objects.filter(job_id=job_pk).order_by("opened_at").first()
    action = Action.objects.filter(job_id=job_pk).order_by("created_at").first()
    cluster.stop(job)
    out = phases(killed_at, started.ts, {**ev, "step": step}, step.data.get("step"))
    out["incident"] = incident.opened_at.timestamp() - killed_at if incident else None
    out["action"] = (
        f"{action.kind} {action.state}" + (f" by {action.blocked_by}" if action.blocked_by else "")
        if action
        else "none"
    )
    started_at = action.started_at if action else None
    out["driver"] = started_at.timestamp() - killed_at if started_at else None
    return out


def delete_jobs(prefix: str) -> None:
    from django.db.models import ProtectedError

    from jobs.models import TrainingJob

    for _ in range(10):
        try:
            TrainingJob.objects.filter(key__startswith=prefix).delete()
            return
        except ProtectedError as exc:
            for obj in exc.protected_objects:
                with contextlib.suppress(Exception):
                    obj.delete()
    TrainingJob.objects.filter(key__startswith=prefix).delete()


def fmt(v) -> str:
    return "   -  " if v is None else f"{v:6.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each way (at least 5)")
    ap.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--keep", action="store_true", help="keep this run's jobs and files")
    args = ap.parse_args()

    run_id = uuid.uuid4().hex[:8]
    prefix = f"bench-restart-{run_id}-"
    queue = f"bench-restart-{run_id}"
    var_dir = tempfile.mkdtemp(prefix="rebound-bench-restart-")
    cluster_dir = os.path.join(var_dir, "cluster")
    os.environ.update(
        REDIS_URL=args.redis_url,
        REBOUND_CELERY_QUEUE=queue,
        REBOUND_CLUSTER_DIR=cluster_dir,
        REBOUND_RECOVERY_DRIVER="local",
    )
    setup_django(args.database_url)
    from django.db import connection

    from console.services import token_issue
    from jobs.models import Cluster
    from recovery.models import ClusterRecoverySettings

    cluster_name = f"bench-restart-{run_id}"
    token_obj, token = token_issue(scope="ingest", cluster_name=cluster_name, name=cluster_name)
    ClusterRecoverySettings.objects.update_or_create(
        cluster=Cluster.objects.get(name=cluster_name),
        defaults={"driver": "local", "driver_options": {"root": cluster_dir}},
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    connection.close()
    worker = start_worker(args.database_url, var_dir)
    server = start_server(args.database_url, 2, port, var_dir)
    cluster = None
    results: dict[str, list[dict]] = {"torchrun": [], "rebound": []}
    failed = None
    try:
        wait_ready(server, base)
        cluster = LocalCluster.create(
            cluster_dir,
            nodes=dict.fromkeys(("n1", "n2", "n3", "n4"), 1),
            sink={"url": base, "token": token},
            heartbeat_s=0.5,
        )
        cluster.start_node_agents()
        print(
            f"restart: {args.runs} runs each way of the demo job (2 ranks, a checkpoint every"
            f" {CKPT_EVERY} steps): SIGKILL rank 1 -> the next launch's first step",
            flush=True,
        )
        print("  way       run  total  started  ready  restore  (incident  driver)  action")
        for i in range(args.runs):
            order = ("torchrun", "rebound") if i % 2 == 0 else ("rebound", "torchrun")
            for way in order:
                job = f"{prefix}{way[:2]}-{i:02d}"
                r = torchrun_run(var_dir, job) if way == "torchrun" else rebound_run(cluster, job)
                results[way].append(r)
                extra = (
                    f"  ({fmt(r['incident'])}  {fmt(r['driver'])})  {r['action']}"
                    if way == "rebound"
                    else ""
                )
                print(
                    f"  {way:9} {i + 1:3}  {r['total']:5.2f}  {r['started']:7.2f}"
                    f"  {r['ready']:5.2f}  {r['restore']:7.3f}{extra}",
                    flush=True,
                )
    except BenchError as exc:
        failed = str(exc)
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        stop_server(server)
        stop_server(worker)
        with contextlib.suppress(Exception):
            import redis

            forget_queues(redis.Redis.from_url(args.redis_url), queue)
        if args.keep:
            print(f"kept: jobs {prefix}*, cluster state and logs in {var_dir}")
        else:
            shutil.rmtree(var_dir, ignore_errors=True)
            delete_jobs(prefix)
            from recovery.models import Action

            # The cluster's nodes are kept by the actions recovery proposed on them.
            Action.objects.filter(cluster__name=cluster_name).delete()
            with contextlib.suppress(Exception):
                Cluster.objects.filter(name=cluster_name).delete()
        token_obj.delete()

    if failed:
        print(f"FAILED: {failed}")
        return 1
    med = {w: statistics.median(r["total"] for r in rs) for w, rs in results.items()}
    ratio = med["rebound"] / med["torchrun"]
    ok = ratio <= TARGET_RATIO
    print()
    print("summary (seconds from the kill, medians)")
    for way, rs in results.items():
        parts = "  ".join(
            f"{k} {statistics.median(r[k] for r in rs):.2f}"
            for k in ("started", "ready", "restore")
        )
        print(f"  {way:9} first step {med[way]:6.2f} s   ({parts})")
    print(
        f"  rebound / torchrun = {ratio:.2f}  target <= {TARGET_RATIO}: {verdict(ok)}"
        " (rebound also accounts the crash and decides the restart)"
    )
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
