"""Writes of the console app: tokens, users' roles and passwords, failed sign-ins."""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.db import transaction
from django.utils import timezone

from console.models import ApiToken, LoginFailure, new_raw_token, token_digest
from console.roles import ROLE_ORDER, lower_role, user_role
from jobs.services import cluster_get_or_create


class RoleError(ValueError):
    pass


def token_issue(
    *, scope: str, cluster_name: str | None = None, username: str | None = None, name: str = ""
) -> tuple[ApiToken, str]:
    """A new token and its raw value, shown once.

    An ingest token's cluster is created when missing. A token that acts as a user
    may not be given more than the user's role (and it follows the user's role later:
    see console.roles.token_role).
    """
    if scope not in ApiToken.Scope.values:
        raise RoleError(f"unknown scope {scope!r}; one of {', '.join(ApiToken.Scope.values)}")
    if scope == ApiToken.Scope.INGEST and not cluster_name:
        raise RoleError("an ingest token needs --cluster: it may post events for that cluster only")
    if scope != ApiToken.Scope.INGEST and cluster_name:
        raise RoleError("only ingest tokens are bound to a cluster")
    user = None
    if username:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise RoleError(f"no user named {username!r}")
        held = user_role(user)
        if held is None:
            raise RoleError(f"{username} has no role: give one first (manage.py set_role)")
        if scope != ApiToken.Scope.INGEST and lower_role(scope, held) != scope:
            raise RoleError(
                f"{username} is {'an' if held[0] in 'aeiou' else 'a'} {held}:"
                f" a token acting as {username} may be {held} at most"
            )
    with transaction.atomic():
        cluster = cluster_get_or_create(name=cluster_name) if cluster_name else None
        raw = new_raw_token()
        token = ApiToken.objects.create(
            name=name,
            digest=token_digest(raw),
            hint=raw[:12],
            scope=scope,
            cluster=cluster,
            user=user,
        )
    return token, raw


def user_set_role(*, user, role: str | None) -> None:
    """Give `user` exactly one role (or none)."""
    if role is not None and role not in ROLE_ORDER:
        raise RoleError(f"unknown role {role!r}; one of {', '.join(ROLE_ORDER)}")
    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name__in=ROLE_ORDER))
        if role:
            user.groups.add(Group.objects.get_or_create(name=role)[0])
    user.__dict__.pop("_rebound_role", None)  # user_role's cache on this object


def user_set_password(*, user, password: str) -> None:
    """Set `user`'s password after Django's password validators (settings) accept it.
    Raises django.core.exceptions.ValidationError with their reasons."""
    validate_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])


def login_failure_record(*, username: str, address: str) -> None:
    """Count one failed sign-in (console.signin), and drop failures too old to matter."""
    now = timezone.now()
    keep = settings.REBOUND_LOGIN_WINDOW_S + settings.REBOUND_LOGIN_LOCKOUT_S
    LoginFailure.objects.filter(at__lt=now - timedelta(seconds=keep)).delete()
    LoginFailure.objects.create(username=username[:150], address=address[:64], at=now)


def login_failures_forget(*, username: str) -> None:
    """A successful sign-in: the username's failures no longer count (its address's do)."""
    LoginFailure.objects.filter(username=username[:150]).delete()
