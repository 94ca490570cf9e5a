"""The pages show when a job was last heard from, and a running job silent past
REBOUND_JOB_SILENT_S with a "silent" badge and that age (jobs.selectors.job_activity),
at no extra query."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import TrainingJob
from tests.factories import TrainingJobFactory
from tests.jobs.test_activity import quiet
from tests.jobs.test_read_api import ev, two_launches

pytestmark = pytest.mark.django_db

S = TrainingJob.Status


@pytest.fixture
def threshold(settings):
    settings.REBOUND_JOB_SILENT_S = 60.0
    return 60.0


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"].user)
    return client


def test_the_pages_show_the_age_of_the_last_event_and_a_silent_badge(viewer, ingest, threshold):
    for key in ("loud", "hushed", "done"):
        assert ingest(two_launches(key)).status_code == 202
    assert ingest([ev(99, "job_finished", 50, "done", attempt=2)]).status_code == 202
    quiet("hushed", 7 * 60 + 5)
    quiet("done", 3 * 3600)

    def row(html, key):
        m = re.search(rf'<tr>\s*<td><a href="/jobs/{key}/">.*?</tr>', html, re.S)
        assert m, key
        return m.group(0)

    badge = '<span class="status status-silent"'
    listing = viewer.get("/jobs/").content.decode()
    assert badge in row(listing, "hushed") and ">silent 7 min</span>" in row(listing, "hushed")
    assert "7 min ago" in row(listing, "hushed")
    assert badge not in row(listing, "loud") and "s ago</span>" in row(listing, "loud")
    assert re.search(
        r'<span class="status status-running"[^>]*>running</span>', row(listing, "loud")
    )
    done = row(listing, "done")
    assert re.search(r'<span class="status status-completed"[^>]*>completed</span>', done)
    assert "3 h ago" in done and badge not in done

    overview = viewer.get("/").content.decode()
    assert ">silent 7 min</span>" in row(overview, "hushed")
    assert badge not in row(overview, "loud") and "s ago</span>" in row(overview, "loud")
    assert "/jobs/done/" not in overview  # not running: not listed

    page = viewer.get("/jobs/hushed/").content.decode()
    h1 = re.search(r"<h1>.*?</h1>", page, re.S).group(0)
    assert badge in h1 and "silent 7 min" in h1
    assert "last heard <b><span" in page and "7 min ago" in page
    page = viewer.get("/jobs/loud/").content.decode()
    h1 = re.search(r"<h1>.*?</h1>", page, re.S).group(0)
    assert re.search(r'<span class="status status-running"[^>]*>running</span>', h1)


def test_status_json_tells_the_pages_which_jobs_went_silent(viewer, ingest, threshold):
    """The pages poll /status.json with the ids of the jobs they show (data-live-job)."""
    for key in ("loud", "hushed", "done"):
        assert ingest(two_launches(key)).status_code == 202
    assert ingest([ev(99, "job_finished", 50, "done", attempt=2)]).status_code == 202
    quiet("hushed", 7 * 60 + 5)
    ids = dict(TrainingJob.objects.values_list("key", "pk"))
    page = viewer.get("/jobs/").content.decode()
    assert f'data-live-job="{ids["hushed"]}"' in page
    assert f'data-live-job-heard="{ids["loud"]}"' in page
    asked = ",".join(str(ids[k]) for k in ("loud", "hushed", "done"))
    jobs = viewer.get("/status.json", {"jobs": asked + ",999999"}).json()["jobs"]
    assert jobs[str(ids["hushed"])] == {
        "activity": "silent",
        "label": "silent 7 min",
        "ago": "7 min ago",
        "silent": True,
    }
    loud = jobs[str(ids["loud"])]
    assert (loud["activity"], loud["label"], loud["silent"]) == ("running", "running", False)
    assert loud["ago"].endswith(" s ago")
    assert jobs[str(ids["done"])]["label"] == "completed"
    assert "999999" not in jobs
    r = viewer.get("/status.json", {"jobs": "1,x"})
    assert r.status_code == 400 and r.json()["field"] == "jobs"


def test_a_job_never_heard_shows_never(viewer, threshold):
    TrainingJobFactory(key="old", status=S.RUNNING, last_received_at=None)
    listing = viewer.get("/jobs/").content.decode()
    assert '<span class="muted">never</span>' in listing
    assert "status-silent" not in listing


def _queries(client, path) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("path", ["/", "/jobs/"])
def test_silent_jobs_cost_the_list_pages_no_query(viewer, ingest, threshold, path):
    for i in range(4):
        assert ingest(two_launches(f"job{i}")).status_code == 202
    viewer.get(path)  # the ledgers computed once
    loud = _queries(viewer, path)
    for i in range(4):
        quiet(f"job{i}", 600)
    html = viewer.get(path).content.decode()
    assert html.count('class="status status-silent"') == 4
    assert _queries(viewer, path) == loud
