"""Alertmanager's webhook: how long Rebound takes to answer a delivery, with the incident
already open when it answers.

    .venv/bin/python bench/alerts.py [--runs 40] [--database-url postgres://...]

Starts a real gunicorn server (one worker) on a database of its own. Per run: a new
job's launch on 8 nodes is ingested, then a delivery of one firing DCGM Xid alert for
one of its nodes is posted to /api/v1/alerts/alertmanager and timed to its answer (the
incident must be in it: opened by the quick detection pass inside the request), then
the same delivery again (a repeat, as repeat_interval sends it), then its resolve (the
incident resolved). Last, one delivery of 100 alerts, one per node of a 100-node job.
Prints p50, p95 and max of each. The follow-up work the server asks for (the full
detection pass, the ledger) goes to a filesystem broker of this run that no worker
reads: what is timed is the webhook alone. Everything is on 127.0.0.1.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

import requests
from harness import DEFAULT_DATABASE_URL, setup_django
from ingest import free_port, start_server, stop_server, wait_ready

T0 = 1_790_000_000.0
STARTS = "2026-09-21T12:00:00Z"  # after T0: while the launches run


def alert(node: str, fingerprint: str, status: str = "firing") -> dict:
    return {
        "status": status,
        "labels": {"alertname": "GpuXidError", "Hostname": node, "err_code": "79", "gpu": "0"},
        "annotations": {"summary": "Xid 79 (GPU fell off the bus)"},
        "startsAt": STARTS,
        "endsAt": "2026-09-21T12:05:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def payload(alerts: list[dict]) -> dict:
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": alerts[0]["status"],
        "receiver": "rebound",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": alerts,
    }


def figures(name: str, seconds: list[float]) -> None:
    seconds = sorted(seconds)
    p95 = seconds[max(0, round(0.95 * len(seconds)) - 1)]
    print(
        f"  {name}: p50 {statistics.median(seconds) * 1000:.0f} ms,"
        f" p95 {p95 * 1000:.0f} ms, max {seconds[-1] * 1000:.0f} ms ({len(seconds)} runs)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    args = ap.parse_args()
    os.environ.pop("REDIS_URL", None)  # the server's follow-up work: to a broker nobody reads
    setup_django(args.database_url)
    from console.services import token_issue
    from jobs.models import Cluster, TrainingJob

    run_id = uuid.uuid4().hex[:8]
    cluster_name = f"bench-alerts-{run_id}"
    token_obj, token = token_issue(scope="ingest", cluster_name=cluster_name)
    port = free_port()
    server = start_server(args.database_url, 1, port, tempfile.mkdtemp(prefix="rb-bench-alerts-"))
    base = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.trust_env = False
    session.headers["Authorization"] = f"Bearer {token}"

    def launch(job: str, nodes: list[str]) -> None:
        events = [
            {"id": "s", "job": job, "kind": "attempt_started", "ts": T0, "attempt": 1,
             "data": {"world_size": 8 * len(nodes), "gpus_per_node": 8, "nodes": nodes}},
            {"id": "t", "job": job, "kind": "step", "ts": T0 + 5, "attempt": 1,
             "data": {"step": 1}},
        ]  # fmt: skip
        r = session.post(f"{base}/api/v1/ingest", json={"events": events}, timeout=30)
        if r.status_code != 202:
            sys.exit(f"ingest answered {r.status_code}: {r.text[:300]}")

    def deliver(alerts: list[dict]) -> tuple[float, dict]:
        began = time.perf_counter()
        r = session.post(f"{base}/api/v1/alerts/alertmanager", json=payload(alerts), timeout=60)
        took = time.perf_counter() - began
        if r.status_code != 200:
            sys.exit(f"the webhook answered {r.status_code}: {r.text[:300]}")
        return took, r.json()

    new, repeat, resolve = [], [], []
    try:
        wait_ready(server, base)
        for run in range(args.runs):
            job = f"{cluster_name}-{run:03d}"
            nodes = [f"{job}-n{k}" for k in range(8)]
            launch(job, nodes)
            fired = [alert(nodes[3], f"{run_id}{run:08x}")]
            took, answer = deliver(fired)
            if not answer["alerts"][0]["incidents"]:
                sys.exit(f"run {run}: no incident in the webhook's answer: {answer}")
            new.append(took)
            took, answer = deliver(fired)
            assert answer["repeats"] == 1, answer
            repeat.append(took)
            took, answer = deliver([alert(nodes[3], f"{run_id}{run:08x}", "resolved")])
            assert answer["resolved"] == 1, answer
            resolve.append(took)
        job = f"{cluster_name}-wide"
        nodes = [f"{job}-n{k:03d}" for k in range(100)]
        launch(job, nodes)
        wide, answer = deliver([alert(n, f"{run_id}w{k:07x}") for k, n in enumerate(nodes)])
        assert answer["new"] == 100 and all(a["incidents"] for a in answer["alerts"]), answer
    finally:
        stop_server(server)
        token_obj.delete()
        for job in TrainingJob.objects.filter(cluster__name=cluster_name):
            job.delete()
        Cluster.objects.filter(name=cluster_name).delete()

    print("Alertmanager webhook, answer time (1 gunicorn worker, PostgreSQL, on 127.0.0.1):")
    figures("a firing alert, its incident opened in the request", new)
    figures("the same delivery again (a repeat)", repeat)
    figures("its resolve, the incident resolved", resolve)
    print(f"  100 alerts in one delivery, one per node of a 100-node job: {wide * 1000:.0f} ms")


if __name__ == "__main__":
    main()
