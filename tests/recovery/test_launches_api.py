"""POST /api/v1/launches: a launch's number per launch identity, never reused, and the
gate that refuses a new launch of a finished job, on a paused cluster, or in a crash
loop. Personas, bad input, idempotency, and the race of concurrent launches."""

import json
import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from jobs.models import Attempt, Cluster, LaunchReservation, TrainingJob
from recovery.services import cluster_pause, launch_admit
from tests.factories import IncidentFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/launches"


def post(persona, body, raw=None):
    data = raw if raw is not None else json.dumps(body)
    return persona.client().post(URL, data=data, content_type="application/json")


def launch(personas, identity, job="llm-7b", persona="ingest"):
    return post(personas[persona], {"job": job, "launch": identity})


# --- numbers ---------------------------------------------------------------------------


def test_a_new_identity_gets_a_new_number_and_the_same_identity_the_same(personas):
    r = launch(personas, "te:run-a:r0/n:0001")
    assert r.status_code == 201, r.content
    assert r.json() == {
        "job": "llm-7b",
        "attempt": 1,
        "launch": "te:run-a:r0/n:0001",
        "created": True,
    }
    job = TrainingJob.objects.get(key="llm-7b")
    assert job.cluster.name == "east"  # created like ingest creates it, on the token's cluster

    again = launch(personas, "te:run-a:r0/n:0001")
    assert again.status_code == 200
    assert again.json() == {**r.json(), "created": False}

    r2 = launch(personas, "te:run-a:r1/n:0002")
    assert (r2.status_code, r2.json()["attempt"]) == (201, 2)
    assert launch(personas, "te:run-a:r0/n:0001").json()["attempt"] == 1
    assert list(LaunchReservation.objects.values_list("attempt", "identity")) == [
        (1, "te:run-a:r0/n:0001"),
        (2, "te:run-a:r1/n:0002"),
    ]


def test_numbers_follow_the_launches_ingest_stored(personas, ingest):
    """A launch reported without a reservation (an older agent, a curl) still counts."""
    t = 1_796_000_000
    started = {"world_size": 2, "gpus_per_node": 2, "nodes": ["g1"]}
    events = [
        {
            "id": "s5",
            "job": "llm-7b",
            "kind": "attempt_started",
            "ts": t,
            "attempt": 5,
            "data": started,
        },
    ]
    assert ingest(events).status_code == 202
    r = launch(personas, "slurm:991:r0/n:ab")
    assert (r.status_code, r.json()["attempt"]) == (201, 6)
    # Reservations count as much as stored launches: a number is never handed out twice.
    assert launch(personas, "slurm:991:r1/n:cd").json()["attempt"] == 7


def test_each_job_counts_on_its_own(personas):
    assert launch(personas, "x", job="a").json()["attempt"] == 1
    assert launch(personas, "x", job="b").json()["attempt"] == 1
    assert launch(personas, "y", job="a").json()["attempt"] == 2


# --- who may ---------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["admin", "operator", "viewer", "outsider"])
def test_only_ingest_tokens_may_reserve(personas, who):
    r = launch(personas, "n:1", persona=who)
    assert r.status_code == 403, r.content
    assert r.json()["error"]
    assert not LaunchReservation.objects.exists()
    assert not TrainingJob.objects.filter(key="llm-7b").exists()


def test_anonymous_may_not():
    r = APIClient().post(URL, {"job": "llm-7b", "launch": "n:1"}, format="json")
    assert r.status_code in (401, 403)
    assert not LaunchReservation.objects.exists()


def test_a_job_of_another_cluster_is_refused_as_ingest_refuses_it(personas):
    assert launch(personas, "n:1").status_code == 201  # llm-7b is east's now
    r = launch(personas, "n:2", persona="ingest_west")
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden_job"
    assert "llm-7b" in r.json()["detail"]
    assert LaunchReservation.objects.count() == 1
    # west creates its own jobs
    assert launch(personas, "n:1", job="west-job", persona="ingest_west").status_code == 201
    assert TrainingJob.objects.get(key="west-job").cluster == Cluster.objects.get(name="west")


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        ({"launch": "n:1"}, "job"),
        ({"job": "llm-7b"}, "launch"),
        ({"job": "llm 7b", "launch": "n:1"}, "job"),
        ({"job": "llm-7b\n", "launch": "n:1"}, "job"),
        ({"job": "x" * 101, "launch": "n:1"}, "job"),
        ({"job": 7, "launch": "n:1"}, "job"),
        ({"job": "llm-7b", "launch": ""}, "launch"),
        ({"job": "llm-7b", "launch": "x" * 201}, "launch"),
        ({"job": "llm-7b", "launch": "n:1\n"}, "launch"),
        ({"job": "llm-7b", "launch": "n:\u00e9"}, "launch"),
        ({"job": "llm-7b", "launch": "n:\u0000"}, "launch"),
        ({"job": "llm-7b", "launch": 12}, "launch"),
        ({"job": "llm-7b", "launch": ["n:1"]}, "launch"),
        ({"job": "llm-7b", "launch": None}, "launch"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(personas, body, field):
    r = post(personas["ingest"], body)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid"
    assert field in r.json()["fields"]
    assert not LaunchReservation.objects.exists()


@pytest.mark.parametrize("raw", ["{not json", "[]", '"x"', ""])
def test_a_body_that_is_not_an_object_is_a_400(personas, raw):
    r = post(personas["ingest"], None, raw=raw)
    assert r.status_code == 400, r.content
    assert r.json()["error"]
    assert not LaunchReservation.objects.exists()


def test_the_longest_identity_and_a_space_are_fine(personas):
    identity = "te:run a:r0/" + "x" * 188
    assert len(identity) == 200
    assert launch(personas, identity).status_code == 201


# --- the gate --------------------------------------------------------------------------


def _finish(ingest, job="llm-7b"):
    t = 1_796_000_000
    started = {"world_size": 2, "gpus_per_node": 2, "nodes": ["g1"]}
    events = [
        {"id": "a1", "job": job, "kind": "attempt_started", "ts": t, "attempt": 1, "data": started},
        {"id": "e1", "job": job, "kind": "attempt_ended", "ts": t + 60, "attempt": 1,
         "data": {"reason": "completed"}},
        {"id": "f1", "job": job, "kind": "job_finished", "ts": t + 61, "attempt": 1},
    ]  # fmt: skip
    assert ingest(events).status_code == 202


def test_a_finished_job_takes_no_new_launch_until_reopened(personas, ingest):
    assert launch(personas, "n:1").status_code == 201
    _finish(ingest)
    r = launch(personas, "n:2")
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "job_finished"
    assert body["job"] == "llm-7b"
    assert body["detail"] == (
        f"job llm-7b finished at {body['finished_at']}; reopen it with"
        " POST /api/v1/jobs/llm-7b/reopen or use another job name"
    )
    assert body["finished_at"].startswith("2026-")
    assert list(LaunchReservation.objects.values_list("attempt", flat=True)) == [1]
    # A retry of the launch admitted before the finish still gets its number.
    assert launch(personas, "n:1").status_code == 200

    reopen = (
        personas["operator"]
        .client()
        .post("/api/v1/jobs/llm-7b/reopen", {"reason": "more steps"}, format="json")
    )
    assert reopen.status_code == 200, reopen.content
    r = launch(personas, "n:2")
    assert (r.status_code, r.json()["attempt"]) == (201, 2)


def test_a_paused_cluster_takes_no_new_launch(personas):
    assert launch(personas, "n:1").status_code == 201
    cluster_pause(cluster=Cluster.objects.get(name="east"), actor="alice", reason="maintenance")
    r = launch(personas, "n:2")
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "cluster_paused"
    assert "paused by alice" in body["detail"] and "maintenance" in body["detail"]
    assert "POST /api/v1/clusters/east/resume" in body["detail"]
    assert (body["paused_by"], body["reason"]) == ("alice", "maintenance")
    assert LaunchReservation.objects.count() == 1
    # A new job on the paused cluster is refused too, and nothing is reserved for it.
    assert launch(personas, "n:1", job="other").status_code == 409
    assert not LaunchReservation.objects.filter(job__key="other").exists()
    # The other cluster is not paused.
    assert launch(personas, "n:1", job="w", persona="ingest_west").status_code == 201


def test_an_open_crash_loop_takes_no_new_launch_until_resolved(personas):
    assert launch(personas, "n:1").status_code == 201
    job = TrainingJob.objects.get(key="llm-7b")
    loop = IncidentFactory(
        job=job, detector="crash_loop", episode="loop-1", fault_type="crash_loop",
        cause="software", severity="critical", summary="5 launches within 30 minutes",
    )  # fmt: skip
    IncidentFactory(job=job)  # an ordinary crash refuses nothing
    r = launch(personas, "n:2")
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "crash_loop"
    assert body["incident"] == loop.pk
    assert f"incident #{loop.pk}" in body["detail"]
    assert "5 launches within 30 minutes" in body["detail"]
    assert LaunchReservation.objects.count() == 1

    loop.state = "resolved"
    loop.save()
    assert launch(personas, "n:2").status_code == 201


def test_the_gate_judges_nothing_for_an_ordinary_job(personas):
    """No finish, no pause, no loop: no refusal (and the gate reads little)."""
    assert launch(personas, "n:1").status_code == 201
    assert Attempt.objects.count() == 0  # a reservation is not a launch until it reports


# --- races (PostgreSQL: real row locks between connections) -----------------------------


def _race(identities: list[str]) -> list:
    cluster = Cluster.objects.get_or_create(name="east")[0]
    start = threading.Barrier(len(identities))
    results: list = [None] * len(identities)

    def run(i, identity):
        try:
            start.wait()
            results[i] = launch_admit(cluster=cluster, job_key="race", identity=identity)
        except Exception as exc:  # shown by the assertion below
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate(identities)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_for_one_identity_get_one_number():
    results = _race(["te:r:0/n:same"] * 8)
    assert all(not isinstance(r, Exception) for r in results), results
    assert {r.attempt for r in results} == {1}
    assert sum(r.created for r in results) == 1
    assert LaunchReservation.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_for_different_identities_get_different_numbers():
    results = _race([f"te:r:0/n:{i}" for i in range(8)])
    assert all(not isinstance(r, Exception) for r in results), results
    assert sorted(r.attempt for r in results) == list(range(1, 9))
    assert all(r.created for r in results)
    assert TrainingJob.objects.filter(key="race").count() == 1
