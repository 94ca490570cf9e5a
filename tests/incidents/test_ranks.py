"""Per-rank scores of the latest complete window: a slow rank stands out, a uniform
slowdown does not."""

import pytest

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def window(first, rank, compute, attempt=1, step_s=2.0):
    return {
        "id": f"w{next(_n)}",
        "job": "j1",
        "kind": "rank_window",
        "ts": T0 + first + 10,
        "attempt": attempt,
        "node": f"n{rank // 4}",
        "rank": rank,
        "data": {
            "first_step": first,
            "last_step": first + 9,
            "compute_s": compute,
            "step_s": step_s,
            "comm_wait_s": step_s - compute,
        },
    }


def start(attempt=1, world=8):
    return {
        "id": f"s{next(_n)}",
        "job": "j1",
        "kind": "attempt_started",
        "ts": T0,
        "attempt": attempt,
        "data": {"world_size": world, "nodes": ["n0", "n1"]},
    }


def ranks(personas):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/ranks")
    assert r.status_code == 200, r.content
    return r.json()


def test_a_slow_rank_stands_out(ingest, personas):
    events = [start()]
    events += [window(1, r, 0.80) for r in range(8)]
    events += [window(11, r, 1.20 if r == 5 else 0.80) for r in range(8)]
    assert ingest(events).status_code == 202
    body = ranks(personas)
    assert (body["attempt"], body["first_step"], body["last_step"]) == (1, 11, 20)
    by_rank = {x["rank"]: x for x in body["ranks"]}
    assert by_rank[5]["slow"] and by_rank[5]["node"] == "n1"
    assert by_rank[5]["peer_score"] == pytest.approx(0.8 / 1.2)
    assert not any(x["slow"] for r, x in by_rank.items() if r != 5)


def test_a_uniform_slowdown_flags_nobody(ingest, personas):
    events = [start()]
    events += [window(1, r, 0.80) for r in range(8)]
    events += [window(11, r, 1.60) for r in range(8)]  # every rank twice as slow
    assert ingest(events).status_code == 202
    body = ranks(personas)
    assert not any(x["slow"] for x in body["ranks"])
    assert all(x["self_score"] == pytest.approx(1.0) for x in body["ranks"])


def test_a_rank_that_degrades_alone_is_caught_by_its_own_best(ingest, personas):
    events = [start()]
    events += [window(1, r, 0.40 if r == 2 else 0.80) for r in range(8)]  # rank 2 was fast
    events += [window(11, r, 0.80) for r in range(8)]  # now it is merely average
    assert ingest(events).status_code == 202
    by_rank = {x["rank"]: x for x in ranks(personas)["ranks"]}
    assert by_rank[2]["peer_score"] == pytest.approx(1.0)
    assert by_rank[2]["self_score"] == pytest.approx(0.5)
    assert by_rank[2]["slow"]


def test_an_incomplete_window_waits(ingest, personas):
    events = [start()]
    events += [window(1, r, 0.80) for r in range(8)]
    events += [window(11, r, 0.80) for r in range(5)]  # three ranks still to report
    assert ingest(events).status_code == 202
    assert ranks(personas)["first_step"] == 1


def test_no_windows_yet(ingest, personas):
    assert ingest([start()]).status_code == 202
    assert ranks(personas) == {
        "job": "j1",
        "attempt": 1,
        "first_step": None,
        "last_step": None,
        "ranks": [],
    }
    assert personas["viewer"].client().get("/api/v1/jobs/nope/ranks").status_code == 404
    assert personas["ingest"].client().get("/api/v1/jobs/j1/ranks").status_code == 403
