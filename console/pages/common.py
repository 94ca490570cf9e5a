"""What every page shares: who may see it, who may change things, how a form
answers (JSON to the page's script, a redirect without it), the path converter of
stored names, the date field of period filters, how long ago something was and when a
job was last heard from."""

from __future__ import annotations

from datetime import date
from functools import wraps

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.shortcuts import redirect
from django.urls import register_converter

from console.roles import role_allows, user_role
from jobs import selectors as job_selectors


class StoredName:
    """A job key or node name as a URL path's last part: anything stored, '/' and
    newlines included. The wire refuses such names now, but rows stored before (or
    by the admin) must keep a page: reverse() percent-encodes what needs it."""

    regex = r"(?s:.+)"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value) -> str:
        return str(value)


register_converter(StoredName, "name")


class DayField(forms.DateField):
    """A whole UTC day of a period filter, within the years events may carry
    (jobs.wire's TS_MIN..TS_MAX): 0001-01-01 or 9999-12-31 would overflow the
    day arithmetic, and are mistakes anyway."""

    FIRST, LAST = date(2000, 1, 1), date(2099, 12, 31)

    def clean(self, value):
        day = super().clean(value)
        if day is not None and not (self.FIRST <= day <= self.LAST):
            raise forms.ValidationError(f"A day from {self.FIRST} to {self.LAST}.")
        return day


def span(seconds: float) -> str:
    """'12 s', '5 min', '3 h', '2 d': whole units, rounded down."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


def age(then, now) -> str:
    """'12 s ago', '5 min ago', '3 h ago', '2 d ago'; 'never' for no time."""
    if then is None:
        return "never"
    return f"{span((now - then).total_seconds())} ago"


def job_heard(job, now) -> dict:
    """A job's status as the pages show it (jobs.selectors.job_activity: `silent` for a
    running job not heard from lately) and how long ago it was last heard from."""
    a = job_selectors.job_activity(job, now=now)
    return {
        "id": job.pk,
        "activity": a.activity,
        "silent": a.silent,
        "last_heard_at": a.last_heard_at,
        "ago": age(a.last_heard_at, now),
        "silent_for": span(a.heard_ago_s) if a.silent else "",
        "silent_after": span(job_selectors.job_silent_after_s()),
    }


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
