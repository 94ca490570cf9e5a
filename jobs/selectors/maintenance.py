"""Reads of maintenance windows: which windows cover a node or a cluster at a time
(the detectors, the ledger and recovery's guardrail ask, once per pass or
computation: one indexed query), and the windows as the API and the page list them.

A window covers [starts_at, ends_at) of its nodes, or of every node of its cluster
when it names none; a cancelled window covers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Prefetch, Q
from django.utils import timezone

from common.time import dt
from jobs.models import MaintenanceWindow, Node


@dataclass(frozen=True)
class Span:
    """A window as the figures read it: times in unix seconds, its nodes by name and id
    (both empty: the whole cluster)."""

    id: int
    start: float
    end: float
    reason: str
    nodes: frozenset[str]
    node_ids: frozenset[int]

    @property
    def whole_cluster(self) -> bool:
        return not self.nodes

    def covers(self, ts: float, names=()) -> bool:
        """Whether it covers time `ts` on any of the nodes `names` (any node, when it
        is the whole cluster's)."""
        if not self.start <= ts < self.end:
            return False
        return self.whole_cluster or not self.nodes.isdisjoint(names)

    def describe(self) -> str:
        what = "the whole cluster" if self.whole_cluster else ", ".join(sorted(self.nodes))
        why = f": {self.reason}" if self.reason else ""
        return f"maintenance window #{self.id} ({what}){why}"


def maintenance_spans(
    *, cluster_id: int, start: float | None = None, end: float | None = None
) -> list[Span]:
    """The cluster's windows (not cancelled) that overlap [start, end] (unix seconds;
    None: unbounded), in start order. One query (the cluster_end index)."""
    qs = MaintenanceWindow.objects.filter(cluster_id=cluster_id, cancelled_at__isnull=True)
    if start is not None:
        qs = qs.filter(ends_at__gt=dt(start))
    if end is not None:
        qs = qs.filter(starts_at__lte=dt(end))
    rows = qs.order_by("starts_at", "id").values_list(
        "id", "starts_at", "ends_at", "reason", "nodes__name", "nodes__id"
    )
    found: dict[int, list] = {}
    for pk, starts, ends, reason, name, node_id in rows:  # one row per node (or one: none)
        span = found.setdefault(pk, [starts.timestamp(), ends.timestamp(), reason, set(), set()])
        if name is not None:
            span[3].add(name)
            span[4].add(node_id)
    return [
        Span(pk, a, b, reason, frozenset(names), frozenset(ids))
        for pk, (a, b, reason, names, ids) in found.items()
    ]


def span_covering(spans: list[Span], ts: float, names=()) -> Span | None:
    """The first of `spans` covering time `ts` on one of `names` (or the whole cluster)."""
    names = set(names)
    return next((s for s in spans if s.covers(ts, names)), None)


def maintenance_active(*, cluster_id: int, node_ids=(), at: datetime | None = None) -> Span | None:
    """The window in force at `at` (default now) on the cluster as a whole or on one of
    the nodes `node_ids`, if any. One query."""
    at = at or timezone.now()
    ts = at.timestamp()
    ids = set(node_ids)
    for span in maintenance_spans(cluster_id=cluster_id, start=ts, end=ts):
        if span.start <= ts < span.end and (span.whole_cluster or span.node_ids & ids):
            return span
    return None


def maintenance_nodes_under(*, cluster_id: int, at: datetime | None = None) -> tuple[bool, set]:
    """(whole cluster under maintenance, ids of the nodes under maintenance) at `at`."""
    at = at or timezone.now()
    ts = at.timestamp()
    whole, ids = False, set()
    for span in maintenance_spans(cluster_id=cluster_id, start=ts, end=ts):
        if span.start <= ts < span.end:
            whole |= span.whole_cluster
            ids |= span.node_ids
    return whole, ids


WINDOW_STATES = ("active", "upcoming", "past", "cancelled")


def window_state(window: MaintenanceWindow, now: datetime) -> str:
    if window.cancelled_at is not None:
        return "cancelled"
    if window.ends_at <= now:
        return "past"
    return "active" if window.starts_at <= now else "upcoming"


def maintenance_window_list(
    *,
    cluster: str | None = None,
    active: bool | None = None,
    upcoming: bool | None = None,
    include_cancelled: bool = True,
    now: datetime | None = None,
):
    """Windows, latest start first, with their cluster and nodes (two queries).
    `active`: in force now (not cancelled); `upcoming`: not started yet (not cancelled);
    False for either: the others."""
    now = now or timezone.now()
    qs = MaintenanceWindow.objects.select_related("cluster").prefetch_related(
        Prefetch("nodes", queryset=Node.objects.order_by("name"))
    )
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if not include_cancelled:
        qs = qs.filter(cancelled_at__isnull=True)
    live = Q(cancelled_at__isnull=True)
    in_force = live & Q(starts_at__lte=now, ends_at__gt=now)
    ahead = live & Q(starts_at__gt=now)
    if active is not None:
        qs = qs.filter(in_force) if active else qs.exclude(in_force)
    if upcoming is not None:
        qs = qs.filter(ahead) if upcoming else qs.exclude(ahead)
    return qs.order_by("-starts_at", "-id")


def maintenance_pre_action_due(*, now: datetime | None = None):
    """Windows whose pre-maintenance action is due (lead time reached, window not
    ended, not cancelled) and not proposed yet."""
    now = now or timezone.now()
    return (
        MaintenanceWindow.objects.filter(
            cancelled_at__isnull=True,
            pre_action_proposed_at__isnull=True,
            ends_at__gt=now,
        )
        .exclude(pre_action=MaintenanceWindow.PreAction.NONE)
        .select_related("cluster")
        .prefetch_related("nodes")
        .order_by("starts_at", "id")
    )
