"""Reads of the incidents app."""

from datetime import timedelta
from statistics import median

from django.db.models import Count, Min, Prefetch, Q, QuerySet
from django.utils import timezone

from incidents.models import Incident, TimelineEntry
from jobs.models import Attempt, Node, RankWindow


def incident_list(
    *,
    job: str | None = None,
    cluster: str | None = None,
    cause: str | None = None,
    state: str | None = None,
    since=None,
    until=None,
) -> QuerySet[Incident]:
    qs = Incident.objects.select_related("job", "cluster").prefetch_related(
        Prefetch("nodes", queryset=Node.objects.only("id", "name"))
    )
    if job:
        qs = qs.filter(job__key=job)
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if cause:
        qs = qs.filter(cause=cause)
    if state:
        qs = qs.filter(state=state)
    if since is not None:
        qs = qs.filter(fault_at__gte=since)
    if until is not None:
        qs = qs.filter(fault_at__lt=until)
    return qs.order_by("-fault_at", "-id")


def incident_detail(*, pk: int) -> Incident | None:
    return (
        incident_list()
        .prefetch_related(Prefetch("timeline", queryset=TimelineEntry.objects.order_by("at", "id")))
        .filter(pk=pk)
        .first()
    )


REPEAT_OFFENDER_MIN = 3  # incidents in the period that make a node a repeat offender


def _percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation, as numpy's default."""
    if not values:
        return None
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _summary(values: list[float]) -> dict:
    return {
        "count": len(values),
        "mean_s": sum(values) / len(values) if values else None,
        "p50_s": _percentile(values, 0.5),
        "p90_s": _percentile(values, 0.9),
    }


def reliability(*, cluster: str | None, start, end) -> dict:
    """Failures in [start, end): by cause, MTBF, times to resume and recover, lost
    GPU-hours by cause, and the nodes in several of them."""
    incidents = list(incident_list(cluster=cluster, since=start, until=end))
    total = len(incidents)
    by_cause: dict[str, dict] = {}
    for i in incidents:
        c = by_cause.setdefault(i.cause, {"count": 0, "lost_gpu_hours": 0.0})
        c["count"] += 1
        c["lost_gpu_hours"] += i.lost_gpu_hours
    for c in by_cause.values():
        c["share"] = c["count"] / total
    node_counts: dict[str, int] = {}
    for i in incidents:
        for n in i.nodes.all():
            node_counts[n.name] = node_counts.get(n.name, 0) + 1
    period_s = (end - start).total_seconds()
    return {
        "cluster": cluster,
        "start": start,
        "end": end,
        "failures": total,
        "mtbf_s": period_s / total if total else None,
        "by_cause": dict(sorted(by_cause.items(), key=lambda kv: -kv[1]["count"])),
        "time_to_resume": _summary([i.time_to_resume_s for i in incidents if i.resumed_at]),
        "time_to_recover": _summary([i.time_to_recover_s for i in incidents if i.recovered_at]),
        "lost_gpu_hours": sum(i.lost_gpu_hours for i in incidents),
        "repeat_offenders": [
            {"node": name, "incidents": n}
            for name, n in sorted(node_counts.items(), key=lambda kv: (-kv[1], kv[0]))
            if n >= REPEAT_OFFENDER_MIN
        ],
    }


def node_list(*, cluster: str | None = None, state: str | None = None, now=None):
    """Nodes with their incidents in the last 7 and 30 days (by fault time)."""
    now = now or timezone.now()
    qs = Node.objects.select_related("cluster").annotate(
        incidents_7d=Count("incidents", filter=Q(incidents__fault_at__gte=now - timedelta(days=7))),
        incidents_30d=Count(
            "incidents", filter=Q(incidents__fault_at__gte=now - timedelta(days=30))
        ),
    )
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if state:
        qs = qs.filter(state=state)
    return qs.order_by("cluster__name", "name")


SLOW_SCORE = 0.75  # below this a rank is slow (NVIDIA's resiliency extension's threshold)


def job_rank_scores(*, job) -> dict:
    """The latest complete window of the job's current launch, scored per rank.

    `peer_score` = the median of all ranks' compute time in the window / this
    rank's; `self_score` = this rank's best compute time in the launch / this
    one's, relative to the median rank's (so a uniform slowdown scores 1).
    Below 0.75 is slow. Reads O(ranks x windows of the launch), not the job.
    """
    attempt = job.attempts.exclude(started_at=None).order_by("-number").first()
    if attempt is None:
        attempt = Attempt.objects.filter(job=job).order_by("-number").first()
    empty = {"job": job.key, "attempt": None, "first_step": None, "last_step": None, "ranks": []}
    if attempt is None:
        return empty
    windows = RankWindow.objects.filter(job=job, attempt=attempt.number)
    world = attempt.world_size
    # The latest window every rank has reported.
    per_window = windows.values("first_step").annotate(n=Count("rank")).order_by("-first_step")
    if world:
        per_window = per_window.filter(n__gte=world)
    latest = per_window.first()
    if latest is None:
        return {**empty, "attempt": attempt.number}
    rows = list(
        windows.filter(first_step=latest["first_step"]).select_related("node").order_by("rank")
    )
    best = dict(windows.values("rank").annotate(best=Min("compute_s")).values_list("rank", "best"))
    mid = median(r.compute_s for r in rows)
    degradation = {r.rank: (best[r.rank] / r.compute_s if r.compute_s else 1.0) for r in rows}
    mid_degradation = median(degradation.values()) or 1.0
    ranks = []
    for r in rows:
        peer = mid / r.compute_s if r.compute_s else 1.0
        own = degradation[r.rank] / mid_degradation
        ranks.append(
            {
                "rank": r.rank,
                "node": r.node.name if r.node else None,
                "compute_s": r.compute_s,
                "step_s": r.step_s,
                "comm_wait_s": r.comm_wait_s,
                "peer_score": peer,
                "self_score": own,
                "slow": peer < SLOW_SCORE or own < SLOW_SCORE,
            }
        )
    return {
        "job": job.key,
        "attempt": attempt.number,
        "first_step": latest["first_step"],
        "last_step": rows[0].last_step,
        "ranks": ranks,
    }
