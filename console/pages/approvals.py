"""The approval queue: every action waiting for a decision with its evidence and blast
radius, the Approve and Reject forms (the two-person rule shown before anyone clicks,
and still enforced by the service), and the actions decided lately, states live."""

from django.shortcuts import render
from django.urls import path, reverse

from common.api import status_of
from common.errors import AppError
from console.pages.common import answer, can_operate, operator_post, viewer_page
from recovery import queue, selectors, services
from recovery.api.serializers import COMMENT_MAX, DecisionSerializer, RejectSerializer
from recovery.models import Action

QUEUE_LIMIT = 25  # cards, each with its evidence; the count says how many more wait
DECIDED_LIMIT = 50
OWN_ACTION = "you requested this; another operator must approve"


@viewer_page
def page(request):
    waiting = selectors.approval_queue(limit=QUEUE_LIMIT)
    operator = can_operate(request)
    for item in waiting["items"]:
        item["own"] = operator and selectors.action_is_own(action=item["action"], user=request.user)
    return render(
        request,
        "console/approvals.html",
        {
            "items": waiting["items"],
            "total": waiting["total"],
            "decided": selectors.approvals_decided(limit=DECIDED_LIMIT),
            "can_operate": operator,
            "own_reason": OWN_ACTION,
        },
    )


@operator_post
def decide(request, pk):
    """Approve or reject (the submit button's `decision`), as the REST API does: the
    service decides, its refusal is the answer."""
    back = reverse("console:approvals")
    action = Action.objects.filter(pk=pk).first()
    if action is None:
        return answer(request, False, f"No action #{pk}.", status=404, back=back, error="not_found")
    decision = request.POST.get("decision", "")
    # The API's validator of the decision's body (a rejection must say why).
    form_class = RejectSerializer if decision == "reject" else DecisionSerializer
    form = form_class(data={"comment": request.POST.get("comment", "")})
    if not form.is_valid():
        if form.errors["comment"][0].code == "max_length":
            detail = f"The comment is too long (at most {COMMENT_MAX} characters)."
            return answer(request, False, detail, status=400, back=back, error="invalid")
        detail = "Say why you reject it: a comment is required."
        return answer(
            request, False, detail, status=400, back=back, error="invalid", field="comment"
        )
    comment = form.validated_data.get("comment", "")
    actor, user = request.user.get_username(), request.user
    try:
        if decision == "approve":
            action = services.action_approve(action=action, actor=actor, user=user, comment=comment)
            detail = f"Approved: action #{pk} is {action.state.replace('_', ' ')}."
        elif decision == "reject":
            action = services.action_reject(action=action, actor=actor, user=user, comment=comment)
            detail = f"Rejected action #{pk}."
        else:
            detail = "Choose Approve or Reject."
            return answer(request, False, detail, status=400, back=back, error="invalid")
    except AppError as exc:  # the service's refusal, with the API's status
        state = Action.objects.filter(pk=pk).values_list("state", flat=True).first()
        extra = {"state": state, **exc.extra}
        return answer(
            request, False, exc.detail, status=status_of(exc), back=back, error=exc.code, **extra
        )
    queue.action_send(action)
    return answer(request, True, detail, back=back, state=action.state, action=action.pk)


urls = [
    path("approvals/", page, name="approvals"),
    path("approvals/<int:pk>/decide", decide, name="approval-decide"),
]
