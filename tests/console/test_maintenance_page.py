"""The maintenance page: viewers see each cluster's windows; operators declare and
cancel them there; the reliability page and the job page show planned interruptions
apart."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import Cluster, MaintenanceWindow, Node
from tests.jobs.test_accounting import T0, crash_and_restart, to_wire

pytestmark = pytest.mark.django_db


@pytest.fixture
def east(personas):
    cluster = Cluster.objects.get(name="east")
    for name in ("n1", "n2"):
        Node.objects.create(cluster=cluster, name=name)
    return cluster


def at(hours: float) -> datetime:
    return timezone.now() + timedelta(hours=hours)


def test_viewers_see_current_upcoming_and_past_windows(client, personas, east):
    services.maintenance_window_create(
        cluster=east, starts_at=at(-1), ends_at=at(1), nodes=["n2"], reason="PSU swap"
    )
    services.maintenance_window_create(
        cluster=east, starts_at=at(24), ends_at=at(26), reason="network upgrade"
    )
    services.maintenance_window_create(
        cluster=east, starts_at=at(-30), ends_at=at(-28), reason="old one"
    )
    client.force_login(personas["viewer"].user)
    r = client.get("/maintenance/")
    assert r.status_code == 200
    html = r.content.decode()
    current, upcoming, past = (html.index(t) for t in ("Current", "Upcoming", "Past and"))
    assert current < html.index("PSU swap") < upcoming < html.index("network upgrade") < past
    assert html.index("old one") > past
    assert "the whole cluster" in html and "n2" in html
    assert 'href="/maintenance/"' in html  # in the header
    assert "Declare a maintenance window" not in html  # viewers change nothing
    assert "maintenance-cancel" not in html and "Cancel</button>" not in html


def test_operators_declare_and_cancel_on_the_page(client, personas, east):
    client.force_login(personas["operator"].user)
    page = client.get("/maintenance/").content.decode()
    assert "Declare a maintenance window" in page
    form = {
        "cluster": "east",
        "starts_at": at(2).strftime("%Y-%m-%d %H:%M"),
        "ends_at": at(4).strftime("%Y-%m-%d %H:%M"),
        "nodes": "n1, n2",
        "reason": "BIOS",
        "pre_action": "drain_at_next_checkpoint",
        "pre_action_lead_s": "900",
    }
    r = client.post("/maintenance/declare/", form, HTTP_ACCEPT="application/json")
    assert r.status_code == 200, r.content
    window = MaintenanceWindow.objects.get(pk=r.json()["window"])
    assert sorted(window.nodes.values_list("name", flat=True)) == ["n1", "n2"]
    assert (window.created_by, window.pre_action_lead_s) == ("operator", 900)
    bad = client.post(
        "/maintenance/declare/", form | {"nodes": "n9"}, HTTP_ACCEPT="application/json"
    )
    assert bad.status_code == 400 and "n9" in bad.json()["detail"]
    late = client.post(
        "/maintenance/declare/",
        form | {"ends_at": at(1).strftime("%Y-%m-%d %H:%M")},
        HTTP_ACCEPT="application/json",
    )
    assert late.status_code == 400 and "ends_at" in late.json()["detail"]
    r = client.post(f"/maintenance/{window.pk}/cancel/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    window.refresh_from_db()
    assert window.cancelled_at is not None
    again = client.post(f"/maintenance/{window.pk}/cancel/", HTTP_ACCEPT="application/json")
    assert again.status_code == 409
    gone = client.post("/maintenance/999999/cancel/", HTTP_ACCEPT="application/json")
    assert gone.status_code == 404


def test_viewers_may_not_declare_or_cancel(client, personas, east):
    window = services.maintenance_window_create(cluster=east, starts_at=at(1), ends_at=at(2))
    client.force_login(personas["viewer"].user)
    form = {"cluster": "east", "starts_at": "2030-01-01 00:00", "ends_at": "2030-01-01 01:00"}
    json = {"HTTP_ACCEPT": "application/json"}
    assert client.post("/maintenance/declare/", form, **json).status_code == 403
    assert client.post(f"/maintenance/{window.pk}/cancel/", **json).status_code == 403
    assert client.get("/maintenance/declare/").status_code == 405
    assert MaintenanceWindow.objects.count() == 1


def test_reliability_and_job_pages_show_planned_interruptions(client, personas, ingest):
    cluster = Cluster.objects.get(name="east")
    services.maintenance_window_create(
        cluster=cluster,
        starts_at=datetime.fromtimestamp(T0 + 25, tz=UTC),
        ends_at=datetime.fromtimestamp(T0 + 45, tz=UTC),
    )
    assert ingest(to_wire(crash_and_restart(), "pj")).status_code == 202
    from tests.incidents.conftest import detect

    [incident] = detect("pj")
    assert incident.cause == "planned"
    client.force_login(personas["viewer"].user)
    html = client.get("/jobs/pj/").content.decode()
    assert "Goodput without planned" in html
    day = datetime.fromtimestamp(T0, tz=UTC).date()
    r = client.get("/reliability/", {"since": day.isoformat(), "until": day.isoformat()})
    html = r.content.decode()
    assert r.status_code == 200
    assert "Planned interruptions" in html and "without planned interruptions" in html


def test_the_page_and_the_api_list_in_a_fixed_number_of_queries(client, personas, east):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(personas["viewer"].user)
    api = personas["viewer"].client()

    def counts():
        with CaptureQueriesContext(connection) as page:
            assert client.get("/maintenance/").status_code == 200
        with CaptureQueriesContext(connection) as listed:
            assert api.get("/api/v1/maintenance").status_code == 200
        return len(page.captured_queries), len(listed.captured_queries)

    services.maintenance_window_create(cluster=east, starts_at=at(1), ends_at=at(2), nodes=["n1"])
    counts()  # the first request of a token records its use
    few = counts()
    for k in range(5):
        services.maintenance_window_create(
            cluster=east, starts_at=at(3 + k), ends_at=at(4 + k), nodes=["n1", "n2"]
        )
    assert counts() == few


def test_the_admin_lists_and_cancels_windows(client, personas, east):
    window = services.maintenance_window_create(
        cluster=east, starts_at=at(1), ends_at=at(2), reason="in the admin"
    )
    admin = personas["admin"].user
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    assert b"in the admin" in client.get("/admin/jobs/maintenancewindow/").content
    assert client.get("/admin/jobs/maintenancewindow/add/").status_code == 403
    r = client.post(
        "/admin/jobs/maintenancewindow/",
        {"action": "cancel", "_selected_action": [window.pk]},
    )
    assert r.status_code == 302
    window.refresh_from_db()
    assert window.cancelled_at is not None
