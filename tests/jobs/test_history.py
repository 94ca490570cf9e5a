"""A launch's history is never rewritten: a second start of a launch, or a new
launch of a finished job, is a 409 naming the job, the launch and what is stored,
and nothing of its batch is stored. Late, repeated and out-of-order delivery of
the same history stays fine; an operator may reopen a finished job."""

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, Event, TrainingJob
from jobs.selectors import job_goodput
from tests.jobs.test_ingest import T0, ev, launch, stored_counts

pytestmark = pytest.mark.django_db


def finished_job(ingest, job="j1"):
    """Launch 1 of `job`, completed at T0+30, the job finished at T0+31."""
    events = [
        *launch(job),
        ev(20, "attempt_ended", 30, job, reason="completed"),
        ev(21, "job_finished", 31, job),
    ]
    assert ingest(events).status_code == 202
    return events


def assert_conflict(r, job, attempt):
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["error"] == "history_conflict"
    assert f"'{job}'" in body["detail"] and f"launch {attempt}" in body["detail"]
    first = body["conflicts"][0]
    assert (first["job"], first["attempt"]) == (job, attempt)
    return body


# --- a second start of a launch ----------------------------------------------------


def test_running_the_demo_again_into_a_finished_job_is_a_409_and_stores_nothing(ingest):
    finished_job(ingest)
    before = stored_counts()
    ledger_before = job_goodput(job=TrainingJob.objects.get(key="j1"))
    rerun = [
        {**e, "id": f"run2-{e['id']}", "ts": e["ts"] + 3600}
        for e in launch()
        if e["kind"] != "heartbeat"
    ]
    body = assert_conflict(ingest(rerun), "j1", 1)
    stored = body["conflicts"][0]["stored"]
    assert stored["event"] == "e1"  # the attempt_started stored for launch 1
    assert stored["started_at"].startswith("2026-09-21T")
    assert "e1" in body["detail"]
    assert stored_counts() == before
    assert job_goodput(job=TrainingJob.objects.get(key="j1")) == ledger_before


def test_a_second_start_of_a_running_launch_is_a_409(ingest):
    ingest(launch())
    again = ev(50, "attempt_started", 40, world_size=2, nodes=["n9"])
    body = assert_conflict(ingest([ev(51, "step", 41, step=3), again]), "j1", 1)
    assert body["conflicts"][0]["index"] == 1
    attempt = Attempt.objects.get(job__key="j1", number=1)
    assert attempt.world_size == 8
    assert not Event.objects.filter(client_id__in=["e50", "e51"]).exists()


def test_two_starts_of_one_launch_in_one_batch_are_a_409(ingest):
    r = ingest(
        [ev(1, "attempt_started", 0, world_size=8), ev(2, "attempt_started", 5, world_size=4)]
    )
    assert_conflict(r, "j1", 1)
    assert stored_counts() == (0, 0, 0, 0, 0, 0)


def test_resending_a_finished_jobs_whole_history_is_fine(ingest):
    events = finished_job(ingest)
    r = ingest(list(reversed(events)))
    assert r.status_code == 202
    beats = sum(e["kind"] == "heartbeat" for e in events)  # never stored: accepted again
    assert r.json() == {"accepted": beats, "duplicates": len(events) - beats}


# --- a new launch of a finished job ------------------------------------------------


def test_a_new_launch_of_a_finished_job_is_a_409(ingest):
    finished_job(ingest)
    body = assert_conflict(
        ingest([ev(60, "attempt_started", 100, attempt=2, world_size=8)]), "j1", 2
    )
    assert "finished" in body["detail"]
    assert body["conflicts"][0]["stored"]["finished_at"].startswith("2026-09-21T")
    assert not Attempt.objects.filter(job__key="j1", number=2).exists()


def test_steps_of_a_new_launch_after_the_finish_are_a_409_even_before_its_start(ingest):
    finished_job(ingest)
    r = ingest([ev(70 + i, "step", 100 + i, attempt=2, step=i) for i in range(3)])
    assert_conflict(r, "j1", 2)


def test_a_job_finished_before_its_last_launch_started_arrives_fine(ingest):
    """The finish is delivered before the last launch's start (another sender, a
    spill file resent late): the launch started before the finish, so it is history."""
    ingest(launch())
    ingest([ev(20, "attempt_ended", 30, reason="failed"), ev(21, "job_finished", 100, attempt=2)])
    late = [
        ev(31, "step", 62, attempt=2, step=3),  # before its own start, too
        ev(30, "attempt_started", 60, attempt=2, world_size=8),
        ev(32, "attempt_ended", 99, attempt=2, reason="completed"),
    ]
    r = ingest(late)
    assert r.status_code == 202, r.content
    job = TrainingJob.objects.get(key="j1")
    assert job.status == TrainingJob.Status.COMPLETED
    assert job.attempts.get(number=2).started_at.timestamp() == pytest.approx(T0 + 60)


def test_a_launchs_events_before_its_start_then_its_start_are_fine_after_the_finish(ingest):
    ingest(launch())
    ingest([ev(21, "job_finished", 100, attempt=2)])
    assert ingest([ev(31, "step", 62, attempt=2, step=3)]).status_code == 202
    assert ingest([ev(30, "attempt_started", 60, attempt=2, world_size=8)]).status_code == 202


def reads(queries, table):
    return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and f'"{table}"' in q["sql"]]


def test_the_check_costs_no_query_per_event(ingest):
    """One read of the attempts per batch, which the projection makes anyway for a
    batch with lifecycle events; no stored start is read back unless refused."""
    finished_job(ingest)
    counts = []
    for n in (2, 40):  # a finished job's refused batch of steps
        with CaptureQueriesContext(connection) as q:
            r = ingest([ev(100 + i, "step", 200 + i, attempt=2, step=i) for i in range(n)])
        assert r.status_code == 409
        counts.append(len(q.captured_queries))
        assert len(reads(q.captured_queries, "jobs_attempt")) == 1
    assert counts[0] == counts[1]
    ingest(launch("j2"))
    counts = []
    for n in (2, 40):  # a running job's batch
        more = [ev(300 + 100 * n + i, "step", 20 + i, "j2", step=10 + i) for i in range(n)]
        more.append(ev(299 + n, "checkpoint_saved", 80 + n, "j2", step=10))
        with CaptureQueriesContext(connection) as q:
            assert ingest(more).status_code == 202
        counts.append(len(q.captured_queries))
        assert len(reads(q.captured_queries, "jobs_attempt")) == 1
        assert not [sql for sql in reads(q.captured_queries, "jobs_event") if "attempt" in sql]
    assert counts[0] == counts[1]


# --- reopening -----------------------------------------------------------------------


def reopen(personas, key="j1", persona="operator", **body):
    return personas[persona].client().post(f"/api/v1/jobs/{key}/reopen", data=body, format="json")


def test_an_operator_reopens_a_finished_job_and_it_takes_a_new_launch(
    ingest, personas, caplog, django_capture_on_commit_callbacks
):
    finished_job(ingest)
    caplog.set_level(logging.INFO, logger="rebound.audit")
    with django_capture_on_commit_callbacks(execute=True):
        r = reopen(personas, reason="one more epoch")
    assert r.status_code == 200, r.content
    assert r.json()["key"] == "j1" and r.json()["finished_at"] is None
    audit = [rec.getMessage() for rec in caplog.records if rec.name == "rebound.audit"]
    assert any(
        "j1" in m and "reopened" in m and "operator" in m and "one more epoch" in m for m in audit
    )

    second = [
        ev(40, "attempt_started", 100, attempt=2, world_size=8),
        ev(41, "ready", 110, attempt=2),
        ev(42, "step", 111, attempt=2, step=3),
        ev(43, "attempt_ended", 120, attempt=2, reason="completed"),
    ]
    assert ingest(second).status_code == 202
    job = TrainingJob.objects.get(key="j1")
    figures = job_goodput(job=job)
    assert figures["elapsed_s"] == pytest.approx(120)  # no longer stops at the old finish
    # From the first launch's end to the second's start: downtime.
    assert figures["categories"]["downtime"] == pytest.approx(70)
    assert sum(figures["categories"].values()) == pytest.approx(figures["elapsed_s"])
    # The stream keeps the finish it reopened, and says who reopened it.
    assert Event.objects.filter(job=job, kind="job_finished").count() == 1
    marker = Event.objects.get(job=job, kind="job_reopened")
    assert marker.data["by"] == "operator" and marker.data["reason"] == "one more epoch"

    # Finished again later: it ends there.
    assert ingest([ev(44, "job_finished", 125, attempt=2)]).status_code == 202
    job.refresh_from_db()
    assert job.finished_at.timestamp() == pytest.approx(T0 + 125)
    assert job_goodput(job=job)["elapsed_s"] == pytest.approx(125)


def test_a_late_copy_of_the_reopened_finish_does_not_finish_the_job_again(ingest, personas):
    finished_job(ingest)
    assert reopen(personas).status_code == 200
    assert ingest([ev(21, "job_finished", 31)]).status_code == 202  # the same id: a duplicate
    r = ingest([ev(22, "job_finished", 31)])  # another sender's copy of the same finish
    assert r.status_code == 202
    job = TrainingJob.objects.get(key="j1")
    assert job.finished_at is None
    assert ingest([ev(40, "attempt_started", 100, attempt=2, world_size=8)]).status_code == 202


def test_reopening_a_job_that_is_not_finished_is_a_409(ingest, personas):
    ingest(launch())
    r = reopen(personas)
    assert r.status_code == 409
    assert r.json()["error"] == "not_finished"


def test_reopening_an_unknown_job_is_a_404(personas):
    assert reopen(personas, key="nope").status_code == 404


@pytest.mark.parametrize("persona", ["viewer", "ingest", "outsider"])
def test_only_operators_reopen(ingest, personas, persona):
    finished_job(ingest)
    assert reopen(personas, persona=persona).status_code in (401, 403)
    assert TrainingJob.objects.get(key="j1").finished_at is not None


def test_reopen_is_in_the_openapi_schema(personas):
    schema = personas["viewer"].client().get("/api/v1/schema", HTTP_ACCEPT="application/json")
    text = schema.content.decode()
    assert "/api/v1/jobs/{key}/reopen" in text
