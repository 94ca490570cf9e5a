"""The gate in front of a new launch: a guardrail that stops blind restarts.

`launch_admit` hands a launch its number (`jobs.services.launch_reserve`, one per
launch identity, never reused) unless the console says not to start it:

- `job_finished`: the job finished; an operator reopens it, or the launch takes
  another job name;
- `cluster_paused`: the cluster's recovery is paused (`cluster_pause`);
- `crash_loop`: the job has an open crash-loop incident (`incidents.detectors.crash_loop`):
  a person looks before it runs again.

Each is a `LaunchRefused` (409) whose `detail` says what to do, and reserves nothing.
The gate runs under the job's row lock, in the reservation's transaction, so a job
that finishes meanwhile cannot slip a launch through. An identity that has its number
already gets it again unjudged: a retry of a launch admitted before.
"""

from __future__ import annotations

from datetime import UTC, datetime

from incidents.detectors.crash_loop import CRASH_LOOP
from incidents.models import Incident
from jobs.models import Cluster, TrainingJob
from jobs.services import LaunchReserved, launch_reserve
from recovery.errors import LaunchRefused
from recovery.selectors import cluster_settings


def iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def launch_gate(job: TrainingJob) -> None:
    """Raises `LaunchRefused` when a new launch of `job` should not start."""
    if job.finished_at is not None:
        at = iso(job.finished_at)
        raise LaunchRefused(
            f"job {job.key} finished at {at}; reopen it with POST /api/v1/jobs/{job.key}/reopen"
            " or use another job name",
            code="job_finished",
            job=job.key,
            finished_at=at,
        )
    cfg = cluster_settings(job.cluster_id)
    if cfg.paused:
        since = f" since {iso(cfg.paused_at)}" if cfg.paused_at else ""
        raise LaunchRefused(
            f"recovery on cluster {job.cluster.name} is paused by {cfg.paused_by or 'someone'}"
            f"{since} ({cfg.pause_reason or 'no reason given'}); job {job.key} starts no new"
            f" launch until it is resumed (POST /api/v1/clusters/{job.cluster.name}/resume)",
            code="cluster_paused",
            job=job.key,
            paused_by=cfg.paused_by,
            paused_at=iso(cfg.paused_at) if cfg.paused_at else None,
            reason=cfg.pause_reason,
        )
    loop = (
        Incident.objects.filter(job=job, detector=CRASH_LOOP, state__in=Incident.OPEN_STATES)
        .order_by("-opened_at", "-id")
        .first()
    )
    if loop is not None:
        raise LaunchRefused(
            f"job {job.key} is in a crash loop (incident #{loop.pk}: {loop.summary}); no new"
            f" launch until a person resolves it (POST /api/v1/incidents/{loop.pk}/resolve)",
            code="crash_loop",
            job=job.key,
            incident=loop.pk,
        )


def launch_admit(*, cluster: Cluster, job_key: str, identity: str) -> LaunchReserved:
    """The launch number of `identity` in `job_key` (created on `cluster` when new), or
    `LaunchRefused`; `JobsOfAnotherCluster` (403) for a job of another cluster."""
    return launch_reserve(cluster=cluster, job_key=job_key, identity=identity, admit=launch_gate)
