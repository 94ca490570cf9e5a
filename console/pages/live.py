"""The JSON status the pages poll every few seconds: the badges, the states of the
actions a page shows, whether the jobs a page shows are running or silent, and (for
the node grid) every node's state."""

from django.http import JsonResponse
from django.urls import path
from django.utils import timezone

from console.pages.common import job_heard, viewer_page
from incidents.models import Incident
from jobs.models import Node, TrainingJob
from recovery.models import Action

MAX_IDS = 500


def _ids(raw: str) -> list[int] | None:
    """Ids from "1,2,3" (at most MAX_IDS); None when a part is not an id."""
    parts = [p.strip() for p in raw.split(",")[:MAX_IDS] if p.strip()]
    if not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in parts):
        return None  # '²' is a digit to str.isdigit, not to int; 18 digits fit a bigint
    return [int(p) for p in parts]


def badges() -> dict:
    """The counts every page's header shows."""
    return {
        "approvals": Action.objects.filter(state=Action.State.AWAITING_APPROVAL).count(),
        "incidents": Incident.objects.filter(state__in=Incident.OPEN_STATES).count(),
    }


def jobs_heard(ids: list[int], now) -> dict:
    """Per job id: its status badge as the pages draw it (`silent 3 min` for a running job
    not heard from lately) and when it was last heard from. One query."""
    out = {}
    for job in TrainingJob.objects.filter(pk__in=ids).only("status", "last_received_at"):
        heard = job_heard(job, now)
        silent = heard["silent"]
        out[str(job.pk)] = {
            "activity": heard["activity"],
            "label": f"silent {heard['silent_for']}" if silent else heard["activity"],
            "ago": heard["ago"],
            "silent": silent,
        }
    return out


def _bad_ids(field: str, what: str) -> JsonResponse:
    detail = f"{field} must be {what} ids separated by commas."
    return JsonResponse(
        {"error": "invalid_parameter", "detail": detail, "field": field}, status=400
    )


@viewer_page
def status(request):
    now = timezone.now()
    body = {"at": now.isoformat(), **badges()}
    ids = _ids(request.GET.get("actions", ""))
    if ids is None:
        return _bad_ids("actions", "action")
    if ids:
        body["actions"] = {
            str(pk): {"state": state}
            for pk, state in Action.objects.filter(pk__in=ids).values_list("pk", "state")
        }
    jobs = _ids(request.GET.get("jobs", ""))
    if jobs is None:
        return _bad_ids("jobs", "job")
    if jobs:
        body["jobs"] = jobs_heard(jobs, now)
    cluster = request.GET.get("nodes")
    if cluster:
        nodes = Node.objects.all()
        if cluster != "all":
            nodes = nodes.filter(cluster__name=cluster)
        body["nodes"] = {str(pk): state for pk, state in nodes.values_list("pk", "state")}
    return JsonResponse(body)


urls = [path("status.json", status, name="status")]
