"""Reads of the incidents app."""

from django.db.models import Prefetch, QuerySet

from incidents.models import Incident, TimelineEntry
from jobs.models import Node


def incident_list(
    *,
    job: str | None = None,
    cluster: str | None = None,
    cause: str | None = None,
    state: str | None = None,
    since=None,
    until=None,
) -> QuerySet[Incident]:
    qs = Incident.objects.select_related("job", "cluster").prefetch_related(
        Prefetch("nodes", queryset=Node.objects.only("id", "name"))
    )
    if job:
        qs = qs.filter(job__key=job)
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if cause:
        qs = qs.filter(cause=cause)
    if state:
        qs = qs.filter(state=state)
    if since is not None:
        qs = qs.filter(fault_at__gte=since)
    if until is not None:
        qs = qs.filter(fault_at__lt=until)
    return qs.order_by("-fault_at", "-id")


def incident_detail(*, pk: int) -> Incident | None:
    return (
        incident_list()
        .prefetch_related(Prefetch("timeline", queryset=TimelineEntry.objects.order_by("at", "id")))
        .filter(pk=pk)
        .first()
    )
