"""Per-rank scores of the latest complete window: a slow rank stands out, a uniform
slowdown does not; the ranks come a page at a time, slowest first, filtered by
slowness or node, and a malformed parameter is a 400 naming it."""

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


def ranks(personas, **params):
    r = personas["viewer"].client().get("/api/v1/jobs/j1/ranks", params)
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


@pytest.mark.postgres  # SQLite's key refuses the copy (no partitions: no time in it)
def test_a_window_stored_twice_is_read_once(ingest, personas):
    events = [start()] + [window(1, r, 0.80) for r in range(8)]
    copy = dict(events[3], id="copy", ts=events[3]["ts"] + 1)  # rank 2, another id and time
    copy["data"] = dict(copy["data"], compute_s=1.6)
    assert ingest(events).status_code == 202
    assert ingest([copy]).json() == {"accepted": 1, "duplicates": 0}
    body = ranks(personas)
    assert [x["rank"] for x in body["ranks"]] == list(range(8))
    assert body["ranks"][2]["compute_s"] == 0.80 and body["slow_count"] == 0


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
        "world_size": 8,
        "count": 0,
        "slow_count": 0,
        "ranks": [],
    }
    assert personas["viewer"].client().get("/api/v1/jobs/nope/ranks").status_code == 404
    assert personas["ingest"].client().get("/api/v1/jobs/j1/ranks").status_code == 403


def sixteen_ranks(ingest):
    """16 ranks on n0..n3; in the latest window rank 13 (on n3) is slow, rank 6 (on n1)
    a little slower than the rest."""
    slower = {13: 1.20, 6: 0.88}
    events = [start(world=16)]
    events += [window(1, r, 0.80) for r in range(16)]
    events += [window(11, r, slower.get(r, 0.80)) for r in range(16)]
    assert ingest(events).status_code == 202


def numbers(body):
    return [x["rank"] for x in body["ranks"]]


def test_the_ranks_come_a_page_at_a_time_slowest_first(ingest, personas):
    sixteen_ranks(ingest)
    body = ranks(personas, limit=2)
    assert (body["world_size"], body["count"], body["slow_count"]) == (16, 16, 1)
    assert (body["first_step"], body["last_step"]) == (11, 20)
    assert numbers(body) == [13, 6]
    assert numbers(ranks(personas, limit=2, offset=2)) == [0, 1]  # ties by rank
    everyone = ranks(personas)  # the default page holds them all
    assert numbers(everyone) == [13, 6, *(r for r in range(16) if r not in (13, 6))]
    assert len(everyone["ranks"]) == 16
    assert ranks(personas, offset=16)["ranks"] == []
    assert numbers(ranks(personas, order="rank", limit=3)) == [0, 1, 2]


def test_the_ranks_filter_by_slowness_and_node(ingest, personas):
    sixteen_ranks(ingest)
    slow = ranks(personas, slow="true")
    assert (slow["count"], slow["slow_count"], numbers(slow)) == (1, 1, [13])
    fine = ranks(personas, slow="false", limit=1)
    assert (fine["count"], fine["slow_count"], numbers(fine)) == (15, 1, [6])
    on_n3 = ranks(personas, node="n3")
    assert (on_n3["count"], numbers(on_n3)) == (4, [13, 12, 14, 15])
    assert all(x["node"] == "n3" for x in on_n3["ranks"])
    assert numbers(ranks(personas, node="n3", order="rank", slow="false")) == [12, 14, 15]
    assert ranks(personas, node="elsewhere")["count"] == 0


@pytest.mark.parametrize(
    "name, value",
    [
        ("limit", "0"),
        ("limit", "1001"),
        ("limit", "ten"),
        ("limit", "1.5"),
        ("limit", "\u00b2"),
        ("offset", "-1"),
        ("offset", "99999999999999999999"),
        ("order", "fastest"),
        ("slow", "yes"),
    ],
)
def test_a_malformed_parameter_is_a_400_naming_it(ingest, personas, name, value):
    sixteen_ranks(ingest)
    r = personas["viewer"].client().get("/api/v1/jobs/j1/ranks", {name: value})
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_parameter" and r.json()["field"] == name
    assert name in r.json()["detail"]


def test_the_scores_are_kept_while_recent_then_scored_anew(
    ingest, personas, django_assert_num_queries, django_capture_on_commit_callbacks, monkeypatch
):
    """A large job ingests several times a second: its scores are computed at most every
    RECENT_S, by the worker while the cached ones are under STALE_S old."""
    from jobs.services import page_cache

    sixteen_ranks(ingest)
    before = numbers(ranks(personas, limit=1))
    with django_assert_num_queries(3):  # the token, its role, the job; the scores cached
        assert numbers(ranks(personas, limit=1, offset=1)) == [6]
    events = [window(21, r, 1.20 if r == 1 else 0.80) for r in range(16)]
    assert ingest(events).status_code == 202  # a new revision, but the scores are recent
    with django_assert_num_queries(3):
        assert numbers(ranks(personas, limit=1)) == before
    clock = page_cache.time.time()
    monkeypatch.setattr(page_cache.time, "time", lambda: clock + page_cache.RECENT_S + 1)
    # Older than RECENT_S: served once more, and the refresh is asked for (through the
    # outbox; run inline here once committed), so the next read has the new scores.
    with django_capture_on_commit_callbacks(execute=True) as sent:
        assert numbers(ranks(personas, limit=1)) == before
    assert len(sent) == 1
    with django_capture_on_commit_callbacks(execute=True) as sent:
        assert numbers(ranks(personas, limit=1)) == [1]
    assert not sent  # fresh: nothing more asked for
    # Past STALE_S behind an ingest (no worker refreshed them), the request scores them.
    assert ingest([window(22, r, 1.20 if r == 2 else 0.80) for r in range(16)]).status_code == 202
    monkeypatch.setattr(page_cache.time, "time", lambda: clock + 2 * page_cache.STALE_S)
    assert numbers(ranks(personas, limit=1)) == [2]
