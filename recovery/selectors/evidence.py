"""What an approver weighs for one action (`action_evidence`): the incident, the nodes
and jobs affected, the ranks a replacement moves, and the progress since the last
durable checkpoint that a relaunch throws away (GPU-hours at stake). The approval
page reads the same facts for many actions at once (selectors.approvals)."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Q
from django.utils import timezone

from incidents.models import Incident
from jobs.models import Attempt, Checkpoint, Node, RankWindow, TrainingJob
from jobs.selectors import checkpoints_durable_latest_first, job_latest_attempt
from recovery import guardrails
from recovery.models import Action
from recovery.selectors.actions import cluster_settings

K = Action.Kind
S = Action.State
# Kinds whose run relaunches the job: the progress since its last checkpoint is lost
# (for a replacement at the next checkpoint, only what comes after that checkpoint).
RESTARTING = frozenset(
    {
        K.RESTART_JOB,
        K.ROLLBACK,
        K.REPLACE_NODE,
        K.REPLACE_AT_NEXT_CHECKPOINT,
        K.SCALE_DOWN,
        K.DRAIN_NODE,
    }
)
# Kinds that move a job off some of its nodes: the ranks there are the ones replaced.
OFF_NODES = frozenset({K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT, K.SCALE_DOWN})


def gpu_hours_at_stake(*, job: TrainingJob, from_step: int | None = None) -> dict:
    """The progress a relaunch of the job throws away: its current launch's time
    since the checkpoint it would restart from (the latest durable one, or
    `from_step`'s), x the launch's world size."""
    attempt = job_latest_attempt(job)
    ckpts = checkpoints_durable_latest_first(job)
    if from_step is not None:
        ckpts = ckpts.filter(step=from_step)
    ckpt = ckpts.first()
    return stake_figures(job=job, attempt=attempt, checkpoint=ckpt)


def stake_figures(
    *, job: TrainingJob, attempt: Attempt | None, checkpoint: Checkpoint | None
) -> dict:
    """gpu_hours_at_stake's arithmetic on rows already read: the job's latest launch
    and the checkpoint a relaunch would restart from."""
    ckpt = checkpoint
    world = (attempt.world_size if attempt else None) or 0
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
        latest = job_latest_attempt(job)
        if latest is not None and latest.nodes.filter(pk=node.pk).exists():
            out.append(job)
    return out


def ranks_on_nodes(wanted) -> dict[tuple[int, int], list[int]]:
    """The ranks each (job, launch number, node) ran, by (job id, node id), from the
    launch's rank windows: one query for all."""
    where = Q()
    for job_id, number, node_id in wanted:
        where |= Q(job_id=job_id, attempt=number, node_id=node_id)
    if not where:
        return {}
    out: dict[tuple[int, int], set[int]] = defaultdict(set)
    for job_id, node_id, rank in (
        RankWindow.objects.filter(where).values_list("job_id", "node_id", "rank").distinct()
    ):
        out[(job_id, node_id)].add(rank)
    return {k: sorted(v) for k, v in out.items()}


def rank_ranges(ranks: list[int]) -> str:
    """Sorted ranks as runs joined by an en dash: [0, 1, 2, 5] -> "0-2, 5" (with the dash)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}\N{EN DASH}{b}" for a, b in runs)


def action_off_nodes(action: Action, by_name=None) -> list[Node]:
    """The nodes a replacement or a scale-down moves its job off."""
    if action.kind not in OFF_NODES:
        return []
    nodes = [action.node] if action.node_id else []
    for name in action_param_nodes(action):
        n = (
            by_name.get((action.cluster_id, name))
            if by_name is not None
            else Node.objects.filter(cluster_id=action.cluster_id, name=name).first()
        )
        if n is not None and n not in nodes:
            nodes.append(n)
    return nodes


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
    relaunched = [j for j in jobs if j.status not in guardrails.FINISHED_JOB]
    at_stake = None
    if restarting and relaunched:
        from_step = action.params.get("step") if action.kind == K.ROLLBACK else None
        at_stake = {j.key: gpu_hours_at_stake(job=j, from_step=from_step) for j in relaunched}
    off = action_off_nodes(action)
    job_rows = []
    for j in jobs:
        row = _job(j)
        latest = row["attempt"]
        ranks = ranks_on_nodes({(j.pk, latest, n.pk) for n in off} if latest else set())
        row["ranks_on_nodes"] = {n.name: ranks[(j.pk, n.pk)] for n in off if (j.pk, n.pk) in ranks}
        job_rows.append(row)
    seen = set()
    node_rows = []
    for n in nodes:
        if n.pk not in seen:
            seen.add(n.pk)
            node_rows.append(
                {"name": n.name, "state": n.state, "state_changed_at": n.state_changed_at}
            )
    blocked = None
    if action.state == S.AWAITING_APPROVAL:
        ctx = guardrails.Context(cluster_settings(action.cluster_id), timezone.now())
        blocked = guardrails.decision_block(action, ctx)
    return {
        "incident": _incident(incident) if incident is not None else None,
        "approval_blocked_by": (
            {"guardrail": blocked[0], "reason": blocked[1]} if blocked else None
        ),
        "nodes": node_rows,
        "jobs": job_rows,
        "restarts_jobs": restarting and bool(relaunched),
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
    attempt = job_latest_attempt(job)
    return {
        "key": job.key,
        "status": job.status,
        "attempt": attempt.number if attempt else None,
        "world_size": attempt.world_size if attempt else None,
        "nodes": sorted(attempt.nodes.values_list("name", flat=True)) if attempt else [],
        "last_step": job.last_step,
    }


def action_param_nodes(action: Action) -> list[str]:
    names = action.params.get("nodes") if isinstance(action.params, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
