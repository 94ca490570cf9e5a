"""Before planned maintenance: a window with a `pre_action` proposes, its
`pre_action_lead_s` before it starts, what moves the running jobs off its nodes,
through the policies and approvals like any proposal (trigger `maintenance`).

- `drain_at_next_checkpoint`: one `replace_at_next_checkpoint` per running job and
  node of the window it runs on: at the job's next durable checkpoint the node is
  swapped for a spare and goes into repair (recovery.services.execution). A window
  over a whole cluster has nowhere to move the jobs to: nothing is proposed, and the
  result says so.
- `checkpoint_now`: no driver can ask a job to save a checkpoint now (the drivers
  restart, replace, cordon, drain and scale down; the checkpoint cadence is the
  job's own). Nothing is proposed; the audit log and the result say so, so that an
  operator can ask the job's owners to save one.

Each window is handled once: `pre_action_proposed_at` is claimed by a conditional
update (a second run, or a second beat, finds it taken).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from common.errors import AppError
from jobs.models import Attempt, MaintenanceWindow, TrainingJob
from jobs.selectors import maintenance_pre_action_due
from recovery.models import Action
from recovery.policies import policy_rules
from recovery.services.proposals import action_propose

logger = logging.getLogger(__name__)
audit_log = logging.getLogger("rebound.audit")

P = MaintenanceWindow.PreAction
TRIGGER = "maintenance"


@dataclass
class PreMaintenance:
    windows: list[int] = field(default_factory=list)  # claimed by this run
    actions: list[Action] = field(default_factory=list)  # proposed
    notices: list[str] = field(default_factory=list)  # what could not be proposed, and why


def maintenance_pre_actions_propose(*, now=None) -> PreMaintenance:
    """Propose the pre-maintenance actions of the windows now due (see the module)."""
    now = now or timezone.now()
    result = PreMaintenance()
    for window in maintenance_pre_action_due(now=now):
        if window.starts_at - timedelta(seconds=window.pre_action_lead_s) > now:
            continue  # not yet
        with transaction.atomic():
            claimed = MaintenanceWindow.objects.filter(
                pk=window.pk, pre_action_proposed_at__isnull=True, cancelled_at__isnull=True
            ).update(pre_action_proposed_at=now)
            if not claimed:
                continue
            result.windows.append(window.pk)
            _propose(window, result)
    for notice in result.notices:
        audit_log.info(notice)
    return result


def _running_jobs_on(window: MaintenanceWindow) -> list[tuple[TrainingJob, list]]:
    """The cluster's running jobs whose latest launch uses nodes of the window, with
    those nodes."""
    nodes = {n.pk: n for n in window.nodes.all()}
    jobs = TrainingJob.objects.filter(
        cluster_id=window.cluster_id, status=TrainingJob.Status.RUNNING
    ).select_related("cluster")
    out = []
    for job in jobs:
        latest = Attempt.objects.filter(job=job).order_by("-number").first()
        if latest is None:
            continue
        used = sorted(
            (nodes[pk] for pk in latest.nodes.values_list("pk", flat=True) if pk in nodes),
            key=lambda n: n.name,
        )
        if used:
            out.append((job, used))
    return out


def _propose(window: MaintenanceWindow, result: PreMaintenance) -> None:
    what = f"maintenance window #{window.pk} ({window.reason or 'no reason given'})"
    starts = f"{window.starts_at:%Y-%m-%d %H:%M} UTC"
    if window.pre_action == P.CHECKPOINT_NOW:
        result.notices.append(
            f"{what} starts at {starts}: checkpoint_now asked, but no driver can make a job"
            " save a checkpoint now; nothing proposed: ask the jobs' owners to save one"
        )
        return
    if not window.nodes.exists():
        result.notices.append(
            f"{what} covers the whole cluster {window.cluster.name}: there is nowhere to"
            " move its jobs; nothing proposed"
        )
        return
    rules = policy_rules(cluster_id=window.cluster_id, job_id=None, trigger=TRIGGER)
    for job, nodes in _running_jobs_on(window):
        for rule in policy_rules(cluster_id=window.cluster_id, job_id=job.pk, trigger=TRIGGER):
            for node in nodes:
                try:
                    result.actions.append(
                        action_propose(
                            cluster=window.cluster,
                            kind=rule.kind,
                            node=node,
                            job=job,
                            params={"maintenance_window": window.pk},
                            reason=f"{what} starts at {starts}: move job {job.key} off {node.name}",
                            requested_by=f"policy:{TRIGGER}",
                            mode=rule.mode,
                            policy=rule.name,
                            dedup_key=f"maintenance:{window.pk}:{rule.kind}:{job.pk}:{node.pk}",
                        )
                    )
                except AppError as exc:  # refused (a lease, a duplicate) or invalid
                    result.notices.append(
                        f"{what}: {rule.kind} of {node.name} for job {job.key} not"
                        f" proposed: {exc.detail}"
                    )
    if not rules:
        result.notices.append(f"{what}: the {TRIGGER} policy is off on this cluster")
