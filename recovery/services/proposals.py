"""Proposing an action: what a proposal may name (`InvalidAction` otherwise), the
lease it must find free, and its route: an automatic proposal the guardrails allow
is queued at once; any other waits for a person's approval, naming the guardrail
that stopped it."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from incidents.models import Incident
from jobs.models import Cluster, Node, TrainingJob
from recovery import guardrails
from recovery.errors import InvalidAction, Refused
from recovery.models import Action, ClusterRecoverySettings
from recovery.selectors import job_latest_durable_step
from recovery.services.actions import (
    JOB_AND_NODE_KINDS,
    JOB_KINDS,
    NODE_KINDS,
    action_audit_add,
    action_transition,
)

K = Action.Kind
S = Action.State


def cluster_settings_lock(cluster_id: int) -> ClusterRecoverySettings:
    """The cluster's settings row, locked: proposals on one cluster are counted one
    at a time (storm protection must not let two racing proposals both pass)."""
    ClusterRecoverySettings.objects.get_or_create(cluster_id=cluster_id)
    return ClusterRecoverySettings.objects.select_for_update().get(cluster_id=cluster_id)


def _validate(kind, cluster, node, job, params, incident) -> None:
    def invalid(field, detail):
        raise InvalidAction(detail, field=field)

    if kind not in K.values:
        invalid("kind", f"kind must be one of {', '.join(K.values)}")
    if node is not None and node.cluster_id != cluster.pk:
        invalid("node", f"node {node.name} is not a node of cluster {cluster.name}")
    if job is not None and job.cluster_id != cluster.pk:
        invalid("job", f"job {job.key} runs on another cluster than {cluster.name}")
    if incident is not None and incident.cluster_id != cluster.pk:
        invalid("incident", f"incident #{incident.pk} is of another cluster than {cluster.name}")
    if kind in NODE_KINDS | JOB_AND_NODE_KINDS and node is None:
        invalid("node", f"{kind} needs a node")
    if kind in JOB_KINDS | JOB_AND_NODE_KINDS | {K.SCALE_DOWN} and job is None:
        invalid("job", f"{kind} needs a job")
    if kind == K.ROLLBACK and not isinstance(params.get("step"), int):
        invalid("params", "rollback needs params.step: the checkpoint's step to restart from")
    if kind == K.SCALE_DOWN:
        names = params.get("nodes")
        if node is None and not names:
            invalid("params", "scale_down needs a node or params.nodes: the nodes to drop")
        if names is not None and (
            not isinstance(names, list) or not all(isinstance(n, str) for n in names)
        ):
            invalid("params", "params.nodes must be a list of node names")
        if names:
            known = set(
                Node.objects.filter(cluster=cluster, name__in=names).values_list("name", flat=True)
            )
            foreign = sorted(set(names) - known)
            if foreign:
                invalid(
                    "params.nodes",
                    f"not nodes of cluster {cluster.name}: {', '.join(foreign[:10])}",
                )


def action_propose(
    *,
    cluster: Cluster,
    kind: str,
    reason: str,
    requested_by: str,
    requested_by_user=None,
    node: Node | None = None,
    job: TrainingJob | None = None,
    params: dict | None = None,
    incident: Incident | None = None,
    mode: str = Action.Mode.APPROVAL,
    dry_run: bool = False,
    policy: str = "",
    dedup_key: str = "",
) -> Action:
    """Records a proposed action and routes it: an automatic one that the guardrails
    allow is queued at once; any other waits for approval, with the guardrail that
    stopped it named. Raises InvalidAction for a proposal that can never be made as
    written, Refused `lease` when another action holds the node or job, `duplicate`
    when a policy already proposed it."""
    params = dict(params or {})
    _validate(kind, cluster, node, job, params, incident)
    if kind == K.REPLACE_AT_NEXT_CHECKPOINT and job is not None:
        params.setdefault("after_step", job_latest_durable_step(job))
    with transaction.atomic():
        cfg = cluster_settings_lock(cluster.pk)
        action = Action(
            kind=kind,
            mode=mode,
            cluster=cluster,
            node=node,
            job=job,
            params=params,
            reason=reason,
            incident=incident,
            policy=policy,
            dedup_key=dedup_key,
            requested_by=requested_by,
            requested_by_user=requested_by_user,
            dry_run=dry_run or cfg.dry_run,
        )
        now = timezone.now()
        ctx = guardrails.Context(cfg, now)
        held = guardrails.lease(action, ctx)
        if held:
            raise Refused(held, code="lease", guardrail="lease")
        action.target_snapshot = guardrails.target_snapshot(action)
        try:
            with transaction.atomic():
                action.save()
        except IntegrityError as exc:
            if dedup_key and Action.objects.filter(dedup_key=dedup_key).exists():
                raise Refused(f"already proposed ({dedup_key})", code="duplicate") from exc
            raise Refused(
                "lease: another action holds this target", code="lease", guardrail="lease"
            ) from exc
        action_audit_add(
            action=action,
            frm="",
            to=S.PROPOSED,
            actor=requested_by,
            why=reason or "proposed",
            at=now,
        )
        if mode == Action.Mode.AUTO:
            blocked = guardrails.first_block(action, ctx, guardrails.AUTOMATIC + guardrails.ALWAYS)
            if blocked is None:
                action_transition(
                    action=action, to=S.QUEUED, actor=requested_by, why=f"automatic ({policy})"
                )
                return action
        else:
            blocked = guardrails.first_block(action, ctx, guardrails.ALWAYS)
        name, why = blocked if blocked else ("", "")
        action_transition(
            action=action,
            to=S.AWAITING_APPROVAL,
            actor=requested_by,
            why=why or "needs approval",
            blocked_by=name,
            blocked_reason=why,
        )
    return action
