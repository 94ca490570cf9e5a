"""Launch numbers handed out before a launch reports anything, so none is ever reused.

A launch (a torchrun worker group, a Slurm job step, a plain `python train.py`) asks
for its number at start with its *launch identity*: the launcher's ids and a nonce its
rank 0 drew at start (`agent.launch_env.launch_identity`). `launch_reserve` gives a new
identity the next number, max(the job's stored launches and reservations) + 1, and the
same identity always the same number:

    result = launch_reserve(cluster=cluster, job_key="llm-7b", identity="te:abc:r0/n:9f2c")
    result.attempt, result.created      # 4, True; asked again: 4, False

Race-safe: the job row is locked (created first when new, as ingest creates it, on the
token's cluster) before anything is read, and (job, identity) and (job, attempt) are
unique in the database, so two requests for one identity get one number and two
identities two numbers. `admit(job)`, when given, is called under that lock before a
new number is handed out and may raise to refuse the launch (the recovery app's gate:
a finished job, a paused cluster, a crash loop): a refused launch reserves nothing. An
identity that has its number already gets it again without being judged: that is a
retry of a launch admitted before (its answer was lost), not a new launch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Max

from jobs.models import Attempt, Cluster, LaunchReservation, TrainingJob
from jobs.services.ingest import JobsOfAnotherCluster


@dataclass(frozen=True)
class LaunchReserved:
    job: TrainingJob
    attempt: int
    identity: str
    created: bool


def job_lock_or_create(*, cluster: Cluster, job_key: str) -> TrainingJob:
    """The job `job_key`, created on `cluster` when new, locked for the transaction;
    `JobsOfAnotherCluster` (403) when another cluster owns it. Call inside a transaction."""
    TrainingJob.objects.bulk_create(
        [TrainingJob(key=job_key, cluster=cluster)], ignore_conflicts=True
    )
    job = (
        TrainingJob.objects.select_for_update(of=("self",))
        .select_related("cluster")
        .get(key=job_key)
    )
    if job.cluster_id != cluster.id:
        raise JobsOfAnotherCluster(cluster=cluster.name, keys=[job_key])
    return job


def launch_reserve(
    *,
    cluster: Cluster,
    job_key: str,
    identity: str,
    admit: Callable[[TrainingJob], None] | None = None,
) -> LaunchReserved:
    """The launch number of `identity` in job `job_key`; see the module docstring."""
    with transaction.atomic():
        job = job_lock_or_create(cluster=cluster, job_key=job_key)
        held = LaunchReservation.objects.filter(job=job, identity=identity).first()
        if held is not None:
            return LaunchReserved(job=job, attempt=held.attempt, identity=identity, created=False)
        if admit is not None:
            admit(job)  # raises to refuse; nothing was written
        stored = Attempt.objects.filter(job=job).aggregate(n=Max("number"))["n"] or 0
        reserved = LaunchReservation.objects.filter(job=job).aggregate(n=Max("attempt"))["n"] or 0
        number = max(stored, reserved) + 1
        LaunchReservation.objects.create(job=job, attempt=number, identity=identity)
    return LaunchReserved(job=job, attempt=number, identity=identity, created=True)
