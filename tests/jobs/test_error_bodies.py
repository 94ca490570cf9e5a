"""The jobs API's error answers, body for body: what clients branch on (`error`), what
they show (`detail`) and the fields beside them. The services raise them as
common.errors classes and the API's one handler answers them; these pin the answers."""

import pytest

from jobs.models import Event
from tests.jobs.test_history import finished_job, reopen
from tests.jobs.test_ingest import T0, ev, launch

pytestmark = pytest.mark.django_db


def post(personas, body: bytes, **headers):
    return (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data=body, content_type="application/json", **headers)
    )


def test_an_encoding_other_than_gzip_is_a_415(personas):
    r = post(personas, b'{"events": []}', HTTP_CONTENT_ENCODING="br")
    assert r.status_code == 415
    assert r.json() == {
        "error": "unsupported_encoding",
        "detail": "Content-Encoding 'br' is not supported; send gzip or no encoding.",
    }


def test_a_body_of_the_wrong_shape_names_its_field(personas):
    r = post(personas, b'{"events": [], "extra": 1}')
    assert r.status_code == 400
    reason = "unknown field; the body holds only 'events'"
    assert r.json() == {
        "error": "invalid_body",
        "detail": f"extra: {reason}",
        "errors": [{"index": None, "field": "extra", "reason": reason}],
    }


def test_a_body_that_is_no_json_is_a_400(personas):
    r = post(personas, b"{")
    assert r.status_code == 400
    body = r.json()
    assert set(body) == {"error", "detail", "errors"}
    assert body["error"] == "invalid_body"
    [error] = body["errors"]
    assert error["index"] is None and error["field"] == "body"
    assert error["reason"].startswith("not valid JSON: ")
    assert body["detail"] == f"body: {error['reason']}"


def test_too_many_events_is_a_413(ingest):
    r = ingest([ev(i, "step", i * 0.001, step=i) for i in range(5001)])
    assert r.status_code == 413
    assert r.json() == {
        "error": "too_many_events",
        "detail": "5001 events; a request may carry at most 5000.",
    }


def test_invalid_events_are_listed(ingest):
    r = ingest([ev(1, "step", 1, step=-1), ev(2, "nope", 2)])
    assert r.status_code == 400
    body = r.json()
    assert set(body) == {"error", "detail", "errors"}
    assert body["error"] == "invalid_events"
    assert body["detail"] == "2 of 2 events are invalid; nothing was stored."
    assert {e["index"] for e in body["errors"]} == {0, 1}


def test_a_job_of_another_cluster_is_a_403(ingest):
    ingest(launch("j1"))
    r = ingest(launch("j1"), persona="ingest_west")
    assert r.status_code == 403
    assert r.json() == {
        "error": "forbidden_job",
        "detail": "This token's cluster 'west' does not own job(s): j1.",
        "jobs": ["j1"],
    }


def test_a_new_launch_of_a_finished_job_is_a_409_saying_how_to_reopen(ingest):
    finished_job(ingest)
    r = ingest(
        [
            ev(40, "attempt_started", 100, attempt=2, world_size=8),
            ev(41, "attempt_started", 101, attempt=3, world_size=8),
        ]
    )
    assert r.status_code == 409
    body = r.json()
    assert set(body) == {"error", "detail", "conflicts"}
    assert body["error"] == "history_conflict"
    first = body["conflicts"][0]
    assert first["stored"] == {"finished_at": "2026-09-21T14:13:51Z"}
    assert body["detail"] == (
        f"{first['reason']}; and 1 more (POST /api/v1/jobs/j1/reopen)."
        " Nothing of this request was stored."
    )
    assert Event.objects.filter(client_id__in=["e40", "e41"]).count() == 0


def test_a_second_start_of_a_launch_is_a_409_naming_the_stored_one(ingest):
    ingest(launch())
    r = ingest([{**launch()[0], "id": "again"}])
    assert r.status_code == 409
    body = r.json()
    [conflict] = body["conflicts"]
    assert conflict == {
        "index": 0,
        "job": "j1",
        "attempt": 1,
        "reason": conflict["reason"],
        "stored": {"event": "e1", "started_at": "2026-09-21T14:13:20Z"},
    }
    assert body["detail"] == f"{conflict['reason']}. Nothing of this request was stored."


def test_reopening_a_running_job_is_a_409(ingest, personas):
    ingest(launch())
    r = reopen(personas)
    assert r.status_code == 409
    assert r.json() == {
        "error": "not_finished",
        "detail": "job 'j1' is not finished; there is nothing to reopen.",
        "job": "j1",
    }


@pytest.mark.parametrize(
    ("query", "field", "detail"),
    [
        (
            "start=yesterday",
            "start",
            "start must be unix seconds or an RFC 3339 time with an offset.",
        ),
        (f"start={T0 + 10}&end={T0}", "end", "end must not be before start."),
    ],
)
def test_a_bad_window_names_its_parameter(ingest, personas, query, field, detail):
    ingest(launch())
    r = personas["viewer"].client().get(f"/api/v1/jobs/j1/goodput?{query}")
    assert r.status_code == 400
    assert r.json() == {"error": "invalid_parameter", "detail": detail, "field": field}


def test_a_bad_status_filter_names_the_choices(personas):
    r = personas["viewer"].client().get("/api/v1/jobs/?status=lost")
    assert r.status_code == 400
    body = r.json()
    assert body["error"] == "invalid_parameter" and body["field"] == "status"
    assert body["detail"].startswith("status must be one of ")
