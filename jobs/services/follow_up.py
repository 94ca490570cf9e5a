"""What ingest hands on, through the outbox (common.outbox): per job, one
`jobs.events_stored` task that announces the new events to the apps to the right (the
`events_stored` signal) and asks for a ledger refresh."""

import logging

from django.conf import settings
from django.db import transaction

from common.outbox import Work, outbox_claim, outbox_enqueue
from jobs.models import TrainingJob
from jobs.signals import events_stored

logger = logging.getLogger(__name__)

# What ingest hands on (common.outbox): per job, one `jobs.events_stored` task that
# announces the new events (the signal) and asks for a ledger refresh. A launch that
# began or ended, a fault or a saved checkpoint (a replacement may wait for it) is
# announced at once; other kinds within EVENTS_STORED_DEBOUNCE_S, all the batches
# of that window in one announcement.
EVENTS_STORED_TASK = "jobs.events_stored"
LEDGER_REFRESH_TASK = "jobs.ledger_refresh"
PROMPT_KINDS = frozenset(
    {"attempt_started", "attempt_ended", "fault", "checkpoint_saved", "job_finished"}
)
EVENTS_STORED_DEBOUNCE_S = 1
# A busy job sends many batches a second; one refresh per job in this window is enough.
LEDGER_REFRESH_DEBOUNCE_S = settings.REBOUND_LEDGER_DEBOUNCE_S


def events_follow_up_enqueue(job_ids: list[int], kinds: dict[int, set[str]]) -> None:
    """Ask for the announcement of `job_ids`' new events (`kinds` by job id), in the
    caller's transaction."""
    outbox_enqueue(
        [
            Work(
                EVENTS_STORED_TASK,
                str(job_id),
                [job_id, sorted(kinds[job_id])],
                delay_s=0 if kinds[job_id] & PROMPT_KINDS else EVENTS_STORED_DEBOUNCE_S,
            )
            for job_id in job_ids
        ]
    )


def events_follow_up(*, job_id: int, kinds: list[str]) -> None:
    """In the worker: tell the apps to the right that `job_id` has new events of
    `kinds`, and have its ledger refreshed. The work they ask for is recorded with
    this task's claim of its outbox row, in one transaction: all of it or none."""
    with transaction.atomic():
        outbox_claim(task=EVENTS_STORED_TASK, key=str(job_id))
        outbox_enqueue(
            [Work(LEDGER_REFRESH_TASK, str(job_id), [job_id], LEDGER_REFRESH_DEBOUNCE_S)]
        )
        for receiver, result in events_stored.send_robust(
            sender=TrainingJob, job_ids=[job_id], kinds={job_id: set(kinds)}
        ):
            if isinstance(result, Exception):
                logger.error("events_stored receiver %r failed: %r", receiver, result)
