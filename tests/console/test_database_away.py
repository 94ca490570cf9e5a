"""A database that is away (restarting, failing over, cut off) is a 503 with
Retry-After, for the API and the pages, never a 500; when it is back the console
answers again. gunicorn reaches the test database through a TCP proxy the test cuts
and restores."""

import contextlib
import json
import socket
import threading
import time

import pytest
import requests
from django.db import connection
from django.test import Client

from jobs.models import Event
from tests.console.conftest import PRODUCTION
from tests.processes import Server, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class TcpProxy:
    """127.0.0.1:<port> forwarded to PostgreSQL. `cut()` drops every connection and
    stops listening (a database that went away); `restore()` listens again."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = free_port()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def restore(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR
        listener.settimeout(0.2)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy():
    s = connection.settings_dict
    p = TcpProxy((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    p.restore()
    yield p
    if p._listener is not None:
        p.cut()


def _heartbeat(i: int) -> str:
    # With data, so stored as an event (a plain heartbeat only moves its node's bucket).
    event = {"id": f"hb-{i}", "job": "db-away", "kind": "heartbeat", "ts": time.time()}
    event["data"] = {"probe": i}
    return json.dumps({"events": [{**event, "node": "n1"}]})


@pytest.mark.parametrize("mode", ["debug", "production"])
def test_a_database_away_is_a_503_with_retry_after_and_then_it_answers_again(
    tmp_path, personas, proxy, collected_static, mode
):
    s = connection.settings_dict
    user = s["USER"] or "postgres"
    env = {"DATABASE_URL": f"postgres://{user}@127.0.0.1:{proxy.port}/{s['NAME']}"}
    if mode == "production":
        env |= {**PRODUCTION, "REBOUND_VAR_DIR": str(collected_static)}
    browser = Client()
    browser.force_login(personas["viewer"].user)
    cookies = {"sessionid": browser.cookies["sessionid"].value}
    ingest = {
        "Authorization": f"Bearer {personas['ingest'].token}",
        "Content-Type": "application/json",
    }
    viewer = {"Authorization": f"Bearer {personas['viewer'].token}"}
    server = Server(tmp_path, env=env)
    server.start()
    try:
        url = server.url
        r = requests.post(f"{url}/api/v1/ingest", _heartbeat(0), headers=ingest, timeout=30)
        assert r.ok, (r.status_code, r.text[:500])
        assert requests.get(f"{url}/", cookies=cookies, timeout=30).status_code == 200

        proxy.cut()
        # The first request finds its kept connection dropped, the next ones cannot connect.
        for i in range(1, 4):
            r = requests.post(f"{url}/api/v1/ingest", _heartbeat(i), headers=ingest, timeout=30)
            assert r.status_code == 503, (r.status_code, r.text[:500])
            assert int(r.headers["Retry-After"]) > 0
            assert r.json()["error"] == "unavailable" and r.json()["detail"]
        r = requests.get(f"{url}/api/v1/jobs/", headers=viewer, timeout=30)
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
        assert int(r.headers["Retry-After"]) > 0
        r = requests.get(f"{url}/", cookies=cookies, timeout=30)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
        assert r.headers["Content-Type"].startswith("text/html") and "try again" in r.text

        proxy.restore()
        r = requests.post(f"{url}/api/v1/ingest", _heartbeat(9), headers=ingest, timeout=30)
        assert r.status_code in (200, 202), r.text[:500]
        assert requests.get(f"{url}/", cookies=cookies, timeout=30).status_code == 200
        assert requests.get(f"{url}/api/v1/jobs/", headers=viewer, timeout=30).ok
    finally:
        server.stop()
    ids = set(Event.objects.filter(job__key="db-away").values_list("client_id", flat=True))
    assert ids == {"hb-0", "hb-9"}, server.output[-3000:]
