"""Celery tasks of the jobs app, run inline and on a real worker process."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from console.celery import app
from jobs import services
from jobs.models import LedgerSnapshot, TrainingJob
from jobs.tasks import ledger_refresh

ROOT = Path(__file__).resolve().parents[2]
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
    ledger_refresh(job.id)
    first = LedgerSnapshot.objects.get(job=job)
    ledger_refresh(job.id)
    again = LedgerSnapshot.objects.get(job=job)
    assert LedgerSnapshot.objects.count() == 1
    assert (again.revision, again.figures) == (first.revision, first.figures)
    assert first.figures["categories"]["productive"] == pytest.approx(1.0)


@pytest.mark.django_db
def test_ledger_refresh_of_a_deleted_job_does_nothing():
    ledger_refresh(987654)
    assert LedgerSnapshot.objects.count() == 0


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user, host, port = s["USER"] or "postgres", s["HOST"] or "127.0.0.1", s["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_refreshes_the_ledger_after_ingest(ingest, monkeypatch, tmp_path):
    """A celery worker process on the project's broker (Redis in CI) picks up the task
    that ingest sends on commit, and writes the snapshot to the same database."""
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.skip("an in-memory SQLite database cannot be shared with a worker process")
    queue = f"test-{uuid.uuid4().hex[:8]}"
    app.conf.task_always_eager = False
    monkeypatch.setattr(services, "LEDGER_REFRESH_DEBOUNCE_S", 1)
    default_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    env = {**os.environ, "DATABASE_URL": _database_url(), "REBOUND_CELERY_QUEUE": queue}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "--pool",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
            "-Q",
            queue,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert ingest(events()).status_code == 202
        job = TrainingJob.objects.get(key="j1")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not LedgerSnapshot.objects.filter(job=job).exists():
            assert worker.poll() is None, worker.stdout.read()
            time.sleep(0.2)
        snapshot = LedgerSnapshot.objects.get(job=job)
        assert snapshot.revision == job.revision
        assert snapshot.figures["elapsed_s"] == pytest.approx(6.0)
    finally:
        app.conf.task_default_queue = default_queue
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
    assert "jobs.ledger_refresh" in out


@pytest.mark.django_db(transaction=True)
def test_a_broker_outage_does_not_fail_the_ingest(ingest, monkeypatch):
    """The batch is committed before the tasks are sent; if sending fails, the client
    still gets its 202 and the events are stored (the failure is logged)."""
    from incidents import tasks as incident_tasks
    from jobs import tasks as job_tasks

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    app.conf.task_always_eager = False
    for task in (job_tasks.ledger_refresh, incident_tasks.detect_job, incident_tasks.open_reported):
        monkeypatch.setattr(task, "delay", broker_down)
        monkeypatch.setattr(task, "apply_async", broker_down)
    r = ingest(events())
    assert r.status_code == 202
    assert TrainingJob.objects.get(key="j1").events_count == 3
