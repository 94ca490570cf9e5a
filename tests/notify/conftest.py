"""Notify fixtures: a local HTTP receiver (http.server in a thread on a free port) that
records what it is sent and answers with the statuses it is told, a cluster `east`
with a running job, incidents made to order, channels and rules."""

from __future__ import annotations

import http.server
import json
import threading
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest

from notify.models import Channel, Rule
from tests.factories import (
    AttemptFactory,
    ClusterFactory,
    IncidentFactory,
    NodeFactory,
    TrainingJobFactory,
)
from tests.processes import free_port

T0 = 1_790_000_000.0
SECRET = "s3cret-hmac-key"
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


class Receiver:
    """What a webhook, Slack or PagerDuty endpoint would see: each request's path,
    headers, raw body and arrival (time.monotonic()). `statuses` are answered in turn
    (the last one again once they run out)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.statuses = [200]
        self.lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def bodies(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests]


@contextmanager
def running_receiver():
    import time

    receiver = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body,
                        "at": time.monotonic(),
                    }
                )
                n = len(receiver.requests)
                status = receiver.statuses[min(n, len(receiver.statuses)) - 1]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}' if status < 300 else b'{"status": "no"}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", receiver.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver():
    with running_receiver() as r:
        yield r


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="east")


@pytest.fixture
def job(cluster):
    nodes = [NodeFactory(cluster=cluster, name=f"n{i:02d}", gpus=8) for i in range(1, 5)]
    job = TrainingJobFactory(key="llm", cluster=cluster, first_event_ts=T0, last_event_ts=T0)
    AttemptFactory(
        job=job, number=1, world_size=16, gpus_per_node=8, started_at=dt(T0), nodes=nodes[:2]
    )
    return job


_episode = iter(range(1, 10**6))


def make_incident(job, *, cause="gpu", severity="critical", fault_type="gpu_xid", **fields):
    return IncidentFactory(
        job=job,
        cause=cause,
        severity=severity,
        fault_type=fault_type,
        episode=fields.pop("episode", f"ep{next(_episode)}"),
        summary=fields.pop("summary", f"{fault_type} on n01"),
        fault_at=fields.pop("fault_at", dt(T0 + 990)),
        detected_at=fields.pop("detected_at", dt(T0 + 995)),
        lost_gpu_seconds=fields.pop("lost_gpu_seconds", 7200.0),
        **fields,
    )


def make_channel(kind="webhook", url="", **fields) -> Channel:
    name = fields.pop("name", f"{kind}-channel")
    defaults = {"secret": SECRET if kind == "webhook" else ROUTING_KEY}
    if kind == "email":
        defaults = {"emails": ["sre@example.com", "oncall@example.com"]}
    return Channel.objects.create(name=name, kind=kind, url=url, **{**defaults, **fields})


def make_rule(channel, **fields) -> Rule:
    return Rule.objects.create(
        name=fields.pop("name", f"rule-{channel.name}"), channel=channel, **fields
    )
