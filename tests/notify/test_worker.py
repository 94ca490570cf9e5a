"""A channel that fails, on a REAL Celery worker (eager mode runs a countdown at once):
the delivery is retried after each backoff (base, 2 x base, 4 x base ...), six
attempts in all, then the notification is `failed`; every failed attempt and the
final failure show on the incident's timeline."""

import time
from itertools import pairwise

import pytest
from django.db import connection

from incidents.models import Incident
from incidents.signals import incident_opened
from notify.models import Notification
from tests.notify.conftest import make_channel, make_incident, make_rule
from tests.processes import celery_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.engine_free,
    pytest.mark.timeout(180),
]

BASE_S = 0.5  # the worker's REBOUND_NOTIFY_RETRY_BASE_S: 0.5, 1, 2, 4, 8 s


def wait_for(condition, what: str, worker, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert worker.poll() is None, "the worker died"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_failing_channel_is_retried_with_backoff_then_failed(receiver, job):
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.skip("an in-memory SQLite database cannot be shared with a worker process")
    receiver.statuses = [500]
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    env = {"REBOUND_NOTIFY_RETRY_BASE_S": str(BASE_S)}
    with celery_worker(env=env) as worker:
        incident = make_incident(job)
        incident_opened.send(sender=Incident, incident=incident)
        n = wait_for(
            lambda: Notification.objects.filter(incident=incident, state="failed").first(),
            "the notification to fail for good",
            worker,
        )
        time.sleep(1.0)  # long enough for a stray extra send to have run too
    assert n.attempts == 6, worker.output[-3000:]
    assert n.last_error.startswith("HTTP 500")
    assert len(receiver.requests) == 6
    gaps = [b["at"] - a["at"] for a, b in pairwise(receiver.requests)]
    for number, gap in enumerate(gaps, start=1):
        wanted = BASE_S * 2 ** (number - 1)
        # A countdown may fire a few milliseconds early; it never fires much late here.
        assert wanted - 0.1 <= gap < wanted + 5, (number, gaps)
    attempts = list(n.delivery_attempts.values_list("number", "outcome", "http_status"))
    assert attempts == [(i, "error", 500) for i in range(1, 7)]
    entries = [e.message for e in incident.timeline.filter(kind="notification").order_by("at")]
    assert len(entries) == 6
    assert all(f"attempt {i} of 6 failed: HTTP 500" in entries[i - 1] for i in range(1, 6))
    assert "failed after 6 attempt(s): HTTP 500" in entries[5]
