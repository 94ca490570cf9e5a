"""The broker going away under a running console: a Redis of the test's own, killed and
restarted under a gunicorn server and a worker with beat (as scripts/run starts them).

Nothing reported while the broker is away is lost (the outbox keeps the work in the
database), the worker outlives every restart, and a crash reported during an outage
becomes its incident within seconds of the broker's return.
"""

import shutil
import signal
import subprocess
import threading
import time

import pytest
import requests

from common.models import OutboxEntry
from common.outbox import RESEND_S
from console.services import token_issue
from incidents.models import Incident
from jobs.models import Event
from tests.processes import Server, celery_worker, free_port

pytestmark = [
    pytest.mark.postgres,  # the worker and the server share the test database
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
    pytest.mark.timeout(300),  # gunicorn and the worker start slowly on a busy machine
]


class RedisServer:
    """A redis-server on a free port, with nothing kept across a restart (its data is
    wiped, as a restarted broker without persistence loses its queues)."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import redis

                redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return
            except Exception:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def stop(self, sig=signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def stack(tmp_path, redis_server):
    """A worker with beat and a gunicorn server, both on the test's Redis; yields
    (server, worker, token, the worker's log file)."""
    env = {"REDIS_URL": redis_server.url}
    log = tmp_path / "worker.log"
    with celery_worker(env=env, beat_schedule=tmp_path / "beat", logfile=log) as worker:
        server = Server(tmp_path / "server", env=env)
        (tmp_path / "server").mkdir()
        server.start(timeout=90)  # a busy machine starts gunicorn slowly
        _, token = token_issue(scope="ingest", cluster_name="east")
        try:
            yield server, worker, token, log
        finally:
            server.stop()
    assert "Unrecoverable error" not in log.read_text()
    assert worker.returncode == 0, worker.output[-3000:]  # a warm shutdown, at the end


@pytest.fixture
def t0():
    """When the test's first launch began: two minutes back, taken when the test starts
    (a time taken at import would age through a long run until the launch's warm-up
    outlasts hang.warmup_timeout_s and a hang incident takes the crash's place)."""
    return time.time() - 120


def launch(job, attempt, ts):
    return [
        {"id": f"s{attempt}", "job": job, "kind": "attempt_started", "ts": ts, "attempt": attempt}
        | {"data": {"world_size": 2, "gpus_per_node": 2, "nodes": [f"{job}-n"]}},
        {"id": f"r{attempt}", "job": job, "kind": "ready", "ts": ts + 1, "attempt": attempt},
    ]


def crash(job, attempt, ts):
    return [
        {"id": f"f{attempt}", "job": job, "kind": "fault", "ts": ts, "attempt": attempt}
        | {"node": f"{job}-n", "data": {"type": "crash", "message": "segfault"}},
        {"id": f"e{attempt}", "job": job, "kind": "attempt_ended", "ts": ts + 1}
        | {"attempt": attempt, "data": {"reason": "failed", "exit_code": 139}},
    ]


def post(server, token, events, timeout=10):
    began = time.monotonic()
    r = requests.post(
        server.url + "/api/v1/ingest",
        json={"events": events},
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )
    assert r.status_code == 202, r.text
    return time.monotonic() - began


def wait_for(predicate, timeout, worker):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        assert worker.poll() is None, "the worker exited"
        time.sleep(0.2)
    return predicate()


def what_happened(job, log) -> str:
    """What a failure shows: the job's incidents and events, the work the outbox still
    holds, and the worker's log."""
    incidents = list(Incident.objects.filter(job__key=job).values("fault_type", "state"))
    kinds = list(Event.objects.filter(job__key=job).values_list("kind", flat=True))
    held = list(OutboxEntry.objects.values("task", "key", "due_at", "retry_at"))
    return f"incidents {incidents}\nevents {kinds}\noutbox {held}\n{log.read_text()[-6000:]}"


def crash_incidents(job):
    return Incident.objects.filter(job__key=job, fault_type="crash")


def test_the_worker_outlives_a_redis_kill_and_a_sigterm_restart(stack, redis_server, t0):
    server, worker, token, log = stack
    post(server, token, launch("k", 1, t0))
    for sig in (signal.SIGKILL, signal.SIGTERM):
        redis_server.stop(sig)
        time.sleep(2)
        redis_server.start()
        time.sleep(3)
        assert worker.poll() is None, log.read_text()[-3000:]
    # ... and it carries on: a crash reported now opens its incident. A task sent in the
    # moment around a restart can go with the broker's data; the outbox sends it again
    # after RESEND_S, so that is the bound here.
    post(server, token, crash("k", 1, t0 + 30))
    waited = RESEND_S + 20
    assert wait_for(lambda: crash_incidents("k").exists(), waited, worker), what_happened("k", log)
    assert "Connection to broker lost" in log.read_text()  # it did see both go


def test_a_crash_reported_during_an_outage_opens_within_seconds_of_the_return(
    stack, redis_server, t0
):
    server, worker, token, log = stack
    post(server, token, launch("o", 1, t0))
    redis_server.stop(signal.SIGKILL)
    outage_began = time.monotonic()
    time.sleep(5)
    # The broker is away: ingest still answers 202 at once, and stores the batch.
    assert post(server, token, crash("o", 1, t0 + 30)) < 5
    assert Event.objects.filter(job__key="o", kind="fault").exists()
    time.sleep(max(0.0, 30 - (time.monotonic() - outage_began)))
    assert not crash_incidents("o").exists()
    redis_server.start()
    back = time.monotonic()
    assert wait_for(lambda: crash_incidents("o").exists(), 10, worker), log.read_text()[-3000:]
    print(f"incident {time.monotonic() - back:.1f} s after the broker's return")


def test_three_redis_restarts_under_load_lose_no_event_and_no_incident(stack, redis_server, t0):
    server, worker, token, log = stack
    jobs = ["la", "lb"]
    sent = dict.fromkeys(jobs, 0)
    crashes = dict.fromkeys(jobs, 0)
    stop = threading.Event()
    errors = []

    def load(job):
        attempt, step, ts = 1, 0, t0
        events = launch(job, attempt, ts)
        try:
            while not stop.is_set():
                for _ in range(50):
                    step += 1
                    ts += 0.01
                    events.append(
                        {"id": f"p{attempt}-{step}", "job": job, "kind": "step", "ts": ts}
                        | {"attempt": attempt, "data": {"step": step}}
                    )
                if step % 500 == 0:  # a crash every ten batches, then a new launch
                    events += crash(job, attempt, ts + 0.001)
                    crashes[job] += 1
                    attempt += 1
                    ts += 1
                    events += launch(job, attempt, ts)
                post(server, token, events)
                sent[job] += len(events)
                events = []
                time.sleep(0.05)
        except Exception as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    try:
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            time.sleep(4)
            redis_server.stop(sig)
            time.sleep(3)
            redis_server.start()
    finally:
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    for job in jobs:
        assert crashes[job] >= 2
        assert Event.objects.filter(job__key=job).count() == sent[job]  # no event lost
    # Every crash becomes its incident: what the wiped Redis lost is sent again.
    assert wait_for(
        lambda: all(crash_incidents(j).count() == crashes[j] for j in jobs), 60, worker
    ), ({j: crash_incidents(j).count() for j in jobs}, crashes, log.read_text()[-3000:])
    assert worker.poll() is None
