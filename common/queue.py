"""Sending a Celery task once the caller's transaction commits: the worker then finds
the rows the task is about as committed, and a rolled-back change sends nothing.

Work that must survive a broker outage goes through the outbox (common.outbox);
this is for work that something else brings back if its message is lost (the
reconciler, the sweep)."""

from __future__ import annotations

from django.db import transaction


def enqueue_on_commit(task, *args, **options) -> None:
    """`task.apply_async(args, **options)` after the current transaction commits (at
    once outside one); a broker that refuses the send fails no caller (`robust`)."""
    transaction.on_commit(lambda: task.apply_async(args, **options), robust=True)
