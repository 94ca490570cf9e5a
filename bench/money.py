"""What pricing lost compute costs the reads that show it: incidents' money
(incidents.costs) over a cluster whose nodes are in several priced pools, with big
launches, as the reliability report, the overview and the incident list read it.

    .venv/bin/python bench/money.py [--jobs 200] [--incidents 5000] [--nodes-per-launch 256]

Seeds its own database (`rebound_bench_money`, or --database-url; rows are kept and
reused while the sizes match; --reseed drops the database first) with plain rows: one cluster
priced per GPU-hour, 4 node pools (3 priced), 2,048 nodes, each job 3 launches on
`--nodes-per-launch` nodes (each launch with its count of nodes by pool, as ingest
keeps it), incidents spread over the last 30 days. Prints the median of `--n` runs of
each read and its query count: with the launches' counts, without them (as rows
written past the services; their nodes are counted), and with the cluster's price
alone.
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

from harness import pg_connect, setup_django

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_money"
POOLS = {"h100": Decimal("4.10"), "a100": Decimal("2.20"), "l40s": Decimal("1.30"), "spot": None}
NODES = 2048


def seed(n_jobs: int, n_incidents: int, per_launch: int):
    from django.db import transaction
    from django.utils import timezone

    from incidents.models import Incident
    from jobs.models import Attempt, Cluster, Node, NodePoolPrice, TrainingJob

    name = f"money-{n_jobs}-{n_incidents}-{per_launch}-counted"
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is not None:
        return cluster
    t = time.perf_counter()
    with transaction.atomic():
        cluster = Cluster.objects.create(name=name, gpu_hour_price=Decimal("2.50"))
        NodePoolPrice.objects.bulk_create(
            NodePoolPrice(cluster=cluster, pool=p, gpu_hour_price=v)
            for p, v in POOLS.items()
            if v is not None
        )
        pools = list(POOLS)
        nodes = Node.objects.bulk_create(
            Node(cluster=cluster, name=f"n{i:05d}", pool=pools[i % len(pools)])
            for i in range(NODES)
        )
        jobs = TrainingJob.objects.bulk_create(
            TrainingJob(cluster=cluster, key=f"{name}-job{j}") for j in range(n_jobs)
        )
        picks = [
            [nodes[(k * (per_launch // 3) + i) % NODES] for i in range(per_launch)]
            for k in range(3 * n_jobs)
        ]
        attempts = Attempt.objects.bulk_create(
            Attempt(
                job=job,
                number=k + 1,
                world_size=per_launch * 8,
                gpus_per_node=8,
                # Its nodes counted by pool, as ingest keeps them (jobs.services.lifecycle).
                pool_counts=dict(Counter(n.pool for n in picks[3 * j + k])),
            )
            for j, job in enumerate(jobs)
            for k in range(3)
        )
        through = Attempt.nodes.through
        rows = [
            through(attempt_id=a.pk, node_id=n.pk)
            for a, picked in zip(attempts, picks, strict=True)
            for n in picked
        ]
        through.objects.bulk_create(rows, batch_size=10_000)
        now = timezone.now()
        Incident.objects.bulk_create(
            Incident(
                job=jobs[i % n_jobs],
                cluster=cluster,
                detector="launch_fault",
                episode=f"e{i}",
                attempt=i % 3 + 1,
                cause=("gpu", "network", "software", "hang")[i % 4],
                severity="major",
                summary="bench",
                fault_at=now - timedelta(seconds=i * 30 * 86400 / n_incidents),
                detected_at=now - timedelta(seconds=i * 30 * 86400 / n_incidents),
                lost_gpu_seconds=3600.0 * (1 + i % 50),
            )
            for i in range(n_incidents)
        )
    from django.db import connection

    with connection.cursor() as c:  # as autovacuum would have, before anyone reads them
        for table in ("jobs_attempt", "jobs_attempt_nodes", "jobs_node", "incidents_incident"):
            c.execute(f"VACUUM ANALYZE {table}")
    print(f"seeded {name} in {time.perf_counter() - t:.1f} s")
    return cluster


def drop_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name.startswith("rebound_bench"):
        sys.exit(f"--reseed drops the database: only a rebound_bench* one, not {name!r}")
    with pg_connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(label: str, fn, n: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fn()  # warm
    times = []
    for _ in range(n):
        with CaptureQueriesContext(connection) as q:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    print(f"  {label:<58} {statistics.median(times) * 1000:8.1f} ms  {len(q)} queries")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--incidents", type=int, default=5000)
    ap.add_argument("--nodes-per-launch", type=int, default=256)
    ap.add_argument("--n", type=int, default=5, help="timed runs of each read")
    ap.add_argument("--reseed", action="store_true")
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "")
    args = ap.parse_args()
    url = args.database_url or DEFAULT_DATABASE_URL
    if args.reseed:
        drop_database(url)
    setup_django(url)
    from django.db import transaction
    from django.utils import timezone

    from incidents.costs import incident_costs
    from incidents.models import Incident
    from jobs.models import Attempt, NodePoolPrice

    cluster = seed(args.jobs, args.incidents, args.nodes_per_launch)
    now = timezone.now()
    qs = Incident.objects.filter(cluster=cluster)
    rows = list(qs.values_list("pk", "cluster_id", "job_id", "attempt", "lost_gpu_seconds"))
    priced = sum(c is not None for c in incident_costs(rows).values())
    print(
        f"{len(rows)} incidents of {args.jobs} jobs, launches of {args.nodes_per_launch} nodes"
        f" in 4 pools, 3 priced ({priced} incidents priced)"
    )
    print("with node pool prices (each launch's count of its nodes by pool, as ingest keeps it):")
    run_all(cluster, rows, now, args.n)
    with transaction.atomic():
        Attempt.objects.filter(job__cluster=cluster).update(pool_counts=None)
        print("with node pool prices, launches without their count (their nodes counted):")
        run_all(cluster, rows, now, args.n)
        transaction.set_rollback(True)
    with transaction.atomic():
        NodePoolPrice.objects.filter(cluster=cluster).delete()
        print("the cluster's price alone (no pools: no nodes read):")
        run_all(cluster, rows, now, args.n)
        transaction.set_rollback(True)
    return 0


def run_all(cluster, rows, now, n: int) -> None:
    from incidents import selectors
    from incidents.costs import attach_costs, incident_costs, lost_recent

    args = argparse.Namespace(n=n)
    measure("incident_costs, every incident", lambda: incident_costs(rows), args.n)
    page = list(selectors.incident_list(cluster=cluster.name)[:100])
    measure("attach_costs, a page of 100", lambda: attach_costs(page), args.n)

    def report(money: bool):
        def run():
            r = selectors.reliability(cluster=cluster.name, start=now - timedelta(days=30), end=now)
            assert not money or r["lost_cost"]

        return run

    measure("reliability(), 30 days (with its money)", report(True), args.n)
    measure("lost_recent (overview: GPU-hours and money, 7 days)", lost_recent, args.n)
    measure(
        "lost_gpu_hours_recent (overview: GPU-hours, before)",
        selectors.lost_gpu_hours_recent,
        args.n,
    )


if __name__ == "__main__":
    sys.exit(main())
