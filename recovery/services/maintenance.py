"""Before planned maintenance: a window with a `pre_action` proposes, its
`pre_action_lead_s` before it starts, what moves the running jobs off its nodes,
through the policies and approvals like any proposal (trigger `maintenance`).

- `drain_at_next_checkpoint`: one `replace_at_next_checkpoint` per running job and
  node of the window it runs on: at the job's next durable checkpoint the node is
  swapped for a spare and goes into repair (recovery.services.execution). A window
  over a whole cluster has nowhere to move the jobs to: nothing is proposed, and the
  result says so.
- `checkpoint_now`: one `checkpoint_job` per running job of the window's nodes (a
  window over a whole cluster: every running job of the cluster, since saving needs
  no spare). The driver delivers the request (the job's control file, SIGUSR1 on
  Slurm; docs/checkpoint-now.md) and the job saves at its next step.

Each kind goes through the `maintenance` policy chain: drain_at_next_checkpoint
proposes its rules other than checkpoint_job, checkpoint_now only checkpoint_job
(a cluster or job may set it to approval, or off).

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

K = Action.Kind
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
    those nodes; for a window over the whole cluster, every running job (no nodes)."""
    nodes = {n.pk: n for n in window.nodes.all()}
    jobs = TrainingJob.objects.filter(
        cluster_id=window.cluster_id, status=TrainingJob.Status.RUNNING
    ).select_related("cluster")
    out = []
    for job in jobs.order_by("key"):
        if not nodes:
            out.append((job, []))
            continue
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
    checkpoint = window.pre_action == P.CHECKPOINT_NOW
    if not checkpoint and not window.nodes.exists():
        result.notices.append(
            f"{what} covers the whole cluster {window.cluster.name}: there is nowhere to"
            " move its jobs; nothing proposed"
        )
        return

    def wanted(rules):
        return [r for r in rules if (r.kind == K.CHECKPOINT_JOB) == checkpoint]

    def propose(rule, job, node, reason) -> None:
        target = f"{job.pk}:{node.pk}" if node is not None else f"{job.pk}"
        try:
            result.actions.append(
                action_propose(
                    cluster=window.cluster,
                    kind=rule.kind,
                    node=node,
                    job=job,
                    params={"maintenance_window": window.pk},
                    reason=f"{what} starts at {starts}: {reason}",
                    requested_by=f"policy:{TRIGGER}",
                    mode=rule.mode,
                    policy=rule.name,
                    dedup_key=f"maintenance:{window.pk}:{rule.kind}:{target}",
                )
            )
        except AppError as exc:  # refused (a lease, a duplicate) or invalid
            on = f" of {node.name}" if node is not None else ""
            result.notices.append(
                f"{what}: {rule.kind}{on} for job {job.key} not proposed: {exc.detail}"
            )

    rules = wanted(policy_rules(cluster_id=window.cluster_id, job_id=None, trigger=TRIGGER))
    for job, nodes in _running_jobs_on(window):
        for rule in wanted(
            policy_rules(cluster_id=window.cluster_id, job_id=job.pk, trigger=TRIGGER)
        ):
            if rule.kind == K.CHECKPOINT_JOB:
                propose(rule, job, None, f"save a checkpoint of job {job.key} now")
                continue
            for node in nodes:
                propose(rule, job, node, f"move job {job.key} off {node.name}")
    if not rules:
        kinds = "checkpoint_job" if checkpoint else "its moves"
        result.notices.append(f"{what}: the {TRIGGER} policy for {kinds} is off on this cluster")
