"""Stragglers: a node whose ranks stay slow for several windows; and the false-positive
side (a single slow window, jitter, every rank slowing down together)."""

import random

import pytest

from incidents.models import Incident
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))
NODES = ["n0", "n1", "n2", "n3"]  # two ranks each


def start(attempt=1, t=0.0, nodes=NODES):
    return {
        "id": f"e{next(_n)}",
        "job": "j1",
        "kind": "attempt_started",
        "ts": T0 + t,
        "attempt": attempt,
        "data": {"world_size": 2 * len(nodes), "nodes": list(nodes)},
    }


def windows(n, compute, attempt=1, t0=0.0, first=1, nodes=NODES, step_s=1.0):
    """n windows of 10 steps; compute(w, rank) gives a rank's compute time in window w."""
    out = []
    for w in range(n):
        # Synchronous training: every rank's step waits for the slowest.
        step = max(compute(w, r) for r in range(2 * len(nodes))) + step_s - 0.8
        for rank in range(2 * len(nodes)):
            c = compute(w, rank)
            out.append(
                {
                    "id": f"e{next(_n)}",
                    "job": "j1",
                    "kind": "rank_window",
                    "ts": T0 + t0 + 10 * (w + 1),
                    "attempt": attempt,
                    "rank": rank,
                    "node": nodes[rank // 2],
                    "data": {
                        "first_step": first + 10 * w,
                        "last_step": first + 10 * w + 9,
                        "compute_s": c,
                        "step_s": max(step, c),
                        "comm_wait_s": max(step, c) - c,
                    },
                }
            )
    return out


def stragglers(ingest, events):
    for i in range(0, len(events), 1000):
        assert ingest(events[i : i + 1000]).status_code == 202
    return [i for i in detect("j1") if i.fault_type == "straggler"]


def test_a_node_slow_for_three_windows_is_a_straggler(ingest):
    slow = lambda w, r: 1.2 if (r in (6, 7) and w >= 4) else 0.8  # noqa: E731
    [incident] = stragglers(ingest, [start()] + windows(10, slow))
    assert incident.cause == Incident.Cause.STRAGGLER
    assert [n.name for n in incident.nodes.all()] == ["n3"]
    assert incident.ranks == [6, 7]
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 50)  # window 5 ends
    assert incident.detected_at.timestamp() == pytest.approx(T0 + 70)  # the third slow one
    assert "peer score 0.67" in incident.summary
    # 6 slow windows of 10 steps, 1.4 s instead of the 1.0 s baseline, on 8 GPUs
    assert incident.lost_gpu_seconds == pytest.approx(6 * 10 * 0.4 * 8)


@pytest.mark.parametrize("from_window", [0, 4])
def test_one_node_of_two_slow_is_a_straggler(ingest, from_window):
    """Half the ranks slow: their median is no reference (it sits between the two
    nodes); a quarter of them, as fast or faster, is. Slow from the launch's start or
    from its fifth window alike."""
    two = ["n0", "n1"]
    slow = lambda w, r: 1.3 if (r in (2, 3) and w >= from_window) else 0.8  # noqa: E731
    [incident] = stragglers(ingest, [start(nodes=two)] + windows(10, slow, nodes=two))
    assert [n.name for n in incident.nodes.all()] == ["n1"]
    assert incident.ranks == [2, 3]


def test_two_slow_windows_or_a_blip_are_not(ingest):
    blip = lambda w, r: 1.2 if (r in (6, 7) and w in (3, 4, 7)) else 0.8  # noqa: E731
    assert stragglers(ingest, [start()] + windows(10, blip)) == []


def test_jitter_is_not(ingest):
    rng = random.Random(3)
    jitter = lambda w, r: 0.8 * rng.uniform(0.9, 1.1)  # noqa: E731
    assert stragglers(ingest, [start()] + windows(30, jitter)) == []


def test_every_rank_slowing_down_together_is_not(ingest):
    uniform = lambda w, r: 0.8 if w < 5 else 1.6  # noqa: E731
    assert stragglers(ingest, [start()] + windows(12, uniform)) == []


def test_a_node_slow_from_the_start_is_caught_by_its_peers(ingest):
    always = lambda w, r: 1.3 if r in (2, 3) else 0.8  # noqa: E731
    [incident] = stragglers(ingest, [start()] + windows(5, always))
    assert [n.name for n in incident.nodes.all()] == ["n1"]


def test_the_straggler_stays_tied_to_its_node_across_launches(ingest):
    slow_n3 = lambda w, r: 1.2 if r in (6, 7) else 0.8  # noqa: E731
    # launch 2 places n3 first: its ranks are now 0 and 1
    moved = ["n3", "n0", "n1", "n2"]
    slow_moved = lambda w, r: 1.2 if r in (0, 1) else 0.8  # noqa: E731
    events = [start()] + windows(4, slow_n3)
    events += [start(2, 100, moved)] + windows(
        4, slow_moved, attempt=2, t0=100, first=41, nodes=moved
    )
    [incident] = stragglers(ingest, events)
    assert [n.name for n in incident.nodes.all()] == ["n3"]
    assert incident.ranks == [0, 1, 6, 7]
    assert len(incident.evidence) == 8  # every slow window of both launches


def test_one_slow_gpu_makes_its_node_a_straggler(ingest):
    one = lambda w, r: 1.2 if (r == 7 and w >= 4) else 0.8  # noqa: E731
    [incident] = stragglers(ingest, [start()] + windows(10, one))
    assert [n.name for n in incident.nodes.all()] == ["n3"]
    assert incident.ranks == [7]


def test_a_window_reported_again_under_other_ids_and_times_counts_once(ingest):
    """Copies of rank 0's windows (new ids, later times, 5x the compute) stored beside
    the first reports: the first stored is the one judged, whether the copies came
    before the windows were judged or after."""
    slow = lambda w, r: 1.2 if (r in (6, 7) and w >= 4) else 0.8  # noqa: E731
    first = windows(10, slow)
    copies = [
        dict(e, id=f"copy-{e['id']}", ts=e["ts"] + 1, data=dict(e["data"], compute_s=4.0))
        for e in first
        if e["rank"] == 0
    ]
    assert ingest([start()] + first).status_code == 202
    [incident] = stragglers(ingest, copies[:5])
    [again] = stragglers(ingest, copies[5:])
    for i in (incident, again):  # as in the first test here, where nothing came twice
        assert [n.name for n in i.nodes.all()] == ["n3"] and i.ranks == [6, 7]
        assert i.fault_at.timestamp() == pytest.approx(T0 + 50)
        assert i.detected_at.timestamp() == pytest.approx(T0 + 70)
        assert i.lost_gpu_seconds == pytest.approx(6 * 10 * 0.4 * 8)
