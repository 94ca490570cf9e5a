"""The approval page's reads: the actions awaiting approval with what an approver weighs
(as `action_evidence` gives it for one, here batched: a fixed number of queries
whatever the number of actions), each cluster's guardrail state, and the actions
decided lately."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, F, OuterRef, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from incidents.models import Incident, TimelineEntry
from jobs.models import Attempt, Checkpoint, Node, TrainingJob
from jobs.selectors import attempts_latest_first, checkpoints_durable_latest_first
from recovery import guardrails
from recovery.models import Action, ActionAudit, ClusterRecoverySettings
from recovery.selectors.evidence import (
    RESTARTING,
    action_off_nodes,
    action_param_nodes,
    rank_ranges,
    ranks_on_nodes,
    stake_figures,
)

K = Action.Kind
S = Action.State
QUEUE_SIGNALS = 3  # the latest signals shown per incident


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
    named = {(a.cluster_id, n) for a in actions for n in action_param_nodes(a)}
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
    off = {a.pk: action_off_nodes(a, by_name) for a in actions}
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
        for n in [
            a.node,
            a.spare,
            *(by_name.get((a.cluster_id, m)) for m in action_param_nodes(a)),
        ]:
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
