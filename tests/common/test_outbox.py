"""The outbox: work handed to Celery on commit is kept in the database until a task
takes it, so a broker that is away loses nothing (see also tests/test_broker_outage.py)."""

import shutil
import signal
import subprocess
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from common import outbox
from common.models import OutboxEntry
from common.outbox import Work, outbox_drain, outbox_enqueue
from console.celery import app
from jobs import tasks as job_tasks
from jobs.models import TrainingJob
from tests.processes import free_port

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0


def events(job="j1"):
    return [
        {"id": "a", "job": job, "kind": "attempt_started", "ts": T0, "attempt": 1}
        | {"data": {"world_size": 2}},
        {"id": "b", "job": job, "kind": "fault", "ts": T0 + 5, "attempt": 1}
        | {"data": {"type": "crash"}},
    ]


def test_ingest_writes_one_row_per_job_in_its_transaction(ingest):
    batch = events("j1") + events("j2")
    assert ingest(batch).status_code == 202
    rows = OutboxEntry.objects.filter(task="jobs.events_stored").order_by("key")
    jobs = dict(TrainingJob.objects.values_list("key", "id"))
    assert [r.key for r in rows] == sorted([str(jobs["j1"]), str(jobs["j2"])])
    assert rows[0].args[1] == ["attempt_started", "fault"]


def test_a_second_request_merges_into_the_waiting_one(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sent:
        outbox_enqueue([Work("jobs.ledger_refresh", "7", [7], delay_s=5)])
    with django_capture_on_commit_callbacks() as again:
        outbox_enqueue([Work("jobs.ledger_refresh", "7", [7], delay_s=5)])
    assert len(sent) == 1 and again == []  # already on its way
    with django_capture_on_commit_callbacks() as sooner:
        outbox_enqueue([Work("jobs.ledger_refresh", "7", [7], delay_s=0)])
    assert len(sooner) == 1  # due sooner now: sent again
    [row] = OutboxEntry.objects.all()
    assert row.due_at <= timezone.now()


def test_two_requests_for_one_row_in_one_call_merge(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sent:
        outbox_enqueue(
            [
                Work("jobs.ledger_refresh", "7", [7], delay_s=5),
                Work("jobs.ledger_refresh", "7", [7]),
            ]
        )
    assert len(sent) == 1
    [row] = OutboxEntry.objects.all()
    assert row.due_at <= timezone.now()


def test_nothing_is_sent_when_the_transaction_rolls_back(django_capture_on_commit_callbacks):
    with (
        django_capture_on_commit_callbacks() as sent,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        outbox_enqueue([Work("jobs.ledger_refresh", "7", [7])])
        raise RuntimeError
    assert sent == [] and not OutboxEntry.objects.exists()


def test_the_task_claims_its_row(ingest, django_capture_on_commit_callbacks):
    """Run inline (eager): the follow-up claims its row and asks for the next work."""
    with django_capture_on_commit_callbacks(execute=True):
        assert ingest(events()).status_code == 202
    tasks = set(OutboxEntry.objects.values_list("task", flat=True))
    assert "jobs.events_stored" not in tasks  # claimed
    assert not {"jobs.ledger_refresh", "incidents.open_reported", "incidents.detect_job"} & tasks


def test_work_not_sent_waits_for_the_drain(ingest, monkeypatch, django_capture_on_commit_callbacks):
    """The broker refuses the send: the client has its 202, the row stays, marked for
    the drain; once the broker is back, the drain sends it and the task claims it."""

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(job_tasks.events_follow_up, "apply_async", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        assert ingest(events()).status_code == 202
    [row] = OutboxEntry.objects.filter(task="jobs.events_stored")
    assert row.retry_at <= timezone.now()
    assert outbox_drain() == 0  # still away: nothing sent, nothing lost
    assert OutboxEntry.objects.filter(pk=row.pk).exists()
    monkeypatch.undo()
    with django_capture_on_commit_callbacks(execute=True):
        assert outbox_drain() == 1
    assert not OutboxEntry.objects.filter(task="jobs.events_stored").exists()


def test_a_row_the_broker_lost_is_sent_again_after_a_while(django_capture_on_commit_callbacks):
    """Sent, then lost with a restarted Redis: still here past retry_at, so sent again."""
    app.conf.task_always_eager = False  # nothing runs it here: as if the message were lost
    try:
        with django_capture_on_commit_callbacks(execute=False):
            outbox_enqueue([Work("jobs.ledger_refresh", "987654", [987654])])
    finally:
        app.conf.task_always_eager = True
    assert outbox_drain() == 0  # not yet: its message may be queued still
    later = timezone.now() + timedelta(seconds=outbox.RESEND_S + 1)
    assert outbox_drain(now=later) == 1
    assert not OutboxEntry.objects.exists()  # the (eager) task claimed it


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_channel_of_a_closed_broker_connection_fails_as_a_connection_error():
    """What killed the worker after a Redis restart: kombu rebuilt a connection pool for a
    channel whose connection the consumer had already collected, from a transport whose
    `client` is None: AttributeError, "Unrecoverable error". It is a connection error
    now, which the worker recovers from."""
    import redis
    from kombu import Connection

    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        conn = Connection(f"redis://127.0.0.1:{port}/0", transport_options={})
        for _ in range(100):
            try:
                conn.connect()
                break
            except Exception:
                time.sleep(0.05)
        channel = conn.channel()
        channel.client.ping()
        # A channel left open when its connection was collected after a connection loss
        # (closing it failed halfway: its pools are gone, its transport forgot the
        # connection), and then used: a late acknowledgement, a timer.
        channel._disconnect_pools()
        conn._do_close_transport()
        assert channel.connection.client is None
        with (
            pytest.raises(redis.exceptions.ConnectionError),
            channel.conn_or_acquire() as client,
        ):
            client.ping()
        assert isinstance(redis.exceptions.ConnectionError(), channel.connection_errors)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
