"""Detection and accounting against a known truth: a simulated fleet through Rebound.

    .venv/bin/python bench/fleet.py [--nodes 16] [--days 1] [--rate 100] [--seed 0]
        [--tick 60] [--pass-every 300] [--json PATH] [--database-url postgres://...]

Simulates `--nodes` nodes x 8 GPUs running a few jobs for `--days` (bench/fleetsim/sim.py:
faults by the Llama 3 mix at `--rate` per 1,000 node-days, noise that must not open
incidents, recovery from checkpoints), replays the events through the real ingest and
detection on the simulated clock (bench/fleetsim/drive.py), and prints the scoreboard
(bench/fleetsim/score.py): per fault class recall, precision and time to detect, false
incidents per 1,000 node-days, per job goodput against the truth. Each run uses a
cluster and jobs of its own in the benchmark database (`rebound_bench`), deleted after.
"""

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from harness import DEFAULT_DATABASE_URL, setup_django

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=100.0, help="faults per 1,000 node-days")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tick", type=float, default=60.0, help="simulated seconds per ingest")
    ap.add_argument(
        "--pass-every", type=float, default=300.0, help="simulated seconds between full passes"
    )
    ap.add_argument("--json", help="write the scoreboard as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the run's jobs and incidents")
    ap.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    args = ap.parse_args()

    setup_django(args.database_url)
    from console.celery import app

    # The ingest's follow-up stays in the outbox: the driver runs the passes itself.
    app.conf.broker_url = "memory://"
    from fleetsim.drive import replay
    from fleetsim.score import incidents_seen, ledger_seen, reliability_seen, render, scoreboard
    from fleetsim.sim import FleetConfig, simulate

    from jobs.models import Cluster, TrainingJob

    cfg = FleetConfig(nodes=args.nodes, days=args.days, rate=args.rate, seed=args.seed)
    began = time.monotonic()
    fleet = simulate(cfg)
    run = uuid.uuid4().hex[:6]
    for e in fleet.events:  # the run's own jobs
        e["job"] = f"{e['job']}-{run}"
    for f in fleet.faults:
        f.job = f"{f.job}-{run}"
    for j in fleet.jobs:
        j.key = f"{j.key}-{run}"
    simulated = time.monotonic() - began
    cluster = f"bench-fleet-{run}"
    keys = [j.key for j in fleet.jobs]
    try:
        stats = replay(
            fleet.events, cluster_name=cluster, tick_s=args.tick, pass_every_s=args.pass_every
        )
        board = scoreboard(
            fleet, incidents_seen(keys), ledger_seen(keys), reliability_seen(cluster, cfg.days)
        )
    finally:
        if not args.keep:
            TrainingJob.objects.filter(key__in=keys).delete()
            Cluster.objects.filter(name=cluster).delete()
    board["run"] = {
        "simulate_s": simulated,
        "replay_s": stats.wall_s,
        "requests": stats.requests,
        "quick_passes": stats.quick_passes,
        "full_passes": stats.full_passes,
        "sweeps": stats.sweeps,
        "tick_s": args.tick,
        "pass_every_s": args.pass_every,
    }
    print(render(board))
    print(
        f"simulated in {simulated:.1f} s; replayed in {stats.wall_s:.1f} s"
        f" ({stats.requests} requests, {stats.full_passes} full passes, {stats.sweeps} sweeps)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(board, indent=2))


if __name__ == "__main__":
    main()
