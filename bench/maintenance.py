"""What maintenance windows cost the ledger: `jobs.accounting.job_ledger` of the
accounting benchmark's job (bench/accounting.py builds it) with no window on its
cluster, then with 200 windows (one over the end of its first launch, the others
elsewhere in its time), and the windows' query alone.

    .venv/bin/python bench/maintenance.py [--events 1000000] [--repeat 5] [--database-url ...]

Prints the medians, the planned figures, and checks that the eight categories are
the same with and without windows (planned is a view over them).
"""

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from harness import DEFAULT_DATABASE_URL, setup_django, verdict

WINDOWS = 200


def timed(fn, repeat: int, *, reconnect: bool = True):
    from django.db import connection

    times, out = [], None
    for _ in range(repeat):
        if reconnect:  # nothing cached on the connection
            connection.close()
        connection.ensure_connection()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    args = p.parse_args()
    setup_django(args.database_url)
    import accounting as bench_accounting

    from jobs import accounting
    from jobs.models import MaintenanceWindow, TrainingJob
    from jobs.selectors import maintenance_spans

    job = bench_accounting.existing_job(args.events) or bench_accounting.build_job(
        args.database_url, args.events
    )
    MaintenanceWindow.objects.filter(cluster_id=job.cluster_id).delete()
    job = TrainingJob.objects.get(pk=job.pk)
    plain_s, plain = timed(lambda: accounting.job_ledger(job), args.repeat)

    def query():
        return maintenance_spans(
            cluster_id=job.cluster_id, start=job.first_event_ts, end=job.last_event_ts
        )

    none_s, _ = timed(query, args.repeat * 20, reconnect=False)

    first = plain.launches[0]
    end = datetime.fromtimestamp(first.stop, tz=UTC)
    windows = [
        MaintenanceWindow(
            cluster_id=job.cluster_id,
            starts_at=end - timedelta(seconds=60),
            ends_at=end + timedelta(seconds=60),
        )
    ]
    span = (job.last_event_ts - job.first_event_ts) / WINDOWS
    for k in range(1, WINDOWS):
        start = datetime.fromtimestamp(job.first_event_ts + k * span, tz=UTC)
        windows.append(
            MaintenanceWindow(
                cluster_id=job.cluster_id, starts_at=start, ends_at=start + timedelta(seconds=1)
            )
        )
    MaintenanceWindow.objects.bulk_create(windows)
    try:
        windowed_s, windowed = timed(lambda: accounting.job_ledger(job), args.repeat)
        query_s, spans = timed(query, args.repeat * 20, reconnect=False)
    finally:
        MaintenanceWindow.objects.filter(cluster_id=job.cluster_id).delete()

    print(f"job {job.key}: {job.events_count:,} events, {len(plain.launches)} launches")
    print(f"job_ledger, no window:      median {plain_s:.3f} s")
    print(f"job_ledger, {WINDOWS} windows:  median {windowed_s:.3f} s")
    print(f"the windows' query alone:   median {none_s * 1000:.2f} ms with none")
    print(f"the windows' query alone:   median {query_s * 1000:.2f} ms ({len(spans)} windows)")
    d = windowed.as_dict()
    print(
        f"planned: launches {windowed.planned_launches}, {d['planned_s']:,.1f} s,"
        f" {d['planned_gpu_seconds']:,.1f} GPU-s; gpu_goodput {d['gpu_goodput']:.4f},"
        f" without planned {d['gpu_goodput_excluding_planned']:.4f}"
    )
    same = all(abs(plain.categories[k] - windowed.categories[k]) < 1e-9 for k in plain.categories)
    print(f"categories unchanged by the windows: {verdict(same)}")
    return 0 if same and windowed.planned_launches else 2


if __name__ == "__main__":
    sys.exit(main())
