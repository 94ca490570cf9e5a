"""What the jobs app announces to the apps to its right (incidents, recovery).

`events_stored` is sent after an ingest commits (by the `jobs.events_stored` task,
in the worker, inside a transaction: see jobs.services.events_follow_up), with
`sender=TrainingJob`, `job_ids` (the jobs that got new events) and `kinds` ({job
id: set of the event kinds stored}). Receivers must be quick: they hand work to
Celery, best through the outbox (common.outbox), so it commits with the rest.

`ledger_refreshed` is sent (inside the refresh task) after a job's cumulative
ledger was recomputed, with `job`, `ledger` (jobs.accounting.Ledger) and
`steps` (jobs.accounting.Steps), so that figures derived from the ledger (an
incident's lost GPU-hours) follow it without reading the job's history again.

`maintenance_changed` is sent after a maintenance window was declared or cancelled
(after commit), with `window_id`, `cluster_id`, `start` and `end` (unix seconds):
what it covers is planned, or no longer, so the incidents inside it are judged again.
"""

from django.dispatch import Signal

events_stored = Signal()
ledger_refreshed = Signal()
maintenance_changed = Signal()
