"""Reliability figures and the nodes list."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

# The sample's faults fall between 2026-09-21T14:16 and 14:24 UTC.
PERIOD = {"start": "2026-09-21T14:00:00Z", "end": "2026-09-21T15:00:00Z"}


def test_reliability_of_the_sample(personas, incidents, sample):
    _, expected = sample
    r = personas["viewer"].client().get("/api/v1/reliability", {**PERIOD, "cluster": "east"})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["failures"] == 3
    assert body["mtbf_s"] == pytest.approx(1200.0)  # one hour, three failures
    assert body["by_cause"]["gpu"]["count"] == 2
    assert body["by_cause"]["gpu"]["share"] == pytest.approx(2 / 3)
    assert body["by_cause"]["training_instability"]["count"] == 1
    resumes = sorted(i["time_to_resume_s"] for i in expected["incidents"])
    assert body["time_to_resume"]["count"] == 3
    assert body["time_to_resume"]["mean_s"] == pytest.approx(sum(resumes) / 3, abs=1e-4)
    assert body["time_to_resume"]["p50_s"] == pytest.approx(resumes[1], abs=1e-4)
    recovers = sorted(i["time_to_recover_s"] for i in expected["incidents"])
    assert body["time_to_recover"]["p90_s"] == pytest.approx(
        recovers[1] + 0.8 * (recovers[2] - recovers[1]), abs=1e-4
    )
    lost = sum(i["lost_gpu_hours"] for i in expected["incidents"])
    assert body["lost_gpu_hours"] == pytest.approx(lost, abs=1e-6)
    assert body["repeat_offenders"] == []


def test_repeat_offenders_are_listed(personas, incidents):
    node = incidents[0].nodes.get()
    for i in incidents[1:]:
        i.nodes.set([node])
    body = personas["viewer"].client().get("/api/v1/reliability", PERIOD).json()
    assert body["repeat_offenders"] == [{"node": node.name, "incidents": 3}]


def test_an_empty_period(personas, incidents):
    r = (
        personas["viewer"]
        .client()
        .get(
            "/api/v1/reliability", {"start": "2020-01-01T00:00:00Z", "end": "2020-02-01T00:00:00Z"}
        )
    )
    body = r.json()
    assert body["failures"] == 0 and body["mtbf_s"] is None
    assert body["time_to_resume"] == {"count": 0, "mean_s": None, "p50_s": None, "p90_s": None}


def test_reliability_bad_period_is_400(personas):
    c = personas["viewer"].client()
    assert c.get("/api/v1/reliability", {"start": "later"}).status_code == 400
    r = c.get("/api/v1/reliability", {"start": PERIOD["end"], "end": PERIOD["start"]})
    assert r.status_code == 400


def test_nodes_list(personas, incidents):
    c = personas["viewer"].client()
    r = c.get("/api/v1/nodes/", {"cluster": "east"})
    assert r.status_code == 200
    rows = {n["name"]: n for n in r.json()["results"]}
    assert set(rows) == {"gpu-node-000", "gpu-node-001", "gpu-node-100"}
    assert rows["gpu-node-001"]["state"] == "active"
    assert rows["gpu-node-001"]["incidents_30d"] == 0  # the sample's faults are long past
    # move two of them into the last 7 and 30 days, on one node
    node = incidents[0].nodes.get()
    now = timezone.now()
    for incident, days in ((incidents[0], 2), (incidents[1], 20)):
        incident.fault_at = now - timedelta(days=days)
        incident.save(update_fields=["fault_at"])
        incident.nodes.set([node])
    rows = {n["name"]: n for n in c.get("/api/v1/nodes/").json()["results"]}
    assert (rows[node.name]["incidents_7d"], rows[node.name]["incidents_30d"]) == (1, 2)
    assert c.get("/api/v1/nodes/", {"state": "broken"}).status_code == 400
    assert c.get("/api/v1/nodes/", {"state": "spare"}).json()["count"] == 0


def test_reliability_and_nodes_need_a_role(personas):
    for path in ("/api/v1/reliability", "/api/v1/nodes/"):
        assert APIClient().get(path).status_code == 401
        assert personas["ingest"].client().get(path).status_code == 403
        assert personas["outsider"].client().get(path).status_code == 403
