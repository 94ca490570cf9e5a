"""Writes of maintenance windows: declare one (validated), cancel one.

A window changes what the figures mean for the time it covers, so both writes mark
the ledger snapshots of the jobs that ran then as stale (their planned figures are
recomputed by the next reader) and, after commit, send `maintenance_changed` for
the apps to the right (incidents re-labels the interruptions inside it).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from common.errors import Conflict, Invalid
from common.time import TS_MAX, TS_MIN
from jobs.models import Cluster, LedgerSnapshot, MaintenanceWindow, Node, TrainingJob
from jobs.signals import maintenance_changed

# Longer than this is a typo (a year for a month), not maintenance.
MAX_LENGTH = timedelta(days=31)
# The pre-maintenance action is proposed at most this long before the window.
MAX_LEAD_S = 7 * 86400
MAX_NODES = 10_000


def maintenance_window_create(
    *,
    cluster: Cluster,
    starts_at: datetime,
    ends_at: datetime,
    nodes: list[str] | None = None,
    reason: str = "",
    pre_action: str = MaintenanceWindow.PreAction.NONE,
    pre_action_lead_s: int = 600,
    created_by: str = "",
) -> MaintenanceWindow:
    """Declare planned maintenance of `nodes` (names in `cluster`; none: all of it)."""
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if not TS_MIN <= value.timestamp() <= TS_MAX:  # the years events may carry
            raise Invalid(f"{name} is out of range.", code="invalid", field=name)
    if ends_at <= starts_at:
        raise Invalid("ends_at must be after starts_at.", code="invalid", field="ends_at")
    if ends_at - starts_at > MAX_LENGTH:
        raise Invalid(
            f"A window may last at most {MAX_LENGTH.days} days.", code="invalid", field="ends_at"
        )
    if pre_action not in MaintenanceWindow.PreAction.values:
        raise Invalid(f"Unknown pre_action {pre_action!r}.", code="invalid", field="pre_action")
    if not 0 <= pre_action_lead_s <= MAX_LEAD_S:
        raise Invalid(
            f"pre_action_lead_s must be from 0 to {MAX_LEAD_S}.",
            code="invalid",
            field="pre_action_lead_s",
        )
    names = sorted(set(nodes or []))
    if len(names) > MAX_NODES:
        raise Invalid(f"At most {MAX_NODES} nodes a window.", code="invalid", field="nodes")
    found = list(Node.objects.filter(cluster=cluster, name__in=names)) if names else []
    missing = sorted(set(names) - {n.name for n in found})
    if missing:
        shown = ", ".join(repr(n) for n in missing[:10])
        raise Invalid(
            f"Not nodes of cluster {cluster.name}: {shown}", code="invalid", field="nodes"
        )
    with transaction.atomic():
        window = MaintenanceWindow.objects.create(
            cluster=cluster,
            starts_at=starts_at,
            ends_at=ends_at,
            reason=reason,
            pre_action=pre_action,
            pre_action_lead_s=pre_action_lead_s,
            created_by=created_by,
        )
        if found:
            window.nodes.set(found)
        _changed(window)
    return window


def maintenance_window_cancel(*, window: MaintenanceWindow, actor: str = "") -> MaintenanceWindow:
    """Cancel a window (a conditional update: cancelling twice changes nothing more).
    What it covered is judged again as if it had never been declared."""
    with transaction.atomic():
        done = MaintenanceWindow.objects.filter(pk=window.pk, cancelled_at__isnull=True).update(
            cancelled_at=timezone.now()
        )
        window.refresh_from_db()
        if not done:
            raise Conflict(
                f"Maintenance window #{window.pk} was cancelled already.", code="invalid_state"
            )
        _changed(window)
    return window


def _changed(window: MaintenanceWindow) -> None:
    """Stale the ledgers of the jobs that ran during the window; tell the others."""
    start, end = window.starts_at.timestamp(), window.ends_at.timestamp()
    jobs = TrainingJob.objects.filter(
        cluster_id=window.cluster_id, first_event_ts__lte=end, last_event_ts__gte=start
    )
    LedgerSnapshot.objects.filter(job__in=jobs).update(revision=-1, announced_revision=-1)
    transaction.on_commit(
        lambda: maintenance_changed.send(
            sender=MaintenanceWindow,
            window_id=window.pk,
            cluster_id=window.cluster_id,
            start=start,
            end=end,
        ),
        robust=True,
    )
