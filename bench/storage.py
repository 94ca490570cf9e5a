"""Storage per GPU-day: a simulated job at the real rate through ingest and detection,
then storage upkeep (jobs.services.upkeep), with what each stream table holds before
and after, and every figure checked unchanged by it.

    .venv/bin/python bench/storage.py [--nodes 2048] [--hours 2] [--rate 4.2] [--seed 3]
        [--database-url postgres://.../rebound_bench_storage]

One job of `--nodes` nodes x 8 GPUs (2,048: 16,384 ranks) for `--hours` of its clock at
the rate of the README's snippet on a large job: a step every 5 s, a window per rank
every 10 steps, heartbeats per node every 10 s, faults at `--rate` per 1,000 node-days
(bench/fleetsim), replayed through the real ingest and detection on a simulated clock
(bench/fleetsim/drive.py). Its database is its own, dropped and made again at the start,
so the tables hold this run alone.

Sizes are PostgreSQL's (`pg_total_relation_size`: rows, indexes, TOAST) of a copy of
each table's live rows, so both readings count live rows only. Upkeep runs once at the
end with the horizons shortened to `--keep-s` (so a short run shows what a long one
keeps), and the per-day figures follow from the per-hour ones:
- kept for good: what upkeep leaves of the hours it rolled up, per day;
- held while recent: the raw windows and buckets the default horizons (settings) hold,
  at the run's rate per hour.
The ledger, the incidents (with their times and costs) and the reliability report are
read before and after upkeep and must be identical.
"""

import argparse
import math
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from harness import setup_django, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_storage"
STREAMS = ("rank_window", "heartbeat", "step")
TABLES = [
    "jobs_event",
    "jobs_steprecord",
    "jobs_rankwindow",
    "jobs_heartbeatbucket",
    "jobs_rankwindowhour",
    "jobs_evidencewindow",
    "jobs_checkpoint",
    "jobs_attempt",
    "incidents_incident",
    "incidents_detectorstate",
]


def recreate(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def sizes(where: dict[str, str] | None = None) -> dict[str, tuple[int, int]]:
    """(rows, bytes) per table: the size of a copy of its live rows (those matching
    `where[table]` if given) with its indexes, so that neither the dead rows upkeep
    leaves for VACUUM nor a transaction elsewhere that keeps them from being removed
    count."""
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for table in TABLES:
            copy = f"bench_copy_{table}"
            cond = (where or {}).get(table, "true")
            cur.execute(f"DROP TABLE IF EXISTS {copy}")
            cur.execute(f"CREATE TABLE {copy} (LIKE {table} INCLUDING ALL)")
            cur.execute(f"INSERT INTO {copy} SELECT * FROM {table} WHERE {cond}")
            cur.execute(f"ANALYZE {copy}")
            cur.execute(f"SELECT count(*), pg_total_relation_size('{copy}') FROM {copy}")
            out[table] = cur.fetchone()
            cur.execute(f"DROP TABLE {copy}")
    return out


def figures(keys, days):
    from fleetsim.score import incidents_seen, ledger_seen, reliability_seen

    return incidents_seen(keys), ledger_seen(keys), reliability_seen("fleet", days)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument(
        "--rate", type=float, default=4.2, help="faults per 1,000 node-days (Llama 3: 4.2)"
    )
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--keep-s", type=float, default=600.0, help="horizons for the end's upkeep")
    ap.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = ap.parse_args()

    recreate(args.database_url)
    setup_django(args.database_url)
    from console.celery import app

    app.conf.broker_url = "memory://"  # the driver runs the passes itself
    from django.conf import settings
    from django.test import override_settings
    from fleetsim.drive import replay
    from fleetsim.sim import FleetConfig, simulate

    from common.time import dt
    from incidents.upkeep import incidents_storage_upkeep
    from jobs import partitions
    from jobs.models import TrainingJob

    cfg = FleetConfig(
        nodes=args.nodes,
        days=args.hours / 24,
        rate=args.rate,
        seed=args.seed,
        step_s=5.0,
        window_steps=10,
        heartbeat_s=10.0,
        job_nodes=(args.nodes,),
        max_job_nodes=args.nodes,
        eval_every=720,  # an hour of 5 s steps
    )
    began = time.monotonic()
    fleet = simulate(cfg)
    n_events = len(fleet.events)
    print(
        f"simulated {args.nodes} nodes x 8 GPUs for {args.hours:g} h: {n_events:,} events,"
        f" {len(fleet.faults)} faults ({time.monotonic() - began:.0f} s)"
    )
    # The hourly partitions of windows and buckets, made ahead of the trace as upkeep
    # makes them ahead of the clock: its rows land in them, and upkeep lets them go.
    for table in (partitions.WINDOWS, partitions.BEATS):
        partitions.hours_ensure(table, fleet.events[0]["ts"], ahead_h=math.ceil(args.hours) + 1)
    run = uuid.uuid4().hex[:4]
    for e in fleet.events:
        e["id"] = f"{run}-{e['id']}"
    began = time.monotonic()
    stats = replay(fleet.events, cluster_name="fleet", tick_s=60, pass_every_s=600)
    took = time.monotonic() - began
    print(
        f"replayed through ingest and detection in {took:.0f} s"
        f" ({n_events / took:,.0f} events/s, {stats.full_passes} full passes)"
    )
    keys = [j.key for j in fleet.jobs]
    job = TrainingJob.objects.get(key=keys[0])
    span_h = (job.last_event_ts - job.first_event_ts) / 3600
    gpus = args.nodes * 8
    before = figures(keys, cfg.days)
    raw = sizes()

    short = {
        "REBOUND_KEEP_RANK_WINDOWS_S": args.keep_s,
        "REBOUND_KEEP_HEARTBEAT_BUCKETS_S": args.keep_s,
        "REBOUND_KEEP_WINDOW_EVENTS_S": 0,
    }
    began = time.monotonic()
    with override_settings(**short):
        incidents_storage_upkeep(now=dt(job.last_event_ts))
        last = incidents_storage_upkeep(now=dt(job.last_event_ts + 1))
    upkeep_s = time.monotonic() - began
    after = figures(keys, cfg.days)
    kept = sizes()
    # What upkeep keeps for good: everything but the raw tail inside the horizons.
    cutoff = job.last_event_ts - args.keep_s
    bucket = math.floor(cutoff / 10)
    good = sizes(
        {"jobs_rankwindow": f"ts < {cutoff}", "jobs_heartbeatbucket": f"bucket < {bucket}"}
    )
    same = before == after
    print(f"upkeep: {upkeep_s:.1f} s for both runs; the last reported {last.report}")

    print(f"\n{'table':26} {'rows raw':>12} {'MB raw':>9} {'rows kept':>12} {'MB kept':>9}")
    for t in TABLES:
        print(
            f"{t:26} {raw[t][0]:>12,} {raw[t][1] / 1e6:>9.1f} {kept[t][0]:>12,}"
            f" {kept[t][1] / 1e6:>9.1f}"
        )
    kinds = {k: sum(e["kind"] == k for e in fleet.events) / span_h for k in STREAMS}
    print("events per hour of the job: " + ", ".join(f"{k} {v:,.0f}" for k, v in kinds.items()))
    rolled_h = span_h - args.keep_s / 3600
    day_raw = sum(b for _, b in raw.values()) / span_h * 24
    # Over the hours rolled up, though the tables kept whole cover the whole run: an
    # upper bound.
    day_good = sum(b for _, b in good.values()) / rolled_h * 24
    # The raw rows a horizon holds, at the run's rate per hour.
    windows_h = raw["jobs_rankwindow"][1] / span_h
    buckets_h = raw["jobs_heartbeatbucket"][1] / span_h
    # What upkeep dropped of jobs_event: the raw events of windows.
    window_events_h = max(raw["jobs_event"][1] - kept["jobs_event"][1], 0) / span_h
    keep_w = settings.REBOUND_KEEP_RANK_WINDOWS_S / 3600
    keep_b = settings.REBOUND_KEEP_HEARTBEAT_BUCKETS_S / 3600
    keep_e = settings.REBOUND_KEEP_WINDOW_EVENTS_S / 3600
    held = (
        windows_h * min(24, keep_w)
        + buckets_h * min(24, keep_b)
        + window_events_h * min(24, keep_e)
    )
    print(
        f"\njob clock covered: {span_h:.2f} h; upkeep rolled all but the last {args.keep_s:g} s up"
    )
    print(
        f"without upkeep: {day_raw / 1e9:.2f} GB a day for {gpus:,} GPUs"
        f" = {day_raw / gpus / 1e3:.1f} KB per GPU-day"
    )
    print(
        f"kept for good:  {day_good / 1e9:.3f} GB a day = {day_good / gpus / 1e3:.2f} KB"
        f" per GPU-day ({day_good * 54 / 1e9:.1f} GB over 54 days)"
    )
    print(
        f"held while recent, default horizons (raw windows {keep_w:g} h, buckets {keep_b:g} h,"
        f" windows' raw events {keep_e:g} h): {held / 1e9:.2f} GB"
    )
    # The same horizons at the nominal rate (no pause, no fault): every rank's window
    # every `window_steps` steps of 5 s, every node's bucket every 10 s.
    per_row = {t: raw[t][1] / max(raw[t][0], 1) for t in TABLES}
    windows_nominal = gpus * 3600 / (cfg.step_s * cfg.window_steps)
    held_nominal = (
        per_row["jobs_rankwindow"] * windows_nominal * min(24, keep_w)
        + per_row["jobs_heartbeatbucket"] * args.nodes * 360 * min(24, keep_b)
        + per_row["jobs_event"] * windows_nominal * min(24, keep_e)
    )
    ok = day_good + held_nominal <= 1e9
    print(
        f"after a day with default horizons: {(day_good + held) / 1e9:.2f} GB at this run's"
        f" rate; {(day_good + held_nominal) / 1e9:.2f} GB at the nominal rate"
        f" ({windows_nominal:,.0f} windows an hour; target <= 1 GB): {verdict(ok)}"
    )
    print(
        f"ledger, incidents, reliability unchanged by upkeep: {verdict(same)}"
        f" ({len(before[0])} incidents)"
    )
    return 0 if same and ok else 1


if __name__ == "__main__":
    sys.exit(main())
