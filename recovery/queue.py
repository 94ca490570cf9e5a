"""The one place that sends the recovery app's Celery tasks.

Services record and never send. Their callers (the API views, the pages, the
tasks, the receivers) call these afterwards; each task is sent once the caller's
transaction commits, so that the worker finds the row as committed. An incident's
proposal goes through the outbox (common.outbox): nothing else would send it again
after a broker outage, whereas actions' rows are the reconciler's to send again.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.outbox import Work, outbox_enqueue
from common.queue import enqueue_on_commit
from recovery import services, tasks
from recovery.models import Action


def action_execute_send(action: Action, *, countdown: float | None = None) -> None:
    """Run a queued action, with its kind's time limit; `countdown`: not before then
    (a retry's backoff)."""
    limit = services.TIME_LIMITS_S[action.kind]
    enqueue_on_commit(
        tasks.action_execute,
        action.pk,
        countdown=countdown,
        soft_time_limit=limit,
        time_limit=limit + services.DEADLINE_GRACE_S,
    )


def action_follow_up_send(action_id: int) -> None:
    """An action ended: the open incidents around it may propose their next step."""
    enqueue_on_commit(tasks.action_follow_up, action_id)


def incident_propose_send(incident_id: int) -> None:
    """An incident opened or changed: propose what the policies say (durably: a row
    in the outbox, in the caller's transaction)."""
    outbox_enqueue([Work(tasks.PROPOSE_TASK, str(incident_id), [incident_id])])


def action_send(action: Action) -> None:
    """What the action's state, as a service just left it, calls for: a queued action
    is executed, an ended one followed up; any other waits (for a person, or for the
    reconciler)."""
    if action.state == Action.State.QUEUED:
        action_execute_send(action)
    elif action.state in Action.TERMINAL_STATES:
        action_follow_up_send(action.pk)


def actions_send(actions: Iterable[Action]) -> None:
    for action in actions:
        action_send(action)
