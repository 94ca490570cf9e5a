"""The nodes pages: every node with its state, recent incidents, last heartbeat and
current action (filtered, paginated); one node in depth with its actions, incidents
and launches; and the manual actions operators take on it (cordon, uncordon,
validate), proposed exactly as `POST /api/v1/actions/` proposes them so that the
same policies and guardrails apply."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.utils import timezone

from common.api import status_of
from common.errors import AppError
from console.pages.common import age, answer, can_operate, operator_post, viewer_page
from console.pages.overview import STATE_LABELS, node_states, segment
from incidents.selectors import incident_list, node_list
from jobs.models import Cluster, Node
from recovery import queue, services
from recovery.api.serializers import REASON_MAX, ActionProposeSerializer
from recovery.models import Action
from recovery.selectors import node_actions, nodes_current_actions

PER_PAGE = 200
ACTIONS_MAX = 50
INCIDENTS_MAX = 25
LAUNCHES_MAX = 25

# The manual actions a node page offers: kind -> button label.
MANUAL = {
    Action.Kind.CORDON_NODE: "Cordon",
    Action.Kind.UNCORDON_NODE: "Uncordon",
    Action.Kind.VALIDATE_NODE: "Validate",
}


@viewer_page
def node_list_page(request):
    cluster = request.GET.get("cluster") or None
    state = request.GET.get("state") or None
    if state not in Node.State.values:
        state = None
    now = timezone.now()
    paginator = Paginator(node_list(cluster=cluster, state=state, now=now), PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    nodes = list(page.object_list)
    current = nodes_current_actions(node_ids=[n.pk for n in nodes])
    prefix = reverse("console:node-list")
    for n in nodes:  # what the rows show, worked out once here (200 rows of reverse()
        # and lookups in the template cost more than the rest of the page)
        n.href = f"{prefix}{segment(n.cluster.name)}/{segment(n.name)}/"
        n.state_label = STATE_LABELS.get(n.state, n.state)
        n.heard = age(n.last_heard_at, now)
        n.current_action = current.get(n.pk)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "console/node_list.html",
        {
            "nodes": nodes,
            "page": page,
            "total": paginator.count,
            "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
            "states": node_states(),
            "cluster": cluster or "",
            "state": state or "",
            "query": query.urlencode(),
        },
    )


def _node(cluster: str, name: str) -> Node:
    return get_object_or_404(
        Node.objects.select_related("cluster"), cluster__name=cluster, name=name
    )


@viewer_page
def node_detail(request, cluster, name):
    node = _node(cluster, name)
    now = timezone.now()
    actions = node_actions(node=node)
    incidents = incident_list().filter(nodes=node)
    launches = node.attempts.select_related("job").order_by("-started_at", "-id")
    action_rows = list(actions[:ACTIONS_MAX])
    incident_rows = list(incidents[:INCIDENTS_MAX])
    launch_rows = list(launches[:LAUNCHES_MAX])

    return render(
        request,
        "console/node_detail.html",
        {
            "node": node,
            "heard": age(node.last_heard_at, now),
            "current": next((a for a in action_rows if a.state in Action.ACTIVE_STATES), None),
            "actions": action_rows,
            "actions_total": actions.count(),
            "incidents": incident_rows,
            "incidents_total": incidents.count(),
            "launches": launch_rows,
            "launches_total": launches.count(),
            "active_states": Action.ACTIVE_STATES,
            "manual": list(MANUAL.items()) if can_operate(request) else [],
            "states": node_states(),
        },
    )


@operator_post
def node_act(request, cluster, name):
    """Propose a manual action on the node: the same call, with the same arguments,
    as the REST API's `POST /api/v1/actions/` (recovery.api.views.ActionListView),
    so it waits for another operator's approval and the guardrails apply."""
    node = _node(cluster, name)
    back = reverse("console:node-detail", args=[node.cluster.name, node.name])
    kind = request.POST.get("kind", "")
    if kind not in MANUAL:
        return answer(request, False, "Unknown action for a node.", status=400, back=back)
    # The API's validator of a proposal (the cluster and node are the page's own).
    form = ActionProposeSerializer(
        data={"kind": kind, "reason": request.POST.get("reason", "")}, partial=True
    )
    if not form.is_valid():
        return answer(
            request, False, f"Say why (1 to {REASON_MAX} characters).", status=400, back=back
        )
    reason = form.validated_data["reason"]
    try:
        action = services.action_propose(
            cluster=node.cluster,
            kind=kind,
            node=node,
            reason=reason,
            params={},
            requested_by=request.user.username,
            requested_by_user=request.user,
            dry_run=False,
        )
    except AppError as exc:  # the service's refusal, with the API's status
        return answer(
            request,
            False,
            f"Refused ({exc.code}): {exc.detail}",
            status=status_of(exc),
            back=back,
            code=exc.code,
            **exc.extra,
        )
    queue.action_send(action)
    return answer(request, True, outcome(action), back=back, action=action.pk, state=action.state)


def outcome(action: Action) -> str:
    what = f"{MANUAL.get(action.kind, action.kind)} of {action.node.name}: action #{action.pk}"
    if action.state == Action.State.AWAITING_APPROVAL:
        text = f"{what} waits for another operator's approval"
        if action.blocked_by:
            text += f" (guardrail {action.blocked_by}: {action.blocked_reason})"
        return text + "."
    if action.state == Action.State.QUEUED:
        return f"{what} is queued."
    return f"{what} is {action.get_state_display().lower()}."


def node_act_or_page(request, cluster, name):
    """`nodes/<cluster>/<name>/act/` acts on the node `name` (POST), and is also the
    page of a node named `<name>/act` (GET): a name the wire refuses now, which an
    older row may still hold."""
    page_of = f"{name}/act"
    named = Node.objects.filter(cluster__name=cluster, name=page_of)
    if request.method == "GET" and named.exists():
        return node_detail(request, cluster, page_of)
    return node_act(request, cluster, name)


# Node names may hold '/' (rows stored before the wire refused it): `name` takes
# the rest of the path, so the action URL comes first.
urls = [
    path("nodes/", node_list_page, name="node-list"),
    path("nodes/<str:cluster>/<name:name>/act/", node_act_or_page, name="node-act"),
    path("nodes/<str:cluster>/<name:name>/", node_detail, name="node-detail"),
]
