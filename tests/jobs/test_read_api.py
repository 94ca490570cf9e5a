"""The read API: jobs, goodput (cumulative and windowed), attempts, checkpoints, schema."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from jobs.models import LedgerSnapshot, TrainingJob

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
CATEGORIES = {
    "productive",
    "startup",
    "checkpoint_restore",
    "checkpoint_save",
    "wasted_progress",
    "stalled",
    "downtime",
    "other",
}


def ev(i, kind, ts, job="j1", attempt=1, **data):
    return {
        "id": f"{job}-{i}",
        "job": job,
        "kind": kind,
        "ts": T0 + ts,
        "attempt": attempt,
        "data": data,
    }


def two_launches(job="j1"):
    """Launch 1 crashes after step 3 (checkpoint at 2); launch 2 resumes from 2 on 4 GPUs."""
    return [
        ev(1, "attempt_started", 0, job, world_size=8, nodes=["a", "b"]),
        ev(2, "ready", 10, job),
        ev(3, "step", 11, job, step=1),
        ev(4, "step", 12, job, step=2),
        ev(5, "checkpoint_saved", 14, job, step=2, blocking_s=2.0, uri="s3://ck/2"),
        ev(6, "step", 15, job, step=3),
        ev(7, "attempt_ended", 20, job, reason="failed"),
        ev(8, "attempt_started", 30, job, attempt=2, world_size=4, nodes=["a"]),
        ev(9, "ready", 35, job, attempt=2),
        ev(10, "checkpoint_load_started", 35, job, attempt=2, step=2),
        ev(11, "checkpoint_loaded", 37, job, attempt=2, step=2),
        ev(12, "step", 38, job, attempt=2, step=3),
        ev(13, "step", 39, job, attempt=2, step=4),
    ]


@pytest.fixture
def job(ingest):
    assert ingest(two_launches()).status_code == 202
    return TrainingJob.objects.get(key="j1")


def test_job_detail(personas, job):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/")
    assert r.status_code == 200
    body = r.json()
    assert body["key"] == "j1"
    assert body["cluster"] == "east"
    assert body["status"] == "running"
    assert body["current_attempt"]["number"] == 2
    assert body["world_size"] == 4
    assert body["last_step"] == 4
    assert body["last_durable_checkpoint"]["step"] == 2
    assert body["last_durable_checkpoint"]["uri"] == "s3://ck/2"
    assert body["goodput"]["elapsed_s"] == pytest.approx(39.0)
    assert body["goodput"]["goodput"] == pytest.approx(4.0 / 39.0)
    assert body["last_event_at"] == "2026-09-21T14:13:59Z"


def test_job_goodput(personas, job):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/goodput")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {
        "job",
        "elapsed_s",
        "categories",
        "gpu_seconds",
        "goodput",
        "gpu_goodput",
        "slowdown_s",
        "as_of",
        "badput_cost",  # money: null, the cluster has no price (tests/jobs/test_prices.py)
        "currency",
    }
    assert body["badput_cost"] is None and body["currency"] is None
    assert set(body["categories"]) == CATEGORIES == set(body["gpu_seconds"])
    c = body["categories"]
    assert c["startup"] == pytest.approx(15.0)  # 10 + 5
    assert c["checkpoint_restore"] == pytest.approx(2.0)
    assert c["checkpoint_save"] == pytest.approx(2.0)
    # step 3 of launch 1 (1 s after its save) is re-run by launch 2: waste.
    assert c["wasted_progress"] == pytest.approx(1.0)
    assert c["productive"] == pytest.approx(4.0)  # steps 1, 2 (launch 1) and 3, 4 (launch 2)
    assert c["stalled"] == pytest.approx(5.0)
    assert c["downtime"] == pytest.approx(10.0)
    assert sum(c.values()) == pytest.approx(body["elapsed_s"])
    assert body["gpu_seconds"]["downtime"] == pytest.approx(80.0)  # weighted by launch 1's 8 GPUs
    assert body["as_of"] == "2026-09-21T14:13:59Z"


def test_goodput_window(personas, job):
    c = personas["viewer"].client()
    r = c.get("/api/v1/jobs/j1/goodput", {"start": T0 + 20, "end": "2026-09-21T14:13:55Z"})
    assert r.status_code == 200
    body = r.json()
    assert body["elapsed_s"] == pytest.approx(15.0)
    assert body["categories"]["downtime"] == pytest.approx(10.0)
    assert body["categories"]["startup"] == pytest.approx(5.0)
    assert body["goodput"] == 0


@pytest.mark.parametrize(
    "params",
    [{"start": "tuesday"}, {"end": "2026-09-21T14:13:55"}, {"start": T0 + 20, "end": T0 + 10}],
)
def test_goodput_window_bad_parameters_are_400(personas, job, params):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/goodput", params)
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_parameter"


def test_goodput_is_cached_per_revision(personas, job, ingest):
    c = personas["viewer"].client()
    first = c.get("/api/v1/jobs/j1/goodput").json()
    snap = LedgerSnapshot.objects.get(job=job)
    assert snap.revision == TrainingJob.objects.get(pk=job.pk).revision
    with CaptureQueriesContext(connection) as q:
        assert c.get("/api/v1/jobs/j1/goodput").json() == first
    assert not any("jobs_steprecord" in x["sql"] for x in q.captured_queries)
    ingest([ev(14, "step", 40, attempt=2, step=5)])
    assert c.get("/api/v1/jobs/j1/goodput").json()["elapsed_s"] == pytest.approx(40.0)


def test_unknown_job_is_404(personas):
    for path in ("/api/v1/jobs/nope/", "/api/v1/jobs/nope/goodput", "/api/v1/jobs/nope/attempts"):
        r = personas["viewer"].client().get(path)
        assert r.status_code == 404
        assert r.json()["error"] == "not_found"


def test_attempts(personas, job):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/attempts")
    assert r.status_code == 200
    results = r.json()["results"]
    assert [a["number"] for a in results] == [1, 2]
    assert results[0]["nodes"] == ["a", "b"]
    assert results[0]["end_reason"] == "failed"
    assert results[0]["duration_s"] == pytest.approx(20.0)
    assert results[0]["end_inferred"] is False
    assert results[1]["ended_at"] is None and results[1]["end_inferred"] is False


def test_a_launch_that_died_without_a_word_ends_at_the_next_start(personas, ingest, client):
    """No `attempt_ended` from launch 1 (a rank killed, no wrapper): the API and the
    job page show it ended when launch 2 started, as the accounting counts it; the
    stored row stays as received, so a late `attempt_ended` still gives the real end."""
    events = [e for e in two_launches("quiet") if e["kind"] != "attempt_ended"]
    assert ingest(events).status_code == 202
    c = personas["viewer"].client()
    first, second = c.get("/api/v1/jobs/quiet/attempts").json()["results"]
    assert first["ended_at"] == second["started_at"]
    assert (first["end_inferred"], first["end_reason"]) == (True, "")
    assert first["duration_s"] == pytest.approx(30.0)
    assert second["ended_at"] is None and second["end_inferred"] is False
    client.force_login(personas["viewer"].user)
    page = client.get("/jobs/quiet/").content.decode()
    table = page[page.index("<h2>Launches</h2>") :]
    assert table.count("<td>running</td>") == 1 and ">no report</span>" in table

    late = ev(7, "attempt_ended", 20, "quiet", reason="killed")
    assert ingest([late]).status_code == 202
    first = c.get("/api/v1/jobs/quiet/attempts").json()["results"][0]
    assert (first["end_inferred"], first["end_reason"], first["duration_s"]) == (
        False,
        "killed",
        pytest.approx(20.0),
    )


def test_checkpoints(personas, job):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/checkpoints")
    results = r.json()["results"]
    assert len(results) == 1
    assert results[0]["step"] == 2 and results[0]["durable"] is True
    assert results[0]["blocking_s"] == 2.0


def test_job_list_filters_and_query_count(personas, ingest):
    for i in range(6):
        ingest(two_launches(f"job{i}"))
    ingest(two_launches("westjob"), persona="ingest_west")
    c = personas["viewer"].client()
    c.get("/api/v1/jobs/")  # fills the ledger cache
    with CaptureQueriesContext(connection) as q:
        r = c.get("/api/v1/jobs/")
    assert r.json()["count"] == 7
    # token, count, page, attempts, checkpoints: independent of the number of jobs
    assert len(q.captured_queries) <= 6, [x["sql"] for x in q.captured_queries]
    r = c.get("/api/v1/jobs/", {"cluster": "west"})
    assert [j["key"] for j in r.json()["results"]] == ["westjob"]
    r = c.get("/api/v1/jobs/", {"status": "running"})
    assert r.json()["count"] == 7
    assert c.get("/api/v1/jobs/", {"status": "sleeping"}).status_code == 400


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/",
        "/api/v1/jobs/j1/",
        "/api/v1/jobs/j1/goodput",
        "/api/v1/jobs/j1/attempts",
        "/api/v1/jobs/j1/checkpoints",
    ],
)
def test_roles_may_read(personas, job, persona, path):
    assert personas[persona].client().get(path).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/",
        "/api/v1/jobs/j1/",
        "/api/v1/jobs/j1/goodput",
        "/api/v1/jobs/j1/attempts",
        "/api/v1/jobs/j1/checkpoints",
    ],
)
def test_ingest_tokens_outsiders_and_strangers_may_not_read(personas, job, path):
    assert personas["ingest"].client().get(path).status_code == 403
    assert personas["outsider"].client().get(path).status_code == 403
    assert APIClient().get(path).status_code == 401


def test_reads_are_read_only(personas, job):
    c = personas["admin"].client()
    assert c.post("/api/v1/jobs/j1/goodput", {}).status_code == 405
    assert c.delete("/api/v1/jobs/j1/").status_code == 405


def test_openapi_schema_and_docs(client):
    r = client.get("/api/v1/schema")
    assert r.status_code == 200
    text = r.content.decode()
    for path in ("/api/v1/ingest", "/api/v1/jobs/{key}/goodput", "/api/v1/jobs/{key}/attempts"):
        assert path in text
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()


def test_job_list_shows_the_last_snapshot_while_the_detail_is_exact(personas, job, ingest):
    c = personas["viewer"].client()
    c.get("/api/v1/jobs/")  # a snapshot at this revision
    ingest([ev(14, "step", 40, attempt=2, step=5)])
    listed = c.get("/api/v1/jobs/").json()["results"][0]["goodput"]
    assert listed["elapsed_s"] == pytest.approx(39.0)  # stale until the refresh task runs
    detail = c.get("/api/v1/jobs/j1/").json()["goodput"]
    assert detail["elapsed_s"] == pytest.approx(40.0)
