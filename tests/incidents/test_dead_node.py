"""Dead nodes: heartbeats that stop while the launch goes on (on the job's clock)."""

import random

import pytest

from incidents.models import Incident
from jobs.models import Node
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def ev(kind, ts, attempt=1, node=None, **data):
    e = {"id": f"e{next(_n)}", "job": "j1", "kind": kind, "ts": T0 + ts, "data": data}
    if attempt is not None:
        e["attempt"] = attempt
    if node is not None:
        e["node"] = node
    return e


def launch(until, nodes=("n0", "n1")):
    out = [ev("attempt_started", 0, world_size=8, nodes=list(nodes)), ev("ready", 10)]
    out += [ev("step", 11 + i, step=1 + i) for i in range(int(until) - 11)]
    return out


def beats(node, t0, t1, every=5.0, jitter=0.0, seed=0):
    rng, out, t = random.Random(seed), [], t0
    while t <= t1:
        out.append(ev("heartbeat", t, None, node=node))
        t += every + rng.uniform(0, jitter)
    return out


def dead(ingest, events):
    assert ingest(events).status_code == 202
    return [i for i in detect("j1") if i.fault_type == "dead_node"]


def test_a_node_that_falls_silent_is_dead_and_suspect(ingest):
    events = launch(200) + beats("n0", 0, 300) + beats("n1", 0, 95)
    [incident] = dead(ingest, events)
    assert (incident.cause, incident.severity) == (Incident.Cause.HOST, Incident.Severity.CRITICAL)
    assert [n.name for n in incident.nodes.all()] == ["n1"]
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 95)
    assert incident.detected_at.timestamp() == pytest.approx(T0 + 125)
    assert Node.objects.get(name="n1").state == Node.State.SUSPECT
    assert Node.objects.get(name="n0").state == Node.State.ACTIVE
    assert incident.timeline.filter(kind="state_change", data__to="suspect").count() == 1


def test_nodes_that_never_sent_heartbeats_are_not_expected_to(ingest):
    assert dead(ingest, launch(200) + beats("n0", 0, 300)) == []


def test_late_heartbeats_within_the_timeout_are_fine(ingest):
    events = launch(300) + beats("n0", 0, 300, jitter=20) + beats("n1", 0, 300, jitter=20, seed=1)
    assert dead(ingest, events) == []


def test_heartbeats_stopping_with_a_completed_launch_are_fine(ingest):
    events = launch(200) + beats("n0", 0, 200) + beats("n1", 0, 200)
    events += [ev("attempt_ended", 202, reason="completed"), ev("job_finished", 202)]
    assert dead(ingest, events) == []


def test_a_suspect_node_is_not_marked_again(ingest):
    events = launch(200) + beats("n0", 0, 300) + beats("n1", 0, 95)
    dead(ingest, events)
    detect("j1")
    [incident] = Incident.objects.filter(fault_type="dead_node")
    assert incident.timeline.filter(kind="state_change", data__to="suspect").count() == 1


def test_shuffled_heartbeats_give_the_same_silence(ingest):
    events = launch(200) + beats("n0", 0, 300, jitter=3) + beats("n1", 0, 95, jitter=3, seed=2)
    random.Random(5).shuffle(events)
    for i in range(0, len(events), 37):
        assert ingest(events[i : i + 37]).status_code == 202
    [incident] = [i for i in detect("j1") if i.fault_type == "dead_node"]
    last_n1 = max(e["ts"] for e in events if e.get("node") == "n1")
    assert incident.fault_at.timestamp() == pytest.approx(last_n1)
