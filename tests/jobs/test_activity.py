"""Jobs that went quiet: a running job the console has received nothing from for longer
than REBOUND_JOB_SILENT_S shows as `silent` with that age, in the API and the pages,
while its stored status stays `running` (jobs.selectors.job_activity, the one rule)."""

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import selectors
from jobs.models import TrainingJob
from tests.factories import TrainingJobFactory
from tests.jobs.test_read_api import ev, two_launches

pytestmark = pytest.mark.django_db

S = TrainingJob.Status
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def threshold(settings):
    settings.REBOUND_JOB_SILENT_S = 60.0
    return 60.0


def quiet(key: str, seconds: float) -> None:
    """As if the job's latest events had arrived `seconds` ago."""
    TrainingJob.objects.filter(key=key).update(
        last_received_at=timezone.now() - timedelta(seconds=seconds)
    )


# --- the rule ----------------------------------------------------------------------


def test_the_default_threshold_is_two_minutes():
    assert django_settings.REBOUND_JOB_SILENT_S == 120.0


def test_a_running_job_is_silent_only_past_the_threshold(threshold):
    now = timezone.now()
    at = TrainingJobFactory(status=S.RUNNING, last_received_at=now - timedelta(seconds=60))
    past = TrainingJobFactory(
        status=S.RUNNING, last_received_at=now - timedelta(seconds=60, microseconds=1)
    )
    fresh = TrainingJobFactory(status=S.RUNNING, last_received_at=now - timedelta(seconds=5))

    a = selectors.job_activity(at, now=now)
    assert (a.activity, a.silent, a.silent_for_s) == (S.RUNNING, False, None)
    assert a.heard_ago_s == 60.0 and a.last_heard_at == at.last_received_at
    b = selectors.job_activity(past, now=now)
    assert (b.activity, b.silent) == ("silent", True)
    assert b.silent_for_s == pytest.approx(60.000001)
    c = selectors.job_activity(fresh, now=now)
    assert (c.activity, c.heard_ago_s, c.silent_for_s) == (S.RUNNING, 5.0, None)
    # The filter says the same at the same instant.
    silent = TrainingJob.objects.filter(selectors.jobs_silent_q(now=now))
    assert set(silent) == {past}
    # The stored status is not touched.
    assert TrainingJob.objects.get(pk=past.pk).status == S.RUNNING


@pytest.mark.parametrize("status", [S.PENDING, S.INTERRUPTED, S.COMPLETED, S.FAILED])
def test_a_job_that_is_not_running_is_never_silent(threshold, status):
    now = timezone.now()
    job = TrainingJobFactory(status=status, last_received_at=now - timedelta(days=30))
    a = selectors.job_activity(job, now=now)
    assert (a.activity, a.silent, a.silent_for_s) == (status, False, None)
    assert a.heard_ago_s == 30 * 86400.0
    assert not TrainingJob.objects.filter(selectors.jobs_silent_q(now=now)).exists()


def test_a_job_never_heard_on_the_consoles_clock_is_not_judged(threshold):
    job = TrainingJobFactory(status=S.RUNNING, last_received_at=None)
    a = selectors.job_activity(job)
    assert (a.activity, a.last_heard_at, a.heard_ago_s) == (S.RUNNING, None, None)
    assert set(selectors.job_list(silent=False)) == {job}
    assert not selectors.job_list(silent=True).exists()


def test_the_threshold_is_read_at_each_call(settings):
    job = TrainingJobFactory(
        status=S.RUNNING, last_received_at=timezone.now() - timedelta(seconds=90)
    )
    settings.REBOUND_JOB_SILENT_S = 120.0
    assert not selectors.job_activity(job).silent
    settings.REBOUND_JOB_SILENT_S = 30.0
    assert selectors.job_activity(job).silent


def test_ingest_stamps_the_consoles_clock_and_the_next_event_wakes_the_job(
    personas, ingest, threshold
):
    before = timezone.now()
    assert ingest(two_launches()).status_code == 202
    job = TrainingJob.objects.get(key="j1")
    assert before <= job.last_received_at <= timezone.now()
    quiet("j1", 61)
    c = personas["viewer"].client()
    assert c.get("/api/v1/jobs/j1/").json()["activity"] == "silent"
    heartbeat = {"id": "hb-1", "job": "j1", "kind": "heartbeat", "ts": 1_790_000_050.0}
    assert ingest([{**heartbeat, "node": "a"}]).status_code == 202
    body = c.get("/api/v1/jobs/j1/").json()
    assert (body["status"], body["activity"], body["silent_for_s"]) == ("running", "running", None)


# --- the API -----------------------------------------------------------------------


def test_the_job_detail_says_when_it_was_last_heard_and_that_it_went_silent(
    personas, ingest, threshold
):
    assert ingest(two_launches()).status_code == 202
    c = personas["viewer"].client()
    body = c.get("/api/v1/jobs/j1/").json()
    heard = TrainingJob.objects.get(key="j1").last_received_at
    assert body["last_heard_at"] == heard.isoformat().replace("+00:00", "Z")
    assert (body["status"], body["activity"], body["silent_for_s"]) == ("running", "running", None)

    quiet("j1", 300)
    body = c.get("/api/v1/jobs/j1/").json()
    assert body["status"] == "running"  # the stored status keeps its meaning
    assert body["activity"] == "silent"
    assert 300 <= body["silent_for_s"] < 330
    assert body["last_event_at"] == "2026-09-21T14:13:59Z"  # the job's clock, unchanged


def test_the_job_list_marks_the_silent_ones_and_filters_them(personas, ingest, threshold):
    for key in ("loud", "hushed", "done"):
        assert ingest(two_launches(key)).status_code == 202
    assert ingest([ev(99, "job_finished", 50, "done", attempt=2)]).status_code == 202
    quiet("hushed", 120)
    quiet("done", 3600)
    c = personas["viewer"].client()

    rows = {j["key"]: j for j in c.get("/api/v1/jobs/").json()["results"]}
    assert {k: (j["status"], j["activity"]) for k, j in rows.items()} == {
        "loud": ("running", "running"),
        "hushed": ("running", "silent"),
        "done": ("completed", "completed"),
    }
    assert rows["hushed"]["silent_for_s"] == pytest.approx(120, abs=30)
    assert rows["done"]["silent_for_s"] is None and rows["done"]["last_heard_at"]

    def keys(**params):
        r = c.get("/api/v1/jobs/", params)
        assert r.status_code == 200, r.json()
        return sorted(j["key"] for j in r.json()["results"])

    assert keys(status="running") == ["hushed", "loud"]  # as before: the stored status
    assert keys(silent="true") == ["hushed"]
    assert keys(silent="false") == ["done", "loud"]
    assert keys(status="running", silent="false") == ["loud"]
    r = c.get("/api/v1/jobs/", {"silent": "yes"})
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_parameter" and r.json()["field"] == "silent"


def test_the_job_lists_queries_do_not_grow_with_silent_jobs(personas, ingest, threshold):
    for i in range(6):
        assert ingest(two_launches(f"job{i}")).status_code == 202
    for i in range(0, 6, 2):
        quiet(f"job{i}", 600)
    c = personas["viewer"].client()
    c.get("/api/v1/jobs/")  # fills the ledger cache
    for params in ({}, {"silent": "true"}):
        with CaptureQueriesContext(connection) as q:
            r = c.get("/api/v1/jobs/", params)
        assert r.status_code == 200
        # token, count, page, attempts, checkpoints: as test_read_api's
        assert len(q.captured_queries) <= 6, [x["sql"] for x in q.captured_queries]
    assert r.json()["count"] == 3


def test_the_schema_documents_the_fields_and_the_filter(client):
    schema = json.loads(client.get("/api/v1/schema", {"format": "json"}).content)
    job = schema["components"]["schemas"]["Job"]
    props = job["properties"]
    activity = props["activity"]
    if "$ref" in activity or "allOf" in activity:
        ref = (activity.get("allOf") or [activity])[0]["$ref"].rsplit("/", 1)[1]
        activity = schema["components"]["schemas"][ref]
    assert set(activity["enum"]) == {*S.values, "silent"}
    assert props["last_heard_at"]["format"] == "date-time" and props["last_heard_at"]["nullable"]
    assert props["silent_for_s"]["nullable"]
    assert {"activity", "last_heard_at", "silent_for_s"} <= set(job["required"])
    params = {p["name"]: p for p in schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert set(params["silent"]["schema"]["enum"]) == {"true", "false"}


def test_the_readmes_curl_job_goes_silent_instead_of_running_forever(personas, ingest, threshold):
    """The README's "Sending events" example, as posted there: three events, then nothing."""
    text = README.read_text()
    section = text[text.index("## Sending events") :]
    body = re.search(r"-d '(\{.*?\})'\n", section, re.S).group(1)
    events = json.loads(body)["events"]
    assert {e["job"] for e in events} == {"llm-7b"}
    assert ingest(events).status_code == 202
    c = personas["viewer"].client()
    assert c.get("/api/v1/jobs/llm-7b/").json()["activity"] == "running"
    quiet("llm-7b", django_settings.REBOUND_JOB_SILENT_S + 1)
    body = c.get("/api/v1/jobs/llm-7b/").json()
    assert (body["status"], body["activity"]) == ("running", "silent")
    assert "silent" in section[: section.index("## Instrumenting")]
