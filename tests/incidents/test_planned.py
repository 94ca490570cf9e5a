"""Planned interruptions: an incident whose fault falls inside a maintenance window
covering one of its nodes (or its whole cluster) is of cause `planned`, not a
failure (failure counts, MTBF); a window declared after the fact re-labels, a
cancelled one gives the cause back; nodes under maintenance raise nothing."""

from datetime import UTC, datetime, timedelta

import pytest

from incidents import selectors, services
from incidents.models import Incident, SweepState
from jobs import services as job_services
from jobs.models import Cluster, MaintenanceWindow, Node, TrainingJob
from tests.incidents.conftest import detect
from tests.incidents.test_dead_node import T0 as DEAD_T0
from tests.incidents.test_dead_node import beats, launch
from tests.incidents.test_sweep import NOW, heard, received
from tests.incidents.test_sweep import launch as sweep_launch
from tests.jobs.test_accounting import T0, crash_and_restart, to_wire

pytestmark = pytest.mark.django_db


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def window(a, b, nodes=(), t0=T0, reason="rack move"):
    return job_services.maintenance_window_create(
        cluster=Cluster.objects.get(name="east"),
        starts_at=dt(t0 + a),
        ends_at=dt(t0 + b),
        nodes=list(nodes),
        reason=reason,
    )


def crash(ingest, key="planned"):
    assert ingest(to_wire(crash_and_restart(), key)).status_code == 202
    return detect(key)


def reliability(client):
    r = client.get(
        "/api/v1/reliability",
        {"start": dt(T0 - 3600).isoformat(), "end": dt(T0 + 3600).isoformat()},
    )
    assert r.status_code == 200, r.content
    return r.json()


def test_a_crash_inside_a_window_is_planned_and_not_a_failure(ingest, personas):
    crash(ingest, key="unplanned")  # one before any window: a failure
    before = reliability(personas["viewer"].client())
    assert (before["failures"], before["planned"]["count"]) == (1, 0)

    w = window(25, 45)  # the crash at 30, its launch failed at 35
    [incident] = crash(ingest)
    assert incident.cause == Incident.Cause.PLANNED
    assert incident.fault_type == "crash"  # kept
    assert incident.summary.startswith(f"planned (maintenance window #{w.pk}")
    assert incident.lost_gpu_seconds == pytest.approx(36 * 8)  # its cost, shown
    assert not Incident.objects.filter(pk=incident.pk).filter(selectors.is_failure()).exists()

    body = reliability(personas["viewer"].client())
    assert body["incidents"] == 2 and body["failures"] == 1  # the planned one is not
    assert body["mtbf_s"] == pytest.approx(7200)  # the period over the one failure
    assert body["planned"] == {"count": 1, "lost_gpu_hours": pytest.approx(36 * 8 / 3600)}
    assert body["by_cause"]["planned"]["failures"] == 0
    assert set(body["goodput"]) == {
        "gpu_goodput",
        "gpu_goodput_excluding_planned",
        "jobs",
        "jobs_without_ledger",
    }


def test_a_window_declared_after_the_fact_relabels_and_cancelling_restores(
    ingest, personas, django_capture_on_commit_callbacks
):
    [incident] = crash(ingest)
    was = incident.cause
    assert was != Incident.Cause.PLANNED
    op = personas["operator"].client()
    body = {"cluster": "east", "starts_at": dt(T0 + 25).isoformat()}
    body["ends_at"] = dt(T0 + 45).isoformat()
    # The receiver asks for the job's pass through the outbox; tasks run inline.
    with django_capture_on_commit_callbacks(execute=True):
        r = op.post("/api/v1/maintenance", body, content_type="application/json")
    assert r.status_code == 201, r.content
    incident.refresh_from_db()
    assert incident.cause == Incident.Cause.PLANNED
    moved = incident.timeline.filter(kind="detection", message__startswith="Re-attributed")
    assert moved.get().data["cause"] == {"from": was, "to": "planned"}

    with django_capture_on_commit_callbacks(execute=True):
        r = op.post(f"/api/v1/maintenance/{r.json()['id']}/cancel")
    assert r.status_code == 200
    incident.refresh_from_db()
    assert incident.cause == was
    assert not incident.summary.startswith("planned")


def test_a_window_of_other_nodes_leaves_the_crash_a_failure(ingest):
    events = crash_and_restart()
    events[0]["data"]["nodes"] = ["n1", "n2"]
    events[1]["node"] = "n2"  # a heartbeat-free trace names its nodes at the start
    assert ingest(to_wire(events, "nodes")).status_code == 202
    Node.objects.get_or_create(cluster=Cluster.objects.get(name="east"), name="n3")
    window(25, 45, ["n3"])
    [incident] = detect("nodes")
    assert incident.cause != Incident.Cause.PLANNED
    window(25, 45, ["n2"])
    TrainingJob.objects.filter(key="nodes").update(revision=0)
    services.incidents_detect(job=TrainingJob.objects.get(key="nodes"))
    incident.refresh_from_db()
    assert incident.cause == Incident.Cause.PLANNED


def test_a_dead_node_under_maintenance_opens_nothing(ingest):
    events = launch(200) + beats("n0", 0, 300) + beats("n1", 0, 95)
    assert ingest([e | {"job": "j1"} for e in events]).status_code == 202
    window(60, 400, ["n1"], t0=DEAD_T0)
    assert [i for i in detect("j1") if i.fault_type == "dead_node"] == []
    assert Node.objects.get(name="n1").state == Node.State.ACTIVE


def test_a_dead_node_outside_its_window_is_still_found(ingest):
    events = launch(200) + beats("n0", 0, 300) + beats("n1", 0, 95)
    assert ingest(events).status_code == 202
    window(150, 400, ["n1"], t0=DEAD_T0)  # it fell silent before the window
    [incident] = [i for i in detect("j1") if i.fault_type == "dead_node"]
    assert incident.cause == Incident.Cause.HOST


def test_the_sweep_leaves_nodes_under_maintenance_alone(ingest):
    events = sweep_launch("quiet", node="n0") + sweep_launch("busy", node="n1")
    assert ingest(events).status_code == 202
    received("quiet", 200)
    heard("n0", 200)
    received("busy", 2)  # the cluster is heard from: its silent jobs are judged
    heard("n1", 2)
    services.incidents_sweep(now=NOW - timedelta(seconds=600))
    SweepState.objects.filter(pk=1).update(at=NOW - timedelta(seconds=15))
    job_services.maintenance_window_create(
        cluster=Cluster.objects.get(name="east"),
        starts_at=NOW - timedelta(seconds=3000),
        ends_at=NOW + timedelta(hours=1),
        nodes=["n0"],
    )
    result = services.incidents_sweep(now=NOW)
    assert result.suspect == []
    assert Node.objects.get(name="n0").state == Node.State.ACTIVE
    # The silent job is judged; what it shows inside the window is planned.
    assert result.judged == ["quiet"]
    found = Incident.objects.filter(job__key="quiet")
    assert not found.filter(fault_type="dead_node").exists()
    assert found.exists()
    assert set(found.values_list("cause", flat=True)) == {Incident.Cause.PLANNED}


def test_planned_incidents_make_no_repeat_offender(ingest):
    MaintenanceWindow.objects.all().delete()
    events = crash_and_restart()
    events[0]["data"]["nodes"] = ["n2"]
    for k in range(3):
        key = f"r{k}"
        assert ingest(to_wire(events, key)).status_code == 202
    window(25, 45, ["n2"])
    for k in range(3):
        detect(f"r{k}")
    assert not Incident.objects.filter(fault_type="repeat_offender").exists()
    assert Incident.objects.filter(cause=Incident.Cause.PLANNED).count() == 3


def test_launches_failing_inside_a_window_are_no_crash_loop(ingest):
    from tests.incidents.test_crash_loop import T0 as LOOP_T0
    from tests.incidents.test_crash_loop import launch as loop_launch
    from tests.incidents.test_crash_loop import loops

    events = []
    for a in range(1, 6):  # the storm of test_crash_loop, inside a window
        events += loop_launch(a, (a - 1) * 300, restore=(a - 1) * 10 or None, save=a * 10)
    window(0, 3600, t0=LOOP_T0)
    assert loops(ingest, events) == []
    assert Incident.objects.filter(cause=Incident.Cause.PLANNED).count() == 5
