"""The reliability report: its figures are incidents.selectors.reliability's, its charts
draw them, and goodput by week adds up to the jobs' ledgers."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.pages.incidents import duration
from incidents import selectors, services
from incidents.models import Incident
from jobs.accounting import job_ledger
from jobs.models import Node, TrainingJob
from jobs.services import job_goodput
from tests.factories import (
    AttemptFactory,
    ClusterFactory,
    LedgerSnapshotFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

# The sample's faults fall on 2026-09-21 (a Monday), between 14:16 and 14:24 UTC.
SAMPLE_DAY = {"since": "2026-09-21", "until": "2026-09-21"}
DAY_START, DAY_END = datetime(2026, 9, 21, tzinfo=UTC), datetime(2026, 9, 22, tzinfo=UTC)


@pytest.fixture
def sample_job(ingest, sample):
    """The worked example ingested, its incidents detected and its ledger cached."""
    events, _ = sample
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="sample-small")
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
    job.refresh_from_db()
    job_goodput(job=job)
    return job


def chart(html: str, div_id: str) -> dict:
    m = re.search(
        rf'<script type="application/json" id="{div_id}-data" data-chart="{div_id}">(.*?)</script>',
        html,
        re.S,
    )
    assert m, f"no chart {div_id}"
    return json.loads(m.group(1))


def make_incident(job, *, fault_at, nodes=(), **fields):
    return incident_row(job, fault_at=fault_at, nodes=nodes, summary="crash", **fields)


# --- who may see it --------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_roles_see_the_report(client, personas, sample_job, persona):
    client.force_login(personas[persona].user)
    r = client.get("/reliability/", SAMPLE_DAY)
    assert r.status_code == 200
    html = r.content.decode()
    assert "Reliability report" in html and '<form method="post"' not in html.split("</header>")[1]
    for div in ("failures-chart", "lost-chart", "goodput-chart"):
        assert f'id="{div}"' in html and chart(html, div)["layout"]["title"]["text"]
    assert "vendor/plotly.min.js" in html
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html


def test_outsiders_and_strangers_see_nothing(client, personas):
    r = client.get("/reliability/")
    assert r.status_code == 302 and "/login/" in r["Location"]
    client.force_login(personas["outsider"].user)
    assert client.get("/reliability/").status_code == 403


# --- the figures ----------------------------------------------------------------------


def test_the_figures_are_the_selectors(client, personas, sample_job):
    client.force_login(personas["viewer"].user)
    r = client.get("/reliability/", {**SAMPLE_DAY, "cluster": "east"})
    expected = selectors.reliability(cluster="east", start=DAY_START, end=DAY_END)
    assert r.context["report"] == expected
    assert expected["failures"] == 3  # the sample's: the test means something
    html = r.content.decode()
    assert "<b>3</b>" in html and duration(expected["mtbf_s"]) in html
    for key in ("time_to_resume", "time_to_recover"):
        for stat in ("mean_s", "p50_s", "p90_s"):
            assert duration(expected[key][stat]) in html
    causes = list(expected["by_cause"])
    failures = chart(html, "failures-chart")["data"][0]
    assert failures["x"] == [c.replace("_", " ") for c in causes]
    assert failures["y"] == [expected["by_cause"][c]["count"] for c in causes] == [2, 1]
    lost = chart(html, "lost-chart")["data"][0]
    assert lost["y"] == pytest.approx([expected["by_cause"][c]["lost_gpu_hours"] for c in causes])
    fig = chart(html, "lost-chart")["layout"]
    assert fig["yaxis"]["title"]["text"] == "GPU-hours" and fig["showlegend"]
    # The shares in the table, as the selector has them.
    assert "67%" in html and "33%" in html
    # The same figures as the REST endpoint gives.
    api = (
        personas["viewer"]
        .client()
        .get(
            "/api/v1/reliability",
            {"cluster": "east", "start": "2026-09-21T00:00:00Z", "end": "2026-09-22T00:00:00Z"},
        )
    )
    assert api.json()["failures"] == 3
    assert api.json()["mtbf_s"] == pytest.approx(expected["mtbf_s"])


def test_the_cluster_narrows_the_report(client, personas, sample_job):
    west = ClusterFactory(name="west")
    vit = TrainingJobFactory(key="vit", cluster=west)
    make_incident(vit, fault_at=DAY_START + timedelta(hours=3), cause="memory")
    client.force_login(personas["viewer"].user)
    everywhere = client.get("/reliability/", SAMPLE_DAY).context["report"]
    east = client.get("/reliability/", {**SAMPLE_DAY, "cluster": "east"}).context["report"]
    west_ = client.get("/reliability/", {**SAMPLE_DAY, "cluster": "west"}).context["report"]
    assert (everywhere["failures"], east["failures"], west_["failures"]) == (4, 3, 1)
    assert set(west_["by_cause"]) == {"memory"} and "memory" not in east["by_cause"]
    assert everywhere == selectors.reliability(cluster=None, start=DAY_START, end=DAY_END)


def test_the_period_presets_and_dates(client, personas):
    client.force_login(personas["viewer"].user)
    for params, days in (({}, 30), ({"range": "7d"}, 7), ({"range": "90d"}, 90)):
        report = client.get("/reliability/", params).context["report"]
        assert report["end"] - report["start"] == timedelta(days=days)
        assert abs((report["end"] - timezone.now()).total_seconds()) < 60
    report = client.get("/reliability/", {"since": "2026-01-05", "until": "2026-01-11"}).context[
        "report"
    ]
    assert (report["start"], report["end"]) == (
        datetime(2026, 1, 5, tzinfo=UTC),
        datetime(2026, 1, 12, tzinfo=UTC),
    )
    r = client.get("/reliability/", {"since": "2026-02-01", "until": "2026-01-01"})
    assert "The end comes before the start." in r.content.decode()
    report = r.context["report"]  # the valid field still chooses
    assert report["start"] == datetime(2026, 2, 1, tzinfo=UTC)
    assert abs((report["end"] - timezone.now()).total_seconds()) < 60


def test_repeat_offenders_link_to_their_nodes(client, personas, sample_job):
    node = Node.objects.get(cluster__name="east", name="gpu-node-001")
    for incident in Incident.objects.filter(job=sample_job):
        incident.nodes.set([node])
    client.force_login(personas["viewer"].user)
    r = client.get("/reliability/", SAMPLE_DAY)
    assert r.context["report"]["repeat_offenders"] == [{"node": "gpu-node-001", "incidents": 3}]
    assert 'href="/nodes/east/gpu-node-001/"' in r.content.decode()


# --- goodput by week --------------------------------------------------------------------


def test_a_week_that_holds_the_whole_job_has_its_ledger_goodput(client, personas, sample_job):
    week = datetime(2026, 9, 21, tzinfo=UTC), datetime(2026, 9, 28, tzinfo=UTC)
    out = selectors.goodput_by_week(cluster="east", start=week[0], end=week[1])
    [row] = out["weeks"]
    exact = job_ledger(sample_job, start=week[0].timestamp(), end=week[1].timestamp())
    assert row["week"] == "2026-W39" and row["jobs"] == 1
    assert row["goodput"] == pytest.approx(exact.gpu_goodput, rel=1e-9)
    assert row["gpu_hours"] * 3600 == pytest.approx(sum(exact.gpu_seconds.values()), rel=1e-9)
    assert out["jobs_without_ledger"] == 0
    client.force_login(personas["viewer"].user)
    html = client.get("/reliability/", SAMPLE_DAY).content.decode()
    bars = chart(html, "goodput-chart")
    assert bars["data"][0]["x"] == ["2026-W39"]
    assert bars["data"][0]["y"] == [round(100 * exact.gpu_goodput, 2)]
    assert bars["layout"]["yaxis"]["title"]["text"] == "goodput (%)"


W1 = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday: ISO week 2026-W10
DAY = timedelta(days=1)
GPUS = 8


def two_week_job(cluster, key="llm", other_share=0.1, with_ledger=True):
    """Two weeks on 8 GPUs: launch 1 from W1 Monday, a crash on W2 Monday noon
    (12 h of wasted progress, 12 h down), launch 2 from W2 Tuesday to the end of W2."""
    job = TrainingJobFactory(
        key=key,
        cluster=cluster,
        first_event_ts=W1.timestamp(),
        last_event_ts=(W1 + 14 * DAY).timestamp(),
    )
    AttemptFactory(job=job, number=1, world_size=GPUS, started_at=W1)
    AttemptFactory(job=job, number=2, world_size=GPUS, started_at=W1 + 8 * DAY)
    lost = {
        "wasted_progress": 12 * 3600.0 * GPUS,
        "downtime": 12 * 3600.0 * GPUS,
        "slowdown": 999.0,  # not badput: left out
    }
    make_incident(
        job,
        fault_at=W1 + 7 * DAY + DAY / 2,
        resumed_at=W1 + 8 * DAY,
        lost_gpu_seconds=sum(lost.values()),
        lost_breakdown=lost,
    )
    total = 14 * 86400.0 * GPUS
    other = other_share * total
    productive = total - other - 24 * 3600.0 * GPUS
    if with_ledger:
        LedgerSnapshotFactory(
            job=job,
            revision=1,
            figures={
                "gpu_seconds": {
                    "productive": productive,
                    "checkpoint_save": other,
                    "wasted_progress": lost["wasted_progress"],
                    "downtime": lost["downtime"],
                },
            },
        )
    return job, productive


def test_goodput_by_week_places_incident_losses_in_their_week(db):
    east = ClusterFactory(name="east")
    _, productive = two_week_job(east)
    two_week_job(east, key="no-ledger-yet", with_ledger=False)
    out = selectors.goodput_by_week(cluster="east", start=W1, end=W1 + 14 * DAY)
    w1, w2 = out["weeks"]
    assert (w1["week"], w2["week"]) == ("2026-W10", "2026-W11")
    assert w1["gpu_hours"] == pytest.approx(7 * 24 * GPUS)
    assert w1["goodput"] == pytest.approx(0.9)  # only the other badput, at the job's rate
    assert w2["goodput"] == pytest.approx(0.9 - 1 / 7)  # and a day of 8 GPUs lost
    total = (w1["productive_gpu_hours"] + w2["productive_gpu_hours"]) * 3600
    assert total == pytest.approx(productive)  # the ledger's productive, split
    assert (out["jobs"], out["jobs_without_ledger"]) == (1, 1)


def test_goodput_by_week_clips_weeks_to_the_period(db):
    east = ClusterFactory(name="east")
    two_week_job(east)
    start, end = W1 + 3 * DAY, W1 + 7 * DAY + DAY / 2  # Thursday of W1 to W2 Monday noon
    out = selectors.goodput_by_week(cluster="east", start=start, end=end)
    w1, w2 = out["weeks"]
    assert (w1["start"], w1["end"]) == (start, W1 + 7 * DAY)
    assert (w2["start"], w2["end"]) == (W1 + 7 * DAY, end)
    assert w1["gpu_hours"] == pytest.approx(4 * 24 * GPUS)
    assert w2["gpu_hours"] == pytest.approx(12 * GPUS)
    assert w1["goodput"] == pytest.approx(0.9)
    # W2's half day is the wasted progress before the crash (the loss runs from Monday
    # 00:00 to the resume on Tuesday): nothing of it was kept.
    assert w2["goodput"] == 0.0
    assert selectors.goodput_by_week(cluster="west", start=start, end=end)["jobs"] == 0


# --- cost --------------------------------------------------------------------------------


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_report_queries_do_not_grow_with_incidents_or_jobs(
    client, personas, django_assert_max_num_queries
):
    east = ClusterFactory(name="east")
    node = NodeFactory(cluster=east, name="n01")
    url = "/reliability/?since=2026-03-02&until=2026-03-15"
    client.force_login(personas["viewer"].user)

    def grow(n):
        for k in range(n):
            job, _ = two_week_job(east, key=f"job-{Incident.objects.count()}-{k}")
            make_incident(job, fault_at=W1 + DAY, attempt=1, nodes=[node])

    grow(3)  # a repeat offender from the start: the node links' query runs in both
    few = count_queries(client, url)
    assert few <= 15  # 2 of them: where recovery time went (incidents, audit)
    grow(60)
    with django_assert_max_num_queries(few):
        r = client.get(url)
    report = r.context["report"]
    assert report["failures"] == 126 and report["repeat_offenders"][0]["incidents"] == 63
    assert r.context["goodput"]["jobs"] == 63


# --- what a failure is, on both pages ----------------------------------------------------


def test_a_straggler_is_a_slowdown_not_a_failure_on_both_pages(client, personas):
    from tests.console.test_job_page import T0, ingest_job

    job = ingest_job("slow-rank-job", launches=3, steps_per_launch=150)  # 2 Xid failures
    straggler = incident_row(
        job,
        fault_at=datetime.fromtimestamp(T0 + 100, tz=UTC),
        detector="straggler",
        attempt=None,
        cause="straggler",
        fault_type="straggler",
    )
    assert Incident.objects.filter(job=job).count() == 3
    day = datetime.fromtimestamp(T0, tz=UTC).date().isoformat()
    client.force_login(personas["viewer"].user)

    def both() -> tuple[int, int, str, str]:
        r = client.get("/reliability/", {"since": day, "until": day})
        j = client.get("/jobs/slow-rank-job/")
        return (
            r.context["report"]["failures"],
            j.context["whatif"]["failures"],
            r.content.decode(),
            j.content.decode(),
        )

    reliability, what_if, page, job_page = both()
    assert reliability == what_if == 2
    for html in (page, job_page):
        assert selectors.FAILURE_DEFINITION in html
    by_cause = client.get("/reliability/", {"since": day, "until": day}).context["report"][
        "by_cause"
    ]
    assert by_cause["straggler"]["count"] == 1 and by_cause["straggler"]["failures"] == 0
    assert by_cause["gpu"]["failures"] == 2

    # An action that restarted the job for the straggler makes it an interruption.
    straggler.timeline.create(
        kind="action",
        at=straggler.detected_at,
        actor="policy:straggler",
        source="recovery",
        message="action #1 replace_at_next_checkpoint: running → succeeded",
        data={
            "action": 1,
            "kind": "replace_at_next_checkpoint",
            "from": "running",
            "to": "succeeded",
        },
    )
    reliability, what_if, _, _ = both()
    assert reliability == what_if == 3


def test_the_period_menu_names_the_period_shown(client, personas):
    client.force_login(personas["viewer"].user)

    def menu(params) -> tuple[str, str]:
        r = client.get("/reliability/", params)
        html = r.content.decode()
        selected = re.search(
            r'<option value="([^"]*)" selected>([^<]*)</option>', html.split('name="range"')[1]
        )
        return selected.group(2), r.context["period"]

    assert menu({}) == ("last 30 days", "last 30 days")
    assert menu({"cluster": ""}) == ("last 30 days", "last 30 days")
    assert menu({"range": "7d"}) == ("last 7 days", "last 7 days")
    label, period = menu({"since": "2026-01-05", "until": "2026-01-11"})
    assert label == "the dates below" and period == "2026-01-05 to 2026-01-11"
    # A preset wins over dates; the dates it overrode are not left in the form.
    r = client.get("/reliability/", {"range": "7d", "since": "2026-01-05"})
    assert r.context["period"] == "last 7 days"
    assert 'value="2026-01-05"' not in r.content.decode()


def test_where_recovery_time_went(client, personas, sample_job):
    """The phases' means over the period, as recovery.selectors.phases_summary gives
    them and the API answers them."""
    client.force_login(personas["viewer"].user)
    html = client.get("/reliability/", {**SAMPLE_DAY, "cluster": "east"}).content.decode()
    api = (
        personas["viewer"]
        .client()
        .get(
            "/api/v1/reliability/phases",
            {"cluster": "east", "start": "2026-09-21T00:00:00Z", "end": "2026-09-22T00:00:00Z"},
        )
        .json()
    )
    assert api["incidents"] == 3
    restarting = {p["phase"]: p for p in api["phases"]}["restarting"]
    # The sample's three relaunches took 40 s, 40 s and 40 s to start and restore.
    assert restarting["mean_s"] == pytest.approx(40.0)
    row = re.search(r'<tr data-phase="restarting">(.*?)</tr>', html, re.S).group(1)
    assert ">3<" in row and duration(40.0) in row
    assert "People (waiting for approval) held up 0%" in html
