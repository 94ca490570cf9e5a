"""Running a queued action: the guardrails again, the claim (queued -> running, a
conditional update, so a second delivery does nothing), the driver call, the nodes'
new states, and the end (succeeded, failed, or back to queued to retry a transient
driver error after a backoff); and the reconciler of rows stuck past their deadline.
The caller sends what the outcome calls for (recovery.queue)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.models import Node, TrainingJob
from jobs.selectors import job_latest_attempt
from jobs.services import node_claim_spare, node_set_state
from recovery import guardrails
from recovery.drivers import DriverError, DriverTransientError, get_driver
from recovery.drivers.noop import NoopDriver
from recovery.models import Action
from recovery.selectors import cluster_settings, job_latest_durable_step
from recovery.services.actions import (
    JOB_AND_NODE_KINDS,
    QUEUE_GRACE_S,
    action_back_to_approval,
    action_changed_send,
    action_transition,
)

logger = logging.getLogger(__name__)

K = Action.Kind
S = Action.State
N = Node.State

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
    K.CHECKPOINT_JOB: 60,  # delivering the request only; the save is the job's own
}
DEADLINE_GRACE_S = 30
HOLD_S = 60  # a queued row held by the pause is looked at again after this
CHECKPOINT_POLL_S = 30  # replace_at_next_checkpoint: look for the checkpoint this often
CHECKPOINT_MAX_WAIT_S = 3600  # ... and replace anyway after this long
MAX_ATTEMPTS = 3


def backoff_s(attempts: int) -> float:
    """The wait before the next run after `attempts` runs ended in a transient driver
    error: 5 s, 20 s, 80 s, ... at most 5 minutes."""
    return min(300.0, 5.0 * 4 ** max(0, attempts - 1))


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
    if kind == K.CHECKPOINT_JOB:
        return driver.checkpoint_job(job.key, key=key)
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
    newest = job_latest_durable_step(action.job)
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
        # Held, not returned to approval: it goes once the pause (or the maintenance
        # window) is over; the reconciler sends it again after HOLD_S.
        held = guardrails.first_block(action, ctx, (guardrails.pause, guardrails.maintenance))
        if held:
            name, why = held
            if Action.objects.filter(pk=action.pk, state=S.QUEUED).update(
                blocked_by=name, blocked_reason=why, deadline=now + timedelta(seconds=HOLD_S)
            ):
                action.blocked_by, action.blocked_reason = name, why
                action_changed_send(action=action, frm=S.QUEUED, to=S.QUEUED, why=why)
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
            action_back_to_approval(
                action=action, actor="rebound:guardrail", name=blocked[0], why=blocked[1]
            )
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
