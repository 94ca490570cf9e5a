"""Stand-ins for the reporter's tests: a fake ingest endpoint and a TCP proxy.

`FakeConsole` answers `POST /api/v1/ingest` like the console does (dedup on
id, 400 naming bad indexes, 401 for a wrong token), hands out launch numbers
(`POST /api/v1/launches`) and can be told to fail
the next requests, answer slowly, or stop and start again on the same port.
`TcpProxy` sits between a reporter and a real server and can be cut.
"""

import contextlib
import gzip
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "test-token"


def wait_for(predicate, timeout=5.0, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass
class Request:
    at: float
    status: int
    ids: list
    gzip: bool
    raw_bytes: int
    body_bytes: int


class FakeConsole:
    def __init__(self):
        self.lock = threading.Lock()
        self.stored: dict[str, dict] = {}  # id -> event, the first delivery wins
        self.order: list[str] = []
        self.launches: dict[str, dict[str, int]] = {}  # job -> launch identity -> number
        self.requests: list[Request] = []
        # What the next requests get: a status, (status, headers), or ("slow", seconds):
        # stored as usual, but the answer comes that much later.
        self.script: deque = deque()
        self.refuse_token = False
        self.port = None
        self._server = None
        self._conns: set[socket.socket] = set()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        server = ThreadingHTTPServer(("127.0.0.1", self.port or 0), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def stop(self):
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for conn in list(self._conns):  # kept-alive connections too
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def kinds(self):
        with self.lock:
            return [self.stored[i]["kind"] for i in self.order]

    def answer(self, path, headers, events, raw_bytes, body_bytes, gz):
        with self.lock:
            step = self.script.popleft() if self.script else None
        slow = 0.0
        extra = {}
        if isinstance(step, tuple) and step[0] == "slow":
            slow, step = step[1], None
        if isinstance(step, tuple):
            step, extra = step
        ids = [e.get("id") for e in events]
        if step is not None:
            status, body = step, {"error": "scripted", "detail": f"scripted {step}"}
        elif path != "/api/v1/ingest":
            status, body = 404, {"error": "not_found"}
        elif headers.get("Authorization") != f"Bearer {TOKEN}" or self.refuse_token:
            status, body = 401, {"error": "authentication_failed"}
        else:
            status, body = self._ingest(events)
        with self.lock:
            self.requests.append(Request(time.monotonic(), status, ids, gz, raw_bytes, body_bytes))
        time.sleep(slow)
        return status, body, extra

    def launch(self, body):
        """`POST /api/v1/launches`: a number per launch identity, as the console hands out."""
        with self.lock:
            job = self.launches.setdefault(body["job"], {})
            created = body["launch"] not in job
            if created:
                job[body["launch"]] = len(job) + 1
            answer = {"job": body["job"], "attempt": job[body["launch"]], "launch": body["launch"]}
        return (201 if created else 200), {**answer, "created": created}

    def _ingest(self, events):
        errors = []
        for i, ev in enumerate(events):
            data = ev.get("data") or {}
            if data.get("poison"):
                # Like a body the console cannot read at all: no index to blame.
                return 400, {
                    "error": "invalid_body",
                    "errors": [{"index": None, "field": "body", "reason": "unreadable"}],
                }
            if data.get("bad"):
                errors.append({"index": i, "field": "data.bad", "reason": "bad on purpose"})
        if errors:
            return 400, {"error": "invalid_events", "detail": "invalid", "errors": errors}
        accepted = 0
        with self.lock:
            for ev in events:
                if ev["id"] not in self.stored:
                    self.stored[ev["id"]] = ev
                    self.order.append(ev["id"])
                    accepted += 1
        return 202, {"accepted": accepted, "duplicates": len(events) - accepted}


def _handler(console: FakeConsole):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real console behind a proxy
        disable_nagle_algorithm = True  # headers and body are two writes

        def setup(self):
            super().setup()
            console._conns.add(self.connection)

        def finish(self):
            console._conns.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def log_message(self, *args):
            pass

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            gz = self.headers.get("Content-Encoding") == "gzip"
            body = gzip.decompress(raw) if gz else raw
            if self.path == "/api/v1/launches":
                (status, payload), extra = console.launch(json.loads(body)), {}
            else:
                events = json.loads(body)["events"]
                status, payload, extra = console.answer(
                    self.path, self.headers, events, len(raw), len(body), gz
                )
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (a timeout test)

    return Handler


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target`; `stop` cuts every connection, `start` reopens."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = None
        self._sock = None
        self._thread = None
        self._stopped = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port or 0))
        sock.listen(64)
        sock.settimeout(0.02)
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, args=(sock, self._stopped))
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self):
        if self._sock is None:
            return
        self._stopped.set()
        self._thread.join(2)
        self._sock.close()
        self._sock = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, sock, stopped):
        while not stopped.is_set():
            try:
                client, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
