"""What an incident is attributed to, and when its fault began: a peer's NCCL timeout
reported before the crash that caused it, a node's Xid with the ranks that died of it."""

import time
from datetime import timedelta

import pytest

from incidents import services
from incidents.models import Incident, TimelineEntry
from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db

_n = iter(range(1, 10**6))
NODES = ["node-a", "node-b"]


def event(kind, ts, attempt=1, node=None, rank=None, **data):
    e = {"id": f"e{next(_n)}", "job": "live", "kind": kind, "ts": ts, "data": data}
    if attempt is not None:
        e["attempt"] = attempt
    if node is not None:
        e["node"] = node
    if rank is not None:
        e["rank"] = rank
    return e


def launch(t0, attempt=1, steps=20):
    out = [
        event("attempt_started", t0, attempt, world_size=4, gpus_per_node=2, nodes=NODES),
        event("ready", t0 + 1, attempt),
    ]
    out += [event("step", t0 + 1 + s, attempt, rank=0, step=s) for s in range(1, steps + 1)]
    return out


def symptoms(t, attempt, ranks):
    """The peers' reports of a collective that failed: NCCL timeouts, symptoms."""
    return [
        event("fault", t + 0.01 * r, attempt, NODES[r // 2], r, type="nccl_timeout") for r in ranks
    ]


def job():
    return TrainingJob.objects.get(key="live")


def test_a_crash_reported_after_its_symptoms_re_attributes_the_incident_on_the_timeline(ingest):
    # The job's clock is Rebound's here (one machine), as in the demo.
    t0 = time.time() - 60
    crash_t = t0 + 25
    assert ingest(launch(t0) + symptoms(crash_t, 1, (0, 2, 3))).status_code == 202
    [incident] = services.incidents_detect(job=job(), inferred=False)  # ingest's quick pass
    assert (incident.cause, incident.fault_type) == ("network", "nccl_timeout")

    # The supervisor reports the rank that died once it has torn the launch down.
    later = [
        event("fault", crash_t + 1.5, 1, "node-a", 1, type="crash", exit_code=-9),
        event("attempt_ended", crash_t + 1.6, 1, reason="failed", exit_code=-9),
    ]
    assert ingest(later).status_code == 202
    services.incidents_detect(job=job())
    incident.refresh_from_db()
    assert (incident.cause, incident.fault_type, incident.ranks) == ("software", "crash", [1])

    # Its fault began at the earliest sign, the first NCCL timeout, not at the later
    # report of its cause: the incident was not opened before its own fault.
    assert incident.fault_at.timestamp() == pytest.approx(crash_t, abs=1e-3)
    assert incident.detected_at.timestamp() == pytest.approx(crash_t, abs=1e-3)
    assert incident.opened_at >= incident.fault_at

    [entry] = incident.timeline.filter(data__has_key="cause")
    assert entry.kind == TimelineEntry.Kind.DETECTION
    assert entry.data["cause"] == {"from": "network", "to": "software"}
    assert entry.data["fault_type"] == {"from": "nccl_timeout", "to": "crash"}
    assert "network (nccl_timeout) → software (crash)" in entry.message
    assert "symptom" in entry.message and "node-a rank 1" in entry.message
    # It stands after the signals that changed it: the crash and the launch's end.
    assert list(incident.timeline.order_by("at", "id"))[-1] == entry
    # Another pass changes nothing, so it writes no second entry.
    services.incidents_detect(job=job())
    assert incident.timeline.filter(data__has_key="cause").count() == 1


def test_an_xid_names_the_ranks_that_died_on_its_node(ingest):
    t0 = 1_790_000_000.0
    xid_t = t0 + 25
    events = launch(t0) + [
        # The node agent's report: the node, no rank, no launch.
        event("fault", xid_t, None, "node-b", type="gpu_xid", xid=79),
        *symptoms(xid_t + 0.4, 1, (0, 1)),  # ranks of node-a lost their peers
        event("fault", xid_t + 0.8, 1, "node-b", 2, type="crash", exit_code=-9),
        event("attempt_ended", xid_t + 0.9, 1, reason="failed", exit_code=-9),
    ]
    assert ingest(events).status_code == 202
    [incident] = services.incidents_detect(job=job())
    assert (incident.cause, incident.fault_type, incident.xid) == ("gpu", "gpu_xid", 79)
    # The crash on the Xid's node names rank 2; the peers that timed out are symptoms.
    assert incident.ranks == [2]
    assert [n.name for n in incident.nodes.all()] == ["node-b"]


def test_the_incident_page_names_the_ranks_and_explains_the_clocks(client, personas, ingest):
    t0 = 1_790_000_000.0
    events = launch(t0) + [
        event("fault", t0 + 25, None, "node-b", type="gpu_xid", xid=79),
        event("fault", t0 + 25.8, 1, "node-b", 3, type="crash", exit_code=-9),
        event("attempt_ended", t0 + 25.9, 1, reason="failed", exit_code=-9),
    ]
    assert ingest(events).status_code == 202
    [incident] = services.incidents_detect(job=job())
    client.force_login(personas["viewer"].user)
    html = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "ranks <b>3</b>" in html and "none named" not in html.split("· ranks")[1][:80]
    # A job whose clock runs ahead of Rebound's: opened "before" its fault, explained.
    Incident.objects.filter(pk=incident.pk).update(
        opened_at=incident.fault_at - timedelta(seconds=5)
    )
    html = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "the job's clock" in html and "ahead of Rebound's" in html
