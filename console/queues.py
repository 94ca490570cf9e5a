"""Which Celery queue each task goes to, so that a detection backlog never delays a
recovery action.

`REBOUND_CELERY_QUEUE` (default `rebound`) is a prefix: the default queue is named
after it and every other queue is `<prefix>.<role>`. Two installations (or two test
workers) on one Redis never share a queue, and a worker started without `-Q` consumes
all of its installation's queues (settings: CELERY_TASK_QUEUES). The table of which
task goes where is settings.REBOUND_TASK_QUEUES; `route_task` (CELERY_TASK_ROUTES)
reads the prefix at each send, from the app's default queue, so that a process that
changes it (tests/processes.py) sends to its new queues.

Stdlib and kombu only: settings import it.
"""

from __future__ import annotations

from kombu import Queue

# The default queue: the periodic control work, and any task the table does not name.
DEFAULT = "default"
DETECT = "detect"
RECOVERY = "recovery"
UPKEEP = "upkeep"
ROLES = (DEFAULT, DETECT, RECOVERY, UPKEEP)


def queue_name(prefix: str, role: str) -> str:
    """The queue of `role` in the installation whose default queue is `prefix`."""
    if role not in ROLES:
        raise ValueError(f"no queue role {role!r}; the roles are {', '.join(ROLES)}")
    return prefix if role == DEFAULT else f"{prefix}.{role}"


def queue_names(prefix: str, roles=ROLES) -> list[str]:
    return [queue_name(prefix, role) for role in roles]


def queue_declarations(prefix: str) -> list[Queue]:
    """CELERY_TASK_QUEUES: what a worker started without `-Q` consumes."""
    return [Queue(name, routing_key=name) for name in queue_names(prefix)]


def task_role(name: str, table: dict[str, str]) -> str:
    """The role of task `name`: its own entry, else its app's (`"jobs.*"`), else the
    default queue."""
    return table.get(name) or table.get(name.split(".", 1)[0] + ".*") or DEFAULT


def route_task(name, args, kwargs, options, task=None, **kw):
    """A Celery router (CELERY_TASK_ROUTES): the queue of `name` under the sending
    app's current prefix. A queue the caller names itself wins (Celery merges)."""
    from celery import current_app
    from django.conf import settings

    app = getattr(task, "app", None) or current_app
    role = task_role(name, settings.REBOUND_TASK_QUEUES)
    return {"queue": queue_name(app.conf.task_default_queue, role)}
