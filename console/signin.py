"""Signing in with a password, throttled: failed sign-ins are counted per username and
per client address, in the database (every web worker sees the same count, and a
restart forgets nothing). `REBOUND_LOGIN_MAX_FAILURES` failures for a username (or
`REBOUND_LOGIN_MAX_FAILURES_PER_ADDRESS` from an address) within
`REBOUND_LOGIN_WINDOW_S` lock it for `REBOUND_LOGIN_LOCKOUT_S`: meanwhile no password
is even checked, the right one included. A success forgets the username's failures.

The lock is enforced by the authentication backend, so it holds for the console's
sign-in page and the admin's alike; the page says why it refuses (429).
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from console.models import LoginFailure
from console.services import login_failure_record, login_failures_forget


def client_address(request) -> str:
    """The client's address: REMOTE_ADDR, or behind `REBOUND_TRUSTED_PROXIES` proxies the
    X-Forwarded-For entry the outermost of them added (entries further left are the
    client's word, not to be trusted)."""
    if request is None:
        return ""
    hops = settings.REBOUND_TRUSTED_PROXIES
    if hops > 0:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
    return request.META.get("REMOTE_ADDR", "")[:64]


def _locked_until(rows, limit: int):
    """When a lock on these failures (newest first) ends, or None when there is none:
    `limit` failures within the window lock from the last of them for the lockout."""
    recent = list(rows.order_by("-at").values_list("at", flat=True)[:limit])
    if limit < 1 or len(recent) < limit:
        return None
    if recent[0] - recent[-1] > timedelta(seconds=settings.REBOUND_LOGIN_WINDOW_S):
        return None
    until = recent[0] + timedelta(seconds=settings.REBOUND_LOGIN_LOCKOUT_S)
    return until if until > timezone.now() else None


def signin_locked_for(*, username: str, address: str) -> float:
    """Seconds until `username` (or `address`) may try again; 0 when it may now."""
    ends = [
        _locked_until(
            LoginFailure.objects.filter(username=username[:150]),
            settings.REBOUND_LOGIN_MAX_FAILURES,
        )
    ]
    if address:
        ends.append(
            _locked_until(
                LoginFailure.objects.filter(address=address),
                settings.REBOUND_LOGIN_MAX_FAILURES_PER_ADDRESS,
            )
        )
    ends = [e for e in ends if e is not None]
    return max((e - timezone.now()).total_seconds() for e in ends) if ends else 0.0


class SignInLocked(PermissionDenied):
    """Raised by the backend: django.contrib.auth.authenticate() then tries no other."""


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        address = client_address(request)
        if signin_locked_for(username=username, address=address):
            raise SignInLocked
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failure_record(username=username, address=address)
        else:
            login_failures_forget(username=username)
        return user


class SignInForm(AuthenticationForm):
    error_messages = {
        **AuthenticationForm.error_messages,
        "locked": (
            "Too many failed sign-ins for this username or from this address:"
            " try again in %(minutes)s."
        ),
    }
    locked = False

    def clean(self):
        self._refuse_if_locked()
        try:
            return super().clean()
        except ValidationError:
            self._refuse_if_locked()  # this failure may be the one that locks
            raise

    def _refuse_if_locked(self):
        username = self.cleaned_data.get("username") or ""
        left = signin_locked_for(username=username, address=client_address(self.request))
        if left:
            self.locked = True
            minutes = math.ceil(left / 60)
            raise ValidationError(
                self.error_messages["locked"],
                code="locked",
                params={"minutes": f"{minutes} minute{'s' if minutes != 1 else ''}"},
            )


class SignInView(LoginView):
    form_class = SignInForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.locked:
            response.status_code = 429
        return response
