"""Shared fixtures: the personas every endpoint is tested with, and an ingest helper.

Personas: admin, operator, viewer (Django users with those roles, each with a
token acting as them), an outsider (a user with no role), an ingest token for
cluster `east` and one for cluster `west`.
"""

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from console.services import token_issue, user_set_role

# The live stack of the end-to-end tests: a local cluster reporting to a live server.
pytest_plugins = ["tests.live"]


def _user(username, role):
    user = get_user_model().objects.create_user(username)  # no password: sessions use force_login
    if role:
        user_set_role(user=user, role=role)
    return user


class Persona:
    def __init__(self, name, raw_token, user=None):
        self.name = name
        self.token = raw_token
        self.user = user

    def client(self) -> APIClient:
        """A client that authenticates with the persona's token, or its session."""
        c = APIClient()
        if self.token:
            c.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        elif self.user:
            c.force_login(self.user)
        return c

    def __repr__(self):
        return f"<persona {self.name}>"


@pytest.fixture
def personas(db):
    out = {}
    for role in ("admin", "operator", "viewer"):
        user = _user(role, role)
        _, raw = token_issue(scope=role, username=role)
        out[role] = Persona(role, raw, user)
    outsider = _user("outsider", None)
    # A session user with no role: signed in, allowed nothing.
    out["outsider"] = Persona("outsider", None, outsider)
    _, raw = token_issue(scope="ingest", cluster_name="east")
    out["ingest"] = Persona("ingest", raw)
    _, raw = token_issue(scope="ingest", cluster_name="west")
    out["ingest_west"] = Persona("ingest_west", raw)
    return out


@pytest.fixture
def ingest(personas):
    """Post events with the `east` ingest token; returns the response."""

    def post(events, persona="ingest", **extra):
        client = personas[persona].client()
        return client.post(
            "/api/v1/ingest",
            data=json.dumps({"events": events}),
            content_type="application/json",
            **extra,
        )

    return post


SAMPLES = Path(__file__).resolve().parent / "data" / "samples"


@pytest.fixture(scope="session")
def sample():
    """The design's worked example (tests/data/samples): events and the figures they must give."""
    events = json.loads((SAMPLES / "small-job.events.json").read_text())["events"]
    expected = json.loads((SAMPLES / "small-job.expected.json").read_text())
    return events, expected


@pytest.fixture(autouse=True)
def recovery_records_only(settings):
    """Recovery acts through the recording `noop` driver unless a test gives a cluster
    its own: nothing a test opens may touch a local cluster left on this machine."""
    settings.REBOUND_RECOVERY_DRIVER = "noop"


@pytest.fixture(autouse=True)
def eager_celery():
    """Tasks run inline unless a test starts a real worker (see tests/jobs/test_tasks.py)."""
    from console.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def pytest_collection_modifyitems(config, items):
    """Tests marked `postgres` need what only PostgreSQL keeps (NaN in a float column)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
