"""Guardrails: small checks run when an action is proposed and again right before
it runs. Each returns None, or a reason that starts with its own name
("storm: ..."); the action records that name in `blocked_by`.

- AUTOMATIC ones stop an action that no person approved; it then waits in the
  approval queue. A person's approval overrides them (that is the point of asking).
- ALWAYS ones stop any action, approved or not: it cannot run as things are.
- `pause` holds everything: new automatic actions wait for approval, and queued
  ones do not start until the cluster is resumed.
- `stale`: the target changed since the action was proposed or approved.
- `lease` is the database's one-action-at-a-time-per-node-and-job constraint (over
  Action.LEASE_STATES: actions awaiting approval hold nothing), checked first so that
  a refusal can name the action holding it.

Dry run is a mode, not a block: a dry-run action (or any on a cluster set to dry
run) goes through its states, and its driver call is only recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from incidents.models import Incident
from jobs.models import Attempt, Node
from recovery.models import Action, ClusterRecoverySettings

K = Action.Kind
S = Action.State

# Kinds that take a node out of the job or out of service.
ISOLATING = frozenset(
    {K.CORDON_NODE, K.DRAIN_NODE, K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT, K.SCALE_DOWN}
)
NEEDS_SPARE = frozenset({K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT})
RESTARTS = frozenset({K.RESTART_JOB, K.ROLLBACK})
UNHEALTHY_NODE_STATES = (
    Node.State.SUSPECT,
    Node.State.CORDONED,
    Node.State.DRAINING,
    Node.State.IN_REPAIR,
)
OPEN_INCIDENT = (Incident.State.OPEN, Incident.State.MITIGATING)


@dataclass(frozen=True)
class Context:
    settings: ClusterRecoverySettings
    now: datetime


def automatic(action: Action) -> bool:
    """Would it run with no person's approval?"""
    return action.mode == Action.Mode.AUTO and not action.approved_by


def pause(action: Action, ctx: Context) -> str | None:
    s = ctx.settings
    if s.paused:
        by = f" by {s.paused_by}" if s.paused_by else ""
        return f"pause: recovery on this cluster is paused{by}: {s.pause_reason or 'no reason'}"
    return None


def lease(action: Action, ctx: Context) -> str | None:
    """Another action on the same node or job, queued, approved or running."""
    target = Q()
    if action.node_id:
        target |= Q(node_id=action.node_id)
    if action.job_id:
        target |= Q(job_id=action.job_id)
    if not target:
        return None
    holder = (
        Action.objects.filter(target, state__in=Action.LEASE_STATES)
        .exclude(pk=action.pk)
        .order_by("id")
        .first()
    )
    if holder is None:
        return None
    return f"lease: action #{holder.pk} ({holder.kind}, {holder.state}) holds this target"


def action_nodes(action: Action) -> set[int]:
    """The nodes an action takes out: its node, and for a scale-down the nodes it drops."""
    ids = {action.node_id} if action.node_id else set()
    names = action.params.get("nodes") if isinstance(action.params, dict) else None
    if names:
        ids |= set(
            Node.objects.filter(cluster_id=action.cluster_id, name__in=names).values_list(
                "id", flat=True
            )
        )
    return ids


def storm_allowed(max_share: float, total_nodes: int) -> int:
    """How many nodes may be unhealthy or isolated before storm protection holds
    automatic isolation: the set share of the cluster, at least one node."""
    return max(1, math.floor(max_share * total_nodes + 1e-9))


def storm(action: Action, ctx: Context) -> str | None:
    """No automatic isolation once more than the set share of the cluster's nodes
    (at least one node) is unhealthy or being isolated within the sliding window."""
    if action.kind not in ISOLATING or not automatic(action):
        return None
    s = ctx.settings
    since = ctx.now - timedelta(seconds=s.storm_window_s)
    nodes = Node.objects.filter(cluster_id=action.cluster_id).exclude(state=Node.State.RETIRED)
    total = nodes.count()
    hit = set(
        nodes.filter(state__in=UNHEALTHY_NODE_STATES, state_changed_at__gte=since).values_list(
            "id", flat=True
        )
    )
    isolations = Action.objects.filter(
        cluster_id=action.cluster_id,
        kind__in=ISOLATING,
        state__in=(S.QUEUED, S.RUNNING, S.SUCCEEDED),
        created_at__gte=since,
    ).exclude(pk=action.pk)
    for other in isolations:
        hit |= action_nodes(other)
    hit |= action_nodes(action)
    allowed = storm_allowed(s.storm_max_share, total)
    if len(hit) <= allowed:
        return None
    return (
        f"storm: {len(hit)} of {total} nodes unhealthy or isolated within"
        f" {s.storm_window_s / 60:g} min, more than {s.storm_max_share:.0%} ({allowed}):"
        " automatic isolation needs approval"
    )


def cooldown(action: Action, ctx: Context) -> str | None:
    """No automatic action on a node or job soon after an action on it failed."""
    if not automatic(action):
        return None
    target = Q()
    if action.node_id:
        target |= Q(node_id=action.node_id)
    if action.job_id:
        target |= Q(job_id=action.job_id)
    if not target:
        return None
    since = ctx.now - timedelta(seconds=ctx.settings.cooldown_s)
    failed = (
        Action.objects.filter(target, state=S.FAILED, finished_at__gte=since)
        .exclude(pk=action.pk)
        .order_by("-finished_at")
        .first()
    )
    if failed is None:
        return None
    return (
        f"cooldown: action #{failed.pk} ({failed.kind}) on this target failed"
        f" {(ctx.now - failed.finished_at).total_seconds():.0f} s ago"
        f" (cool-down {ctx.settings.cooldown_s:g} s)"
    )


def crash_loop(action: Action, ctx: Context) -> str | None:
    """Restarting a job in a crash loop will not fix it: a person decides."""
    if action.kind not in RESTARTS or not action.job_id or not automatic(action):
        return None
    loop = Incident.objects.filter(
        job_id=action.job_id, fault_type="crash_loop", state__in=OPEN_INCIDENT
    ).first()
    if loop is None:
        return None
    return f"crash_loop: the job is in a crash loop (incident #{loop.pk}): {loop.summary}"


def spares(action: Action, ctx: Context) -> str | None:
    """A replacement needs a spare node not promised to another replacement."""
    if action.kind not in NEEDS_SPARE or action.spare_id:
        return None
    free = (
        Node.objects.filter(cluster_id=action.cluster_id, state=Node.State.SPARE)
        .exclude(actions__state__in=Action.ACTIVE_STATES)
        .count()
    )
    promised = (
        Action.objects.filter(
            cluster_id=action.cluster_id,
            kind__in=NEEDS_SPARE,
            state__in=(S.APPROVED, S.QUEUED, S.RUNNING),
            spare=None,
        )
        .exclude(pk=action.pk)
        .count()
    )
    if free - promised >= 1:
        return None
    return (
        f"spares: no spare node free on this cluster ({free} spare, {promised} promised"
        " to other replacements); consider scale_down"
    )


def target_snapshot(action: Action) -> dict:
    """What an approval is given on: the node's state and the job's latest launch."""
    snap: dict = {}
    if action.node_id:
        snap["node_state"] = Node.objects.filter(pk=action.node_id).values_list("state", flat=True)[
            0
        ]
    if action.job_id:
        snap["job_attempt"] = (
            Attempt.objects.filter(job_id=action.job_id)
            .order_by("-number")
            .values_list("number", flat=True)
            .first()
        )
    return snap


def stale(action: Action, ctx: Context) -> str | None:
    """The target changed (node state, a new launch of the job) since it was proposed."""
    now = target_snapshot(action)
    was = action.target_snapshot or {}
    changes = [
        f"{name} {was.get(key)} -> {now.get(key)}"
        for key, name in (("node_state", "node state"), ("job_attempt", "job launch"))
        if key in was and was.get(key) != now.get(key)
    ]
    if not changes:
        return None
    return f"stale: the target changed since it was proposed ({'; '.join(changes)})"


AUTOMATIC = (pause, crash_loop, cooldown, storm)
ALWAYS = (spares,)


def first_block(action: Action, ctx: Context, checks) -> tuple[str, str] | None:
    """(guardrail name, reason) of the first check that blocks, or None."""
    for check in checks:
        reason = check(action, ctx)
        if reason:
            return check.__name__, reason
    return None
