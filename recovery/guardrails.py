"""Guardrails: small checks run when an action is proposed and again right before
it runs. Each returns None, or a reason that starts with its own name
("storm: ..."); the action records that name in `blocked_by`.

- AUTOMATIC ones stop an action that no person approved; it then waits in the
  approval queue. A person's approval overrides them (that is the point of asking).
- ALWAYS ones stop any action, approved or not: it cannot run as things are.
- `pause` holds everything: new automatic actions wait for approval, and queued
  ones do not start until the cluster is resumed.
- `maintenance` does the same for an action on a node under planned maintenance
  now (jobs.selectors.maintenance_active), or on a job running on one (or on a
  cluster under maintenance as a whole): held until the window ends or is
  cancelled. The pre-maintenance actions themselves (params.maintenance_window)
  are what the window asked for, and pass.
- `stale`: the target changed since the action was proposed or approved.
- `lease` is the database's one-action-at-a-time-per-node-and-job constraint (over
  Action.LEASE_STATES: actions awaiting approval hold nothing), checked first so that
  a refusal can name the action holding it.
- DECISION ones are what an approval must pass (`decision_block`): the approval has
  not expired, the target has not finished or moved on (`moved_on`: the action is
  then retired), the lease, and the ALWAYS ones. The service asks before approving
  and the approval page before offering Approve, through the same function; the
  `Facts` they read are loaded for one action or for a page of them alike.

Storm protection counts the nodes a cluster really has: those a person registered
and those heard from lately (a heartbeat), never a name a batch merely mentions.

Long module: every guardrail in one place, so that what may stop an action is read
in one file.

Dry run is a mode, not a block: a dry-run action (or any on a cluster set to dry
run) goes through its states, and its driver call is only recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from django.db.models import Count, OuterRef, Q, Subquery

from incidents.models import Incident
from jobs.models import Attempt, Node, TrainingJob
from jobs.selectors import attempts_latest_first, maintenance_active
from recovery.models import Action, ClusterRecoverySettings

K = Action.Kind
S = Action.State

# Kinds that take a node out of the job or out of service.
ISOLATING = frozenset(
    {K.CORDON_NODE, K.DRAIN_NODE, K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT, K.SCALE_DOWN}
)
NEEDS_SPARE = frozenset({K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT})
RESTARTS = frozenset({K.RESTART_JOB, K.ROLLBACK})
# Kinds whose target is a job (for a replacement or a scale-down: on some of its nodes).
ON_A_JOB = frozenset(
    {
        K.RESTART_JOB,
        K.ROLLBACK,
        K.REPLACE_NODE,
        K.REPLACE_AT_NEXT_CHECKPOINT,
        K.SCALE_DOWN,
        K.CHECKPOINT_JOB,
    }
)
FINISHED_JOB = (TrainingJob.Status.COMPLETED, TrainingJob.Status.FAILED)
# What a node kind leaves its node in: reached meanwhile, the action has nothing to do.
NODE_OUTCOME = {
    K.CORDON_NODE: (Node.State.CORDONED, Node.State.DRAINING, Node.State.IN_REPAIR),
    K.DRAIN_NODE: (Node.State.IN_REPAIR,),
    K.UNCORDON_NODE: (Node.State.ACTIVE,),
    K.VALIDATE_NODE: (Node.State.SPARE, Node.State.ACTIVE),
}
# A node heard from this recently counts toward its cluster's size.
HEARD_WITHIN_S = 3600.0
UNHEALTHY_NODE_STATES = (
    Node.State.SUSPECT,
    Node.State.CORDONED,
    Node.State.DRAINING,
    Node.State.IN_REPAIR,
)


@dataclass(frozen=True)
class Context:
    settings: ClusterRecoverySettings | None  # None where no check run reads it
    now: datetime
    # The targets' facts, loaded for a batch (the approval page); None: for the action.
    facts: Facts | None = field(default=None, compare=False)


@dataclass(frozen=True)
class JobFacts:
    key: str
    status: str
    launch: int | None  # its latest launch's number
    launch_nodes: frozenset[int]  # that launch's nodes


class Facts:
    """What the decision guardrails read about some actions' targets: who holds their
    leases, the spare pools of their clusters, their jobs' latest launches, their
    nodes' states and their incidents' states. Each part is read once for all the
    actions, on first use: a fixed number of queries however many actions."""

    def __init__(self, actions):
        self.actions = list(actions)
        self._pks = {a.pk for a in self.actions if a.pk is not None}

    def covers(self, action: Action) -> bool:
        return action.pk in self._pks

    @cached_property
    def _holders(self) -> list[tuple]:
        nodes = {a.node_id for a in self.actions if a.node_id}
        jobs = {a.job_id for a in self.actions if a.job_id}
        if not nodes and not jobs:
            return []
        return list(
            Action.objects.filter(
                Q(node_id__in=nodes) | Q(job_id__in=jobs), state__in=Action.LEASE_STATES
            )
            .order_by("id")
            .values_list("pk", "node_id", "job_id", "kind", "state")
        )

    def lease_holder(self, action: Action) -> tuple | None:
        """(pk, kind, state) of the first other action holding its node or job."""
        for pk, node_id, job_id, kind, state in self._holders:
            if pk == action.pk:
                continue
            if (action.node_id and node_id == action.node_id) or (
                action.job_id and job_id == action.job_id
            ):
                return pk, kind, state
        return None

    @cached_property
    def _spare_pools(self) -> dict[int, tuple[int, list[int]]]:
        clusters = {a.cluster_id for a in self.actions if a.kind in NEEDS_SPARE}
        if not clusters:
            return {}
        free = dict(
            Node.objects.filter(cluster_id__in=clusters, state=Node.State.SPARE)
            .exclude(actions__state__in=Action.ACTIVE_STATES)
            .values("cluster_id")
            .annotate(n=Count("id", distinct=True))
            .values_list("cluster_id", "n")
        )
        promised: dict[int, list[int]] = {c: [] for c in clusters}
        for cluster_id, pk in Action.objects.filter(
            cluster_id__in=clusters,
            kind__in=NEEDS_SPARE,
            state__in=(S.APPROVED, S.QUEUED, S.RUNNING),
            spare=None,
        ).values_list("cluster_id", "pk"):
            promised[cluster_id].append(pk)
        return {c: (free.get(c, 0), promised[c]) for c in clusters}

    def spare_pool(self, action: Action) -> tuple[int, int]:
        """(spare nodes no action holds, spares promised to other replacements)."""
        free, promised = self._spare_pools.get(action.cluster_id, (0, []))
        return free, sum(1 for pk in promised if pk != action.pk)

    @cached_property
    def _jobs(self) -> dict[int, JobFacts]:
        ids = {a.job_id for a in self.actions if a.job_id}
        if not ids:
            return {}
        latest = attempts_latest_first(OuterRef("pk"))
        rows = list(
            TrainingJob.objects.filter(pk__in=ids)
            .annotate(
                launch=Subquery(latest.values("number")[:1]),
                launch_pk=Subquery(latest.values("pk")[:1]),
            )
            .values_list("pk", "key", "status", "launch", "launch_pk")
        )
        nodes: dict[int, set[int]] = {}
        for attempt_id, node_id in Attempt.nodes.through.objects.filter(
            attempt_id__in=[r[4] for r in rows if r[4]]
        ).values_list("attempt_id", "node_id"):
            nodes.setdefault(attempt_id, set()).add(node_id)
        return {
            pk: JobFacts(key, status, launch, frozenset(nodes.get(launch_pk, ())))
            for pk, key, status, launch, launch_pk in rows
        }

    def job(self, action: Action) -> JobFacts | None:
        return self._jobs.get(action.job_id) if action.job_id else None

    @cached_property
    def _nodes(self) -> dict[int, tuple[str, str]]:
        # A node read with its action just now (select_related) is not read again.
        out = {
            a.node_id: (a.node.name, a.node.state)
            for a in self.actions
            if a.node_id and Action.node.is_cached(a)
        }
        ids = {a.node_id for a in self.actions if a.node_id} - out.keys()
        if ids:
            out |= {
                pk: (name, st)
                for pk, name, st in Node.objects.filter(pk__in=ids).values_list(
                    "pk", "name", "state"
                )
            }
        return out

    def node(self, action: Action) -> tuple[str, str] | None:
        """(name, state) of its node."""
        return self._nodes.get(action.node_id) if action.node_id else None

    @cached_property
    def _incidents(self) -> dict[int, str]:
        ids = {a.incident_id for a in self.actions if a.incident_id and a.policy}
        if not ids:
            return {}
        return dict(Incident.objects.filter(pk__in=ids).values_list("pk", "state"))

    def incident_state(self, action: Action) -> str | None:
        return self._incidents.get(action.incident_id) if action.incident_id else None


def facts(action: Action, ctx: Context) -> Facts:
    """The batch's facts when they cover the action, else its own."""
    if ctx.facts is not None and ctx.facts.covers(action):
        return ctx.facts
    return Facts([action])


def automatic(action: Action) -> bool:
    """Would it run with no person's approval?"""
    return action.mode == Action.Mode.AUTO and not action.approved_by


def pause(action: Action, ctx: Context) -> str | None:
    s = ctx.settings
    if s.paused:
        by = f" by {s.paused_by}" if s.paused_by else ""
        return f"pause: recovery on this cluster is paused{by}: {s.pause_reason or 'no reason'}"
    return None


def maintenance(action: Action, ctx: Context) -> str | None:
    if isinstance(action.params, dict) and "maintenance_window" in action.params:
        return None  # proposed by the window itself, to move off its nodes
    nodes = action_nodes(action)
    job = facts(action, ctx).job(action)
    if job is not None:
        nodes |= job.launch_nodes
    span = maintenance_active(cluster_id=action.cluster_id, node_ids=nodes, at=ctx.now)
    if span is None:
        return None
    until = datetime.fromtimestamp(span.end, tz=ctx.now.tzinfo)
    return f"maintenance: {span.describe()} until {until:%Y-%m-%d %H:%M} UTC"


def lease(action: Action, ctx: Context) -> str | None:
    """Another action on the same node or job, queued, approved or running."""
    holder = facts(action, ctx).lease_holder(action)
    if holder is None:
        return None
    pk, kind, state = holder
    return f"lease: action #{pk} ({kind}, {state}) holds this target"


def action_nodes(action: Action) -> set[int]:
    """The nodes an action takes out: its node, and for a scale-down the nodes it drops."""
    return isolated_nodes(action.cluster_id, [action])


def isolated_nodes(cluster_id: int, actions) -> set[int]:
    """The nodes some actions of a cluster take out (at most one query)."""
    ids = {a.node_id for a in actions if a.node_id}
    names = set()
    for a in actions:
        listed = a.params.get("nodes") if isinstance(a.params, dict) else None
        if isinstance(listed, list):
            names |= {n for n in listed if isinstance(n, str)}
    if names:
        ids |= set(
            Node.objects.filter(cluster_id=cluster_id, name__in=names).values_list("id", flat=True)
        )
    return ids


def storm_allowed(max_share: float, total_nodes: int, max_nodes: int | None = None) -> int:
    """How many nodes may be unhealthy or isolated before storm protection holds
    automatic isolation: the set share of the cluster (at least one node), and never
    more than the absolute cap when one is set."""
    by_share = max(1, math.floor(max_share * total_nodes + 1e-9))
    return by_share if max_nodes is None else min(by_share, max_nodes)


@dataclass(frozen=True)
class StormState:
    """A cluster against its storm limit, over the sliding window."""

    hit: frozenset[int]  # nodes unhealthy or isolated within the window
    nodes: int  # the nodes it has: registered, heard from lately, or hit
    allowed: int
    max_share: float
    max_nodes: int | None
    window_s: float

    @property
    def capped(self) -> bool:
        """The absolute cap, not the share, sets the limit."""
        return self.allowed < storm_allowed(self.max_share, self.nodes)

    @property
    def over(self) -> bool:
        return len(self.hit) > self.allowed

    @property
    def limit(self) -> str:
        if self.capped:
            return f"the cap of {self.max_nodes} node{'' if self.max_nodes == 1 else 's'}"
        return f"{self.max_share:.0%} ({self.allowed})"


def storm_state(cluster_id: int, ctx: Context, *, action: Action | None = None) -> StormState:
    """The nodes of the cluster unhealthy or isolated within the window (with those
    `action` would take out), against the nodes it really has: registered by a person
    or heard from within HEARD_WITHIN_S. Ingest that names nodes creates them
    unregistered, so it cannot raise the limit. A few queries."""
    s = ctx.settings
    since = ctx.now - timedelta(seconds=s.storm_window_s)
    hit = set(
        Node.objects.filter(
            cluster_id=cluster_id, state__in=UNHEALTHY_NODE_STATES, state_changed_at__gte=since
        ).values_list("id", flat=True)
    )
    isolations = Action.objects.filter(
        cluster_id=cluster_id,
        kind__in=ISOLATING,
        state__in=(S.QUEUED, S.RUNNING, S.SUCCEEDED),
        created_at__gte=since,
    ).only("node_id", "params")
    if action is not None:
        isolations = isolations.exclude(pk=action.pk) if action.pk else isolations
    hit |= isolated_nodes(cluster_id, [*isolations, *([action] if action else [])])
    heard = ctx.now - timedelta(seconds=HEARD_WITHIN_S)
    nodes = (
        Node.objects.filter(cluster_id=cluster_id)
        .exclude(state=Node.State.RETIRED)
        .filter(Q(registered=True) | Q(last_heard_at__gte=heard) | Q(pk__in=hit))
        .count()
    )
    return StormState(
        hit=frozenset(hit),
        nodes=nodes,
        allowed=storm_allowed(s.storm_max_share, nodes, s.storm_max_nodes),
        max_share=s.storm_max_share,
        max_nodes=s.storm_max_nodes,
        window_s=s.storm_window_s,
    )


def storm(action: Action, ctx: Context) -> str | None:
    """No automatic isolation once more than the set share of the cluster's nodes
    (at least one node), or more than the absolute cap, is unhealthy or being
    isolated within the sliding window."""
    if action.kind not in ISOLATING or not automatic(action):
        return None
    state = storm_state(action.cluster_id, ctx, action=action)
    if not state.over:
        return None
    return (
        f"storm: {len(state.hit)} of {state.nodes} nodes unhealthy or isolated within"
        f" {state.window_s / 60:g} min, more than {state.limit}:"
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
        job_id=action.job_id, fault_type="crash_loop", state__in=Incident.OPEN_STATES
    ).first()
    if loop is None:
        return None
    return f"crash_loop: the job is in a crash loop (incident #{loop.pk}): {loop.summary}"


def spares(action: Action, ctx: Context) -> str | None:
    """A replacement needs a spare node not promised to another replacement."""
    if action.kind not in NEEDS_SPARE or action.spare_id:
        return None
    free, promised = facts(action, ctx).spare_pool(action)
    if free - promised >= 1:
        return None
    return (
        f"spares: no spare node free on this cluster ({free} spare, {promised} promised"
        " to other replacements); consider scale_down"
    )


def expired(action: Action, ctx: Context) -> str | None:
    """An approval asked for too long ago: the expiry task may not have run yet."""
    if action.state != S.AWAITING_APPROVAL or action.expires_at is None:
        return None
    if action.expires_at > ctx.now:
        return None
    return f"expired: no decision by {action.expires_at:%Y-%m-%d %H:%M:%S} UTC"


def moved_on(action: Action, ctx: Context) -> str | None:
    """The target finished or moved on since it was proposed, so the action has
    nothing left to do: its job finished, relaunched without its node, or (a restart)
    relaunched already; its node retired or already where the action would put it;
    the incident a policy proposed it for resolved. Such an action is retired."""
    f = facts(action, ctx)
    node = f.node(action)
    was = action.target_snapshot or {}
    if node is not None:
        name, state = node
        if state == Node.State.RETIRED:
            return f"moved_on: node {name} is retired"
        if state in NODE_OUTCOME.get(action.kind, ()) and was.get("node_state") != state:
            return f"moved_on: node {name} is {state} already"
    job = f.job(action)
    if job is not None and action.kind in ON_A_JOB:
        if job.status in FINISHED_JOB:
            return f"moved_on: job {job.key} finished ({job.status}): nothing left to act on"
        if (
            node is not None
            and action.kind != K.SCALE_DOWN
            and job.launch_nodes
            and action.node_id not in job.launch_nodes
        ):
            return f"moved_on: job {job.key}'s launch {job.launch} runs without node {node[0]}"
        launched = was.get("job_attempt")
        if (
            action.kind in RESTARTS
            and launched is not None
            and job.launch is not None
            and job.launch > launched
            and job.status == TrainingJob.Status.RUNNING
        ):
            return f"moved_on: job {job.key} was relaunched since (launch {job.launch} runs)"
    if f.incident_state(action) == Incident.State.RESOLVED:
        return f"moved_on: incident #{action.incident_id} was resolved"
    return None


def target_snapshot(action: Action) -> dict:
    """What an approval is given on: the node's state and the job's latest launch."""
    snap: dict = {}
    if action.node_id:
        snap["node_state"] = Node.objects.filter(pk=action.node_id).values_list("state", flat=True)[
            0
        ]
    if action.job_id:
        launches = attempts_latest_first(action.job_id)
        snap["job_attempt"] = launches.values_list("number", flat=True).first()
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


AUTOMATIC = (pause, maintenance, crash_loop, cooldown, storm)
ALWAYS = (spares,)
DECISION = (expired, moved_on, lease, *ALWAYS)


def first_block(action: Action, ctx: Context, checks) -> tuple[str, str] | None:
    """(guardrail name, reason) of the first check that blocks, or None."""
    for check in checks:
        reason = check(action, ctx)
        if reason:
            return check.__name__, reason
    return None


def decision_block(action: Action, ctx: Context) -> tuple[str, str] | None:
    """What stops a person approving it now, (guardrail, reason), or None: the one
    answer the approval service and the approval page both give."""
    return first_block(action, ctx, DECISION)
