"""What every page shares: who may see it, who may change things, and how a
form answers (JSON to the page's script, a redirect without it)."""

from __future__ import annotations

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.shortcuts import redirect

from console.roles import role_allows, user_role


def viewer_page(view):
    """A page: signed-in users with at least the viewer role."""

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not role_allows(user_role(request.user), "viewer"):
            raise PermissionDenied("You need the viewer role to see this console.")
        return view(request, *args, **kwargs)

    return wrapped


def operator_post(view):
    """A form that changes something: POST only (CSRF-checked by the middleware),
    operators and admins only."""

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.method != "POST":
            return JsonResponse({"error": "method", "detail": "POST only"}, status=405)
        if not role_allows(user_role(request.user), "operator"):
            return answer(request, False, "Viewers see everything and change nothing.", status=403)
        return view(request, *args, **kwargs)

    return wrapped


def can_operate(request: HttpRequest) -> bool:
    return role_allows(user_role(request.user), "operator")


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def answer(request: HttpRequest, ok: bool, detail: str, *, status: int = 200, back=None, **data):
    """The reply to a console form: JSON for the page's script, else a message and
    a redirect back to where the form was."""
    if wants_json(request):
        return JsonResponse({"ok": ok, "detail": detail, **data}, status=status if not ok else 200)
    (messages.success if ok else messages.error)(request, detail)
    return redirect(back or request.headers.get("Referer") or "/")
