"""Whether a running job is still heard from: the one rule the API and the pages show.

A job's stored `status` follows its launches' events, so a job whose reporters died
without a word (a killed node, a lost network, the README's curl example) stays
`running`. What the console's own clock knows is when the job's latest events arrived
(`TrainingJob.last_received_at`, set by ingest in the job's summary update): a running
job not heard from for longer than `settings.REBOUND_JOB_SILENT_S` is shown as
`silent`, with that age. Its stored status is left as it is: the silence is a fact
about what arrives, not about the launch, and the next event makes it `running` again.
The sweep (`incidents.services.incidents_sweep`) judges the same silence for hangs and
dead nodes from its own, shorter, threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.models import TrainingJob

SILENT = "silent"
# What `activity` may be: a stored status, or silent.
ACTIVITIES = (*TrainingJob.Status.values, SILENT)


@dataclass(frozen=True)
class JobActivity:
    activity: str  # the job's status, or "silent"
    last_heard_at: datetime | None  # the console's clock; None: nothing received yet
    heard_ago_s: float | None  # how long ago, as of `now`

    @property
    def silent(self) -> bool:
        return self.activity == SILENT

    @property
    def silent_for_s(self) -> float | None:
        return self.heard_ago_s if self.silent else None


def job_silent_after_s() -> float:
    return float(settings.REBOUND_JOB_SILENT_S)


def job_activity(job: TrainingJob, *, now: datetime | None = None) -> JobActivity:
    """The job's status as shown: `silent` for a running job not heard from for longer
    than REBOUND_JOB_SILENT_S (strictly: at exactly the threshold it is still running).
    A job never heard from on the console's clock is not judged. No query."""
    heard = job.last_received_at
    if heard is None:
        return JobActivity(job.status, None, None)
    ago = max(0.0, ((now or timezone.now()) - heard).total_seconds())
    silent = job.status == TrainingJob.Status.RUNNING and ago > job_silent_after_s()
    return JobActivity(SILENT if silent else job.status, heard, ago)


def jobs_silent_q(*, now: datetime | None = None) -> Q:
    """`job_activity`'s rule as a filter: the jobs it shows as silent."""
    before = (now or timezone.now()) - timedelta(seconds=job_silent_after_s())
    return Q(status=TrainingJob.Status.RUNNING, last_received_at__lt=before)
