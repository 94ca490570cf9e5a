"""Tokens: issued by a command, stored hashed, scoped to roles (and ingest to a cluster)."""

import hashlib
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from console.models import ApiToken
from console.roles import role_allows, user_role
from console.services import user_set_role
from jobs.models import Cluster
from tests.factories import ClusterFactory, UserFactory

pytestmark = pytest.mark.django_db


def issue(*args):
    out = StringIO()
    call_command("issue_token", *args, stdout=out)
    return out.getvalue()


def test_issue_token_prints_the_token_alone_and_stores_only_its_hash():
    out = issue("--scope", "ingest", "--cluster", "north")
    raw = out.strip()
    assert out == raw + "\n" and " " not in raw
    token = ApiToken.objects.get()
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {token.digest, token.name}
    assert len(token.hint) < len(raw)
    assert token.cluster.name == "north"  # created when missing


def test_issue_token_reuses_an_existing_cluster():
    ClusterFactory(name="north")
    issue("--scope", "ingest", "--cluster", "north")
    assert Cluster.objects.count() == 1


def test_ingest_tokens_need_a_cluster_and_others_refuse_one():
    with pytest.raises(CommandError, match="needs --cluster"):
        issue("--scope", "ingest")
    with pytest.raises(CommandError, match="only ingest tokens"):
        issue("--scope", "viewer", "--cluster", "north")
    assert ApiToken.objects.count() == 0


def test_a_token_for_a_user(personas):
    raw = issue("--scope", "viewer", "--user", "viewer").strip()
    token = ApiToken.objects.get(digest=hashlib.sha256(raw.encode()).hexdigest())
    assert token.user.username == "viewer"
    with pytest.raises(CommandError, match="no user"):
        issue("--scope", "viewer", "--user", "ghost")


def test_issued_tokens_authenticate(client):
    raw = issue("--scope", "viewer").strip()
    assert client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    assert client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {raw}x").status_code == 401
    assert client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Token {raw}").status_code == 401


def test_role_order():
    assert role_allows("admin", "operator") and role_allows("operator", "viewer")
    assert not role_allows("viewer", "operator")
    assert not role_allows("ingest", "viewer") and not role_allows("admin", "ingest")
    assert role_allows("ingest", "ingest")
    assert not role_allows(None, "viewer")


def test_user_roles_come_from_groups():
    user = UserFactory(username="u1")
    assert user_role(user) is None
    user_set_role(user=user, role="operator")
    assert user_role(user) == "operator"
    user_set_role(user=user, role="viewer")
    assert user_role(user) == "viewer"  # one role at a time
    user.is_superuser = True
    assert user_role(user) == "admin"


def test_set_role_command():
    out = StringIO()
    call_command("set_role", "sre1", "operator", "--create", stdout=out)
    assert user_role(get_user_model().objects.get(username="sre1")) == "operator"
    with pytest.raises(CommandError):
        call_command("set_role", "ghost", "viewer")


def test_session_users_get_their_role(client, personas):
    client.force_login(personas["viewer"].user)
    assert client.get("/api/v1/jobs/").status_code == 200
    client.force_login(personas["outsider"].user)
    r = client.get("/api/v1/jobs/")
    assert r.status_code == 403
    assert "needs viewer" in r.json()["detail"]


def test_a_token_acts_with_no_more_than_its_users_current_role(personas):
    """An operator token of a user later demoted acts as a viewer; with no role left,
    the token is refused (403), like the user's session."""
    operator = personas["operator"]
    api = operator.client()
    assert api.post("/api/v1/actions/", {}, format="json").status_code == 400  # may act

    user_set_role(user=operator.user, role="viewer")
    r = api.post("/api/v1/actions/", {}, format="json")
    assert r.status_code == 403 and "needs operator" in r.json()["detail"]
    assert api.get("/api/v1/jobs/").status_code == 200  # still reads

    user_set_role(user=operator.user, role=None)
    r = api.get("/api/v1/jobs/")
    assert r.status_code == 403 and "needs viewer" in r.json()["detail"]

    user_set_role(user=operator.user, role="admin")  # a promotion does not widen the scope
    assert api.post("/api/v1/clusters/east/faults", {}, format="json").status_code == 403
    assert api.post("/api/v1/actions/", {}, format="json").status_code == 400


def test_a_token_for_a_user_may_not_exceed_the_users_role(personas):
    with pytest.raises(CommandError, match="viewer is a viewer"):
        issue("--scope", "operator", "--user", "viewer")
    with pytest.raises(CommandError, match="outsider has no role"):
        issue("--scope", "viewer", "--user", "outsider")
    assert issue("--scope", "viewer", "--user", "operator").strip()
