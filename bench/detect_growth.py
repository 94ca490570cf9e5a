"""Detection work per ingested event, as a job grows to 1,000,000 events.

    .venv/bin/python bench/detect_growth.py [--events 1000000] [--pass-every 10000]
        [--database-url postgres://...]

In this process, on its own PostgreSQL database (`rebound_bench`): one job's
stream as its reporters send it (steps, a rank window per rank every 10 steps,
node heartbeats, a checkpoint every 100 steps; bench/ingest.py's JobStream) is
stored through the ingest service in batches of 1,000, and every
--pass-every events one full detection pass runs (incidents_detect: hangs,
loss, dead nodes, stragglers, episodes), as the worker would run it. The
ingest's own Celery hand-offs are switched off here so that only the pass is
timed.

Prints, as the job grows, the pass's time per 1,000 new events and the ingest
time per 1,000 events, then one pass that rebuilds the detectors' state from
the whole history (what every pass would cost without incremental state) at
the final length. Passes when the per-event pass cost at the end is within
1.5x of the cost at the start (it does not grow with the job's length).
"""

import argparse
import statistics
import sys
import time
import uuid

from harness import DEFAULT_DATABASE_URL, setup_django, verdict
from ingest import JobStream

BATCH = 1000
GROWTH_LIMIT = 1.5


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--pass-every", type=int, default=10_000)
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = p.parse_args()
    setup_django(args.database_url)

    from incidents import services as incident_services
    from incidents.models import DetectorState
    from jobs import services
    from jobs.models import TrainingJob
    from jobs.wire import validate_events

    services._announce = lambda *a, **k: None  # no Celery hand-offs: only the pass is timed
    services._refresh_ledgers = lambda *a, **k: None
    cluster = services.cluster_get_or_create(name="bench-growth")
    key = f"growth-{uuid.uuid4().hex[:8]}"
    stream = JobStream(key, f"g{key[-4:]}", seed=7)

    rows = []  # (events so far, ingest s per 1k, pass s per 1k, rows read)
    ingest_s, stored, since = 0.0, 0, 0
    print(f"job {key}: {args.events:,} events, a detection pass every {args.pass_every:,}")
    print(f"{'events':>10} {'ingest ms/1k':>13} {'pass ms':>8} {'pass ms/1k new':>15}")
    while stored < args.events:
        events, errors = validate_events(stream.batch(BATCH), BATCH)
        assert not errors, errors
        t = time.perf_counter()
        services.events_ingest(cluster=cluster, events=events)
        ingest_s += time.perf_counter() - t
        stored += BATCH
        since += BATCH
        if since >= args.pass_every:
            job = TrainingJob.objects.get(key=key)
            t = time.perf_counter()
            incident_services.incidents_detect(job=job)
            pass_s = time.perf_counter() - t
            rows.append((stored, ingest_s / since * 1000, pass_s, pass_s / since * 1000))
            if len(rows) == 1 or stored % (args.events // 10) < args.pass_every:
                r = rows[-1]
                print(f"{r[0]:>10,} {r[1] * 1000:>13.1f} {r[2] * 1000:>8.1f} {r[3] * 1000:>15.2f}")
            ingest_s, since = 0.0, 0

    job = TrainingJob.objects.get(key=key)
    DetectorState.objects.filter(job=job).delete()
    t = time.perf_counter()
    incident_services.incidents_detect(job=job)
    rebuild_s = time.perf_counter() - t

    tenth = max(1, len(rows) // 10)
    early = statistics.median(r[3] for r in rows[1 : 1 + tenth])  # the first pass rebuilds
    late = statistics.median(r[3] for r in rows[-tenth:])
    ingest_early = statistics.median(r[1] for r in rows[1 : 1 + tenth])
    ingest_late = statistics.median(r[1] for r in rows[-tenth:])
    print()
    print(f"pass per 1k new events: {early * 1000:.2f} ms early, {late * 1000:.2f} ms late")
    print(
        f"ingest per 1k events: {ingest_early * 1000:.1f} ms early,"
        f" {ingest_late * 1000:.1f} ms late"
    )
    print(
        f"a pass that rebuilds from the whole {stored:,}-event history: {rebuild_s:.2f} s"
        f" ({rebuild_s / (late * args.pass_every / 1000):.0f}x an incremental pass)"
    )
    ok = late <= GROWTH_LIMIT * early
    growth = late / early
    print(f"detection work per event grows {growth:.2f}x (limit {GROWTH_LIMIT}x): {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
