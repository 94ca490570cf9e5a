"""Console page server times on a large installation: every page's p95 under 300 ms.

    .venv/bin/python bench/pages.py [--reseed] [--small] [--only SUBSTR] [--n 30]
        [--warmup 3] [--sql] [--max-page-s 60] [--reliability-query QS]
        [--database-url postgres://...]

Seeds its own PostgreSQL database (`rebound_bench_pages`, `rebound_bench_pages_small`
with --small, or DATABASE_URL or --database-url; created and migrated when missing)
with an installation at scale, then asks each console page for itself, in this
process, through Django's test Client signed in as an operator
(`bench-pages-operator`), and times the server's work.

The installation (bench/pages_plan.py) is anchored at the time it was first seeded; a
rerun reuses what is there and finishes any part a run cut short; --reseed drops the
database and seeds it anew; --small seeds one a fifth of the size. It is written
through the apps' services (bench/pages_seed.py, bench/pages_actions.py): 4 clusters
of 500 nodes, 100 jobs (one of 1,000,000 steps on 128 ranks) with their launches,
steps, checkpoints and rank windows, the incidents Rebound's detectors open from them
(about 500: failed launches and stragglers) and the actions answering them (30
awaiting approval, 300 finished, 4 running).

Then, per page: --warmup requests, one more counted with CaptureQueriesContext
(its SQL queries and their time; --sql prints the three slowest), then --n
timed requests, with DEBUG off as in production, until --max-page-s. Prints
p50, p95 and max in ms and PASS/FAIL against p95 < 300 ms;
a page that answers anything but 200 FAILs with its status (and is not
repeated). Exit status 0 when every page passes.
"""

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import pages_plan as P
import psycopg
from harness import setup_django, verdict

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_pages"
TARGET_P95_MS = 300.0


def ensure_operator():
    from django.contrib.auth import get_user_model

    from console.services import user_set_role

    user, _ = get_user_model().objects.get_or_create(username=P.OPERATOR)
    user_set_role(user=user, role="operator")
    return user


def seed() -> tuple[P.Plan, str]:
    """The installation, written where missing; the plan and a line on what was done."""
    import pages_actions
    import pages_seed
    from django.db.models import Count

    from incidents.models import Incident
    from recovery.models import Action

    pages_seed.quiet()
    t0 = time.perf_counter()
    timings = []
    anchor, complete = pages_seed.seed_state()
    fresh = anchor is None
    anchor = time.time() if fresh else anchor
    t = time.perf_counter()
    p = P.plan(anchor)
    timings.append(f"plan {time.perf_counter() - t:.1f} s")
    ensure_operator()
    if fresh:
        t = time.perf_counter()
        pages_seed.seed_nodes(p)
        timings.append(f"nodes {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    written = pages_seed.seed_jobs(p)
    if written:
        timings.append(f"{written} jobs {time.perf_counter() - t:.1f} s")
    clusters = pages_seed.bench_clusters()
    if written or not complete:
        pages_seed.mark(anchor, complete=False)
        pages_seed.clear()
        t = time.perf_counter()
        pages_seed.seed_incidents(p)
        timings.append(f"detection {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        closing = pages_seed.closings(anchor)
        ended = pages_actions.seed_actions(anchor, closing)
        timings.append(f"actions {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        pages_seed.resolve_incidents(closing)
        timings.append(f"closing {time.perf_counter() - t:.1f} s")
        pages_seed.mark(anchor, complete=True)
        print("  actions by state:", ", ".join(f"{k} {n}" for k, n in sorted(ended.items())))
    incidents = Incident.objects.filter(cluster__in=clusters)
    by_state = dict(incidents.values_list("state").annotate(n=Count("id")).order_by("state"))
    print(
        f"  {incidents.count()} incidents ({', '.join(f'{k} {n}' for k, n in by_state.items())}),"
        f" {Action.objects.filter(cluster__in=clusters).count()} actions"
    )
    total = time.perf_counter() - t0
    if len(timings) == 1:
        return p, f"installation already seeded (checked in {total:.1f} s; --reseed to redo)"
    return p, f"seeded in {total:.1f} s ({', '.join(timings)})"


def drop_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name.startswith("rebound_bench"):
        sys.exit(f"--reseed drops the database: only a rebound_bench* one, not {name!r}")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the measurement -----------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (as bench/detect.py and bench/recovery.py)."""
    s = sorted(values)
    return s[max(0, round(q * len(s)) - 1)]


def pages(p: P.Plan, reliability_query: str) -> list[tuple[str, str]]:
    """(label, URL) of each page, with the rows worth showing picked from the seed."""
    from django.db.models import Count
    from pages_seed import bench_clusters

    from incidents.models import Incident
    from jobs.models import Node

    clusters = bench_clusters()
    incidents = Incident.objects.filter(cluster__in=clusters)
    cause = (incidents.values("cause").annotate(n=Count("id")).order_by("-n").first() or {}).get(
        "cause", "gpu"
    )
    busiest = incidents.annotate(n=Count("timeline")).order_by("-n", "id").first()
    node = (
        Node.objects.filter(cluster__in=clusters)
        .annotate(n=Count("incidents"))
        .order_by("-n", "id")
        .select_related("cluster")
        .first()
    )
    small = next(j for j in p.jobs if j.status == "running" and j.key != P.BIG_KEY)
    query = reliability_query or "range=90d"
    return [
        ("overview", "/"),
        ("jobs", "/jobs/"),
        ("job, 1M steps", f"/jobs/{P.BIG_KEY}/"),
        ("job, small", f"/jobs/{small.key}/"),
        ("incidents", "/incidents/"),
        (f"incidents, cause={cause}", f"/incidents/?cause={cause}"),
        ("incident", f"/incidents/{busiest.pk if busiest else 1}/"),
        ("approvals", "/approvals/"),
        ("nodes", "/nodes/"),
        ("node", f"/nodes/{node.cluster.name}/{node.name}/" if node else "/nodes/x/y/"),
        ("reliability", "/reliability/"),
        ("reliability, 90 days", f"/reliability/?{query}"),
        ("status, nodes=all", "/status.json?nodes=all"),
    ]


@dataclass
class Result:
    label: str
    url: str
    status: int
    queries: int | None = None
    sql_ms: float | None = None  # the counted request's time in the database
    slowest_sql: list[tuple[float, str]] = field(default_factory=list)
    times_ms: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.times_ms) and self.p95 < TARGET_P95_MS

    @property
    def p95(self) -> float:
        return pct(self.times_ms, 0.95) if self.times_ms else float("nan")


def measure(client, label: str, url: str, *, n: int, warmup: int, max_s: float) -> Result:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def get():
        t = time.perf_counter()
        response = client.get(url)
        return response, (time.perf_counter() - t) * 1000.0

    response, ms = get()
    result = Result(label, url, response.status_code)
    if response.status_code != 200:  # failing: once is enough to say so
        exc = getattr(response, "exc_info", None)
        if exc:
            result.note = f"{exc[0].__name__}: {str(exc[1])[:120]}"
        elif response.status_code in (301, 302):
            result.note = f"-> {response.headers.get('Location')}"
        result.times_ms = [ms]
        return result
    for _ in range(max(0, warmup - 1)):
        get()
    with CaptureQueriesContext(connection) as queries:
        get()
    result.queries = len(queries)
    timed = sorted(
        ((float(q["time"]) * 1000.0, q["sql"]) for q in queries.captured_queries), reverse=True
    )
    result.sql_ms = sum(ms for ms, _ in timed)
    result.slowest_sql = timed[:3]
    started = time.perf_counter()
    for _ in range(n):
        response, ms = get()
        result.times_ms.append(ms)
        if response.status_code != 200:
            result.status = response.status_code
            break
        if time.perf_counter() - started > max_s:
            result.note = f"stopped after {len(result.times_ms)} requests ({max_s:.0f} s)"
            break
    return result


def row(r: Result) -> str:
    if r.times_ms and r.status == 200:
        p50 = pct(r.times_ms, 0.5)
        figures = f"{p50:>8.1f} {r.p95:>8.1f} {max(r.times_ms):>8.1f}"
    else:
        figures = f"{'':>8} {'':>8} {max(r.times_ms or [0]):>8.1f}"
    queries = "" if r.queries is None else str(r.queries)
    sql = "" if r.sql_ms is None else f"{r.sql_ms:.1f}"
    verdict_ = verdict(r.ok) + ("" if r.status == 200 else f" ({r.status})")
    line = f"{r.label:<24} {figures} {queries:>7} {sql:>7}  {verdict_:<11} {r.url}"
    return line + (f"  [{r.note}]" if r.note else "")


HEADER = (
    f"{'page':<24} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'queries':>7} {'sql ms':>7}"
    f"  {'verdict':<11} url"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reseed", action="store_true", help="drop the database and seed anew")
    ap.add_argument("--only", default="", help="measure the pages whose label or URL has this")
    ap.add_argument("--n", type=int, default=30, help="timed requests per page")
    ap.add_argument("--warmup", type=int, default=3, help="requests first, not timed")
    ap.add_argument("--sql", action="store_true", help="print each page's 3 slowest queries")
    ap.add_argument("--max-page-s", type=float, default=60.0, help="time limit of a page's runs")
    ap.add_argument(
        "--reliability-query",
        default="",
        help="the 90-day reliability page's query (default: range=90d)",
    )
    ap.add_argument("--small", action="store_true", help="a fifth of the installation")
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "")
    args = ap.parse_args()
    if args.small:
        P.small()
    args.database_url = args.database_url or DEFAULT_DATABASE_URL + ("_small" * args.small)

    if args.reseed:
        drop_database(args.database_url)
    t = time.perf_counter()
    setup_django(args.database_url)
    print(f"database {urlsplit(args.database_url).path.lstrip('/')} ready", end="")
    print(f" (created/migrated as needed) in {time.perf_counter() - t:.1f} s")
    from django.conf import settings
    from django.test import Client

    p, seeded = seed()
    print(seeded)

    # Production's settings for what the pages cost: no query log, no template debug.
    settings.DEBUG = False
    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client(raise_request_exception=False)
    client.force_login(ensure_operator())
    todo = [
        (label, url)
        for label, url in pages(p, args.reliability_query)
        if args.only in label or args.only in url
    ]
    if not todo:
        sys.exit(f"no page matches --only {args.only!r}")
    load = os.getloadavg()[0]
    print(f"{len(todo)} pages, {args.warmup} warm-up and {args.n} timed requests each")
    print(HEADER)
    results = []
    for label, url in todo:
        r = measure(client, label, url, n=args.n, warmup=args.warmup, max_s=args.max_page_s)
        results.append(r)
        print(row(r), flush=True)
        for ms, sql in r.slowest_sql if args.sql else ():
            print(f"    {ms:8.1f} ms  {sql[:300]}")

    print()
    print(f"target p95 < {TARGET_P95_MS:.0f} ms per page, server time in this process:")
    print(HEADER)
    for r in results:
        print(row(r))
    passed = sum(r.ok for r in results)
    timed = [r for r in results if r.times_ms and r.status == 200]
    slowest = max(timed, key=lambda r: r.p95, default=None)
    worst = f"; slowest {slowest.label} p95 {slowest.p95:.0f} ms" if slowest else ""
    print(
        f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end,"
        f" on {os.cpu_count()} CPUs"
    )
    print(
        f"summary: {passed}/{len(results)} pages PASS (p95 < {TARGET_P95_MS:.0f} ms){worst};"
        f" {seeded}: {verdict(passed == len(results))}"
    )
    return 0 if passed == len(results) else 2


if __name__ == "__main__":
    sys.exit(main())
