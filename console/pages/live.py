"""The JSON status the pages poll every few seconds: the badges, the states of the
actions a page shows, and (for the node grid) every node's state."""

from django.http import JsonResponse
from django.urls import path
from django.utils import timezone

from console.pages.common import viewer_page
from incidents.models import Incident
from jobs.models import Node
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


@viewer_page
def status(request):
    body = {"at": timezone.now().isoformat(), **badges()}
    ids = _ids(request.GET.get("actions", ""))
    if ids is None:
        detail = "actions must be action ids separated by commas."
        return JsonResponse(
            {"error": "invalid_parameter", "detail": detail, "field": "actions"}, status=400
        )
    if ids:
        body["actions"] = {
            str(pk): {"state": state}
            for pk, state in Action.objects.filter(pk__in=ids).values_list("pk", "state")
        }
    cluster = request.GET.get("nodes")
    if cluster:
        nodes = Node.objects.all()
        if cluster != "all":
            nodes = nodes.filter(cluster__name=cluster)
        body["nodes"] = {str(pk): state for pk, state in nodes.values_list("pk", "state")}
    return JsonResponse(body)


urls = [path("status.json", status, name="status")]
