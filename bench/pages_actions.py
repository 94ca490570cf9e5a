"""The recovery actions of bench/pages.py's installation, through recovery.services:
each one proposed, decided and ended at its own time (pages_seed.clock), so its
audit trail, its stamps and its entries on the incident's timeline are the state
machine's own. What the plan picks is the path (which incident, what kind, how it
ended); whether a step is allowed is the services' call: a guardrail that routes an
automatic action to approval, or refuses a decision, is obeyed and counted.

- N_AWAITING actions wait for approval, on the newest incidents still open
  (stragglers first: replace, cordon or drain the slow node);
- N_FINISHED answered incidents that recovered or were closed: run automatically
  or approved (succeeded or failed), or rejected, expired or cancelled;
- N_RUNNING validate nodes back from repair, running now.
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pages_plan as P
from pages_plan import dt
from pages_seed import bench_clusters, clock

OUTCOME_WEIGHTS = {
    "auto_succeeded": 0.5,
    "auto_failed": 0.07,
    "approved": 0.25,
    "rejected": 0.08,
    "expired": 0.06,
    "cancelled": 0.04,
}
PATHS = {  # outcome: the states after proposed
    "auto_succeeded": ("queued", "running", "succeeded"),
    "auto_failed": ("queued", "running", "failed"),
    "approved": ("awaiting_approval", "approved", "queued", "running", "succeeded"),
    "rejected": ("awaiting_approval", "rejected"),
    "expired": ("awaiting_approval", "expired"),
    "cancelled": ("awaiting_approval", "cancelled"),
    "awaiting": ("awaiting_approval",),
    "running": ("queued", "running"),
}
APPROVAL_TTL_S = 7 * P.DAY  # the bench's clusters: approvals wait a week
DELAY_S = {  # how long after the state before an action moved to this one
    "awaiting_approval": (0.05, 0.1),
    "approved": (120, 2_400),
    "queued": (0.05, 0.1),
    "rejected": (120, 2_400),
    "expired": (APPROVAL_TTL_S + 1, APPROVAL_TTL_S + 1),
    "cancelled": (60, 1_200),
    "running": (0.3, 1),
    "succeeded": (20, 600),
    "failed": (20, 600),
}
RUN_DEADLINE_S = 3_600
TERMINAL = ("rejected", "expired", "succeeded", "failed", "cancelled")
DRIVER_ERROR = "driver: scontrol exited 1 (node busy)"
# What waits for approval: about a straggler, or about a node that failed lately.
STRAGGLER_KINDS = ("replace_at_next_checkpoint", "replace_node", "cordon_node", "drain_node")
FAULT_KINDS = ("replace_node", "cordon_node", "rollback", "drain_node", "scale_down")
NODE_KINDS = ("replace_at_next_checkpoint", "replace_node", "cordon_node", "drain_node")
NODE_KINDS += ("scale_down", "validate_node")


@dataclass
class Planned:
    created: float
    outcome: str
    kind: str
    cluster: object
    incident: object = None
    node: object = None
    job: object = None
    params: dict | None = None


def refusals() -> tuple[type[Exception], ...]:
    """What the services raise to refuse a step (the names recovery.services has, and
    the shared hierarchy its errors move to)."""
    from common.errors import AppError
    from recovery import services

    names = ("Refused", "InvalidTransition")
    return (AppError, *(getattr(services, n) for n in names if hasattr(services, n)))


def plan_actions(anchor: float, closing: dict) -> list[Planned]:
    from incidents.models import Incident
    from jobs.models import Node

    clusters = bench_clusters()
    rng = P.rng_for(6)
    incidents = list(
        Incident.objects.filter(cluster__in=clusters)
        .select_related("job", "cluster")
        .prefetch_related("nodes")
        .order_by("fault_at", "id")
    )
    plans = []
    # Waiting: what to do about a straggler, or about a node that failed lately.
    unresolved = [i for i in reversed(incidents) if i.pk not in closing]
    stragglers = [i for i in unresolved if i.cause == "straggler"]
    others = [i for i in unresolved if i.cause != "straggler"]
    waiting = (stragglers[:20] + others + stragglers[20:])[: P.N_AWAITING]
    for n, incident in enumerate(waiting):
        kinds = STRAGGLER_KINDS if incident.cause == "straggler" else FAULT_KINDS
        kind = kinds[n % len(kinds)]
        params = {}
        if kind == "rollback":
            params["step"] = max(0, (incident.job.last_step or 0) // 1_000 * 1_000 - 1_000)
        created = anchor - float(rng.uniform(60, 1_500))
        plans.append(answer(incident, kind, "awaiting", created, params))
    answered = {i.pk for i in waiting}
    done = [
        i
        for i in incidents
        if (i.recovered_at is not None or i.pk in closing) and i.pk not in answered
    ]
    picks = rng.choice(len(done), min(P.N_FINISHED, len(done)), replace=False)
    outcomes = list(OUTCOME_WEIGHTS)
    weights = np.array(list(OUTCOME_WEIGHTS.values()))
    for k in sorted(picks.tolist()):
        incident = done[k]
        outcome = outcomes[rng.choice(len(outcomes), p=weights / weights.sum())]
        kind = str(rng.choice(["restart_job", "replace_node", "cordon_node", "validate_node"]))
        if outcome.startswith("auto") and kind == "replace_node":
            kind = "restart_job"
        created = incident.detected_at.timestamp() + float(rng.uniform(1, 5))
        if outcome == "expired" and created + DELAY_S["expired"][0] >= anchor:
            outcome = "cancelled"  # its week is not over yet
        plans.append(answer(incident, kind, outcome, created, {}))
    in_repair = Node.objects.filter(cluster__in=clusters, state="in_repair").select_related(
        "cluster"
    )
    for node in in_repair.order_by("name")[: P.N_RUNNING]:
        created = anchor - float(rng.uniform(120, 900))
        plans.append(Planned(created, "running", "validate_node", node.cluster, node=node))
    return sorted(plans, key=lambda a: a.created)


def answer(incident, kind: str, outcome: str, created: float, params: dict) -> Planned:
    """An action answering `incident`: on its first node and its job, as the kind needs
    (a kind on a node becomes a restart when the incident names none)."""
    node = next(iter(incident.nodes.all()), None)
    if node is None and kind in NODE_KINDS:
        kind = "restart_job"
    job = None if kind in ("cordon_node", "drain_node", "validate_node") else incident.job
    if kind == "scale_down":
        params = {**params, "nodes": [node.name]}
    target = None if kind in ("restart_job", "rollback") else node
    return Planned(created, outcome, kind, incident.cluster, incident, target, job, params)


def seed_actions(anchor: float, closing: dict) -> Counter:
    """Every planned action through the services; returns how they ended (by state,
    and `refused` for a proposal the services refused)."""
    from django.contrib.auth import get_user_model

    from recovery.models import Action, ClusterRecoverySettings

    clusters = bench_clusters()
    Action.objects.filter(cluster__in=clusters).delete()
    for cluster in clusters:
        ClusterRecoverySettings.objects.update_or_create(
            cluster=cluster, defaults={"approval_ttl_s": APPROVAL_TTL_S}
        )
    operator = get_user_model().objects.get(username=P.OPERATOR)
    rng = P.rng_for(7)
    ended = Counter()
    for planned in plan_actions(anchor, closing):
        action = propose(planned)
        if action is None:
            ended["refused"] += 1
            continue
        drive(action, planned, anchor, operator, rng)
        action.refresh_from_db(fields=["state"])
        ended[action.state] += 1
    return ended


def propose(planned: Planned):
    from recovery import services

    incident = planned.incident
    policy = f"default:{incident.cause}" if incident is not None else "default:validate"
    auto = planned.outcome.startswith("auto") or planned.outcome == "running"
    with clock(planned.created):
        try:
            return services.action_propose(
                cluster=planned.cluster,
                kind=planned.kind,
                reason=incident.summary if incident is not None else "node back from repair",
                requested_by=f"policy:{policy}",
                node=planned.node,
                job=planned.job,
                params=planned.params,
                incident=incident,
                mode="auto" if auto else "approval",
                policy=policy,
            )
        except refusals():
            return None


def drive(action, planned: Planned, anchor: float, operator, rng) -> None:
    """Along the planned path, one service call a step, each at its time; the path
    ends where the services refuse a step."""
    from django.db.models import F

    from recovery import services

    def approve(a, t):
        services.action_approve(action=a, actor=P.OPERATOR, user=operator, comment="ok")

    steps = {
        "awaiting_approval": None,  # the proposal routes it
        "approved": approve,
        "queued": approve,  # an automatic action a guardrail sent for approval
        "rejected": lambda a, t: services.action_reject(
            action=a, actor=P.OPERATOR, user=operator, comment="the job resumed by itself"
        ),
        "cancelled": lambda a, t: services.action_cancel(
            action=a, actor=P.OPERATOR, comment="moot"
        ),
        "expired": lambda a, t: services.approvals_expire(),
        # The worker's claim and its end, recorded without a driver.
        "running": lambda a, t: services.action_transition(
            action=a,
            to="running",
            actor="rebound:worker",
            why="attempt 1",
            attempts=F("attempts") + 1,
            deadline=dt(t + RUN_DEADLINE_S),
        ),
        "succeeded": lambda a, t: services.action_transition(
            action=a,
            to="succeeded",
            actor="rebound:worker",
            why="done",
            output={"driver": "slurm", "called_at": t},
        ),
        "failed": lambda a, t: services.action_transition(
            action=a, to="failed", actor="rebound:worker", why=DRIVER_ERROR, error=DRIVER_ERROR
        ),
    }
    t = planned.created
    for to in PATHS[planned.outcome]:
        action.refresh_from_db()
        if action.state == to:
            continue
        step = steps[to]
        if step is None or action.state in TERMINAL:
            return
        t = min(t + float(rng.uniform(*DELAY_S[to])), anchor - 1.0)
        with clock(t):
            try:
                step(action, t)
            except refusals():
                return
