"""Rows the console's page tests build."""

from itertools import count

from django.utils import timezone

from incidents.models import Incident

_episode = count(1)


def incident_row(job, *, fault_at=None, nodes=(), lost_s=0.0, **fields) -> Incident:
    """An incident of `job`: a software crash found at its fault time, unless `fields`
    say otherwise."""
    fault_at = fault_at or timezone.now()
    values = {
        "detector": "launch_fault",
        "attempt": 1,
        "cause": "software",
        "fault_type": "crash",
        "severity": "major",
        "summary": "crash on a node",
        "detected_at": fault_at,
        "lost_gpu_seconds": lost_s,
        **fields,
    }
    incident = Incident.objects.create(
        job=job, cluster=job.cluster, episode=f"e{next(_episode)}", fault_at=fault_at, **values
    )
    incident.nodes.set(nodes)
    return incident
