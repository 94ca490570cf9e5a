"""Maintenance windows in the jobs app: declaring and cancelling them (service and
API, allowed and forbidden), which windows cover a node or a cluster, and the
ledger's planned figures (goodput with and without planned interruptions)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.errors import Conflict, Invalid
from jobs import selectors, services
from jobs.accounting import CATEGORIES, compute_ledger, job_ledger
from jobs.models import Cluster, LedgerSnapshot, MaintenanceWindow, Node, TrainingJob
from jobs.selectors import Span
from tests.jobs.test_accounting import CRASH_AND_RESTART, T0, crash_and_restart, to_wire
from tests.jobs.traces import build

pytestmark = pytest.mark.django_db


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@pytest.fixture
def east(db):
    cluster, _ = Cluster.objects.get_or_create(name="east")  # personas' ingest token made it
    for name in ("n1", "n2", "n3"):
        Node.objects.create(cluster=cluster, name=name)
    return cluster


def declare(cluster, a, b, nodes=(), **kw):
    return services.maintenance_window_create(
        cluster=cluster, starts_at=dt(T0 + a), ends_at=dt(T0 + b), nodes=list(nodes), **kw
    )


# --- the service and the selectors -------------------------------------------------------


def test_a_window_covers_its_nodes_or_its_whole_cluster(east):
    declare(east, 100, 200, ["n1"], reason="firmware")
    declare(east, 500, 600)
    spans = selectors.maintenance_spans(cluster_id=east.pk)
    assert [(s.nodes, s.whole_cluster) for s in spans] == [
        (frozenset({"n1"}), False),
        (frozenset(), True),
    ]
    assert selectors.span_covering(spans, T0 + 150, ["n1"]).reason == "firmware"
    assert selectors.span_covering(spans, T0 + 150, ["n2"]) is None
    assert selectors.span_covering(spans, T0 + 200, ["n1"]) is None  # the end is not in it
    assert selectors.span_covering(spans, T0 + 550, ["n2"]).whole_cluster
    assert selectors.span_covering(spans, T0 + 550, []).whole_cluster
    n1 = Node.objects.get(name="n1")
    assert selectors.maintenance_active(cluster_id=east.pk, node_ids=[n1.pk], at=dt(T0 + 150))
    assert not selectors.maintenance_active(cluster_id=east.pk, node_ids=[n1.pk], at=dt(T0 + 250))
    assert selectors.maintenance_nodes_under(cluster_id=east.pk, at=dt(T0 + 150)) == (
        False,
        {n1.pk},
    )
    assert selectors.maintenance_nodes_under(cluster_id=east.pk, at=dt(T0 + 550))[0] is True


def test_the_cover_query_is_one_query(east):
    for k in range(5):
        declare(east, 1000 * k, 1000 * k + 100, ["n1", "n2"])
    with CaptureQueriesContext(connection) as q:
        spans = selectors.maintenance_spans(cluster_id=east.pk, start=T0, end=T0 + 10_000)
    assert len(spans) == 5 and len(q.captured_queries) == 1


def test_a_cancelled_window_covers_nothing(east):
    window = declare(east, 100, 200)
    services.maintenance_window_cancel(window=window, actor="alice")
    assert selectors.maintenance_spans(cluster_id=east.pk) == []
    with pytest.raises(Conflict):  # twice: said, not done again
        services.maintenance_window_cancel(window=window, actor="alice")


@pytest.mark.parametrize(
    ("a", "b", "nodes", "field"),
    [
        (200, 100, [], "ends_at"),
        (100, 100, [], "ends_at"),
        (0, 40 * 86400, [], "ends_at"),  # absurdly long
        (100, 200, ["n9"], "nodes"),  # not a node of the cluster
    ],
)
def test_what_a_window_may_not_be(east, a, b, nodes, field):
    with pytest.raises(Invalid) as err:
        declare(east, a, b, nodes)
    assert err.value.extra["field"] == field
    assert not MaintenanceWindow.objects.exists()


def test_nodes_of_another_cluster_are_refused(east):
    west, _ = Cluster.objects.get_or_create(name="west")
    Node.objects.create(cluster=west, name="w1")
    with pytest.raises(Invalid, match="w1"):
        declare(east, 0, 100, ["w1"])


# --- the ledger's planned figures --------------------------------------------------------


def ledger_of(spans):
    lifecycle, steps, last = build(crash_and_restart())
    return compute_ledger("j", lifecycle, steps, last_event_ts=last, spans=spans)


def span(a, b, nodes=()):
    return Span(1, T0 + a, T0 + b, "", frozenset(nodes), frozenset())


def test_without_windows_the_figures_are_the_worked_ones():
    for spans in (None, [], [span(1000, 2000)]):  # none, or none over the job
        led = ledger_of(spans)
        for name in CATEGORIES:
            assert led.categories[name] == pytest.approx(CRASH_AND_RESTART.get(name, 0))
        d = led.as_dict()
        assert d["planned_s"] == 0 and d["planned_gpu_seconds"] == 0
        assert d["goodput_excluding_planned"] == d["goodput"]
        assert d["gpu_goodput_excluding_planned"] == d["gpu_goodput"]


def test_a_launch_interrupted_inside_a_window_is_planned_badput():
    led = ledger_of([span(30, 40)])  # launch 1 failed at 35, inside it
    # wasted 6 + stalled 6 + downtime 15 (35 -> 50) + next startup 5 + restore 4
    assert led.planned_launches == [1]
    assert led.planned_s == pytest.approx(36)
    assert led.planned_gpu_seconds == pytest.approx(36 * 8)
    d = led.as_dict()
    assert d["goodput"] == pytest.approx(20 / 73)  # unchanged
    assert d["goodput_excluding_planned"] == pytest.approx(20 / (73 - 36))
    assert d["gpu_goodput_excluding_planned"] == pytest.approx(160 / (73 * 8 - 36 * 8))
    # a view over the categories: they still partition the elapsed time
    assert sum(led.categories.values()) == pytest.approx(led.elapsed_s)


def test_a_window_of_other_nodes_or_a_completed_launch_plans_nothing():
    events = crash_and_restart()
    events[0]["data"]["nodes"] = ["n1", "n2"]
    lifecycle, steps, last = build(events)
    other = compute_ledger("j", lifecycle, steps, last_event_ts=last, spans=[span(30, 40, ["n3"])])
    assert other.planned_s == 0
    mine = compute_ledger("j", lifecycle, steps, last_event_ts=last, spans=[span(30, 40, ["n2"])])
    assert mine.planned_s == pytest.approx(36)
    # launch 2 completed at 72: a window over its end interrupts nothing
    assert ledger_of([span(70, 80)]).planned_s == 0


def test_the_goodput_api_shows_goodput_with_and_without_planned(ingest, personas):
    key = "acct-planned"
    assert ingest(to_wire(crash_and_restart(), key)).status_code == 202
    viewer = personas["viewer"].client()
    before = viewer.get(f"/api/v1/jobs/{key}/goodput").json()
    assert before["planned_gpu_seconds"] == 0
    assert before["gpu_goodput_excluding_planned"] == before["gpu_goodput"]
    assert LedgerSnapshot.objects.filter(job__key=key).exists()

    r = (
        personas["operator"]
        .client()
        .post(
            "/api/v1/maintenance",
            {
                "cluster": "east",
                "starts_at": dt(T0 + 30).isoformat(),
                "ends_at": dt(T0 + 40).isoformat(),
            },
            content_type="application/json",
        )
    )
    assert r.status_code == 201, r.content
    after = viewer.get(f"/api/v1/jobs/{key}/goodput").json()  # the snapshot went stale
    assert after["gpu_goodput"] == pytest.approx(before["gpu_goodput"])
    assert after["planned_gpu_seconds"] == pytest.approx(36 * 8)
    assert after["gpu_goodput_excluding_planned"] == pytest.approx(160 / (73 * 8 - 36 * 8))
    windowed = viewer.get(f"/api/v1/jobs/{key}/goodput", {"start": T0, "end": T0 + 73}).json()
    assert windowed["planned_s"] == pytest.approx(36)

    services.maintenance_window_cancel(window=MaintenanceWindow.objects.get(), actor="x")
    again = viewer.get(f"/api/v1/jobs/{key}/goodput").json()
    assert again["planned_gpu_seconds"] == 0


def test_the_ledger_reads_windows_in_one_query(ingest):
    key = "acct-q"
    assert ingest(to_wire(crash_and_restart(), key)).status_code == 202
    job = TrainingJob.objects.get(key=key)
    with CaptureQueriesContext(connection) as plain:
        job_ledger(job)
    declare(job.cluster, 30, 40)
    with CaptureQueriesContext(connection) as windowed:
        assert job_ledger(job).planned_s == pytest.approx(36)
    assert len(windowed.captured_queries) == len(plain.captured_queries)


# --- the API -------------------------------------------------------------------------------


def post(client, **body):
    return client.post("/api/v1/maintenance", body, content_type="application/json")


def body(a=3600, b=7200, **kw):
    now = timezone.now()
    return {
        "cluster": "east",
        "starts_at": (now + timedelta(seconds=a)).isoformat(),
        "ends_at": (now + timedelta(seconds=b)).isoformat(),
        **kw,
    }


def test_operators_declare_and_cancel_viewers_read(personas, east):
    op, viewer = personas["operator"].client(), personas["viewer"].client()
    r = post(op, **body(nodes=["n2", "n1"], reason="BIOS", pre_action="drain_at_next_checkpoint"))
    assert r.status_code == 201, r.content
    w = r.json()
    assert (w["cluster"], w["nodes"], w["state"], w["created_by"]) == (
        "east",
        ["n1", "n2"],
        "upcoming",
        "operator",
    )
    assert post(viewer, **body()).status_code == 403
    assert viewer.post(f"/api/v1/maintenance/{w['id']}/cancel").status_code == 403
    assert personas["outsider"].client().get("/api/v1/maintenance").status_code == 403
    listed = viewer.get("/api/v1/maintenance").json()
    assert [x["id"] for x in listed["results"]] == [w["id"]]
    assert viewer.get(f"/api/v1/maintenance/{w['id']}").json()["reason"] == "BIOS"
    r = op.post(f"/api/v1/maintenance/{w['id']}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert op.post(f"/api/v1/maintenance/{w['id']}/cancel").status_code == 409
    assert op.post("/api/v1/maintenance/99999999/cancel").status_code == 404
    assert viewer.get(f"/api/v1/maintenance/{2**70}").status_code == 404


def test_the_list_filters(personas, east):
    op = personas["operator"].client()
    now = timezone.now()
    active = declare(east, 0, 1)  # placeholder, moved below
    MaintenanceWindow.objects.filter(pk=active.pk).update(
        starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    upcoming = post(op, **body()).json()["id"]
    west, _ = Cluster.objects.get_or_create(name="west")
    past = services.maintenance_window_create(
        cluster=west, starts_at=now - timedelta(days=2), ends_at=now - timedelta(days=1)
    )
    viewer = personas["viewer"].client()

    def ids(**q):
        r = viewer.get("/api/v1/maintenance", q)
        assert r.status_code == 200, r.content
        return sorted(x["id"] for x in r.json()["results"])

    assert ids(active="true") == [active.pk]
    assert ids(upcoming="true") == [upcoming]
    assert ids(cluster="west") == [past.pk]
    assert ids(active="false", upcoming="false") == [past.pk]
    assert viewer.get("/api/v1/maintenance", {"active": "maybe"}).status_code == 400


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cluster": "nowhere"}, "cluster"),
        ({"nodes": ["n9"]}, "nodes"),
        ({"nodes": "n1"}, "nodes"),
        ({"starts_at": "yesterday"}, "starts_at"),
        ({"pre_action": "reboot"}, "pre_action"),
        ({"pre_action_lead_s": -1}, "pre_action_lead_s"),
        ({"reason": "x" * 301}, "reason"),
        ({"reason": "a\x00b"}, "reason"),
        ({"starts_at": "0001-01-01T00:00:00Z"}, "starts_at"),
        ({"starts_at": "0001-01-01T00:00:00+14:00"}, "starts_at"),
    ],
)
def test_bad_windows_are_a_400_naming_the_field(personas, east, change, field):
    r = post(personas["operator"].client(), **(body() | change))
    assert r.status_code == 400, r.content
    assert field in r.content.decode()


def test_ends_before_it_starts_is_a_400(personas, east):
    r = post(personas["operator"].client(), **body(7200, 3600))
    assert r.status_code == 400 and "ends_at" in r.content.decode()
