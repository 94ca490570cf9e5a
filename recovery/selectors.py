"""Reads of the recovery app: the action queue, an action's evidence, a cluster's
recovery settings."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from incidents.models import Incident
from jobs.models import Attempt, Checkpoint, Node, TrainingJob
from recovery.models import Action, ActionAudit, ClusterRecoverySettings

K = Action.Kind
# Kinds whose run relaunches the job: the progress since its last checkpoint is lost.
RESTARTING = frozenset({K.RESTART_JOB, K.ROLLBACK, K.REPLACE_NODE, K.SCALE_DOWN, K.DRAIN_NODE})


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


def gpu_hours_at_stake(*, job: TrainingJob, from_step: int | None = None) -> dict:
    """The progress a relaunch of the job throws away: its current launch's time
    since the checkpoint it would restart from (the latest durable one, or
    `from_step`'s), x the launch's world size."""
    attempt = Attempt.objects.filter(job=job).order_by("-number").first()
    world = (attempt.world_size if attempt else None) or 0
    ckpts = Checkpoint.objects.filter(job=job, durable=True).exclude(saved_at=None)
    if from_step is not None:
        ckpts = ckpts.filter(step=from_step)
    ckpt = ckpts.order_by("-saved_at", "-step").first()
    out = {
        "last_step": job.last_step,
        "checkpoint_step": ckpt.step if ckpt else None,
        "steps_lost": None,
        "seconds_lost": 0.0,
        "world_size": world,
        "gpu_hours": 0.0,
    }
    if job.last_step_ts is None or attempt is None:
        return out
    launch_start = attempt.ready_at or attempt.started_at
    since = [t.timestamp() for t in (launch_start, ckpt.saved_at if ckpt else None) if t]
    if not since:
        return out
    seconds = max(0.0, job.last_step_ts - max(since))
    if ckpt is not None and job.last_step is not None:
        out["steps_lost"] = max(0, job.last_step - ckpt.step)
    out["seconds_lost"] = round(seconds, 3)
    out["gpu_hours"] = round(seconds * world / 3600.0, 6)
    return out


def _jobs_on(node: Node) -> list[TrainingJob]:
    """Running jobs whose latest launch has the node."""
    jobs = TrainingJob.objects.filter(
        status=TrainingJob.Status.RUNNING, attempts__nodes=node
    ).distinct()
    out = []
    for job in jobs:
        latest = Attempt.objects.filter(job=job).order_by("-number").first()
        if latest is not None and latest.nodes.filter(pk=node.pk).exists():
            out.append(job)
    return out


def action_evidence(action: Action) -> dict:
    """What an approver needs: the incident, the nodes and jobs affected, and the
    GPU-hours at stake (progress since the last checkpoint that a relaunch loses)."""
    incident = action.incident
    nodes = [n for n in (action.node, action.spare) if n is not None]
    names = action.params.get("nodes") if isinstance(action.params, dict) else None
    if names:
        nodes += list(Node.objects.filter(cluster_id=action.cluster_id, name__in=names))
    jobs = [action.job] if action.job_id else []
    if action.node_id and action.kind in (K.DRAIN_NODE, K.CORDON_NODE):
        jobs += [j for j in _jobs_on(action.node) if j.pk != action.job_id]
    restarting = action.kind in RESTARTING
    at_stake = None
    if restarting and jobs:
        from_step = action.params.get("step") if action.kind == K.ROLLBACK else None
        at_stake = {j.key: gpu_hours_at_stake(job=j, from_step=from_step) for j in jobs}
    seen = set()
    node_rows = []
    for n in nodes:
        if n.pk not in seen:
            seen.add(n.pk)
            node_rows.append(
                {"name": n.name, "state": n.state, "state_changed_at": n.state_changed_at}
            )
    return {
        "incident": _incident(incident) if incident is not None else None,
        "nodes": node_rows,
        "jobs": [_job(j) for j in jobs],
        "restarts_jobs": restarting,
        "gpu_hours_at_stake": (
            round(sum(v["gpu_hours"] for v in at_stake.values()), 6) if at_stake else 0.0
        ),
        "at_stake": at_stake or {},
    }


def _incident(incident: Incident) -> dict:
    return {
        "id": incident.pk,
        "cause": incident.cause,
        "fault_type": incident.fault_type,
        "severity": incident.severity,
        "state": incident.state,
        "summary": incident.summary,
        "nodes": sorted(incident.nodes.values_list("name", flat=True)),
        "fault_at": incident.fault_at,
        "detected_at": incident.detected_at,
        "evidence": incident.evidence,
    }


def _job(job: TrainingJob) -> dict:
    attempt = Attempt.objects.filter(job=job).order_by("-number").first()
    return {
        "key": job.key,
        "status": job.status,
        "attempt": attempt.number if attempt else None,
        "world_size": attempt.world_size if attempt else None,
        "nodes": sorted(attempt.nodes.values_list("name", flat=True)) if attempt else [],
        "last_step": job.last_step,
    }
