"""One job of 16,384 ranks on 2,048 nodes: the job page, the ranks API's first page and
the overview each answer with p95 < 300 ms, and the heatmap shows the slow node.

    .venv/bin/python bench/ranks_scale.py [--reseed] [--n 20] [--warmup 1]
        [--database-url postgres://...]

Seeds its own PostgreSQL database (`rebound_bench_ranks_scale`, or DATABASE_URL or
--database-url; created and migrated when missing) with bulk_create: a cluster of
2,048 nodes x 8 ranks, one running job with one launch of 16,384 ranks, its steps, and
20 windows of rank compute times (+-2% noise; node RANKS_SLOW_NODE 1.6x slow in the
last 5 windows) and an open straggler incident naming that node. A rerun reuses a
complete seed; --reseed writes it anew.

Then, through Django's test Client signed in as an operator, with DEBUG off: the first
request of each (cold: the cache cleared), --n timed requests after --warmup, and --n
"live" requests each after an ingest's revision bump (a running job of this size ingests
several times a second: its heat map and rank scores are served while recent and
refreshed by the worker, jobs.services.page_cache); prints p50, p95 and max in ms, the
live p95, and PASS/FAIL against p95 < 300 ms (both). It checks the slow node is a row
of the job page's heatmap, that the ranks API's first page starts with its ranks, and
that the overview rings it. Exit status 0 when all pass.
"""

import argparse
import logging
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from harness import setup_django, verdict

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_ranks_scale"
TARGET_P95_MS = 300.0
CLUSTER = "bench-scale"
JOB = "bench-16k-ranks"
OPERATOR = "bench-ranks-operator"
NODES = 2048
RANKS_PER_NODE = 8
WINDOWS = 20
STEPS_PER_WINDOW = 10
SLOW_NODE = 1233  # ranks 9,864-9,871
SLOW_FROM_WINDOW = 15
SLOW_FACTOR = 1.6
NOISE = 0.02
COMPUTE_S = 0.5
T0 = 1_790_000_000.0


def node_name(i: int) -> str:
    return f"scale-n{i:04d}"


def seeded() -> bool:
    from jobs.models import RankWindow, TrainingJob

    job = TrainingJob.objects.filter(key=JOB).first()
    want = NODES * RANKS_PER_NODE * WINDOWS
    return job is not None and RankWindow.objects.filter(job=job).count() == want


def seed() -> str:
    from django.db import transaction

    from incidents.models import Incident
    from jobs.models import Attempt, Cluster, Node, RankWindow, StepRecord, TrainingJob

    t = time.perf_counter()
    rng = random.Random(7)
    started = datetime.fromtimestamp(T0, UTC)
    with transaction.atomic():
        TrainingJob.objects.filter(key=JOB).delete()
        Cluster.objects.filter(name=CLUSTER).delete()
        cluster = Cluster.objects.create(name=CLUSTER)
        Node.objects.bulk_create(
            [Node(cluster=cluster, name=node_name(i), gpus=RANKS_PER_NODE) for i in range(NODES)]
        )
        nodes = dict(Node.objects.filter(cluster=cluster).values_list("name", "pk"))
        steps = WINDOWS * STEPS_PER_WINDOW
        last_ts = T0 + steps * COMPUTE_S * 1.1
        job = TrainingJob.objects.create(
            key=JOB,
            cluster=cluster,
            status=TrainingJob.Status.RUNNING,
            first_event_ts=T0,
            last_event_ts=last_ts,
            last_step=steps,
            last_step_ts=last_ts,
            revision=1,
        )
        attempt = Attempt.objects.create(
            job=job,
            number=1,
            world_size=NODES * RANKS_PER_NODE,
            gpus_per_node=RANKS_PER_NODE,
            started_at=started,
            ready_at=started,
        )
        attempt.nodes.set(list(nodes.values()))
        StepRecord.objects.bulk_create(
            [
                StepRecord(
                    job=job,
                    attempt=1,
                    step=s,
                    ts=T0 + s * COMPUTE_S * 1.1,
                    loss=4.0 / (1 + s / 50),
                    step_time_s=COMPUTE_S * 1.1,
                )
                for s in range(1, steps + 1)
            ]
        )
        batch = []
        for w in range(WINDOWS):
            first = 1 + w * STEPS_PER_WINDOW
            for i in range(NODES):
                slow = SLOW_FACTOR if i == SLOW_NODE and w >= SLOW_FROM_WINDOW else 1.0
                for local in range(RANKS_PER_NODE):
                    compute = COMPUTE_S * slow * (1 + rng.uniform(-NOISE, NOISE))
                    batch.append(
                        RankWindow(
                            job=job,
                            attempt=1,
                            rank=i * RANKS_PER_NODE + local,
                            node_id=nodes[node_name(i)],
                            first_step=first,
                            last_step=first + STEPS_PER_WINDOW - 1,
                            ts=T0 + (first + STEPS_PER_WINDOW) * COMPUTE_S * 1.1,
                            compute_s=compute,
                            step_s=COMPUTE_S * SLOW_FACTOR * 1.02,
                            comm_wait_s=COMPUTE_S * SLOW_FACTOR * 1.02 - compute,
                        )
                    )
            if len(batch) >= 50_000:
                RankWindow.objects.bulk_create(batch, batch_size=5_000)
                batch = []
        RankWindow.objects.bulk_create(batch, batch_size=5_000)
        now = datetime.now(UTC)
        incident = Incident.objects.create(
            job=job,
            cluster=cluster,
            detector="straggler",
            episode="bench-slow-node",
            attempt=1,
            cause=Incident.Cause.STRAGGLER,
            fault_type="slow_rank",
            severity=Incident.Severity.MINOR,
            summary=f"ranks {SLOW_NODE * 8}-{SLOW_NODE * 8 + 7} slow on {node_name(SLOW_NODE)}",
            ranks=list(range(SLOW_NODE * 8, SLOW_NODE * 8 + 8)),
            fault_at=now - timedelta(minutes=5),
            detected_at=now - timedelta(minutes=4),
        )
        incident.nodes.set([nodes[node_name(SLOW_NODE)]])
    with __import__("django.db").db.connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_rankwindow")
    return f"seeded in {time.perf_counter() - t:.1f} s"


def ensure_operator():
    from django.contrib.auth import get_user_model

    from console.services import user_set_role

    user, _ = get_user_model().objects.get_or_create(username=OPERATOR)
    user_set_role(user=user, role="operator")
    return user


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (as bench/pages.py)."""
    s = sorted(values)
    return s[max(0, round(q * len(s)) - 1)]


def timed(client, url: str, *, n: int, warmup: int):
    """(first response, its ms, the n timed ms, the n ms each after an ingest) for `url`."""
    from django.db.models import F

    from jobs.models import TrainingJob

    def get():
        t = time.perf_counter()
        response = client.get(url)
        return response, (time.perf_counter() - t) * 1000.0

    first, first_ms = get()
    for _ in range(max(0, warmup - 1)):
        get()
    times, live = [], []
    for _ in range(n):
        response, ms = get()
        if response.status_code != 200:
            break
        times.append(ms)
    for _ in range(n):
        TrainingJob.objects.filter(key=JOB).update(revision=F("revision") + 1)  # as ingest
        response, ms = get()
        if response.status_code != 200:
            break
        live.append(ms)
    return first, first_ms, times, live


def heatmap_rows(html: str) -> list[str]:
    """The y labels of the job page's rank chart."""
    import json
    import re

    match = re.search(r'id="chart-ranks-data" data-chart="chart-ranks">(.*?)</script>', html, re.S)
    if match is None:
        return []
    return json.loads(match.group(1))["data"][0]["y"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reseed", action="store_true", help="write the job anew")
    ap.add_argument("--n", type=int, default=20, help="timed requests per URL")
    ap.add_argument("--warmup", type=int, default=1, help="requests first, not timed")
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "")
    args = ap.parse_args()
    url = args.database_url or DEFAULT_DATABASE_URL
    setup_django(url)
    from django.conf import settings
    from django.core.cache import cache
    from django.test import Client

    print(f"database {url.rsplit('/', 1)[-1]}: ", end="", flush=True)
    print(seed() if args.reseed or not seeded() else "seed reused")
    cache.clear()  # the first requests cold

    settings.DEBUG = False
    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client(raise_request_exception=False)
    client.force_login(ensure_operator())
    logging.getLogger("django.request").setLevel(logging.ERROR)  # not the 404 below
    client.get("/jobs/no-such-job/")  # the URL conf and the templates loaded: not a page's cost
    slow_name = node_name(SLOW_NODE)
    slow_ranks = set(range(SLOW_NODE * RANKS_PER_NODE, (SLOW_NODE + 1) * RANKS_PER_NODE))

    checks = []
    pages = [
        ("job page", f"/jobs/{JOB}/"),
        ("ranks API, first page", f"/api/v1/jobs/{JOB}/ranks"),
        ("overview, 2,048 nodes", "/"),
    ]
    print(f"{NODES:,} nodes x {RANKS_PER_NODE} ranks, {WINDOWS} windows; {args.n} timed requests")
    print(
        f"{'page':<24} {'first ms':>9} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}"
        f" {'live p95':>9} {'bytes':>9}  verdict"
    )
    ok_all = True
    for label, path in pages:
        first, first_ms, times, live = timed(client, path, n=args.n, warmup=args.warmup)
        ok = first.status_code == 200 and len(times) == len(live) == args.n
        ok = ok and max(pct(times, 0.95), pct(live, 0.95)) < TARGET_P95_MS
        ok_all &= ok
        figures = (
            f"{pct(times, 0.5):>8.1f} {pct(times, 0.95):>8.1f} {max(times):>8.1f}"
            f" {pct(live, 0.95) if live else float('nan'):>9.1f}"
            if times
            else f"{'':>8} {'':>8} {'':>8} {'':>9}"
        )
        status = "" if first.status_code == 200 else f" ({first.status_code})"
        print(
            f"{label:<24} {first_ms:>9.1f} {figures} {len(first.content):>9,}"
            f"  {verdict(ok)}{status}"
        )
        body = first.content.decode()
        if label == "job page":
            rows = heatmap_rows(body)
            found = [r for r in rows if r.startswith(f"{slow_name} ")]
            checks.append(
                (
                    f"heatmap: {len(rows)} rows; the slow node's: {found[0] if found else None}",
                    bool(found),
                )
            )
        elif label.startswith("ranks"):
            data = first.json()
            top = {r["rank"] for r in data["ranks"][: len(slow_ranks)]}
            checks.append(
                (
                    f"ranks API: count {data['count']:,}, slow {data['slow_count']},"
                    f" first page {len(data['ranks'])} ranks, led by the slow node's",
                    top == slow_ranks,
                )
            )
        else:
            ringed = f'incident" href="/nodes/{CLUSTER}/{slow_name}/"' in body
            checks.append((f"overview: {slow_name} ringed", ringed))
    for what, ok in checks:
        print(f"check {verdict(ok)}: {what}")
        ok_all &= ok
    print(
        f"load average (1 min) {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs;"
        f" target p95 < {TARGET_P95_MS:.0f} ms: {verdict(ok_all)}"
    )
    return 0 if ok_all else 2


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
