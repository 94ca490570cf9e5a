"""The Celery queues (console.queues): each task on the queue of its role, under the
prefix the sending process has now, for sends by task object and by name alike (the
outbox's), through the real broker."""

import contextlib
import re

import pytest
from django.conf import settings
from django.db import transaction

from common.outbox import Work, outbox_enqueue
from console.celery import app
from console.queues import queue_name, queue_names
from tests.processes import ROOT, queue_depth, queue_prefix

# Every task there is, and where it must go: a new task fails this until it is placed.
EXPECTED = {
    "jobs.events_stored": "detect",
    "jobs.ledger_refresh": "detect",
    "jobs.page_cache_refresh": "detect",
    "incidents.open_reported": "detect",
    "incidents.detect_job": "detect",
    "recovery.incident_propose": "recovery",
    "recovery.action_execute": "recovery",
    "recovery.action_follow_up": "recovery",
    "incidents.storage_upkeep": "upkeep",
    "common.outbox_drain": "default",
    "incidents.sweep": "default",
    "recovery.actions_reconcile": "default",
    "recovery.approvals_expire": "default",
    "recovery.approvals_retire": "default",
    "notify.deliver": "default",
    "notify.approvals_expiring": "default",
    "notify.resend": "default",
}


def routed(name: str) -> str:
    return app.amqp.router.route({}, name, task_type=app.tasks.get(name))["queue"].name


@pytest.fixture
def prefix():
    """This test's queue prefix, as tests/processes.py's celery_worker sets one."""
    before = app.conf.task_default_queue
    app.conf.task_default_queue = queue_prefix()
    yield app.conf.task_default_queue
    app.conf.task_default_queue = before


def test_each_task_goes_to_the_queue_of_its_role(prefix):
    app.loader.import_default_modules()
    registered = {name for name in app.tasks if not name.startswith("celery.")}
    assert registered <= set(EXPECTED), f"place the new task(s): {registered - set(EXPECTED)}"
    for name, role in EXPECTED.items():
        assert routed(name) == queue_name(prefix, role), name


def test_no_periodic_work_waits_behind_detection_or_an_action(prefix):
    behind = {queue_name(prefix, "detect"), queue_name(prefix, "recovery")}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert routed(entry["task"]) not in behind, entry["task"]


def test_a_task_no_table_entry_names_goes_to_the_default_queue(prefix):
    assert routed("reports.monthly") == prefix
    assert routed("jobs.something_new") == queue_name(prefix, "detect")  # its app's


@pytest.fixture
def broker(prefix):
    """Sends reach the real broker (Redis, or the filesystem one); emptied afterwards."""
    app.conf.task_always_eager = False
    yield prefix
    with app.connection_for_write() as conn:
        for role in ("default", "detect", "recovery", "upkeep"):
            with contextlib.suppress(conn.channel_errors):
                conn.default_channel.queue_purge(queue_name(prefix, role))


@pytest.mark.django_db(transaction=True)
def test_the_outbox_and_sends_by_name_land_on_the_queue_of_their_role(broker):
    """The outbox stores a task by name and sends it after the commit; its message (and
    one sent with send_task, by name only) goes where the routing table says."""
    with transaction.atomic():
        outbox_enqueue([Work("incidents.detect_job", "7", [7]), Work("common.outbox_drain", "x")])
    app.send_task("recovery.action_execute", [1])

    assert queue_depth(queue_name(broker, "detect")) == 1
    assert queue_depth(queue_name(broker, "default")) == 1
    assert queue_depth(queue_name(broker, "recovery")) == 1
    assert queue_depth(queue_name(broker, "upkeep")) == 0


def test_the_worker_units_in_deploy_consume_every_queue_once():
    consumed = []
    for unit in sorted((ROOT / "deploy" / "systemd").glob("rebound-worker-*.service")):
        command = unit.read_text().replace("\\\n", " ")
        queues = re.search(r"--queues (\S+)", command).group(1)
        consumed += queues.replace("${REBOUND_CELERY_QUEUE}", "site").split(",")
    assert sorted(consumed) == sorted(queue_names("site"))
