"""A transient driver error on a real worker (not eager mode, where a countdown runs at
once): the action runs again only after its backoff, and exactly twice.

The worker's noop driver fails its first call (tests/recovery/flaky_noop.py). An
incident opens; its policy proposes an automatic restart; the worker runs it, the
driver fails, the row goes back to `queued` and the retry is sent with a countdown.
Nothing else may send it sooner (a transition to `queued` once sent the execution
task itself, at once, so the retry ran with no backoff)."""

import time

import pytest
from django.db import connection

from incidents.models import Incident
from incidents.signals import incident_opened
from recovery import services
from recovery.models import Action
from tests.processes import celery_worker
from tests.recovery.conftest import make_incident

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

S = Action.State


def wait_for(condition, what: str, worker, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert worker.poll() is None, "the worker died"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_transient_error_is_retried_once_after_its_backoff(job):
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.skip("an in-memory SQLite database cannot be shared with a worker process")
    countdown = services.backoff_s(1)
    env = {"DJANGO_SETTINGS_MODULE": "tests.recovery.worker_settings_flaky"}
    with celery_worker(env=env) as worker:
        incident = make_incident(job, cause="software", fault_type="crash")
        incident_opened.send(sender=Incident, incident=incident)
        action = wait_for(
            lambda: Action.objects.filter(incident=incident, kind="restart_job").first(),
            "the policy's restart",
            worker,
        )
        wait_for(
            lambda: Action.objects.get(pk=action.pk).state in Action.TERMINAL_STATES,
            "the restart to end",
            worker,
        )
        # Long enough for a stray extra send to have run too.
        time.sleep(2.0)
    action.refresh_from_db()
    assert (action.state, action.attempts) == (S.SUCCEEDED, 2), action.error
    audit = list(action.audit.order_by("at", "id"))
    moves = [(a.from_state, a.to_state) for a in audit]
    assert moves == [
        ("", S.PROPOSED),
        (S.PROPOSED, S.QUEUED),
        (S.QUEUED, S.RUNNING),
        (S.RUNNING, S.QUEUED),
        (S.QUEUED, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
    ], worker.output[-3000:]
    retry, rerun = audit[3], audit[4]
    assert f"retry in {countdown:g} s: scheduler busy (once)" in retry.reason
    waited = (rerun.at - retry.at).total_seconds()
    # The countdown runs from the send, after the retry was recorded (a timer may fire
    # a few milliseconds early).
    assert waited >= countdown - 0.1, f"run again {waited:.2f} s after the error"
