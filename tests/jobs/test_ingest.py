"""Ingest API v1: all or nothing, idempotent on (job, id), and every 4xx path."""

import gzip
import json
import math

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from jobs.models import (
    Attempt,
    Checkpoint,
    Cluster,
    Event,
    HeartbeatBucket,
    Node,
    RankWindow,
    StepRecord,
    TrainingJob,
)

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0


def ev(i, kind, ts, job="j1", attempt=1, **data):
    event = {"id": f"e{i}", "job": job, "kind": kind, "ts": T0 + ts, "data": data}
    if attempt is not None:
        event["attempt"] = attempt
    return event


def launch(job="j1"):
    return [
        ev(1, "attempt_started", 0, job, world_size=8, gpus_per_node=4, nodes=["n0", "n1"]),
        ev(2, "ready", 10, job),
        ev(3, "step", 11, job, step=1, loss=2.5, step_time_s=1.0),
        ev(4, "step", 12, job, step=2, loss=2.4),
        ev(5, "checkpoint_save_started", 12, job, step=2),
        ev(6, "checkpoint_saved", 14, job, step=2, blocking_s=2.0, bytes=10, uri="s3://b/2"),
        {
            "id": "e7",
            "job": job,
            "kind": "rank_window",
            "ts": T0 + 14,
            "attempt": 1,
            "node": "n1",
            "rank": 5,
            "data": {"first_step": 1, "last_step": 2, "compute_s": 0.8, "step_s": 1.0},
        },
        {"id": "e8", "job": job, "kind": "heartbeat", "ts": T0 + 15, "node": "n0"},
    ]


def stored_counts():
    return (
        Event.objects.count(),
        StepRecord.objects.count(),
        RankWindow.objects.count(),
        Attempt.objects.count(),
        Checkpoint.objects.count(),
        TrainingJob.objects.count(),
    )


def test_accepts_a_batch_and_projects_it(ingest):
    r = ingest(launch())
    assert r.status_code == 202
    assert r.json() == {"accepted": 8, "duplicates": 0}
    job = TrainingJob.objects.get(key="j1")
    assert job.cluster.name == "east"
    assert job.status == TrainingJob.Status.RUNNING
    assert job.last_step == 2
    assert job.events_count == 7  # stored: the heartbeat is folded into its node's bucket
    attempt = job.attempts.get(number=1)
    assert attempt.world_size == 8
    assert sorted(attempt.nodes.values_list("name", flat=True)) == ["n0", "n1"]
    assert attempt.ready_at.timestamp() == pytest.approx(T0 + 10)
    ck = job.checkpoints.get()
    assert (ck.step, ck.blocking_s, ck.bytes, ck.uri, ck.durable) == (2, 2.0, 10, "s3://b/2", True)
    assert list(job.steps.order_by("step").values_list("step", "loss")) == [(1, 2.5), (2, 2.4)]
    window = job.rank_windows.get()
    assert (window.rank, window.node.name, window.compute_s) == (5, "n1", 0.8)
    n0 = Node.objects.get(name="n0")
    assert n0.last_heartbeat_at.timestamp() == pytest.approx(T0 + 15)
    assert n0.cluster.name == "east"


def test_resending_is_idempotent(ingest):
    ingest(launch())
    before = stored_counts()
    r = ingest(launch())
    assert r.status_code == 202
    # A heartbeat is never stored (its bucket takes it twice the same as once): it is
    # accepted again, and changes nothing.
    assert r.json() == {"accepted": 1, "duplicates": 7}
    assert stored_counts() == before
    assert HeartbeatBucket.objects.count() == 1


def test_duplicates_inside_one_batch_count_once(ingest):
    events = launch()
    r = ingest(events + events[:3])
    assert r.json() == {"accepted": 8, "duplicates": 3}
    assert Event.objects.count() == 7  # and the heartbeat in its bucket


def test_a_step_or_window_resent_under_another_id_is_projected_once(ingest):
    """Stored as events (their ids are new), projected once: the first one wins, in the
    batch and across batches."""
    ingest(launch())
    window = dict(
        launch()[6],
        id="w2",
        data={"first_step": 1, "last_step": 2, "compute_s": 0.5, "step_s": 1.0},
    )
    again = [ev(31, "step", 11, step=1, loss=9.0), window, dict(window, id="w3")]
    r = ingest(again + [ev(32, "step", 16, step=3, loss=2.3), ev(33, "step", 17, step=3, loss=7.0)])
    assert r.json() == {"accepted": 5, "duplicates": 0}
    assert dict(StepRecord.objects.values_list("step", "loss")) == {1: 2.5, 2: 2.4, 3: 2.3}
    assert list(RankWindow.objects.values_list("rank", "compute_s")) == [(5, 0.8)]
    assert Event.objects.count() == 12


def test_partial_resend_counts_new_and_old(ingest):
    events = launch()
    ingest(events[:4])
    r = ingest(events)
    assert r.json() == {"accepted": 4, "duplicates": 4}


def test_out_of_order_delivery_gives_the_same_rows(ingest):
    events = launch()
    r = ingest(list(reversed(events)))
    assert r.status_code == 202
    attempt = Attempt.objects.get(job__key="j1", number=1)
    assert attempt.world_size == 8 and attempt.ready_at is not None
    ck = Checkpoint.objects.get()
    assert ck.save_started_at is not None and ck.saved_at is not None


def test_attempt_end_before_its_start_still_makes_one_attempt(ingest):
    ingest([ev(10, "attempt_ended", 50, reason="failed", exit_code=1)])
    ingest([ev(11, "attempt_started", 0, world_size=4)])
    attempt = Attempt.objects.get(job__key="j1")
    assert (attempt.world_size, attempt.end_reason, attempt.exit_code) == (4, "failed", 1)
    assert TrainingJob.objects.get(key="j1").status == TrainingJob.Status.INTERRUPTED


def test_job_status_follows_the_lifecycle(ingest):
    ingest(launch())
    ingest([ev(20, "attempt_ended", 30, reason="completed"), ev(21, "job_finished", 30)])
    job = TrainingJob.objects.get(key="j1")
    assert job.status == TrainingJob.Status.COMPLETED
    assert job.finished_at is not None


def test_rfc3339_timestamps_are_accepted(ingest):
    r = ingest(
        [
            {
                "id": "a",
                "job": "j1",
                "kind": "attempt_started",
                "ts": "2026-09-21T14:13:20+02:00",
                "attempt": 1,
                "data": {"world_size": 2},
            },
            {"id": "b", "job": "j1", "kind": "ready", "ts": "2026-09-21T12:13:30.5Z", "attempt": 1},
        ]
    )
    assert r.status_code == 202
    ts = sorted(Event.objects.values_list("ts", flat=True))
    assert ts[1] - ts[0] == pytest.approx(10.5)


def test_nan_loss_is_kept_as_a_signal(ingest, personas):
    body = (
        '{"events": [{"id": "a", "job": "j1", "kind": "step", "ts": 1790000001, "attempt": 1,'
        ' "data": {"step": 1, "loss": NaN}}, {"id": "b", "job": "j1", "kind": "step",'
        ' "ts": 1790000002, "attempt": 1, "data": {"step": 2, "loss": "Infinity"}}]}'
    )
    r = (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data=body, content_type="application/json")
    )
    assert r.status_code == 202, r.content
    assert Event.objects.get(client_id="a").data["loss"] == "NaN"
    assert Event.objects.get(client_id="b").data["loss"] == "Infinity"
    losses = dict(StepRecord.objects.values_list("step", "loss"))
    assert losses[2] == math.inf
    if connection.vendor == "sqlite":
        assert losses[1] is None  # SQLite stores NaN as NULL; the raw event keeps it
    else:
        assert math.isnan(losses[1])


def test_gzip_bodies_are_accepted(personas):
    body = gzip.compress(json.dumps({"events": launch()}).encode())
    r = (
        personas["ingest"]
        .client()
        .post(
            "/api/v1/ingest",
            data=body,
            content_type="application/json",
            HTTP_CONTENT_ENCODING="gzip",
        )
    )
    assert r.status_code == 202
    assert r.json()["accepted"] == 8


def test_an_ingest_token_creates_jobs_on_its_own_cluster_only(ingest):
    ingest(launch("j1"))
    r = ingest(launch("j1"), persona="ingest_west")
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden_job"
    assert "j1" in r.json()["detail"]
    assert TrainingJob.objects.get(key="j1").cluster.name == "east"


def test_a_forbidden_job_in_a_batch_rejects_the_whole_batch(ingest):
    ingest(launch("j1"))
    before = stored_counts()
    r = ingest(launch("j2") + launch("j1"), persona="ingest_west")
    assert r.status_code == 403
    assert stored_counts() == before
    assert not TrainingJob.objects.filter(key="j2").exists()


# --- bad input: 400 names each bad event's index, field and reason; nothing stored ---

BAD_EVENTS = [
    ({"id": "", "job": "j1", "kind": "ready", "ts": T0, "attempt": 1}, "id"),
    ({"id": "x" * 129, "job": "j1", "kind": "ready", "ts": T0, "attempt": 1}, "id"),
    ({"job": "j1", "kind": "ready", "ts": T0, "attempt": 1}, "id"),
    ({"id": "a", "job": "no spaces", "kind": "ready", "ts": T0, "attempt": 1}, "job"),
    ({"id": "a", "job": "j1", "kind": "teleport", "ts": T0, "attempt": 1}, "kind"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": "yesterday", "attempt": 1}, "ts"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": "2026-09-21T12:00:00", "attempt": 1}, "ts"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0 * 1000, "attempt": 1}, "ts"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": True, "attempt": 1}, "ts"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0}, "attempt"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": 0}, "attempt"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": "1"}, "attempt"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": 1, "rank": -1}, "rank"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": 1, "node": 7}, "node"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": 1, "data": []}, "data"),
    ({"id": "a", "job": "j1", "kind": "ready", "ts": T0, "attempt": 1, "colour": "red"}, "colour"),
    (
        {"id": "a", "job": "j1", "kind": "attempt_started", "ts": T0, "attempt": 1},
        "data.world_size",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "attempt_started",
            "ts": T0,
            "attempt": 1,
            "data": {"world_size": 0},
        },
        "data.world_size",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "attempt_started",
            "ts": T0,
            "attempt": 1,
            "data": {"world_size": 2, "nodes": "n0"},
        },
        "data.nodes",
    ),
    ({"id": "a", "job": "j1", "kind": "step", "ts": T0, "attempt": 1, "data": {}}, "data.step"),
    (
        {"id": "a", "job": "j1", "kind": "step", "ts": T0, "attempt": 1, "data": {"step": 1.5}},
        "data.step",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "step",
            "ts": T0,
            "attempt": 1,
            "data": {"step": 1, "loss": "high"},
        },
        "data.loss",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "checkpoint_saved",
            "ts": T0,
            "attempt": 1,
            "data": {"step": 1, "blocking_s": -1},
        },
        "data.blocking_s",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "rank_window",
            "ts": T0,
            "attempt": 1,
            "rank": 0,
            "data": {"first_step": 5, "last_step": 4, "compute_s": 1, "step_s": 1},
        },
        "data.last_step",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "rank_window",
            "ts": T0,
            "attempt": 1,
            "data": {"first_step": 1, "last_step": 4, "compute_s": 1, "step_s": 1},
        },
        "rank",
    ),
    ({"id": "a", "job": "j1", "kind": "heartbeat", "ts": T0}, "node"),
    (
        {"id": "a", "job": "j1", "kind": "fault", "ts": T0, "data": {"type": "gremlins"}},
        "data.type",
    ),
    (
        {
            "id": "a",
            "job": "j1",
            "kind": "attempt_ended",
            "ts": T0,
            "attempt": 1,
            "data": {"reason": "bored"},
        },
        "data.reason",
    ),
    ("not an object", ""),
]


@pytest.mark.parametrize(("bad", "field"), BAD_EVENTS)
def test_a_bad_event_rejects_the_batch_naming_index_and_field(ingest, bad, field):
    good = launch()
    r = ingest([*good[:2], bad, *good[2:]])
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["error"] == "invalid_events"
    assert "nothing was stored" in body["detail"]
    assert any(e["index"] == 2 and e["field"] == field and e["reason"] for e in body["errors"]), (
        body
    )
    assert stored_counts() == (0, 0, 0, 0, 0, 0)


def test_every_bad_event_is_named(ingest):
    events = launch()
    events[1]["ts"] = "soon"
    events[4]["kind"] = "?"
    del events[6]["rank"]
    r = ingest(events)
    assert r.status_code == 400
    named = {(e["index"], e["field"]) for e in r.json()["errors"]}
    assert {(1, "ts"), (4, "kind"), (6, "rank")} <= named
    assert r.json()["detail"].startswith("3 of 8 events")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[]", "body"),
        (b'{"events": {}}', "events"),
        (b'{"events": []}', "events"),
        (b'{"events": [], "extra": 1}', "extra"),
        (b"", "body"),
    ],
)
def test_a_malformed_body_is_a_400(personas, body, field):
    r = (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data=body, content_type="application/json")
    )
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == field
    assert Event.objects.count() == 0


def test_more_than_5000_events_is_a_413(ingest):
    events = [ev(i, "step", i * 0.001, step=i) for i in range(5001)]
    r = ingest(events)
    assert r.status_code == 413
    assert r.json()["error"] == "too_many_events"
    assert Event.objects.count() == 0


def test_5000_events_are_accepted(ingest):
    events = [ev(i, "step", i * 0.001, step=i) for i in range(5000)]
    r = ingest(events)
    assert r.status_code == 202
    assert r.json()["accepted"] == 5000


def test_a_body_over_5_mib_is_a_413(personas):
    pad = "x" * 4000
    events = [ev(i, "ready", 0, message=pad) for i in range(1400)]
    body = json.dumps({"events": events})
    assert len(body) > 5 * 1024 * 1024
    r = (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data=body, content_type="application/json")
    )
    assert r.status_code == 413
    assert r.json()["error"] == "too_large"
    assert Event.objects.count() == 0


def test_a_gzip_bomb_is_a_413(personas):
    body = gzip.compress(b'{"events": [' + b" " * (6 * 1024 * 1024) + b"]}")
    r = (
        personas["ingest"]
        .client()
        .post(
            "/api/v1/ingest",
            data=body,
            content_type="application/json",
            HTTP_CONTENT_ENCODING="gzip",
        )
    )
    assert r.status_code == 413


def test_no_token_is_a_401():
    r = APIClient().post("/api/v1/ingest", data={"events": []}, format="json")
    assert r.status_code == 401
    assert r.json()["error"] == "not_authenticated"
    assert r["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_token_is_a_401():
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION="Bearer rbd_nope")
    r = c.post("/api/v1/ingest", data={"events": launch()}, format="json")
    assert r.status_code == 401
    assert Event.objects.count() == 0


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin", "outsider"])
def test_only_ingest_tokens_may_ingest(personas, persona):
    r = personas[persona].client().post("/api/v1/ingest", data={"events": launch()}, format="json")
    assert r.status_code == 403
    assert "ingest" in r.json()["detail"]
    assert Event.objects.count() == 0


def test_a_revoked_token_is_a_401(personas, ingest):
    from console.models import ApiToken

    ApiToken.objects.filter(scope="ingest").update(revoked_at="2026-01-01T00:00:00Z")
    r = ingest(launch())
    assert r.status_code == 401


@override_settings(INGEST_MAX_EVENTS=5)
def test_limits_come_from_settings(ingest):
    assert ingest(launch()).status_code == 413


def test_clusters_are_isolated(ingest):
    ingest(launch("j1"))
    ingest(launch("j2"), persona="ingest_west")
    assert set(Cluster.objects.values_list("name", flat=True)) == {"east", "west"}
    assert Node.objects.filter(cluster__name="west").count() == 2
