"""Enqueue on commit, durably: Celery work that survives a broker outage.

`outbox_enqueue` writes one row per (task, key) in the caller's transaction (one
statement for all of them; a request for work that is already waiting merges into
it: the earlier due time wins, with its arguments) and, once the transaction
commits, sends the tasks whose rows are new or became due sooner. A send never
makes the caller wait on a dead broker (no retry, short socket timeouts: see
settings) and never fails the caller: the row stays and is marked for the drain.

A task deletes its row when it starts (`outbox_claim`), so a row still here past
its `retry_at` is work whose message never reached the broker or was lost with it
(a Redis restart). `outbox_drain`, run by the worker each time it (re)connects to
the broker and periodically by beat, sends those again. Tasks sent through the
outbox must be safe to run twice: a message can be sent again while the first is
still queued.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import import_module

from django.db import connection, transaction
from django.utils import timezone

from common.models import OutboxEntry

logger = logging.getLogger(__name__)

# A row this old after its due time is taken for lost with the broker and sent again.
RESEND_S = 30.0
DRAIN_BATCH = 500


@dataclass(frozen=True)
class Work:
    task: str  # a registered Celery task name
    key: str  # what it is about: one row per (task, key)
    args: list = field(default_factory=list)
    delay_s: float = 0.0  # run no earlier than this after the commit


def outbox_enqueue(works: list[Work]) -> None:
    """Record `works` in the current transaction; send them after it commits."""
    if not works:
        return
    now = timezone.now()
    # One request per (task, key): the first due wins, as when merging into a stored row.
    works = list({(w.task, w.key): w for w in sorted(works, key=lambda w: -w.delay_s)}.values())
    due = {(w.task, w.key): now + timedelta(seconds=w.delay_s) for w in works}
    if connection.vendor == "postgresql":
        kept = _upsert_postgresql(works, due, now)
    else:
        kept = _upsert_portable(works, due, now)
    # Only what is new or became due sooner: a send for the rest is already on its way.
    to_send = [w for w in works if kept.get((w.task, w.key)) == due[(w.task, w.key)]]
    if to_send:
        transaction.on_commit(lambda: _send(to_send), robust=True)


_UPSERT = """
INSERT INTO common_outboxentry (task, key, args, due_at, retry_at, created_at)
VALUES {values}
ON CONFLICT (task, key) DO UPDATE SET
    args = CASE WHEN EXCLUDED.due_at < common_outboxentry.due_at
                THEN EXCLUDED.args ELSE common_outboxentry.args END,
    due_at = LEAST(common_outboxentry.due_at, EXCLUDED.due_at),
    retry_at = LEAST(common_outboxentry.retry_at, EXCLUDED.retry_at)
RETURNING task, key, due_at
"""


def _upsert_postgresql(works, due, now) -> dict[tuple[str, str], datetime]:
    values, params = [], []
    resend = timedelta(seconds=RESEND_S)
    for w in works:
        values.append("(%s, %s, %s::jsonb, %s, %s, %s)")
        d = due[(w.task, w.key)]
        params += [w.task, w.key, json.dumps(w.args), d, d + resend, now]
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT.format(values=", ".join(values)), params)
        return {(t, k): d for t, k, d in cursor.fetchall()}


def _upsert_portable(works, due, now) -> dict[tuple[str, str], datetime]:
    kept = {}
    resend = timedelta(seconds=RESEND_S)
    with transaction.atomic():
        for w in works:
            d = due[(w.task, w.key)]
            row = OutboxEntry.objects.select_for_update().filter(task=w.task, key=w.key).first()
            if row is None:
                row = OutboxEntry.objects.create(
                    task=w.task, key=w.key, args=w.args, due_at=d, retry_at=d + resend
                )
            elif d < row.due_at:
                row.args, row.due_at = w.args, d
                row.retry_at = min(row.retry_at, d + resend)
                row.save(update_fields=["args", "due_at", "retry_at"])
            kept[(w.task, w.key)] = row.due_at
    return kept


def _task(name: str):
    """The task registered as `name` ("<app>.<task>", defined in <app>/tasks.py)."""
    from celery import current_app

    if name not in current_app.tasks:
        # Its own module only: Celery's import_default_modules would set Django up
        # again (logging configured anew, system checks run) in the web process.
        import_module(name.split(".", 1)[0] + ".tasks")
    return current_app.tasks[name]


def _send(works: list[Work]) -> None:
    """Send after the commit; what the broker does not take waits for the drain."""
    failed = []
    for w in works:
        try:
            _task(w.task).apply_async(w.args, countdown=w.delay_s or None, retry=False)
        except Exception as exc:  # the broker is away: never the caller's failure
            failed.append(w)
            error = exc
    if not failed:
        return
    logger.warning(
        "broker unreachable (%r): %d task(s) left to the outbox drain, e.g. %s(%s)",
        error,
        len(failed),
        failed[0].task,
        failed[0].key,
    )
    try:
        now = timezone.now()
        for w in failed:
            OutboxEntry.objects.filter(task=w.task, key=w.key).update(retry_at=now)
    except Exception:
        logger.exception("could not mark outbox entries for the drain")


def outbox_claim(*, task: str, key: str) -> bool:
    """The task `task` for `key` has started: its row is done with. Work asked for
    after this point writes a new row (and sends a new task)."""
    return OutboxEntry.objects.filter(task=task, key=key).delete()[0] > 0


def outbox_drain(*, now=None, limit: int = DRAIN_BATCH) -> int:
    """Send again what was not sent or was lost with the broker; returns how many
    were sent. Stops at the first failed send (the broker is still away)."""
    now = now or timezone.now()
    rows = list(OutboxEntry.objects.filter(retry_at__lte=now).order_by("retry_at")[:limit])
    sent = []
    for row in rows:
        countdown = max(0.0, (row.due_at - now).total_seconds())
        try:
            _task(row.task).apply_async(row.args, countdown=countdown or None, retry=False)
        except KeyError:
            logger.error("outbox: no task named %r; entry %s dropped", row.task, row.pk)
            OutboxEntry.objects.filter(pk=row.pk).delete()
            continue
        except Exception as exc:
            logger.warning("outbox drain: broker unreachable (%r); %d waiting", exc, len(rows))
            break
        sent.append(row.pk)
    if sent:
        # Sent again; if this message is lost too, the next drain after RESEND_S tries again.
        OutboxEntry.objects.filter(pk__in=sent).update(
            retry_at=timezone.now() + timedelta(seconds=RESEND_S)
        )
        logger.info("outbox drain: %d task(s) sent", len(sent))
    return len(sent)
