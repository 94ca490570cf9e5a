"""Reads of the recovery app's actions: the action list and one action, a cluster's
recovery settings, who requested an action, and the actions of a node or waiting
for a job's next checkpoint."""

from __future__ import annotations

from django.db.models import Prefetch, Q, QuerySet

from jobs.models import Node, TrainingJob
from jobs.selectors import checkpoints_durable_latest_first
from recovery.models import Action, ActionAudit, ClusterRecoverySettings

K = Action.Kind
S = Action.State


def cluster_settings(cluster_id: int) -> ClusterRecoverySettings:
    """The cluster's row, or the defaults (unsaved) when it has none."""
    return ClusterRecoverySettings.objects.filter(
        cluster_id=cluster_id
    ).first() or ClusterRecoverySettings(cluster_id=cluster_id)


def action_list(
    *,
    state: str | None = None,
    cluster: str | None = None,
    job: str | None = None,
    node: str | None = None,
    kind: str | None = None,
    incident: int | None = None,
) -> QuerySet[Action]:
    qs = Action.objects.select_related("cluster", "node", "job", "spare")
    if state:
        qs = qs.filter(state=state)
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if job:
        qs = qs.filter(job__key=job)
    if node:
        qs = qs.filter(node__name=node)
    if kind:
        qs = qs.filter(kind=kind)
    if incident is not None:
        qs = qs.filter(incident_id=incident)
    return qs.order_by("-created_at", "-id")


def action_detail(*, pk: int) -> Action | None:
    return (
        action_list()
        .select_related("incident")
        .prefetch_related(Prefetch("audit", queryset=ActionAudit.objects.order_by("at", "id")))
        .filter(pk=pk)
        .first()
    )


def action_is_own(*, action: Action, user, actor: str | None = None) -> bool:
    """Did `user` (or `actor`, a name; the user's by default) request the action? Then
    another operator must approve it: action_approve asks this too."""
    if getattr(user, "pk", None) and action.requested_by_user_id:
        return user.pk == action.requested_by_user_id
    return (actor or getattr(user, "username", None)) == action.requested_by


def node_actions(*, node: Node) -> QuerySet[Action]:
    """Actions on the node, or that took it as their spare, newest first."""
    return (
        Action.objects.filter(Q(node=node) | Q(spare=node))
        .select_related("node", "job", "spare")
        .order_by("-created_at", "-id")
    )


def nodes_current_actions(*, node_ids) -> dict[int, Action]:
    """Per node id: its newest action not finished yet (Action.ACTIVE_STATES); one query."""
    out: dict[int, Action] = {}
    for action in Action.objects.filter(
        node_id__in=list(node_ids), state__in=Action.ACTIVE_STATES
    ).order_by("node_id", "-created_at", "-id"):
        out.setdefault(action.node_id, action)
    return out


def actions_waiting_for_checkpoint(*, job_ids) -> list[Action]:
    """The queued replacements of these jobs that wait for their next checkpoint."""
    return list(
        Action.objects.filter(
            job_id__in=list(job_ids), kind=K.REPLACE_AT_NEXT_CHECKPOINT, state=S.QUEUED
        )
    )


def job_latest_durable_step(job: TrainingJob) -> int | None:
    """The step of the checkpoint a relaunch of the job would restore."""
    return checkpoints_durable_latest_first(job).values_list("step", flat=True).first()
