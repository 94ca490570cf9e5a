"""The dead-node detector: a node of a launch that had been sending heartbeats and
stopped for longer than `dead_node.timeout_s` while the launch went on (on the
job's clock). Nodes that never sent a heartbeat in the launch are not expected to.

Per node the state keeps every silence longer than the timeout between buckets
that can no longer change, and its latest buckets, which it re-reads each pass.
A node's view depends on its own buckets alone: a heartbeat that lands behind
them (a late batch) makes the pass read that node's buckets again, not the
job's whole history.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F

from incidents.detectors.base import Signal, launch_stop
from incidents.detectors.state import EngineState, NodeBeats
from jobs.models import Attempt, HeartbeatBucket

OPEN_BUCKETS = 2  # a node's latest buckets may still fill (its ranks report out of step)
COLUMNS = ("id", "node", "bucket", "first_ts", "last_ts")


@dataclass
class Beats:
    dead: list[Signal]
    reread: list[str]  # nodes whose view was read again: a heartbeat landed behind it


def advance(job, state: EngineState, launches, finished, upto: int, cfg) -> Beats:
    """Read the heartbeat buckets stored since the last pass; the dead nodes of every
    launch so far."""
    timeout = max(cfg["dead_node.timeout_s"], HeartbeatBucket.BUCKET_S)
    beats = state.beats
    heads = [o[0] for b in beats.values() for o in b.open]
    after = state.cursor["beat"]
    if after:  # the buckets stored since, by id range (see engine._rows), and the open ones
        rows = list(
            HeartbeatBucket.objects.filter(id__gt=after, id__lte=upto)
            .annotate(job_plus=F("job_id") + 0)
            .filter(job_plus=job.id)
            .values_list(*COLUMNS)
        )
        rows += HeartbeatBucket.objects.filter(id__in=heads, job=job).values_list(*COLUMNS)
    else:
        rows = HeartbeatBucket.objects.filter(job=job, id__lte=upto).values_list(*COLUMNS)
    by_node: dict[str, list] = {}
    for row in rows:
        by_node.setdefault(row[1], []).append(row)
    reread = []
    for node, node_rows in by_node.items():
        b = beats.setdefault(node, NodeBeats())
        if b.open and min(row[2] for row in node_rows) < b.open[0][1]:
            # A heartbeat behind the buckets read: only this node's view is wrong,
            # so it alone is read again, from all of its buckets.
            reread.append(node)
            b = beats[node] = NodeBeats()
            node_rows = HeartbeatBucket.objects.filter(
                job=job, node=node, id__lte=upto
            ).values_list(*COLUMNS)
        _fold(b, node_rows, timeout)

    return Beats(_dead_nodes(job, beats, launches, finished, timeout), reread)


def _fold(b: NodeBeats, node_rows, timeout: float) -> None:
    """Take a node's new buckets (or all of them, into a fresh NodeBeats) in."""
    buckets = {o[1]: list(o) for o in b.open}
    for id_, _, bucket, first, last in node_rows:
        buckets[bucket] = [id_, bucket, first, last]
    ordered = sorted(buckets.values(), key=lambda o: o[1])
    for o in ordered[:-OPEN_BUCKETS]:  # these can no longer change
        if b.closed_last is not None and o[2] - b.closed_last > timeout:
            b.silences.append([b.closed_last, o[2]])
        # A bucket filled late may lie inside a span that storage upkeep merged.
        b.closed_last = o[3] if b.closed_last is None else max(b.closed_last, o[3])
    b.open = ordered[-OPEN_BUCKETS:]


def _dead_nodes(job, beats: dict[str, NodeBeats], launches, finished, timeout) -> list[Signal]:
    found = []
    attempts = {
        a.number: a
        for a in Attempt.objects.filter(job=job, number__in=[x.number for x in launches])
        .exclude(started_at=None)
        .prefetch_related("nodes")
    }
    for k, launch in enumerate(launches):
        attempt = attempts.get(launch.number)
        stop = launch_stop(job, launches, k, finished)
        if attempt is None or stop is None:
            continue
        start = attempt.started_at.timestamp()
        for node in attempt.nodes.all():
            b = beats.get(node.name)
            if b is None:
                continue
            silences = list(b.silences)
            last = b.closed_last
            for o in b.open:
                if last is not None and o[2] - last > timeout:
                    silences.append([last, o[2]])
                last = o[3] if last is None else max(last, o[3])
            gaps = [(a, min(z, stop) - a) for a, z in silences] + [(last, stop - last)]
            over = [(a, gap) for a, gap in gaps if start <= a <= stop and gap > timeout]
            if not over:
                continue
            silent_from, gap = over[0]
            found.append(
                Signal(
                    client_id=f"inferred:dead_node:{launch.number}:{node.name}",
                    kind="fault",
                    ts=silent_from,
                    attempt=launch.number,
                    node=node.name,
                    rank=None,
                    data={"type": "dead_node", "silent_s": float(gap)},
                    detected_ts=silent_from + timeout,
                )
            )
    return found
