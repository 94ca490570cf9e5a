"""Reads of the recovery app: the action queue, an action's evidence, a cluster's
recovery settings."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, F, OuterRef, Prefetch, Q, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from incidents.models import Incident, TimelineEntry
from jobs.models import Attempt, Checkpoint, Node, RankWindow, TrainingJob
from jobs.selectors import (
    attempts_latest_first,
    checkpoints_durable_latest_first,
    job_latest_attempt,
)
from recovery import guardrails
from recovery.models import Action, ActionAudit, ClusterRecoverySettings

K = Action.Kind
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


def _off_nodes(action: Action, by_name=None) -> list[Node]:
    """The nodes a replacement or a scale-down moves its job off."""
    if action.kind not in OFF_NODES:
        return []
    nodes = [action.node] if action.node_id else []
    for name in _param_nodes(action):
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
    off = _off_nodes(action)
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


# --- the approval page: the waiting actions with their evidence, batched ---------------
# action_evidence reads per action; the page shows up to `limit` of them, so these read
# the same facts for all of them in a fixed number of queries.

QUEUE_SIGNALS = 3  # the latest signals shown per incident
S = Action.State


def action_is_own(*, action: Action, user, actor: str | None = None) -> bool:
    """Did `user` (or `actor`, a name; the user's by default) request the action? Then
    another operator must approve it: action_approve asks this too."""
    if getattr(user, "pk", None) and action.requested_by_user_id:
        return user.pk == action.requested_by_user_id
    return (actor or getattr(user, "username", None)) == action.requested_by


def _param_nodes(action: Action) -> list[str]:
    names = action.params.get("nodes") if isinstance(action.params, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def cluster_guardrails(cluster_ids, *, now=None) -> dict[int, dict]:
    """Per cluster: the pause switch, the storm state (the nodes unhealthy or isolated
    within the window against the nodes it has and its limits: guardrails.storm_state,
    as the automatic path reads it) and the spare pool left (spares no action holds,
    less those promised to replacements). A few queries per cluster."""
    now = now or timezone.now()
    ids = set(cluster_ids)
    cfgs = {c.cluster_id: c for c in ClusterRecoverySettings.objects.filter(cluster_id__in=ids)}
    spares = {
        row["cluster_id"]: row["n"]
        for row in Node.objects.filter(cluster_id__in=ids, state=Node.State.SPARE)
        .values("cluster_id")
        .annotate(n=Count("id"))
    }
    held = {
        row["cluster_id"]: row
        for row in Action.objects.filter(cluster_id__in=ids, state__in=Action.ACTIVE_STATES)
        .values("cluster_id")
        .annotate(
            promised=Count(
                "id",
                filter=Q(
                    kind__in=guardrails.NEEDS_SPARE,
                    state__in=(S.APPROVED, S.QUEUED, S.RUNNING),
                    spare=None,
                ),
            ),
            spares_held=Count("node", filter=Q(node__state=Node.State.SPARE), distinct=True),
        )
    }
    out = {}
    for cid in ids:
        cfg = cfgs.get(cid) or ClusterRecoverySettings(cluster_id=cid)
        storm = guardrails.storm_state(cid, guardrails.Context(cfg, now))
        h = held.get(cid, {})
        hit = len(storm.hit)
        free = spares.get(cid, 0) - h.get("spares_held", 0)
        out[cid] = {
            "settings": cfg,
            "paused": cfg.paused,
            "pause_reason": cfg.pause_reason,
            "paused_by": cfg.paused_by,
            "paused_at": cfg.paused_at,
            "dry_run": cfg.dry_run,
            "nodes": storm.nodes,
            "unhealthy": hit,
            "unhealthy_share": hit / storm.nodes if storm.nodes else 0.0,
            "storm_window_min": storm.window_s / 60,
            "storm_max_share": cfg.storm_max_share,
            "storm_max_nodes": cfg.storm_max_nodes,
            "storm_allowed": storm.allowed,
            "storm_capped": storm.capped,
            "storm": storm.over,
            "heard_within_min": guardrails.HEARD_WITHIN_S / 60,
            "spares": free,
            "promised": h.get("promised", 0),
            "spares_left": max(0, free - h.get("promised", 0)),
        }
    return out


def approval_queue(*, limit: int = 50) -> dict:
    """The actions awaiting approval, oldest first (at most `limit`), each with what an
    approver weighs (action_evidence's facts): the incident and its latest signals, the
    nodes and jobs affected, the ranks a relaunch restarts, the progress since the
    checkpoint that it throws away, and its cluster's guardrail state. A fixed number
    of queries, whatever the number of actions."""
    waiting = Action.objects.filter(state=S.AWAITING_APPROVAL)
    actions = list(
        waiting.select_related("cluster", "node", "job", "spare", "incident").order_by(
            "created_at", "id"
        )[:limit]
    )
    total = len(actions) if len(actions) < limit else waiting.count()
    if not actions:
        return {"total": total, "items": []}

    # Nodes a scale-down names in its params.
    named = {(a.cluster_id, n) for a in actions for n in _param_nodes(a)}
    by_name = {}
    if named:
        for n in Node.objects.filter(
            cluster_id__in={c for c, _ in named}, name__in={n for _, n in named}
        ):
            by_name[(n.cluster_id, n.name)] = n

    # Running jobs whose latest launch has a node being drained or cordoned.
    watched = {a.node_id for a in actions if a.node_id and a.kind in (K.DRAIN_NODE, K.CORDON_NODE)}
    jobs_on: dict[int, set[int]] = defaultdict(set)
    if watched:
        newest = attempts_latest_first(OuterRef("attempt__job_id")).values("number")[:1]
        for node_id, job_id in Attempt.nodes.through.objects.filter(
            node_id__in=watched,
            attempt__job__status=TrainingJob.Status.RUNNING,
            attempt__number=Subquery(newest),
        ).values_list("node_id", "attempt__job_id"):
            jobs_on[node_id].add(job_id)

    def affected(a: Action) -> list[int]:
        ids = [a.job_id] if a.job_id else []
        if a.node_id in watched and a.kind in (K.DRAIN_NODE, K.CORDON_NODE):
            ids += sorted(jobs_on[a.node_id] - {a.job_id})
        return ids

    # Each affected job with its latest launch (and that launch's nodes) and its latest
    # durable checkpoint; a rollback's own checkpoint besides.
    job_ids = {j for a in actions for j in affected(a)}
    jobs, attempts, attempt_nodes, ckpts, rollback_ckpts = {}, {}, defaultdict(list), {}, {}
    if job_ids:
        latest_attempt = attempts_latest_first(OuterRef("pk")).values("pk")[:1]
        latest_ckpt = checkpoints_durable_latest_first(OuterRef("pk")).values("pk")[:1]
        jobs = {
            j.pk: j
            for j in TrainingJob.objects.filter(pk__in=job_ids).annotate(
                attempt_pk=Subquery(latest_attempt), ckpt_pk=Subquery(latest_ckpt)
            )
        }
        attempts = {
            a.pk: a for a in Attempt.objects.filter(pk__in={j.attempt_pk for j in jobs.values()})
        }
        for attempt_id, name in (
            Attempt.nodes.through.objects.filter(attempt_id__in=attempts)
            .order_by("node__name")
            .values_list("attempt_id", "node__name")
        ):
            attempt_nodes[attempt_id].append(name)
        ckpts = {
            c.pk: c for c in Checkpoint.objects.filter(pk__in={j.ckpt_pk for j in jobs.values()})
        }
        wanted = Q()
        for a in actions:
            if a.kind == K.ROLLBACK and a.job_id and isinstance(a.params.get("step"), int):
                wanted |= Q(job_id=a.job_id, step=a.params["step"])
        if wanted:
            for c in (
                Checkpoint.objects.filter(wanted, durable=True)
                .exclude(saved_at=None)
                .order_by("saved_at", "step")
            ):
                rollback_ckpts[(c.job_id, c.step)] = c  # the latest saved wins

    # The incidents' nodes and latest signals.
    incident_ids = {a.incident_id for a in actions if a.incident_id}
    incident_nodes, signals = defaultdict(list), defaultdict(list)
    if incident_ids:
        for incident_id, name in (
            Incident.nodes.through.objects.filter(incident_id__in=incident_ids)
            .order_by("node__name")
            .values_list("incident_id", "node__name")
        ):
            incident_nodes[incident_id].append(name)
        for entry in (
            TimelineEntry.objects.filter(
                incident_id__in=incident_ids, kind=TimelineEntry.Kind.SIGNAL
            )
            .annotate(
                n=Window(
                    RowNumber(),
                    partition_by=[F("incident_id")],
                    order_by=[F("at").desc(), F("id").desc()],
                ),
                of=Window(Count("id"), partition_by=[F("incident_id")]),
            )
            .filter(n__lte=QUEUE_SIGNALS)
            .order_by("incident_id", "at", "id")
        ):
            signals[entry.incident_id].append(entry)

    now = timezone.now()
    clusters = cluster_guardrails({a.cluster_id for a in actions}, now=now)
    # What would stop an approval now, as action_approve decides it.
    facts = guardrails.Facts(actions)

    # The ranks of each job on the nodes a replacement or scale-down moves it off.
    off = {a.pk: _off_nodes(a, by_name) for a in actions}
    ranks_on = ranks_on_nodes(
        {
            (a.job_id, attempts[jobs[a.job_id].attempt_pk].number, n.pk)
            for a in actions
            if a.job_id in jobs and jobs[a.job_id].attempt_pk in attempts
            for n in off[a.pk]
        }
    )

    items = []
    for a in actions:
        restarting = a.kind in RESTARTING
        nodes, seen = [], set()
        for n in [a.node, a.spare, *(by_name.get((a.cluster_id, m)) for m in _param_nodes(a))]:
            if n is not None and n.pk not in seen:
                seen.add(n.pk)
                nodes.append(n)
        job_rows = []
        for jid in affected(a):
            job = jobs[jid]
            attempt = attempts.get(job.attempt_pk)
            finished = job.status in guardrails.FINISHED_JOB
            row = {
                "job": job,
                "attempt": attempt,
                "nodes": attempt_nodes.get(attempt.pk, []) if attempt else [],
                "world_size": (attempt.world_size if attempt else None) or 0,
                "finished": finished,
                "stake": None,
                "ranks_off": [
                    {
                        "node": n.name,
                        "ranks": ranks_on.get((jid, n.pk), []),
                        "text": rank_ranges(ranks_on.get((jid, n.pk), [])),
                    }
                    for n in off[a.pk]
                    if jid == a.job_id
                ],
            }
            if restarting and not finished:
                if a.kind == K.ROLLBACK:
                    ckpt = rollback_ckpts.get((jid, a.params.get("step")))
                else:
                    ckpt = ckpts.get(job.ckpt_pk)
                row["stake"] = stake_figures(job=job, attempt=attempt, checkpoint=ckpt)
            job_rows.append(row)
        relaunched = [r for r in job_rows if not r["finished"]]
        stakes = [r["stake"] for r in job_rows if r["stake"]]
        lost_steps = [s["steps_lost"] for s in stakes if s["steps_lost"] is not None]
        incident = a.incident
        cfg = clusters[a.cluster_id]["settings"]
        blocker = guardrails.decision_block(a, guardrails.Context(cfg, now, facts))
        items.append(
            {
                "action": a,
                "incident": incident,
                "incident_nodes": incident_nodes.get(a.incident_id, []),
                "signals": signals.get(a.incident_id, []),
                "signal_count": signals[a.incident_id][0].of if signals.get(a.incident_id) else 0,
                "nodes": nodes,
                "jobs": job_rows,
                "relaunches": restarting,  # the kind relaunches the jobs it touches
                "restarts": restarting and bool(relaunched),
                "at_next_checkpoint": a.kind == K.REPLACE_AT_NEXT_CHECKPOINT,
                "ranks_restarting": sum(r["world_size"] for r in relaunched) if restarting else 0,
                "gpu_hours": round(sum(s["gpu_hours"] for s in stakes), 6),
                "seconds_lost": round(sum(s["seconds_lost"] for s in stakes), 3),
                "steps_lost": sum(lost_steps) if lost_steps else None,
                "guardrails": clusters[a.cluster_id],
                # (guardrail, reason) that stops an approval now, or None.
                "blocker": blocker,
            }
        )
    return {"total": total, "items": items}


def approvals_decided(*, limit: int = 50) -> list[Action]:
    """The latest actions to leave the approval queue, last to leave first, each with
    `decided_at`, `decided_by` and `decision` (the state it left for). Read from the
    newest audit entries that left the queue, a bounded read whatever the history's
    size: actions that went back and forth lately may leave fewer than `limit`."""
    left = (
        ActionAudit.objects.filter(from_state=S.AWAITING_APPROVAL)
        .order_by("-at", "-id")
        .values_list("action_id", "at", "actor", "to_state")[: limit * 4]
    )
    latest: dict[int, tuple] = {}
    for action_id, *decision in left:
        latest.setdefault(action_id, decision)
    out = []
    for action in (
        Action.objects.filter(pk__in=latest)
        .exclude(state=S.AWAITING_APPROVAL)  # back in the queue since
        .select_related("cluster", "node", "job")
    ):
        action.decided_at, action.decided_by, action.decision = latest[action.pk]
        out.append(action)
    out.sort(key=lambda a: (a.decided_at, a.pk), reverse=True)
    return out[:limit]


# --- the nodes pages -----------------------------------------------------------------


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
