"""Reads of the notify app: which rules an event matches, the notifications list, the
approvals about to expire. Never writes."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import QuerySet

from incidents.models import Incident
from jobs.models import Cluster
from notify.models import Notification, Rule
from recovery.models import Action


def rule_matches(rule: Rule, *, event: str, cluster: str | None, incident: Incident | None) -> bool:
    """Empty filters let everything through, but for planned incidents: scheduled
    maintenance pages only the rules whose causes name `planned`. Severity and cause
    filters need an incident (an action's own or the one it answers)."""
    if rule.events and event not in rule.events:
        return False
    if rule.clusters and cluster not in rule.clusters:
        return False
    if rule.severities and (incident is None or incident.severity not in rule.severities):
        return False
    if not rule.causes:
        return incident is None or incident.cause != Incident.Cause.PLANNED
    return incident is not None and incident.cause in rule.causes


def rules_matching(*, event: str, cluster_id: int | None, incident: Incident | None) -> list[Rule]:
    rules = list(Rule.objects.filter(enabled=True, channel__enabled=True).select_related("channel"))
    if not rules:
        return []
    name = None
    if cluster_id is not None and any(r.clusters for r in rules):
        name = Cluster.objects.filter(pk=cluster_id).values_list("name", flat=True).first()
    return [r for r in rules if rule_matches(r, event=event, cluster=name, incident=incident)]


def notification_list(*, incident: int | None = None, state: str | None = None) -> QuerySet:
    qs = Notification.objects.select_related("channel", "rule", "cluster").prefetch_related(
        "delivery_attempts"
    )
    if incident is not None:
        qs = qs.filter(incidents=incident)
    if state is not None:
        qs = qs.filter(state=state)
    return qs.order_by("-created_at", "-id")


def approvals_expiring(*, now: datetime, within_s: float) -> QuerySet:
    """Actions still awaiting approval that expire within `within_s` from `now`."""
    return Action.objects.filter(
        state=Action.State.AWAITING_APPROVAL,
        expires_at__gt=now,
        expires_at__lte=now + timedelta(seconds=within_s),
    ).order_by("expires_at", "id")
