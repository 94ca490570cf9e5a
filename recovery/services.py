"""Writes of the recovery app: propose, decide, execute and reconcile actions.

Every change of an action's state goes through `action_transition`: a
conditional UPDATE (`WHERE state = <from>`) whose row count says whether this
caller won, and the audit entry and the incident's timeline entry in the same
transaction. A service only records: it sends no task. What a new state calls for
(a queued row's execution, an ended row's follow-up) is sent by the caller, through
`recovery.queue`, once the transaction commits.

The states (design.md, Actions):

    proposed -> awaiting_approval -> approved | rejected | expired
    approved (or proposed under an automatic policy) -> queued -> running
    running -> succeeded | failed
    any state before running -> cancelled

and three returns the design implies: approved or queued -> awaiting_approval
(a stale approval, or a guardrail tripped right before running: back to the
approval queue), and running -> queued (a transient driver error to retry, or
the reconciler re-queuing a row stuck past its deadline).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from common.errors import AppError
from incidents.models import Incident, TimelineEntry
from incidents.services import timeline_entry_add
from jobs.models import Cluster, Node, TrainingJob
from jobs.selectors import checkpoints_durable_latest_first, job_latest_attempt
from jobs.services import node_claim_spare, node_set_state
from recovery import guardrails
from recovery.drivers import DriverError, DriverTransientError, get_driver
from recovery.drivers.noop import NoopDriver
from recovery.errors import InvalidAction, OwnAction, Refused
from recovery.models import Action, ActionAudit, ClusterRecoverySettings
from recovery.policies import Rule, incident_trigger, policy_rules
from recovery.selectors import action_is_own, cluster_settings

logger = logging.getLogger(__name__)
audit_log = logging.getLogger("rebound.audit")

K = Action.Kind
S = Action.State
N = Node.State

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PROPOSED: frozenset({S.AWAITING_APPROVAL, S.QUEUED, S.CANCELLED}),
    S.AWAITING_APPROVAL: frozenset({S.APPROVED, S.REJECTED, S.EXPIRED, S.CANCELLED}),
    S.APPROVED: frozenset({S.QUEUED, S.AWAITING_APPROVAL, S.CANCELLED}),
    S.QUEUED: frozenset({S.RUNNING, S.AWAITING_APPROVAL, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED}),
}
STAMPS = {
    S.APPROVED: "approved_at",
    S.QUEUED: "queued_at",
    S.RUNNING: "started_at",
    **{s: "finished_at" for s in Action.TERMINAL_STATES},
}
APPROVAL_STATES = frozenset({S.AWAITING_APPROVAL, S.APPROVED, S.REJECTED, S.EXPIRED})
RELEASE_SPARE = frozenset({S.AWAITING_APPROVAL, S.CANCELLED, S.FAILED, S.REJECTED, S.EXPIRED})

# How long one driver run of each kind may take; running past it (plus the
# grace) the reconciler re-queues the row.
TIME_LIMITS_S = {
    K.CORDON_NODE: 60,
    K.UNCORDON_NODE: 60,
    K.DRAIN_NODE: 600,
    K.RESTART_JOB: 300,
    K.ROLLBACK: 300,
    K.REPLACE_NODE: 600,
    K.REPLACE_AT_NEXT_CHECKPOINT: 600,
    K.SCALE_DOWN: 600,
    K.VALIDATE_NODE: 900,
}
DEADLINE_GRACE_S = 30
QUEUE_GRACE_S = 120  # a queued row no worker took by then is sent again
HOLD_S = 60  # a queued row held by the pause is looked at again after this
CHECKPOINT_POLL_S = 30  # replace_at_next_checkpoint: look for the checkpoint this often
CHECKPOINT_MAX_WAIT_S = 3600  # ... and replace anyway after this long
MAX_ATTEMPTS = 3


def backoff_s(attempts: int) -> float:
    return min(300.0, 5.0 * 4 ** max(0, attempts - 1))


NODE_KINDS = frozenset({K.CORDON_NODE, K.UNCORDON_NODE, K.DRAIN_NODE, K.VALIDATE_NODE})
JOB_KINDS = frozenset({K.RESTART_JOB, K.ROLLBACK})
JOB_AND_NODE_KINDS = frozenset({K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT})


class InvalidTransition(Exception):
    pass


# --- the one transition function -----------------------------------------------------


def action_transition(
    *, action: Action, to: str, actor: str, why: str, data: dict | None = None, **fields
) -> bool:
    """Moves `action` from the state it was read in to `to`, if it is still in it.

    Returns False (and changes nothing) when another worker or request moved it
    first. Raises InvalidTransition for a move the state machine does not have.
    `fields` are set in the same UPDATE (F expressions allowed)."""
    frm = action.state
    if to not in TRANSITIONS.get(frm, ()):
        raise InvalidTransition(f"action #{action.pk}: {frm} -> {to} is not a transition")
    now = timezone.now()
    values = {"state": to, "updated_at": now, **fields}
    if to in STAMPS:
        values.setdefault(STAMPS[to], now)
    if to == S.QUEUED:
        values.setdefault("deadline", now + timedelta(seconds=QUEUE_GRACE_S))
    elif to != S.RUNNING:
        values.setdefault("deadline", None)
    if to == S.AWAITING_APPROVAL:
        ttl = cluster_settings(action.cluster_id).approval_ttl_s
        values.setdefault("expires_at", now + timedelta(seconds=ttl))
    # A replacement that will not run (now) gives its claimed spare back to the pool.
    spare_id = action.spare_id if to in RELEASE_SPARE and not action.dry_run else None
    if spare_id:
        values["spare"] = None
    with transaction.atomic():
        if Action.objects.filter(pk=action.pk, state=frm).update(**values) != 1:
            return False
        if spare_id:
            node_set_state(node_id=spare_id, to=N.SPARE, from_states=[N.ACTIVE])
        expressions = [f for f, v in values.items() if hasattr(v, "resolve_expression")]
        for f, v in values.items():
            if f not in expressions:
                setattr(action, f, v)
        if expressions:
            action.refresh_from_db(fields=expressions)
        _record(action, frm, to, actor=actor, why=why, at=now, data=data)
    return True


def _record(action: Action, frm: str, to: str, *, actor: str, why: str, at, data=None) -> None:
    """The audit entry, and the timeline entry of the incident the action answers."""
    ActionAudit.objects.create(
        action=action,
        at=at,
        actor=actor,
        from_state=frm,
        to_state=to,
        reason=why,
        data=data or {},
    )
    if action.incident_id:
        move = f"{frm} → {to}" if frm else to
        timeline_entry_add(
            incident_id=action.incident_id,
            kind=TimelineEntry.Kind.APPROVAL
            if to in APPROVAL_STATES
            else TimelineEntry.Kind.ACTION,
            at=at,
            actor=actor,
            source="recovery",
            message=f"action #{action.pk} {action.kind} ({_target(action)}): {move}: {why}",
            data={"action": action.pk, "kind": action.kind, "from": frm, "to": to},
        )
    message = f"action #{action.pk} {action.kind} {frm or '-'} -> {to} by {actor}: {why}"
    transaction.on_commit(lambda: audit_log.info(message))


def _target(action: Action) -> str:
    parts = []
    if action.node_id:
        parts.append(f"node {action.node.name}")
    if action.job_id:
        parts.append(f"job {action.job.key}")
    return ", ".join(parts) or "cluster"


# --- proposing -----------------------------------------------------------------------


def _lock_settings(cluster_id: int) -> ClusterRecoverySettings:
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
        params.setdefault("after_step", _latest_durable_step(job))
    with transaction.atomic():
        cfg = _lock_settings(cluster.pk)
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
        _record(action, "", S.PROPOSED, actor=requested_by, why=reason or "proposed", at=now)
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


def _latest_durable_step(job: TrainingJob) -> int | None:
    return checkpoints_durable_latest_first(job).values_list("step", flat=True).first()


# --- decisions -----------------------------------------------------------------------


def _fresh(action: Action) -> Action:
    return Action.objects.select_related("cluster", "node", "job").get(pk=action.pk)


def action_approve(*, action: Action, actor: str, user=None, comment: str = "") -> Action:
    """An operator other than the requester approves; the action takes the lease and
    is queued at once, unless its target changed since it was proposed (then it is
    back in the queue, with the new state to approve, and Refused `stale` says so).
    Refused `guardrail` when another action holds the target (`lease`) or no spare
    is left; OwnAction for the requester."""
    action = _fresh(action)
    if action_is_own(action=action, user=user, actor=actor):
        raise OwnAction(f"{actor} requested action #{action.pk}; another operator must approve it.")
    if action.state != S.AWAITING_APPROVAL:
        raise Refused(f"action #{action.pk} is {action.state}, not awaiting", code="invalid_state")
    ctx = guardrails.Context(cluster_settings(action.cluster_id), timezone.now())
    blocked = guardrails.decision_block(action, ctx)
    if blocked:
        name, why = blocked
        _retire(action, name=name, why=why)
        raise Refused(why, code="guardrail", guardrail=name, state=action.state)
    with transaction.atomic():
        try:
            done = action_transition(
                action=action,
                to=S.APPROVED,
                actor=actor,
                why=comment or "approved",
                approved_by=actor,
                approved_by_user=user if getattr(user, "pk", None) else None,
                comment=comment,
            )
        except IntegrityError as exc:  # the lease was taken since the check above
            raise Refused(
                "lease: another action took this target; try again",
                code="guardrail",
                guardrail="lease",
            ) from exc
        if not done:
            raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
        stale = guardrails.stale(action, ctx)
        if stale:
            _back_to_queue(action, actor="rebound:guardrail", name="stale", why=stale)
        else:
            action_transition(action=action, to=S.QUEUED, actor=actor, why="approved")
    if stale:
        raise Refused(f"{stale}; it is back in the approval queue", code="stale", action=action.pk)
    return action


def _back_to_queue(action: Action, *, actor: str, name: str, why: str) -> bool:
    """Approved or queued, but not runnable as approved: awaiting approval again,
    on the target's state as it is now."""
    return action_transition(
        action=action,
        to=S.AWAITING_APPROVAL,
        actor=actor,
        why=why,
        blocked_by=name,
        blocked_reason=why,
        approved_by="",
        approved_by_user=None,
        approved_at=None,
        target_snapshot=guardrails.target_snapshot(action),
    )


def _retire(action: Action, *, name: str, why: str) -> bool:
    """An approval that can no longer be given ends here, audited: `expired` past its
    expiry, `moved_on` (its target finished or moved on) cancelled. Other guardrails
    leave it waiting. True when this call moved it."""
    to = {"expired": S.EXPIRED, "moved_on": S.CANCELLED}.get(name)
    if to is None:
        return False
    return action_transition(action=action, to=to, actor="rebound:guardrail", why=why)


def action_reject(*, action: Action, actor: str, user=None, comment: str) -> Action:
    action = _fresh(action)
    if action.state != S.AWAITING_APPROVAL:
        raise Refused(f"action #{action.pk} is {action.state}, not awaiting", code="invalid_state")
    late = guardrails.expired(action, guardrails.Context(None, timezone.now()))
    if late:
        _retire(action, name="expired", why=late)
        raise Refused(late, code="guardrail", guardrail="expired", state=action.state)
    if not action_transition(
        action=action,
        to=S.REJECTED,
        actor=actor,
        why=comment,
        approved_by=actor,
        approved_by_user=user if getattr(user, "pk", None) else None,
        comment=comment,
    ):
        raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
    return action


def action_cancel(*, action: Action, actor: str, comment: str = "") -> Action:
    action = _fresh(action)
    if S.CANCELLED not in TRANSITIONS.get(action.state, ()):
        raise Refused(
            f"action #{action.pk} is {action.state}: too late to cancel", code="invalid_state"
        )
    if not action_transition(
        action=action, to=S.CANCELLED, actor=actor, why=comment or "cancelled"
    ):
        raise Refused(f"action #{action.pk} changed meanwhile; reload it", code="conflict")
    return action


def approvals_retire(*, now=None, limit: int = 500) -> list[int]:
    """Approvals whose target finished or moved on (guardrails.moved_on): cancelled,
    saying why, in the audit and on the incident's timeline."""
    now = now or timezone.now()
    waiting = list(
        Action.objects.filter(state=S.AWAITING_APPROVAL).order_by("created_at", "id")[:limit]
    )
    ctx = guardrails.Context(None, now, guardrails.Facts(waiting))
    retired = []
    for action in waiting:
        why = guardrails.moved_on(action, ctx)
        if why and _retire(action, name="moved_on", why=why):
            retired.append(action.pk)
    return retired


def approvals_expire(*, now=None) -> list[int]:
    """Approvals not given in time: expired (a rejection)."""
    now = now or timezone.now()
    expired = []
    for action in Action.objects.filter(state=S.AWAITING_APPROVAL, expires_at__lt=now):
        if action_transition(
            action=action,
            to=S.EXPIRED,
            actor="rebound:expiry",
            why=f"no decision by {action.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        ):
            expired.append(action.pk)
    return expired


# --- the pause switch ----------------------------------------------------------------


def cluster_pause(*, cluster: Cluster, actor: str, reason: str) -> ClusterRecoverySettings:
    """Stops new automatic actions (they wait for approval) and holds queued ones;
    running ones finish."""
    with transaction.atomic():
        cfg = _lock_settings(cluster.pk)
        cfg.paused, cfg.pause_reason, cfg.paused_by = True, reason, actor
        cfg.paused_at = timezone.now()
        cfg.save()
        message = f"recovery on cluster {cluster.name} paused by {actor}: {reason}"
        transaction.on_commit(lambda: audit_log.info(message))
    return cfg


def cluster_resume(*, cluster: Cluster, actor: str) -> list[Action]:
    """Lifts the pause. Returns the cluster's queued actions (those the pause held
    among them), for the caller to send again."""
    with transaction.atomic():
        cfg = _lock_settings(cluster.pk)
        was = cfg.pause_reason
        cfg.paused, cfg.pause_reason, cfg.paused_by, cfg.paused_at = False, "", "", None
        cfg.save()
        held = Action.objects.filter(cluster=cluster, state=S.QUEUED)
        held.filter(blocked_by="pause").update(blocked_by="", blocked_reason="")
        message = f"recovery on cluster {cluster.name} resumed by {actor} (paused for: {was})"
        transaction.on_commit(lambda: audit_log.info(message))
        return list(held)


# --- policies ------------------------------------------------------------------------


def _rule_targets(rule: Rule, incident: Incident, nodes: list[Node]):
    """(node, job, params) per action the rule proposes for the incident; empty when
    it does not apply (no node named, the job is finished, nothing to roll back to)."""
    job = incident.job
    if rule.kind in NODE_KINDS:
        return [(n, None, {}) for n in nodes]
    if job.status in guardrails.FINISHED_JOB:
        return []
    if rule.kind == K.RESTART_JOB:
        return [(None, job, {})]
    if rule.kind == K.ROLLBACK:
        before = checkpoints_durable_latest_first(job, saved_by=incident.fault_at)
        step = before.values_list("step", flat=True).first()
        return [] if step is None else [(None, job, {"step": step})]
    if rule.kind in JOB_AND_NODE_KINDS:
        return [(n, job, {}) for n in nodes]
    if rule.kind == K.SCALE_DOWN:
        return [(n, job, {}) for n in nodes]
    return []


def incident_propose(*, incident: Incident) -> list[Action]:
    """Proposes what the policies in force say for an open incident, rule by rule:
    a rule's actions are proposed once the earlier rules' actions for this incident
    have succeeded. Safe to run again (each proposal happens once); it runs when
    the incident opens or changes, and when one of its actions ends."""
    if incident.state not in Incident.OPEN_STATES:
        return []
    trigger = incident_trigger(incident)
    rules = policy_rules(cluster_id=incident.cluster_id, job_id=incident.job_id, trigger=trigger)
    if not rules:
        return []
    nodes = list(incident.nodes.order_by("name"))
    earlier = {
        (a.kind, a.node_id): a for a in Action.objects.filter(incident=incident).exclude(policy="")
    }
    created = []
    for rule in rules:
        all_done = True
        for node, job, params in _rule_targets(rule, incident, nodes):
            prior = earlier.get((rule.kind, node.pk if node else None))
            if prior is None:
                try:
                    prior = action_propose(
                        cluster=incident.cluster,
                        kind=rule.kind,
                        node=node,
                        job=job,
                        params=params,
                        incident=incident,
                        reason=f"incident #{incident.pk}: {incident.summary}",
                        requested_by=f"policy:{trigger}",
                        mode=rule.mode,
                        policy=rule.name,
                        dedup_key=f"incident:{incident.pk}:{rule.kind}:{node.pk if node else '-'}",
                    )
                    created.append(prior)
                except AppError as exc:  # refused (a lease, a duplicate) or invalid
                    logger.info(
                        "incident #%s: %s not proposed yet: %s", incident.pk, rule.kind, exc.detail
                    )
                    all_done = False
                    continue
            if prior.state != S.SUCCEEDED:
                all_done = False
        if not all_done:
            break
    return created


def action_follow_up(*, action: Action) -> list[Action]:
    """After an action ended: the open incidents on its job or node may now propose
    their next step (the next rule of a chain, or one the lease held back)."""
    where = Q()
    if action.job_id:
        where |= Q(job_id=action.job_id)
    if action.node_id:
        where |= Q(nodes=action.node_id)
    if action.incident_id:
        where |= Q(pk=action.incident_id)
    if not where:
        return []
    created = []
    incidents = (
        Incident.objects.filter(where, state__in=Incident.OPEN_STATES)
        .select_related("job", "cluster")
        .distinct()
        .order_by("opened_at", "id")
    )
    for incident in incidents[:20]:
        created += incident_propose(incident=incident)
    return created


# --- execution -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one execution did: skipped (not queued: a repeat), held (paused), returned
    (back to the approval queue), cancelled (its target finished or moved on), waiting
    (for a checkpoint), retry (after `retry_in` s), succeeded, failed."""

    what: str
    retry_in: float | None = None
    action: Action | None = field(default=None, compare=False)  # the row, as it ended

    @property
    def ended(self) -> bool:
        """This run brought the action to an end (its follow-up is due)."""
        return self.what in ("succeeded", "failed", "cancelled")


def _job_nodes(job: TrainingJob) -> list[str] | None:
    attempt = job_latest_attempt(job)
    names = sorted(attempt.nodes.values_list("name", flat=True)) if attempt else []
    return names or None


def _drop_names(action: Action) -> list[str]:
    names = list(action.params.get("nodes") or [])
    if action.node_id and action.node.name not in names:
        names.insert(0, action.node.name)
    return names


def _ensure_spare(action: Action, dry_run: bool) -> Node:
    if action.spare_id:
        return action.spare
    if dry_run:
        spare = Node.objects.filter(cluster_id=action.cluster_id, state=N.SPARE).first()
        return spare or Node(name="<a spare>")
    spare = node_claim_spare(cluster_id=action.cluster_id, exclude_ids=[action.node_id])
    if spare is None:
        raise DriverError("no spare node left to claim")
    Action.objects.filter(pk=action.pk).update(spare=spare)
    action.spare = spare
    return spare


def _call_driver(action: Action, driver) -> dict:
    key = f"rebound:action-{action.pk}"
    kind, node, job = action.kind, action.node, action.job
    if kind == K.CORDON_NODE:
        return driver.cordon(node.name, key=key)
    if kind == K.UNCORDON_NODE:
        return driver.uncordon(node.name, key=key)
    if kind == K.DRAIN_NODE:
        return driver.drain(node.name, key=key)
    if kind == K.VALIDATE_NODE:
        return driver.validate_node(node.name, key=key)
    if kind == K.RESTART_JOB:
        return driver.restart_job(job.key, None, _job_nodes(job), key=key)
    if kind == K.ROLLBACK:
        return driver.restart_job(job.key, int(action.params["step"]), _job_nodes(job), key=key)
    if kind in (K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT):
        spare = _ensure_spare(action, action.dry_run)
        return driver.replace_node(job.key, node.name, spare.name, key=key)
    if kind == K.SCALE_DOWN:
        return driver.scale_down(job.key, _drop_names(action), key=key)
    raise DriverError(f"no driver call for {kind}")


OUT_OF_SERVICE_FROM = (N.ACTIVE, N.SUSPECT, N.CORDONED, N.DRAINING)


def _apply_node_states(action: Action) -> dict[str, str]:
    """The nodes' new states once the driver did its part (through jobs.services)."""
    kind = action.kind
    moves: list[tuple[Node, str, tuple]] = []
    if kind == K.CORDON_NODE:
        moves.append((action.node, N.CORDONED, (N.ACTIVE, N.SUSPECT)))
    elif kind == K.UNCORDON_NODE:
        moves.append((action.node, N.ACTIVE, (N.CORDONED, N.SUSPECT)))
    elif kind == K.DRAIN_NODE:
        moves.append((action.node, N.IN_REPAIR, OUT_OF_SERVICE_FROM))
    elif kind == K.VALIDATE_NODE:
        moves.append((action.node, N.SPARE, (N.IN_REPAIR, N.CORDONED, N.SUSPECT)))
    elif kind in (K.REPLACE_NODE, K.REPLACE_AT_NEXT_CHECKPOINT):
        moves.append((action.node, N.IN_REPAIR, OUT_OF_SERVICE_FROM))
    elif kind == K.SCALE_DOWN:
        for node in Node.objects.filter(cluster_id=action.cluster_id, name__in=_drop_names(action)):
            moves.append((node, N.IN_REPAIR, OUT_OF_SERVICE_FROM))
    return {
        node.name: to
        for node, to, frm in moves
        if node_set_state(node_id=node.pk, to=to, from_states=frm)
    }


def _checkpoint_wait(action: Action, now) -> str | None:
    """For replace_at_next_checkpoint: what it still waits for, or None to go on."""
    if action.kind != K.REPLACE_AT_NEXT_CHECKPOINT or action.dry_run:
        return None
    after = action.params.get("after_step")
    newest = _latest_durable_step(action.job)
    if newest is not None and (after is None or newest > after):
        return None
    max_wait = float(action.params.get("max_wait_s", CHECKPOINT_MAX_WAIT_S))
    if action.queued_at and (now - action.queued_at).total_seconds() > max_wait:
        return None
    return f"a durable checkpoint after step {after}" if after is not None else "a checkpoint"


def action_execute(*, action_id: int) -> Outcome:
    """Runs a queued action once: the guardrails again, the claim (queued -> running,
    a conditional update: a second delivery finds nothing to claim), the driver
    call, and the end (succeeded with the driver's output, failed with its error,
    or back to queued to retry a transient error with backoff)."""
    action = Action.objects.select_related("cluster", "node", "job", "spare").filter(pk=action_id)
    action = action.first()
    if action is None or action.state != S.QUEUED:
        return Outcome("skipped")
    now = timezone.now()
    # A continuation (a retry, a re-run after a lost worker) finishes what it began:
    # the guardrails let it start, and its target may have changed because of it.
    if action.attempts == 0:
        ctx = guardrails.Context(cluster_settings(action.cluster_id), now)
        held = guardrails.pause(action, ctx)
        if held:
            Action.objects.filter(pk=action.pk, state=S.QUEUED).update(
                blocked_by="pause", blocked_reason=held, deadline=now + timedelta(seconds=HOLD_S)
            )
            return Outcome("held", action=action)
        gone = guardrails.moved_on(action, ctx)
        if gone:
            action_transition(action=action, to=S.CANCELLED, actor="rebound:guardrail", why=gone)
            return Outcome("cancelled", action=action)
        checks = (
            (guardrails.stale,)
            + (guardrails.AUTOMATIC if guardrails.automatic(action) else ())
            + guardrails.ALWAYS
        )
        blocked = guardrails.first_block(action, ctx, checks)
        if blocked:
            _back_to_queue(action, actor="rebound:guardrail", name=blocked[0], why=blocked[1])
            return Outcome("returned", action=action)
    waiting = _checkpoint_wait(action, now)
    if waiting:
        Action.objects.filter(pk=action.pk, state=S.QUEUED).update(
            deadline=now + timedelta(seconds=CHECKPOINT_POLL_S), output={"waiting_for": waiting}
        )
        return Outcome("waiting", action=action)

    limit = TIME_LIMITS_S[action.kind]
    claimed = action_transition(
        action=action,
        to=S.RUNNING,
        actor="rebound:worker",
        why=f"attempt {action.attempts + 1}" + (" (dry run)" if action.dry_run else ""),
        deadline=now + timedelta(seconds=limit + DEADLINE_GRACE_S),
        attempts=F("attempts") + 1,
        blocked_by="",
        blocked_reason="",
        error="",
    )
    if not claimed:
        return Outcome("skipped")

    try:
        driver = NoopDriver(dry_run=True) if action.dry_run else get_driver(action.cluster)
        output = _call_driver(action, driver)
    except DriverTransientError as exc:
        if action.attempts < MAX_ATTEMPTS:
            wait = backoff_s(action.attempts)
            action_transition(
                action=action,
                to=S.QUEUED,
                actor="rebound:worker",
                why=f"transient driver error, retry in {wait:g} s: {exc}",
                error=str(exc),
                deadline=timezone.now() + timedelta(seconds=wait + QUEUE_GRACE_S),
            )
            return Outcome("retry", retry_in=wait, action=action)
        return _fail(action, f"gave up after {action.attempts} attempts: {exc}", exc)
    except Exception as exc:  # a driver's refusal, or a bug: the action fails, visibly
        if not isinstance(exc, DriverError):
            logger.exception("action #%s: the driver call raised", action.pk)
        return _fail(action, f"{type(exc).__name__}: {exc}", exc)

    why = "dry run: nothing was done" if action.dry_run else "done"
    data = None
    if action.kind in JOB_AND_NODE_KINDS and action.spare_id:
        # Which spare took the node's place: on the row, its output and its audit.
        output = {**output, "spare": action.spare.name}
        data = {"spare": action.spare.name}
        why += f": {action.node.name} replaced by spare {action.spare.name}"
    with transaction.atomic():
        done = action_transition(
            action=action, to=S.SUCCEEDED, actor="rebound:worker", why=why, output=output, data=data
        )
        if done and not action.dry_run:
            states = _apply_node_states(action)
            if states:
                Action.objects.filter(pk=action.pk).update(output={**output, "node_states": states})
    return Outcome("succeeded" if done else "skipped", action=action)


def _fail(action: Action, error: str, exc: Exception) -> Outcome:
    done = action_transition(
        action=action,
        to=S.FAILED,
        actor="rebound:worker",
        why=error,
        error=error,
        output=getattr(exc, "output", None) or {},
    )
    return Outcome("failed" if done else "skipped", action=action)


# --- the reconciler ------------------------------------------------------------------


@dataclass
class Reconciled:
    resent: list[int]
    requeued: list[int]
    failed: list[int]
    # The rows moved, as left: for the caller to send what each now calls for.
    actions: list[Action] = field(default_factory=list, repr=False)


def actions_reconcile(*, now=None) -> Reconciled:
    """Rows stuck past their deadline: queued ones are sent again (no worker took
    them, or they wait for a checkpoint or the end of a pause); running ones
    (their worker died) are re-queued, the driver being idempotent, until
    MAX_ATTEMPTS runs have started, then failed."""
    now = now or timezone.now()
    result = Reconciled([], [], [])
    stuck = Action.objects.filter(state__in=(S.QUEUED, S.RUNNING), deadline__lt=now)
    for action in stuck.order_by("deadline")[:500]:
        if action.state == S.QUEUED:
            bumped = Action.objects.filter(
                pk=action.pk, state=S.QUEUED, deadline=action.deadline
            ).update(deadline=now + timedelta(seconds=QUEUE_GRACE_S))
            if bumped:
                result.resent.append(action.pk)
                result.actions.append(action)
        elif action.attempts >= MAX_ATTEMPTS:
            if action_transition(
                action=action,
                to=S.FAILED,
                actor="rebound:reconciler",
                why=f"still running past its deadline after {action.attempts} attempts: gave up",
                error="running past its deadline",
            ):
                result.failed.append(action.pk)
                result.actions.append(action)
        elif action_transition(
            action=action,
            to=S.QUEUED,
            actor="rebound:reconciler",
            why="running past its deadline (its worker was lost?): re-queued",
        ):
            result.requeued.append(action.pk)
            result.actions.append(action)
    return result
