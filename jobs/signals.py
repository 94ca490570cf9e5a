"""What the jobs app announces to the apps to its right (incidents, recovery).

`events_stored` is sent after an ingest commits, with `sender=TrainingJob`,
`job_ids` (the jobs that got new events) and `kinds` ({job id: set of the
event kinds stored}). Receivers must be quick: they hand work to Celery.
"""

from django.dispatch import Signal

events_stored = Signal()
