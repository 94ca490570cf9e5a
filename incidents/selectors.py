"""Reads of the incidents app: incident lists and details, reliability figures (MTBF,
causes, repeat offenders, goodput by week), the nodes' incident counts, and the
ranks of a job's latest window as the straggler detector scores them, and the alerts
Alertmanager sent (with the launches running on a node, which an alert is about).

Long module: the app's reads, one reader's helpers beside it, so that the failure
definition and every figure built on it sit side by side; what incidents cost in money
is in incidents.costs."""

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db.models import Count, Exists, Max, Min, OuterRef, Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from incidents.costs import incident_costs, totals
from incidents.detectors.ranks import rank_scores
from incidents.models import Alert, Incident, TimelineEntry
from jobs.models import Attempt, Node, RankWindow, TrainingJob
from jobs.selectors import job_latest_attempt


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


# --- what counts as a failure ------------------------------------------------------------
# One definition for every figure that counts failures (the reliability report and its
# API, MTBF, the job page's what-if), said in these words on the pages.

FAILURE_DEFINITION = (
    "A failure is an incident that interrupted a launch (a crash, a hang, a lost GPU, a"
    " preemption...). A straggler slows a job without interrupting it: it counts only"
    " when an action restarted the job for it. An interruption inside a declared"
    " maintenance window (cause planned) is not a failure: its cost is shown apart."
)
# Recovery's actions that restart the job (recovery.models.Action.Kind values; this app
# sees them on the timeline entries recovery writes, and does not import it).
RESTARTING_ACTIONS = (
    "restart_job",
    "rollback",
    "replace_node",
    "replace_at_next_checkpoint",
    "scale_down",
    "drain_node",
)


def is_failure() -> Q:
    """The condition on incidents that makes one a failure (FAILURE_DEFINITION): it is
    tied to a launch and is not a straggler, or an action restarted the job for it. An
    incident tied to no launch (a crash loop, a repeat offender) sums up others. A
    planned interruption (inside a maintenance window) is never a failure."""
    restarted = TimelineEntry.objects.filter(
        incident=OuterRef("pk"),
        kind=TimelineEntry.Kind.ACTION,
        data__kind__in=RESTARTING_ACTIONS,
        data__to="succeeded",
    )
    interrupted = Q(attempt__isnull=False) & ~Q(cause=Incident.Cause.STRAGGLER)
    return (interrupted | Q(Exists(restarted))) & ~Q(cause=Incident.Cause.PLANNED)


REPEAT_OFFENDER_MIN = 3  # incidents in the period that make a node a repeat offender
RELIABILITY_DEFAULT_DAYS = 30  # the period of the reliability figures when none is asked


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


# What incidents.costs prices an incident by, as rows of values_list.
COST_FIELDS = ("pk", "cluster_id", "job_id", "attempt", "lost_gpu_seconds")


def reliability(*, cluster: str | None, start, end) -> dict:
    """Incidents with a fault in [start, end): the failures among them (is_failure) and
    MTBF, by cause the incidents, failures, lost GPU-hours and their cost (per
    currency, incidents.costs), times to resume and recover, and the nodes in
    several incidents.

    Reads plain rows (no model instances) and counts nodes in SQL: the report
    pages ask for hundreds of incidents at a time."""
    qs = incident_list(cluster=cluster, since=start, until=end).prefetch_related(None)
    rows = list(
        qs.annotate(failure=is_failure()).values_list(
            "cause",
            "lost_gpu_seconds",
            "fault_at",
            "resumed_at",
            "recovered_at",
            "failure",
            *COST_FIELDS,
        )
    )
    total = len(rows)
    failures = sum(1 for r in rows if r[5])
    costs = incident_costs(r[6:] for r in rows)
    by_cause: dict[str, dict] = {}
    for cause, lost_s, _, _, _, failure, pk, *_ in rows:
        c = by_cause.setdefault(
            cause, {"count": 0, "failures": 0, "lost_gpu_hours": 0.0, "costs": []}
        )
        c["count"] += 1
        c["failures"] += bool(failure)
        c["lost_gpu_hours"] += lost_s / 3600.0
        c["costs"].append(costs[pk])
    for c in by_cause.values():
        c["lost_cost"] = totals(c.pop("costs"))
        c["share"] = c["count"] / total
        c["failure_share"] = c["failures"] / failures if failures else 0.0
    node_counts = dict(
        Incident.nodes.through.objects.filter(incident__in=qs.values("pk"))
        .values("node__name")
        .annotate(n=Count("incident"))
        .values_list("node__name", "n")
    )
    period_s = (end - start).total_seconds()
    planned = by_cause.get(Incident.Cause.PLANNED, {})
    return {
        "cluster": cluster,
        "start": start,
        "end": end,
        "incidents": total,
        "failures": failures,
        "mtbf_s": period_s / failures if failures else None,
        "by_cause": dict(
            sorted(by_cause.items(), key=lambda kv: (-kv[1]["failures"], -kv[1]["count"]))
        ),
        "time_to_resume": _summary([(r[3] - r[2]).total_seconds() for r in rows if r[3]]),
        "time_to_recover": _summary([(r[4] - r[2]).total_seconds() for r in rows if r[4]]),
        "lost_gpu_hours": sum(r[1] / 3600.0 for r in rows),
        "lost_cost": totals(costs.values()),
        "unpriced_lost_gpu_hours": sum(r[1] / 3600.0 for r in rows if costs[r[6]] is None),
        # Interruptions inside maintenance windows, apart (also under by_cause).
        "planned": {
            "count": planned.get("count", 0),
            "lost_gpu_hours": planned.get("lost_gpu_hours", 0.0),
        },
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


_WINDOW_FIELDS = ("rank", "node", "compute_s", "step_s", "comm_wait_s")  # as stored
RANK_FIELDS = (*_WINDOW_FIELDS, "peer_score", "self_score", "slow")  # and as scored
RANK_ORDERS = ("slowest", "rank")


def job_rank_scores(*, job) -> dict:
    """The latest complete window of the job's current launch, scored per rank: each
    rank a tuple of RANK_FIELDS in rank order (quick to cache and read back), `slowest`
    their indexes slowest first (the lower score, then by rank), and `slow_count`.
    The API pages it (`rank_scores_page`, recent-cached by
    incidents.services.job_rank_scores_ensure).

    `peer_score` and `self_score` (own) as incidents.detectors.ranks scores them
    (the straggler detector's rule): the lower quartile of the window's compute
    times / this rank's, and this rank's best in the launch / this one's relative
    to the upper quartile's (so a uniform slowdown scores 1). Four queries, reading
    O(ranks x windows of the launch), not the job.
    """
    attempt = job_latest_attempt(job, started=True)
    empty = {
        "job": job.key,
        "attempt": None,
        "first_step": None,
        "last_step": None,
        "world_size": None,
        "ranks": [],
        "slowest": [],
        "slow_count": 0,
    }
    if attempt is None:
        return empty
    empty.update(attempt=attempt.number, world_size=attempt.world_size)
    windows = RankWindow.objects.filter(job=job, attempt=attempt.number)
    world = attempt.world_size
    # The latest window every rank has reported.
    per_window = (
        windows.values("first_step")
        .annotate(n=Count("rank", distinct=True))
        .order_by("-first_step")
    )
    if world:
        per_window = per_window.filter(n__gte=world)
    latest = per_window.first()
    if latest is None:
        return empty
    stored = windows.filter(first_step=latest["first_step"]).order_by("rank", "id")
    fields = ("rank", "node__name", "compute_s", "step_s", "comm_wait_s", "last_step")
    rows = []  # a rank's window stored twice (a copy): the first
    for r in stored.values_list(*fields):
        if not rows or rows[-1][0] != r[0]:
            rows.append(r)
    best = dict(windows.values("rank").annotate(best=Min("compute_s")).values_list("rank", "best"))
    peer, own, slow = rank_scores(
        np.array([[r[2] for r in rows]], dtype=np.float64),
        np.array([[best[r[0]] for r in rows]], dtype=np.float64),
    )
    peer, own, slow = peer[0], own[0], slow[0]
    ranks = [
        (rank, node, compute, step, comm_wait, p, o, sl)
        for (rank, node, compute, step, comm_wait, _), p, o, sl in zip(
            rows, peer.tolist(), own.tolist(), slow.tolist(), strict=True
        )
    ]
    # stable: ties stay in rank order
    slowest = np.argsort(np.minimum(peer, own), kind="stable").tolist()
    return {
        **empty,
        "first_step": latest["first_step"],
        "last_step": rows[0][5],
        "world_size": world or len(rows),
        "ranks": ranks,
        "slowest": slowest,
        "slow_count": int(slow.sum()),
    }


def rank_scores_page(
    scores: dict,
    *,
    order: str = "slowest",
    slow: bool | None = None,
    node: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> dict:
    """One page of `job_rank_scores`, each rank a dict of RANK_FIELDS: the ranks that
    match (`slow`, on `node`) in `order` (`slowest` or `rank`), with `count` (the ranks
    matching) and `slow_count` (the window's slow ranks, whatever the filters)."""
    ranks = scores["ranks"]
    indexes = scores["slowest"] if order == "slowest" else range(len(ranks))
    if slow is not None or node is not None:
        slow_at, node_at = RANK_FIELDS.index("slow"), RANK_FIELDS.index("node")
        indexes = [
            i
            for i in indexes
            if (slow is None or ranks[i][slow_at] == slow)
            and (node is None or ranks[i][node_at] == node)
        ]
    page = indexes[offset : offset + limit]
    return {
        **{k: v for k, v in scores.items() if k != "slowest"},
        "count": len(indexes),
        "ranks": [dict(zip(RANK_FIELDS, ranks[i], strict=True)) for i in page],
    }


# --- the console's incident page and reliability report --------------------------------

TIMELINE_MAX = 500  # entries an incident page shows


def incident_timeline(*, incident: Incident, limit: int = TIMELINE_MAX) -> dict:
    """The incident's timeline in time order, at most `limit` entries: when it is
    longer (a storm of signals), its first and last halves, which hold what opened
    it and what was done since. Two queries at most, whatever its length."""
    qs = TimelineEntry.objects.filter(incident=incident).order_by("at", "id")
    rows = list(qs[: limit + 1])
    if len(rows) <= limit:
        return {"head": rows, "tail": [], "total": len(rows)}
    head = rows[: limit // 2]
    tail = list(qs.reverse()[: limit - len(head)])[::-1]
    total = qs.count()
    return {"head": head, "tail": tail, "total": total}


def node_clusters(*, names, cluster: str | None = None) -> dict[str, list[str]]:
    """The clusters that have a node of each name (reliability counts nodes by name)."""
    qs = Node.objects.filter(name__in=list(names))
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    out: dict[str, list[str]] = {}
    for name, cluster_name in qs.order_by("cluster__name").values_list("name", "cluster__name"):
        out.setdefault(name, []).append(cluster_name)
    return out


def _week_start(at: datetime) -> datetime:
    """Monday 00:00 UTC of `at`'s ISO week."""
    d = at.astimezone(UTC)
    return (d - timedelta(days=d.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _share(a: float, b: float, lo: float, hi: float) -> float:
    """The fraction of [a, b] inside [lo, hi); a point counts whole where it falls."""
    if b <= a:
        return 1.0 if lo <= a < hi else 0.0
    return _overlap(a, b, lo, hi) / (b - a)


def _launch_spans(launches, finished_at, last_event_ts) -> list[tuple[int, float, float, int]]:
    """(number, from, to, world size) of each launch: to the next launch's start, the
    last one to the job's end; the ledger weighs the gap after a launch by its size."""
    spans = []
    previous_ws = None
    starts = sorted(launches, key=lambda x: (x[1], x[0]))
    if not starts:
        return spans
    t_end = finished_at.timestamp() if finished_at is not None else (last_event_ts or 0.0)
    t_end = max(t_end, starts[-1][1])
    for k, (number, start, ws) in enumerate(starts):
        ws = ws or previous_ws or 1
        previous_ws = ws
        stop = starts[k + 1][1] if k + 1 < len(starts) else t_end
        spans.append((number, start, max(stop, start), ws))
    return spans


def goodput_by_week(*, cluster: str | None, start: datetime, end: datetime) -> dict:
    """GPU-weighted goodput per ISO week (UTC) of [start, end), estimated from stored
    figures in three queries, whatever the jobs' length.

    The exact figure, every job's windowed ledger for every week, costs jobs x weeks
    ledger computations (seconds for one 1,000,000-step job), beyond a page's budget.
    The estimate, per job and week:

    * GPU-seconds: its launches' spans in the week (each launch to the next one's
      start, the last to the job's end) x their world size, as the ledger weighs them;
    * its incidents' lost GPU-seconds (`lost_breakdown` less `slowdown`, which is not
      badput) spread evenly from the fault less its wasted progress to the resume:
      where the wasted steps, the stall, the downtime and the restart lie;
    * the rest of its badput (saves, first startup, tails) from its cached ledger
      (`LedgerSnapshot`, possibly a revision behind) at its lifetime rate;
    * productive = GPU-seconds - both.

    Summed over a job's whole life it gives the job's cached productive GPU-seconds
    back; only the split between weeks is estimated. Jobs with no cached ledger yet
    are left out and counted in `jobs_without_ledger`.
    """
    weeks = []
    w = _week_start(start)
    while w < end:
        nxt = w + timedelta(days=7)
        weeks.append((w, max(w, start), min(nxt, end)))
        w = nxt
    bounds = [(lo.timestamp(), hi.timestamp()) for _, lo, hi in weeks]

    jobs = TrainingJob.objects.filter(
        first_event_ts__lt=end.timestamp(), last_event_ts__gte=start.timestamp()
    )
    if cluster:
        jobs = jobs.filter(cluster__name=cluster)
    rows = list(jobs.values_list("id", "finished_at", "last_event_ts", "ledger__figures"))
    job_ids = jobs.values("id")
    launches: dict[int, list] = defaultdict(list)
    for job_id, number, started_at, ws in (
        Attempt.objects.filter(job__in=job_ids)
        .exclude(started_at=None)
        .values_list("job_id", "number", "started_at", "world_size")
    ):
        launches[job_id].append((number, started_at.timestamp(), ws))
    losses: dict[int, list] = defaultdict(list)
    for job_id, attempt, fault_at, resumed_at, breakdown, cause in Incident.objects.filter(
        job__in=job_ids, lost_gpu_seconds__gt=0
    ).values_list("job_id", "attempt", "fault_at", "resumed_at", "lost_breakdown", "cause"):
        planned = cause == Incident.Cause.PLANNED
        losses[job_id].append((attempt, fault_at, resumed_at, breakdown or {}, planned))

    reserved = [0.0] * len(weeks)
    productive = [0.0] * len(weeks)
    planned_lost = [0.0] * len(weeks)
    active = [0] * len(weeks)
    without_ledger = 0
    for job_id, finished_at, last_event_ts, figures in rows:
        if not figures:
            without_ledger += 1
            continue
        gpu = figures["gpu_seconds"]
        total = math.fsum(gpu.values())
        spans = _launch_spans(launches[job_id], finished_at, last_event_ts)
        if total <= 0 or not spans:
            continue
        sizes = {number: ws for number, _, _, ws in spans}
        lost = []  # (from, to, GPU-seconds, planned)
        for attempt, fault_at, resumed_at, breakdown, planned in losses[job_id]:
            gpu_s = math.fsum(v for k, v in breakdown.items() if k != "slowdown")
            if gpu_s <= 0:
                continue
            ws = sizes.get(attempt) or 1
            fault = fault_at.timestamp()
            a = fault - breakdown.get("wasted_progress", 0.0) / ws
            b = resumed_at.timestamp() if resumed_at else fault + (gpu_s - (fault - a) * ws) / ws
            lost.append((a, max(a, b), gpu_s, planned))
        lost_total = math.fsum(g for _, _, g, _ in lost)
        badput = max(0.0, total - gpu["productive"])
        scale = min(1.0, badput / lost_total) if lost_total > 0 else 0.0
        other_rate = (badput - lost_total * scale) / total
        for k, (lo, hi) in enumerate(bounds):
            gpu_s = math.fsum(_overlap(a, b, lo, hi) * ws for _, a, b, ws in spans)
            if gpu_s <= 0:
                continue
            lost_s = scale * math.fsum(g * _share(a, b, lo, hi) for a, b, g, _ in lost)
            planned_lost[k] += scale * math.fsum(
                g * _share(a, b, lo, hi) for a, b, g, planned in lost if planned
            )
            reserved[k] += gpu_s
            productive[k] += max(0.0, gpu_s * (1.0 - other_rate) - lost_s)
            active[k] += 1
    return {
        "cluster": cluster,
        "start": start,
        "end": end,
        "weeks": [
            {
                "week": "{}-W{:02d}".format(*monday.isocalendar()[:2]),
                "start": lo,
                "end": hi,
                "jobs": active[k],
                "gpu_hours": reserved[k] / 3600.0,
                "productive_gpu_hours": productive[k] / 3600.0,
                "goodput": productive[k] / reserved[k] if reserved[k] > 0 else None,
                "planned_gpu_hours": planned_lost[k] / 3600.0,
                "goodput_excluding_planned": _ratio(productive[k], reserved[k] - planned_lost[k]),
            }
            for k, (monday, lo, hi) in enumerate(weeks)
        ],
        # The whole period: with planned interruptions, and with their badput taken out
        # of the denominator (as the job ledger's gpu_goodput_excluding_planned).
        "goodput": _ratio(math.fsum(productive), math.fsum(reserved)),
        "goodput_excluding_planned": _ratio(
            math.fsum(productive), math.fsum(reserved) - math.fsum(planned_lost)
        ),
        "jobs": len(rows) - without_ledger,
        "jobs_without_ledger": without_ledger,
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 1e-9 else None


def lost_gpu_hours_recent(*, now=None) -> dict:
    """GPU-hours lost (incidents' `lost_gpu_seconds`) by faults since midnight UTC
    today and in the last 7 days, by fault time; one query."""
    now = now or timezone.now()
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    week = now - timedelta(days=7)
    sums = Incident.objects.filter(fault_at__gte=min(today, week), fault_at__lte=now).aggregate(
        today=Sum("lost_gpu_seconds", filter=Q(fault_at__gte=today)),
        week=Sum("lost_gpu_seconds", filter=Q(fault_at__gte=week)),
    )
    return {
        "today_since": today,
        "week_since": week,
        "today": (sums["today"] or 0.0) / 3600.0,
        "week": (sums["week"] or 0.0) / 3600.0,
    }


def job_incident_marks(*, job, limit: int = 200) -> dict:
    """For the job page: the latest `limit` incidents of the job (newest first), how
    many it has, how many are failures (is_failure) and the launches they interrupted
    (`interrupted`: numbers). Four queries at most."""
    qs = Incident.objects.filter(job=job)
    rows = list(
        qs.order_by("-fault_at", "-id").values(
            "id", "fault_at", "summary", "cause", "state", "attempt"
        )[:limit]
    )
    total = len(rows) if len(rows) < limit else qs.count()
    failures = qs.filter(is_failure())
    interrupted = list(
        failures.exclude(attempt=None)
        .order_by("attempt")
        .values_list("attempt", flat=True)
        .distinct()
    )
    return {
        "rows": rows,
        "total": total,
        "failures": failures.count(),
        "interrupted": interrupted,
    }


# --- Alertmanager's alerts ---------------------------------------------------------


def nodes_running_launches(*, nodes: list[Node]) -> dict[int, list[tuple[TrainingJob, Attempt]]]:
    """By node id: the running jobs whose newest launch has the node, each with that
    launch (as recovery's evidence reads a node's jobs), for all `nodes` in four queries."""
    ids = [n.pk for n in nodes]
    jobs = {
        j.pk: j
        for j in TrainingJob.objects.filter(
            status=TrainingJob.Status.RUNNING, attempts__nodes__in=ids
        ).distinct()
    }
    newest = (
        Attempt.objects.filter(job_id__in=list(jobs))
        .values("job_id")
        .annotate(number=Max("number"))
        .values_list("job_id", "number")
    )
    where = Q(pk__in=[])
    for job_id, number in newest:
        where |= Q(job_id=job_id, number=number)
    launches = {a.pk: a for a in Attempt.objects.filter(where)} if jobs else {}
    on: dict[int, list[tuple[TrainingJob, Attempt]]] = {pk: [] for pk in ids}
    pairs = Attempt.nodes.through.objects.filter(attempt_id__in=list(launches), node_id__in=ids)
    for attempt_id, node_id in pairs.order_by("attempt__job_id").values_list(
        "attempt_id", "node_id"
    ):
        attempt = launches[attempt_id]
        on[node_id].append((jobs[attempt.job_id], attempt))
    return on


def alert_list(*, cluster: str | None = None, status: str | None = None, node: str | None = None):
    """Alerts as received, the most recently heard first."""
    qs = Alert.objects.select_related("cluster", "node").prefetch_related(
        Prefetch("incidents", queryset=Incident.objects.only("id"))
    )
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if status:
        qs = qs.filter(status=status)
    if node:
        qs = qs.filter(Q(node__name=node) | Q(node_label=node))
    return qs.order_by("-last_received_at", "-id")
