"""Shared fixtures: the personas every endpoint is tested with, and an ingest helper;
the `noop` recovery driver every test runs with; Hypothesis's profiles.

Personas: admin, operator, viewer (Django users with those roles, each with a
token acting as them), an outsider (a user with no role), an ingest token for
cluster `east` and one for cluster `west`.

Hypothesis profiles: "ci" tries the full count of examples, "dev" (the default off
CI) a sixth of it, for a quick local loop. HYPOTHESIS_PROFILE names one; without it,
CI being set in the environment chooses "ci". A property test names no count of its
own, so that the profile decides; one that wants more than the profile's count asks
for `examples(n)`: n under "ci", the same share of the count of the profile loaded.
"""

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient

from console.services import token_issue
from tests.factories import UserFactory

# The live stack of the end-to-end tests: a local cluster reporting to a live server.
pytest_plugins = ["tests.live"]

CI_EXAMPLES = 150
hypothesis_settings.register_profile("ci", max_examples=CI_EXAMPLES, print_blob=True)
hypothesis_settings.register_profile("dev", max_examples=25)
# Loaded before the test modules are imported: their settings objects copy it then.
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


def examples(ci: int) -> int:
    """`ci` examples under the "ci" profile; as many in proportion under another."""
    return max(1, round(ci * hypothesis_settings.default.max_examples / CI_EXAMPLES))


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
        user = UserFactory(username=role, role=role)  # no password: sessions use force_login
        _, raw = token_issue(scope=role, username=role)
        out[role] = Persona(role, raw, user)
    outsider = UserFactory(username="outsider")
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
def noop(settings):
    """Recovery acts through the recording `noop` driver unless a test gives a cluster
    its own: nothing a test opens may touch a local cluster left on this machine.
    Yields the driver (tests read `noop.calls`, queue `noop.errors`), cleared before
    and after each test."""
    from recovery.drivers.noop import NoopDriver

    settings.REBOUND_RECOVERY_DRIVER = "noop"
    NoopDriver.reset()
    yield NoopDriver
    NoopDriver.reset()


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
