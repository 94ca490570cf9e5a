"""What incidents cost in money, next to their lost GPU-hours.

An incident's lost GPU-seconds (`incidents.figures`) are those of the launch it
interrupted: they are priced over that launch's nodes (`jobs.selectors.prices`: each
node at its pool's price, else its cluster's). An incident tied to no launch, or to
one that named no nodes, is priced at its cluster's price. No price: None, never 0.

Reads only; a fixed number of queries for any number of incidents: the prices (one),
and the launches' nodes by pool where a cluster prices pools (one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, timedelta
from decimal import Decimal

from django.utils import timezone

from incidents.models import Incident
from jobs.selectors.prices import Cost, launch_pools, price_book

# (incident id, cluster id, job id, launch number or None, lost GPU-seconds)
CostRow = tuple[int, int, int, int | None, float]


def incident_costs(rows: Iterable[CostRow]) -> dict[int, Cost | None]:
    """Each incident's lost compute in money, by id (None where unpriced)."""
    rows = list(rows)
    book = price_book({r[1] for r in rows})
    pools = launch_pools(
        (job_id, attempt)
        for _, cluster_id, job_id, attempt, lost in rows
        if lost and book.prices_pools(cluster_id)
    )
    return {
        pk: book.cost(cluster_id, lost, pools.get((job_id, attempt)))
        for pk, cluster_id, job_id, attempt, lost in rows
    }


def _row(incident: Incident) -> CostRow:
    return (
        incident.pk,
        incident.cluster_id,
        incident.job_id,
        incident.attempt,
        incident.lost_gpu_seconds,
    )


def attach_costs(incidents: Iterable[Incident]) -> None:
    """Set `lost_cost` (a Cost or None) on each incident, for a page or an answer:
    two queries at most, whatever their number."""
    incidents = list(incidents)
    costs = incident_costs(_row(i) for i in incidents)
    for i in incidents:
        i.lost_cost = costs[i.pk]


def incident_cost(incident: Incident) -> tuple[Decimal, str] | None:
    """One incident's lost compute in money: (amount to the cent, ISO 4217 currency),
    or None where its nodes have no price. For messages (notifications) and pages."""
    return incident_costs([_row(incident)])[incident.pk]


def totals(costs: Iterable[Cost | None]) -> dict[str, Decimal]:
    """The costs summed per currency (clusters may price in different ones); the
    unpriced left out."""
    out: dict[str, Decimal] = {}
    for c in costs:
        if c is not None:
            out[c.currency] = out.get(c.currency, Decimal(0)) + c.amount
    return dict(sorted(out.items()))


def lost_recent(*, now=None) -> dict:
    """The GPU-hours lost by faults since midnight UTC today and in the last 7 days (by
    fault time), as incidents.selectors.lost_gpu_hours_recent counts them, and their
    money per currency (`today_cost`, `week_cost`), for the overview: read in one pass
    over the incidents, two queries (three where a cluster prices node pools)."""
    now = now or timezone.now()
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    week = now - timedelta(days=7)
    rows = list(
        Incident.objects.filter(
            fault_at__gte=min(today, week), fault_at__lte=now, lost_gpu_seconds__gt=0
        ).values_list("pk", "cluster_id", "job_id", "attempt", "lost_gpu_seconds", "fault_at")
    )
    costs = incident_costs(r[:5] for r in rows)
    out = {"today_since": today, "week_since": week}
    for name, since in (("today", today), ("week", week)):
        chosen = [r for r in rows if r[5] >= since]
        out[name] = math.fsum(r[4] for r in chosen) / 3600.0
        out[f"{name}_cost"] = totals(costs[r[0]] for r in chosen)
    return out
