"""Node liveness writes and a late heartbeat's detection cost, at 2,048 nodes.

    .venv/bin/python bench/liveness.py [--nodes 2048] [--ranks-per-node 8]
        [--seconds 60] [--batch 1000] [--history-steps 3000] [--history-nodes 32]
        [--database-url postgres://...]

In this process, on its own PostgreSQL database (`rebound_bench` by default),
through the ingest service (its Celery hand-offs switched off):

1. Liveness writes. Every rank of --nodes nodes sends a heartbeat every 10 s
   (the node agent's rate), spread evenly, for --seconds of wall time (paced to
   it: a node's `last_heard_at` is the console's clock), in batches of --batch.
   Run twice: with REBOUND_NODE_LIVENESS_S at 0 (every batch rewrites each of
   its nodes, as before the setting) and at its default. Prints jobs_node's
   pg_stat_user_tables deltas (n_tup_upd, n_tup_hot_upd, n_dead_tup; autovacuum
   and page pruning may lower the last) and the ingest rate (events per second
   of ingest time).
2. A late heartbeat. A job with a long history (--history-nodes nodes, 8 ranks
   each, a rank window per rank every 10 steps, heartbeats every 10 s) whose
   detection state is up to date gets one node's heartbeat from the middle of
   the history late (far behind the buckets read). Prints the detection pass that takes them in
   (that node's buckets read again) against a pass that rebuilds the state from
   the whole history (what every late heartbeat cost before), and checks both
   find the same.
"""

import argparse
import sys
import time
import uuid

from harness import DEFAULT_DATABASE_URL, setup_django

BEAT_EVERY_S = 10.0
T0 = 1_790_000_000.0


def node_stats(cursor) -> dict[str, int]:
    # Counters reach the view once flushed; this backend's are flushed on request.
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup FROM pg_stat_user_tables"
        " WHERE relname = 'jobs_node'"
    )
    upd, hot, dead = cursor.fetchone()
    return {"n_tup_upd": upd, "n_tup_hot_upd": hot, "n_dead_tup": dead}


def liveness_run(args, granularity: float) -> dict:
    from django.conf import settings
    from django.db import connection

    from jobs import services
    from jobs.wire import validate_events

    settings.REBOUND_NODE_LIVENESS_S = granularity
    run = uuid.uuid4().hex[:6]
    cluster = services.cluster_get_or_create(name="bench-liveness")
    job = f"liveness-{run}"
    ranks = args.nodes * args.ranks_per_node
    per_s = ranks / BEAT_EVERY_S
    total = int(per_s * args.seconds)
    # The nodes exist before the run, as they do on a cluster that has been up.
    names = [f"lv{run}-{n:04d}" for n in range(args.nodes)]
    services.events_ingest(
        cluster=cluster,
        events=validate_events(
            [
                {"id": f"{job}-boot-{n}", "job": job, "kind": "heartbeat", "ts": T0, "node": name}
                for n, name in enumerate(names)
            ],
            args.nodes,
        )[0],
    )
    time.sleep(1.1)  # past the stats flush interval
    with connection.cursor() as cursor:
        before = node_stats(cursor)
    ingest_s, sent, k = 0.0, 0, 0
    start = time.monotonic()
    while sent < total:
        batch = []
        for i in range(sent, min(sent + args.batch, total)):
            rank = (i * 7919) % ranks  # each period, every rank once, the nodes interleaved
            ts = T0 + 1 + i / per_s
            batch.append(
                {
                    "id": f"{job}-{i}",
                    "job": job,
                    "kind": "heartbeat",
                    "ts": round(ts, 6),
                    "node": names[rank // args.ranks_per_node],
                    "rank": rank,
                }
            )
        events, errors = validate_events(batch, len(batch))
        assert not errors, errors[:3]
        # Paced: this batch is due when the wall clock reaches its last event's time.
        due = start + (sent + len(batch)) / per_s
        time.sleep(max(0.0, due - time.monotonic()))
        t = time.perf_counter()
        services.events_ingest(cluster=cluster, events=events)
        ingest_s += time.perf_counter() - t
        sent += len(batch)
        k += 1
    time.sleep(1.1)
    with connection.cursor() as cursor:
        after = node_stats(cursor)
    delta = {key: after[key] - before[key] for key in before}
    out = {"granularity": granularity, "events": sent, "batches": k, "rate": sent / ingest_s}
    return out | delta


def history_events(job: str, nodes: list[str], steps: int, hold: str) -> tuple[list, list]:
    """A launch's steps, rank windows and heartbeats (every node every 10 s); the
    heartbeat of `hold` after steps/2 is returned apart, to be sent late."""
    ranks = len(nodes) * 8
    out = [
        {"id": f"{job}-start", "job": job, "kind": "attempt_started", "ts": T0, "attempt": 1}
        | {"data": {"world_size": ranks, "gpus_per_node": 8, "nodes": nodes}},
        {"id": f"{job}-ready", "job": job, "kind": "ready", "ts": T0 + 5, "attempt": 1},
    ]
    held = []
    for step in range(1, steps + 1):
        ts = T0 + 10 + step
        out.append(
            {"id": f"{job}-s{step}", "job": job, "kind": "step", "ts": ts, "attempt": 1}
            | {"data": {"step": step, "loss": 3.0 / (1 + 0.001 * step)}}
        )
        if step % 10 == 0:
            for rank in range(ranks):
                window = {"first_step": step - 9, "last_step": step, "step_s": 1.0}
                window["compute_s"] = 0.8 + 0.001 * (rank % 7)
                out.append(
                    {"id": f"{job}-w{step}-{rank}", "job": job, "kind": "rank_window", "ts": ts}
                    | {"attempt": 1, "rank": rank, "node": nodes[rank // 8], "data": window}
                )
            for n, node in enumerate(nodes):
                beat = {"id": f"{job}-h{step}-{n}", "job": job, "kind": "heartbeat"}
                beat |= {"ts": ts + 0.01 * n, "node": node}
                late = node == hold and steps // 2 < step <= steps // 2 + 10
                (held if late else out).append(beat)
    return out, held


def late_heartbeat(args) -> dict:
    from django.db import connection

    from incidents.detectors.engine import watch_job
    from incidents.models import DetectorState
    from incidents.settings import detector_settings
    from jobs import services
    from jobs.models import TrainingJob
    from jobs.wire import validate_events

    run = uuid.uuid4().hex[:6]
    cluster = services.cluster_get_or_create(name="bench-liveness")
    key = f"history-{run}"
    nodes = [f"hs{run}-{n:03d}" for n in range(args.history_nodes)]
    hold = nodes[len(nodes) // 2]
    events, held = history_events(key, nodes, args.history_steps, hold)
    t = time.perf_counter()
    for i in range(0, len(events), args.batch):
        batch, errors = validate_events(events[i : i + args.batch], args.batch)
        assert not errors, errors[:3]
        services.events_ingest(cluster=cluster, events=batch)
        job = TrainingJob.objects.get(key=key)
        if (i // args.batch) % 20 == 0:  # the worker's passes keep the state current
            watch_job(job, detector_settings(job))
    job = TrainingJob.objects.get(key=key)
    t_in = time.perf_counter()
    watch_job(job, detector_settings(job))
    in_order_s = time.perf_counter() - t_in
    history_s = time.perf_counter() - t
    state = DetectorState.objects.get(job=job).data

    batch, errors = validate_events(held, len(held))
    assert not errors, errors[:3]
    services.events_ingest(cluster=cluster, events=batch)
    job = TrainingJob.objects.get(key=key)
    t = time.perf_counter()
    late = watch_job(job, detector_settings(job))
    late_s = time.perf_counter() - t
    assert not late.rebuilt and late.nodes_reread == [hold], (late.rebuilt, late.nodes_reread)

    # As before: the same late heartbeats from the same state, rebuilding from every row.
    DetectorState.objects.filter(job=job).update(data={})
    t = time.perf_counter()
    rebuilt = watch_job(job, detector_settings(job))
    rebuild_s = time.perf_counter() - t
    assert rebuilt.rebuilt
    DetectorState.objects.filter(job=job).update(data=state)  # (left as found)

    def found(w):
        return (
            [(s.client_id, s.ts, s.data) for s in w.dead_nodes + w.hangs + w.losses],
            [(s.node, s.first_ts, s.windows) for s in w.stragglers],
        )

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobs_rankwindow WHERE job_id = %s", [job.id])
        windows = cursor.fetchone()[0]
    return {
        "events": len(events) + len(held),
        "windows": windows,
        "history_s": history_s,
        "in_order_s": in_order_s,
        "late_s": late_s,
        "rebuild_s": rebuild_s,
        "same": found(late) == found(rebuilt),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--history-steps", type=int, default=3000)
    p.add_argument("--history-nodes", type=int, default=32)
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = p.parse_args()
    setup_django(args.database_url)

    import jobs.services.ingest as ingest

    ingest.events_follow_up_enqueue = lambda *a, **k: None  # no Celery hand-offs here

    from django.conf import settings

    default = settings.REBOUND_NODE_LIVENESS_S
    ranks = args.nodes * args.ranks_per_node
    print(
        f"liveness: {args.nodes:,} nodes, {ranks:,} ranks each heartbeating every"
        f" {BEAT_EVERY_S:.0f} s, {args.seconds:.0f} s paced, batches of {args.batch:,}"
    )
    print(
        f"{'REBOUND_NODE_LIVENESS_S':>24} {'events':>8} {'batches':>8} {'events/s':>9}"
        f" {'n_tup_upd':>10} {'n_tup_hot_upd':>14} {'n_dead_tup':>11}"
    )
    for granularity in (0.0, default):
        r = liveness_run(args, granularity)
        print(
            f"{r['granularity']:>24g} {r['events']:>8,} {r['batches']:>8,} {r['rate']:>9,.0f}"
            f" {r['n_tup_upd']:>10,} {r['n_tup_hot_upd']:>14,} {r['n_dead_tup']:>11,}"
        )
    settings.REBOUND_NODE_LIVENESS_S = default

    h = late_heartbeat(args)
    print()
    print(
        f"late heartbeat: a job of {h['events']:,} events ({args.history_nodes} nodes,"
        f" {h['windows']:,} rank windows; stored and watched in {h['history_s']:.1f} s)"
    )
    print(f"  an in-order pass (the last batches):      {h['in_order_s'] * 1000:8.1f} ms")
    print(f"  the pass after one node's late heartbeat: {h['late_s'] * 1000:8.1f} ms")
    print(f"  a rebuild from the whole history (before): {h['rebuild_s'] * 1000:7.1f} ms")
    print(f"  same findings both ways: {'yes' if h['same'] else 'NO'}")
    return 0 if h["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
