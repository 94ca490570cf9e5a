"""Signing in: failed sign-ins are throttled per username and per client address, in
the database (so every gunicorn worker sees them); an operator created by set_role
gets a password from stdin."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from console.models import LoginFailure
from console.roles import user_role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-staple-42"
LOCKED = "Too many failed sign-ins"


@pytest.fixture
def alice():
    return UserFactory(username="alice", password=PASSWORD, role="operator")


def sign_in(username, password, address="10.0.0.1", client=None):
    client = client or Client(REMOTE_ADDR=address)
    r = client.post("/login/", {"username": username, "password": password})
    return r, client


def signed_in(r) -> bool:
    return r.status_code == 302 and r.url == "/"


def test_four_wrong_passwords_then_the_right_one_signs_in(settings, alice):
    settings.REBOUND_LOGIN_MAX_FAILURES = 5
    for _ in range(4):
        r, _ = sign_in("alice", "wrong")
        assert r.status_code == 200 and "did not match" in r.text
    r, client = sign_in("alice", PASSWORD)
    assert signed_in(r)
    assert client.get("/").status_code == 200
    assert not LoginFailure.objects.filter(username="alice").exists()  # a success forgets them


def test_five_wrong_passwords_lock_the_username_even_for_the_right_one(settings, alice):
    settings.REBOUND_LOGIN_MAX_FAILURES = 5
    settings.REBOUND_LOGIN_LOCKOUT_S = 900
    for i in range(5):
        r, _ = sign_in("alice", f"wrong-{i}", address=f"10.0.1.{i}")
    assert LOCKED in r.text  # the fifth failure says so at once
    r, client = sign_in("alice", PASSWORD, address="10.0.2.1")  # another address too
    assert r.status_code == 429 and not signed_in(r)
    assert LOCKED in r.text and "try again in 15 minutes" in r.text
    assert client.get("/").status_code == 302  # not signed in
    # Another user is not locked out by alice's failures.
    UserFactory(username="bob", password=PASSWORD, role="viewer")
    assert signed_in(sign_in("bob", PASSWORD, address="10.0.2.2")[0])

    # Fifteen minutes later the lock is over.
    for row in LoginFailure.objects.all():
        LoginFailure.objects.filter(pk=row.pk).update(at=row.at - timedelta(seconds=901))
    assert signed_in(sign_in("alice", PASSWORD, address="10.0.2.1")[0])


def test_failures_from_one_address_lock_that_address_for_every_username(settings, alice):
    settings.REBOUND_LOGIN_MAX_FAILURES = 5
    settings.REBOUND_LOGIN_MAX_FAILURES_PER_ADDRESS = 6
    for i in range(6):
        sign_in(f"guess-{i}", "wrong", address="10.9.9.9")
    r, _ = sign_in("alice", PASSWORD, address="10.9.9.9")
    assert r.status_code == 429 and LOCKED in r.text
    assert signed_in(sign_in("alice", PASSWORD, address="10.9.9.10")[0])


def test_the_lock_holds_for_the_admin_sign_in_too(settings, alice):
    settings.REBOUND_LOGIN_MAX_FAILURES = 3
    alice.is_staff = True
    alice.save()
    for _ in range(3):
        sign_in("alice", "wrong")
    client = Client(REMOTE_ADDR="10.0.3.1")
    client.post("/admin/login/", {"username": "alice", "password": PASSWORD, "next": "/admin/"})
    assert client.get("/admin/").status_code == 302  # still sent to sign in


def test_set_role_create_with_a_password_from_stdin_lets_the_operator_sign_in():
    out = StringIO()
    call_command(
        "set_role",
        "sre2",
        "operator",
        "--create",
        "--password-stdin",
        stdin=StringIO(PASSWORD + "\n"),
        stdout=out,
    )
    assert user_role(get_user_model().objects.get(username="sre2")) == "operator"
    assert signed_in(sign_in("sre2", PASSWORD)[0])


def test_set_role_refuses_a_weak_or_empty_password_and_creates_nobody():
    with pytest.raises(CommandError, match=r"too common|too short"):
        call_command(
            "set_role", "sre3", "viewer", "--create", "--password-stdin", stdin=StringIO("12345\n")
        )
    with pytest.raises(CommandError, match="empty"):
        call_command(
            "set_role", "sre3", "viewer", "--create", "--password-stdin", stdin=StringIO("")
        )
    assert not get_user_model().objects.filter(username="sre3").exists()
