"""Repeat offenders: a node in several incidents of its cluster within a window."""

import pytest

from incidents import services
from incidents.models import Incident
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
DAY = 86400.0
_n = iter(range(1, 10**6))


def ev(job, kind, ts, attempt, node=None, **data):
    e = {
        "id": f"e{next(_n)}",
        "job": job,
        "kind": kind,
        "ts": T0 + ts,
        "attempt": attempt,
        "data": data,
    }
    if node:
        e["node"] = node
    return e


def failing_launch(job, attempt, t, node="n1"):
    return [
        ev(job, "attempt_started", t, attempt, world_size=8, nodes=["n0", node]),
        ev(job, "ready", t + 10, attempt),
        ev(job, "step", t + 11, attempt, step=1),
        ev(job, "fault", t + 12, attempt, node=node, type="gpu_xid", xid=79),
        ev(job, "attempt_ended", t + 20, attempt, reason="failed"),
    ]


def offenders():
    return list(Incident.objects.filter(detector="repeat_offender"))


def post(ingest, events, job="j1"):
    assert ingest(events).status_code == 202
    return detect(job)


def test_three_incidents_in_a_week_make_a_repeat_offender(ingest):
    events = []
    for a, t in enumerate((0, DAY, 2 * DAY), start=1):
        events += failing_launch("j1", a, t)
    post(ingest, events)
    [offender] = offenders()
    assert offender.cause == Incident.Cause.GPU
    assert offender.severity == Incident.Severity.CRITICAL
    assert [n.name for n in offender.nodes.all()] == ["n1"]
    assert "take it out of service" in offender.summary
    assert offender.fault_at.timestamp() == pytest.approx(T0 + 2 * DAY + 12)
    assert len(offender.evidence) == 3
    detect("j1")
    assert len(offenders()) == 1  # a second pass opens nothing more


def test_two_incidents_or_three_spread_over_weeks_are_not(ingest):
    events = failing_launch("j1", 1, 0) + failing_launch("j1", 2, DAY)
    post(ingest, events)
    assert offenders() == []
    post(ingest, failing_launch("j1", 3, 9 * DAY))
    assert offenders() == []


def test_incidents_of_other_jobs_on_the_cluster_count(ingest):
    post(ingest, failing_launch("a", 1, 0), "a")
    post(ingest, failing_launch("b", 1, DAY), "b")
    post(ingest, failing_launch("c", 1, 2 * DAY), "c")
    [offender] = offenders()
    assert offender.job.key == "c"


def test_after_it_is_resolved_only_later_incidents_count(ingest):
    events = []
    for a, t in enumerate((0, DAY, 2 * DAY), start=1):
        events += failing_launch("j1", a, t)
    post(ingest, events)
    [offender] = offenders()
    services.incident_resolve(incident=offender, actor="operator", note="GPU replaced")
    post(ingest, failing_launch("j1", 4, 3 * DAY) + failing_launch("j1", 5, 4 * DAY))
    assert len(offenders()) == 1
    post(ingest, failing_launch("j1", 6, 5 * DAY))
    assert len(offenders()) == 2
