"""Celery tasks of the jobs app, run inline and on a real worker process."""

import time

import pytest
from django.db import connection

from console.celery import app
from jobs.models import LedgerSnapshot, TrainingJob
from jobs.services import ledger_snapshot_ensure
from jobs.signals import ledger_refreshed
from jobs.tasks import ledger_snapshot_refresh
from tests.processes import celery_worker

T0 = 1_790_000_000.0


def events(job="j1"):
    return [
        {
            "id": "a",
            "job": job,
            "kind": "attempt_started",
            "ts": T0,
            "attempt": 1,
            "data": {"world_size": 2},
        },
        {"id": "b", "job": job, "kind": "ready", "ts": T0 + 5, "attempt": 1},
        {"id": "c", "job": job, "kind": "step", "ts": T0 + 6, "attempt": 1, "data": {"step": 1}},
    ]


@pytest.mark.django_db
def test_ledger_refresh_twice_stores_one_snapshot(ingest):
    ingest(events())
    job = TrainingJob.objects.get(key="j1")
    ledger_snapshot_refresh(job.id)
    first = LedgerSnapshot.objects.get(job=job)
    ledger_snapshot_refresh(job.id)
    again = LedgerSnapshot.objects.get(job=job)
    assert LedgerSnapshot.objects.count() == 1
    assert (again.revision, again.figures) == (first.revision, first.figures)
    assert first.figures["categories"]["productive"] == pytest.approx(1.0)


@pytest.mark.django_db
def test_a_readers_snapshot_does_not_keep_the_refresh_from_telling_the_apps(ingest):
    """A reader that computed the current ledger first (the goodput API) told no one:
    the worker's refresh still sends `ledger_refreshed`, which brings the incidents'
    figures up to date; once told, a refresh at the same revision sends nothing."""
    told = []

    def heard(sender, job, **kwargs):
        told.append(job.revision)

    ledger_refreshed.connect(heard)
    try:
        ingest(events())
        job = TrainingJob.objects.get(key="j1")
        ledger_snapshot_ensure(job=job)
        assert LedgerSnapshot.objects.get(job=job).revision == job.revision
        ledger_snapshot_refresh(job.id)
        assert told == [job.revision]
        ledger_snapshot_refresh(job.id)
        ledger_snapshot_ensure(job=job)
        assert told == [job.revision]
    finally:
        ledger_refreshed.disconnect(heard)


@pytest.mark.django_db
def test_ledger_refresh_of_a_deleted_job_does_nothing():
    ledger_snapshot_refresh(987654)
    assert LedgerSnapshot.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_refreshes_the_ledger_after_ingest(ingest, monkeypatch):
    """A celery worker process on the project's broker (Redis in CI) picks up the task
    that ingest sends on commit, and writes the snapshot to the same database."""
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.skip("an in-memory SQLite database cannot be shared with a worker process")
    monkeypatch.setenv("REBOUND_LEDGER_DEBOUNCE_S", "1")  # the worker asks for the refresh
    with celery_worker() as worker:
        assert ingest(events()).status_code == 202
        job = TrainingJob.objects.get(key="j1")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not LedgerSnapshot.objects.filter(job=job).exists():
            assert worker.poll() is None
            time.sleep(0.2)
        snapshot = LedgerSnapshot.objects.get(job=job)
        assert snapshot.revision == job.revision
        assert snapshot.figures["elapsed_s"] == pytest.approx(6.0)
    assert "jobs.ledger_refresh" in worker.output


@pytest.mark.django_db(transaction=True)
def test_a_broker_outage_does_not_fail_the_ingest(ingest, monkeypatch):
    """The batch is committed before the tasks are sent; if sending fails, the client
    still gets its 202 and the events are stored (the failure is logged)."""
    from incidents import tasks as incident_tasks
    from jobs import tasks as job_tasks

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    app.conf.task_always_eager = False
    for task in (
        job_tasks.ledger_snapshot_refresh,
        incident_tasks.incidents_detect_pass,
        incident_tasks.incidents_open_reported,
    ):
        monkeypatch.setattr(task, "delay", broker_down)
        monkeypatch.setattr(task, "apply_async", broker_down)
    r = ingest(events())
    assert r.status_code == 202
    assert TrainingJob.objects.get(key="j1").events_count == 3
