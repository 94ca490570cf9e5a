"""How ingest reads a body: chunked transfer encoding through a real gunicorn, and
gzip bodies of several members, within the 5 MiB limit either way."""

import gzip
import json

import pytest
import requests

from console.services import token_issue
from jobs.models import Event
from tests.processes import Server

T0 = 1_790_000_000.0


def events(n, job="j1", start=0):
    return [
        {"id": f"e{i}", "job": job, "kind": "step", "ts": T0 + i, "attempt": 1, "data": {"step": i}}
        for i in range(start, start + n)
    ]


def body_of(evs) -> bytes:
    return json.dumps({"events": evs}).encode()


@pytest.fixture
def server(tmp_path, transactional_db):
    s = Server(tmp_path / "var")
    s.start()
    yield s
    s.stop()


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_is_read_whole_under_gunicorn(server):
    _, token = token_issue(scope="ingest", cluster_name="east")
    body = body_of(events(300))

    def pieces():  # requests sends a generator with Transfer-Encoding: chunked
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    r = requests.post(
        server.url + "/api/v1/ingest",
        data=pieces(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": 300, "duplicates": 0}
    assert Event.objects.count() == 300


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_past_the_limit_is_a_413_under_gunicorn(server):
    _, token = token_issue(scope="ingest", cluster_name="east")
    chunk = b" " * 65536

    def pieces():
        yield b'{"events": ['
        for _ in range(6 * 16):  # 6 MiB of blanks
            yield chunk
        yield b"]}"

    r = requests.post(
        server.url + "/api/v1/ingest",
        data=pieces(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "too_large"


def gzip_post(personas, body: bytes):
    return (
        personas["ingest"]
        .client()
        .post(
            "/api/v1/ingest",
            data=body,
            content_type="application/json",
            HTTP_CONTENT_ENCODING="gzip",
        )
    )


@pytest.mark.django_db
def test_a_gzip_body_of_two_members_is_read_whole(personas):
    text = body_of(events(50))
    half = len(text) // 2
    body = gzip.compress(text[:half]) + gzip.compress(text[half:])
    r = gzip_post(personas, body)
    assert r.status_code == 202, r.content
    assert r.json()["accepted"] == 50


@pytest.mark.django_db
def test_gzip_members_together_past_the_limit_are_a_413(personas):
    member = gzip.compress(b" " * (3 * 1024 * 1024))
    body = gzip.compress(b'{"events": [') + member + member + gzip.compress(b"]}")
    r = gzip_post(personas, body)
    assert r.status_code == 413, r.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "tail", [b"garbage", gzip.compress(b"x")[:10]], ids=["not-gzip", "truncated-member"]
)
def test_a_gzip_body_with_a_bad_tail_is_a_400(personas, tail):
    r = gzip_post(personas, gzip.compress(body_of(events(3))) + tail)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_body"
    assert Event.objects.count() == 0


@pytest.mark.django_db
def test_a_truncated_gzip_body_is_a_400(personas):
    r = gzip_post(personas, gzip.compress(body_of(events(3)))[:-12])
    assert r.status_code == 400, r.content
    assert Event.objects.count() == 0
