"""Storage after a simulated day: a 16,384-GPU job's steady stream for a day of its
clock, through the real ingest and detection, with storage upkeep on its schedule and
the default horizons, and what the tables hold at the end.

    .venv/bin/python bench/storage_day.py [--nodes 2048] [--hours 24]
        [--database-url postgres://.../rebound_bench_storage]

The stream is bench/ingest.py's large job at the nominal rate (a step every 5 s from
rank 0, every rank's window every 10 steps, every node's heartbeat every 10 s: 533
events a second at 2,048 nodes), made as it is replayed, 10 minutes of its clock at
a time (bench/fleetsim/drive.py: ticks of 60 s, a full detection pass every 600 s,
the sweep every tick). After each 10 minutes storage upkeep runs, as beat runs it
every `REBOUND_UPKEEP_EVERY_S`, on the simulated clock. Its database is its own (that
of bench/storage.py), dropped and made again at the start.

It prints, every simulated hour, what the stream tables take on disk (rows, indexes,
partitions, space of deleted rows not yet reused), and at the end:
- without upkeep: the bytes a day of rows would take, from the bytes per row of each
  table after the first 10 minutes (before upkeep has anything to drop) and the rows
  the day wrote;
- after the day: the size of a copy of each table's live rows (bench/storage.py's
  reading), against the target of 1 GB.
The figures' sameness with and without upkeep is bench/storage.py's check (a run with
faults, read before and after upkeep) and tests/incidents/test_storage_upkeep.py's;
this stream has no fault: its ledger, printed at the end, is nearly all productive.
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

from harness import setup_django, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import LargeJobStream
from storage import DEFAULT_URL, TABLES, recreate, sizes

CHUNK_S = 600  # REBOUND_UPKEEP_EVERY_S's default: upkeep after every 10 minutes of the clock
TARGET_BYTES = 1e9
JOB = "day-job"


def chunks(stream: LargeJobStream, start: float, end: float):
    """The stream's events in `CHUNK_S` slices of its clock (edges on multiples of
    CHUNK_S, so no heartbeat bucket straddles two), each sorted by ts."""
    buffered: list[dict] = []
    edge = math.floor(start / CHUNK_S) * CHUNK_S + CHUNK_S
    while edge - CHUNK_S < end:
        while not buffered or max(e["ts"] for e in buffered[-2000:]) < edge:
            buffered += stream.batch(5000)
        now = [e for e in buffered if e["ts"] < edge]
        buffered = [e for e in buffered if e["ts"] >= edge]
        now.sort(key=lambda e: e["ts"])
        yield edge, now
        edge += CHUNK_S


def on_disk() -> int:
    """What the stream tables take now: every partition, indexes, TOAST, dead rows."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " WHERE c.relkind = 'r' AND (c.relname = ANY(%s) OR c.oid IN"
            " (SELECT inhrelid FROM pg_inherits WHERE inhparent::regclass::text = ANY(%s)))",
            [TABLES, TABLES],
        )
        return int(cur.fetchone()[0])


def autovacuum_on() -> bool:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW autovacuum")
        return cur.fetchone()[0] == "on"


def vacuum() -> None:
    """What autovacuum would do after a run of upkeep (a server may run without it):
    the rows upkeep deleted (raw window events, rows of the default partitions) are
    space to reuse."""
    from django.db import connection

    tables = ["jobs_event", "jobs_rankwindow_default", "jobs_heartbeatbucket_default"]
    with connection.cursor() as cur:
        cur.execute(f"VACUUM {', '.join(tables)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = ap.parse_args()

    recreate(args.database_url)
    setup_django(args.database_url)
    from console.celery import app

    app.conf.broker_url = "memory://"  # the driver runs the passes itself
    from fleetsim.drive import replay

    from common.time import dt
    from incidents.models import Incident
    from incidents.upkeep import incidents_storage_upkeep
    from jobs import partitions
    from jobs.models import TrainingJob
    from jobs.selectors import job_goodput

    gpus = args.nodes * 8
    stream = LargeJobStream(JOB, "dn", seed=7, world=gpus, gpus_per_node=8)
    start = stream.t0
    end = start + args.hours * 3600
    # The hourly partitions upkeep keeps ahead of the clock, as a console running it
    # has them before the job starts.
    for table in (partitions.WINDOWS, partitions.BEATS):
        partitions.hours_ensure(table, start, ahead_h=24)
    autovacuum = autovacuum_on()
    written = dict.fromkeys(TABLES, 0)
    per_row: dict[str, float] = {}
    peak = 0
    began = time.monotonic()
    upkeep_s = 0.0
    print(f"a job of {args.nodes} nodes x 8 GPUs for {args.hours:g} h of its clock")
    print(f"{'hour':>5} {'events':>12} {'on disk GB':>11} {'wall s':>8}")
    sent = 0
    for n, (edge, events) in enumerate(chunks(stream, start, end)):
        sent += len(events)
        for e in events:
            if e["kind"] == "heartbeat":
                continue
            written["jobs_event"] += 1
            if e["kind"] == "rank_window":
                written["jobs_rankwindow"] += 1
            elif e["kind"] == "step":
                written["jobs_steprecord"] += 1
        written["jobs_heartbeatbucket"] += len(
            {(e["node"], e["ts"] // 10) for e in events if e["kind"] == "heartbeat"}
        )
        replay(events, cluster_name="day", tick_s=60, pass_every_s=CHUNK_S)
        if n == 0:  # before upkeep has anything to drop: what a row of each table takes
            first = sizes()
            per_row = {t: b / r for t, (r, b) in first.items() if r}
        t = time.monotonic()
        incidents_storage_upkeep(now=dt(edge))
        upkeep_s += time.monotonic() - t
        if not autovacuum:
            vacuum()
        peak = max(peak, on_disk())
        if (n + 1) % (3600 // CHUNK_S) == 0:
            print(
                f"{(edge - start) / 3600:>5.1f} {sent:>12,}"
                f" {on_disk() / 1e9:>11.2f} {time.monotonic() - began:>8.0f}"
            )
    wall = time.monotonic() - began
    span_h = args.hours
    kept = sizes()
    job = TrainingJob.objects.get(key=JOB)
    ledger = job_goodput(job=job)
    incidents = Incident.objects.filter(job=job).count()

    print(f"\n{'table':26} {'rows written':>14} {'B per row':>10} {'rows kept':>12} {'MB kept':>9}")
    for t in TABLES:
        print(
            f"{t:26} {written.get(t, 0):>14,} {per_row.get(t, 0):>10.0f} {kept[t][0]:>12,}"
            f" {kept[t][1] / 1e6:>9.1f}"
        )
    raw_day = sum(per_row.get(t, 0) * written[t] for t in written) / span_h * 24
    day_after = sum(b for _, b in kept.values())  # what the tables hold at the run's end
    ok = day_after <= TARGET_BYTES
    print(
        f"\nreplayed {sent:,} events in {wall:.0f} s"
        f" (upkeep {upkeep_s:.0f} s of it, {math.ceil(span_h * 3600 / CHUNK_S)} runs)"
    )
    print(
        f"without upkeep: {raw_day / 1e9:.2f} GB a day for {gpus:,} GPUs"
        f" = {raw_day / gpus / 1e3:.1f} KB per GPU-day"
    )
    print(
        f"on disk at most during the day (partitions made ahead and rows deleted and not"
        f" yet reused included; {'autovacuum' if autovacuum else 'VACUUM after each upkeep run'}):"
        f" {peak / 1e9:.2f} GB"
    )
    print(
        f"after {span_h:g} h with default horizons: {day_after / 1e9:.2f} GB"
        f" = {day_after / gpus / 1e3:.1f} KB per GPU-day (target <= 1 GB): {verdict(ok)}"
    )
    productive = ledger["categories"].get("productive", 0.0)
    print(
        f"ledger: {productive / max(sum(ledger['categories'].values()), 1e-9):.4f} productive,"
        f" {incidents} incidents (a stream with no fault)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
