"""/metrics server time on a large installation: the median and p95 of a scrape, and its
query count, against a target p95 under 200 ms.

    .venv/bin/python bench/metrics.py [--n 50] [--warmup 3] [--sql] [--reseed]
        [--database-url postgres://...]

Seeds (or reuses) the page benchmark's installation (bench/pages.py, bench/pages_seed.py:
4 clusters of 500 nodes, 100 jobs, about 500 incidents and 330 actions) in its own
database (`rebound_bench_metrics` by default), then scrapes /metrics in this process
through Django's test Client with a viewer's API token, DEBUG off as in production:
--warmup scrapes, one counted with CaptureQueriesContext (its queries; --sql prints
them), then --n timed ones. The cache and the broker are this machine's Redis when
REDIS_URL is set; without it the broker's queue lengths are not read.

The timed scrapes take the totals (every job, incident and finished action) from the
snapshot, as all but one scrape a minute do; --fresh more scrapes each read them anew
(the snapshot dropped first), as the first scrape after it ages does. --incidents N
copies the seeded incidents until there are about N (in a transaction rolled back at
the end), to see what grows with the incidents table.
"""

import argparse
import os
import sys
import time
from urllib.parse import urlsplit

import pages
from harness import setup_django, verdict

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_metrics"
TARGET_P95_MS = 200.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reseed", action="store_true", help="drop the database and seed anew")
    ap.add_argument("--n", type=int, default=50, help="timed scrapes")
    ap.add_argument("--warmup", type=int, default=3, help="scrapes first, not timed")
    ap.add_argument("--fresh", type=int, default=5, help="scrapes reading the totals anew")
    ap.add_argument("--incidents", type=int, default=0, help="copy incidents up to about N")
    ap.add_argument("--sql", action="store_true", help="print the counted scrape's queries")
    ap.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = ap.parse_args()
    if args.reseed:
        pages.drop_database(args.database_url)
    setup_django(args.database_url)
    print(f"database {urlsplit(args.database_url).path.lstrip('/')} ready")

    from django.conf import settings
    from django.db import connection, transaction
    from django.test import Client

    from console.metrics.collector import forget_totals
    from console.services import token_issue

    _, seeded = pages.seed()
    print(seeded)
    settings.DEBUG = False
    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    _, token = token_issue(scope="viewer", name="bench-metrics")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=True)

    def scrape() -> tuple[bytes, float]:
        t = time.perf_counter()
        response = client.get("/metrics")
        ms = (time.perf_counter() - t) * 1000.0
        if response.status_code != 200:
            sys.exit(f"/metrics answered {response.status_code}: {response.content[:300]!r}")
        return response.content, ms

    with transaction.atomic():
        code = measure(args, scrape, connection, forget_totals)
        transaction.set_rollback(True)  # the copied incidents, the token's last use
    forget_totals()
    return code


def copy_incidents(connection, target: int) -> int:
    """Copy every incident (new episodes, so each is its own) until about `target`."""
    from incidents.models import Incident

    have = Incident.objects.count()
    copies = max(0, -(-target // max(have, 1)) - 1)
    if copies:
        table = Incident._meta.db_table
        columns = [f.column for f in Incident._meta.concrete_fields if f.column != "id"]
        values = ["episode || '-copy' || g" if c == "episode" else f'"{c}"' for c in columns]
        with connection.cursor() as cursor:
            names = ", ".join(f'"{c}"' for c in columns)
            cursor.execute(
                f'INSERT INTO "{table}" ({names}) SELECT {", ".join(values)}'
                f' FROM "{table}", generate_series(1, %s) AS g',
                [copies],
            )
            cursor.execute(f'ANALYZE "{table}"')
    return Incident.objects.count()


def measure(args, scrape, connection, forget_totals) -> int:
    from django.test.utils import CaptureQueriesContext

    if args.incidents:
        print(f"incidents: {copy_incidents(connection, args.incidents)} (copies rolled back)")
    for _ in range(args.warmup):
        scrape()
    with CaptureQueriesContext(connection) as queries:
        body, _ = scrape()
    captured = list(queries.captured_queries)
    sql_ms = sum(float(q["time"]) * 1000.0 for q in captured)
    if args.sql:
        for q in captured:
            print(f"  {float(q['time']) * 1000.0:7.1f} ms  {q['sql'][:400]}")
    times = [scrape()[1] for _ in range(args.n)]
    fresh = []
    for _ in range(args.fresh):
        forget_totals()
        fresh.append(scrape()[1])
    lines = body.decode().splitlines()
    series = sum(1 for line in lines if line and not line.startswith("#"))
    p50, p95 = pages.pct(times, 0.5), pages.pct(times, 0.95)
    ok = p95 < TARGET_P95_MS
    print(
        f"/metrics: {len(body) / 1024:.0f} KiB, {series} series;"
        f" {len(captured)} queries ({sql_ms:.1f} ms in the database)"
    )
    print(
        f"server time over {args.n} scrapes: p50 {p50:.1f} ms, p95 {p95:.1f} ms,"
        f" max {max(times):.1f} ms; target p95 < {TARGET_P95_MS:.0f} ms: {verdict(ok)}"
    )
    if fresh:
        print(
            f"a scrape reading the totals anew (once a max age), over {len(fresh)}:"
            f" p50 {pages.pct(fresh, 0.5):.1f} ms, max {max(fresh):.1f} ms"
        )
    print(f"load average (1 min) {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
