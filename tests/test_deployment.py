"""The console as deployed past one machine (README "Deploying"), on real parts: two
gunicorn web processes and two Celery workers that split the queues (one for detection,
one for recovery and the periodic work, with beat), all reaching PostgreSQL through a
PgBouncer in transaction mode, on Redis.

Under load (batches posted to both web processes), the detection worker is killed
(SIGKILL). Meanwhile a recovery action is asked for, approved and carried out to its
end; detection waits. When a detection worker is back, its backlog drains: every
posted event is stored exactly once, and every crash reported becomes one incident.
"""

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from common.models import OutboxEntry
from console.services import token_issue
from incidents.models import Incident
from jobs.models import Cluster, Event, Node
from jobs.services.follow_up import EVENTS_STORED_TASK
from recovery.models import Action
from tests.factories import UserFactory
from tests.processes import (
    PgBouncer,
    Server,
    celery_worker,
    need_program,
    queue_depth,
    queue_prefix,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
    pytest.mark.timeout(240),
]

JOBS = ["dep-a", "dep-b", "dep-c", "dep-d"]
DETECTION_TASKS = (EVENTS_STORED_TASK, "incidents.open_reported", "incidents.detect_job")
# The detection worker's queues and the other's, as deploy/systemd starts them.
DETECTING = ("detect", "upkeep")
RECOVERING = ("default", "recovery")


class Load(threading.Thread):
    """Posts a batch of 100 steps per job in turn, alternately to each web process, until
    stopped; `crash(job)` puts a crash (and the next launch) in the job's next batch.
    Counts what it sent, per job; any answer but 202 stops it (`error`)."""

    def __init__(self, servers, token):
        super().__init__(daemon=True)
        self.servers, self.token = servers, token
        self.stop = threading.Event()
        self.sent = dict.fromkeys(JOBS, 0)
        self.crashed: dict[str, int] = {}
        self.crash_asked: set[str] = set()
        self.batches = 0
        self.first_batch: list[dict] = []
        self.error = ""
        t0 = time.time() - 120  # the launch's warm-up long done (no hang)
        self.state = {
            job: {"attempt": 1, "step": 0, "ts": t0, "new": launch(job, 1, t0)} for job in JOBS
        }

    def crash(self, job: str) -> None:
        self.crash_asked.add(job)

    def batch(self, job: str) -> list[dict]:
        s = self.state[job]
        events, s["new"] = s["new"], []
        for _ in range(100):
            s["step"] += 1
            s["ts"] += 0.01
            events.append(
                {"id": f"p{s['attempt']}-{s['step']}", "job": job, "kind": "step"}
                | {"ts": s["ts"], "attempt": s["attempt"], "data": {"step": s["step"]}}
            )
        if job in self.crash_asked and job not in self.crashed:
            events += crash(job, s["attempt"], s["ts"] + 0.001)
            self.crashed[job] = s["attempt"]
            s["attempt"] += 1
            s["ts"] += 1
            events += launch(job, s["attempt"], s["ts"])
        return events

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for job in JOBS:
                    events = self.batch(job)
                    server = self.servers[self.batches % len(self.servers)]
                    r = post(server, self.token, events)
                    if r.status_code != 202 or r.json() != {
                        "accepted": len(events),
                        "duplicates": 0,
                    }:
                        raise AssertionError(f"{server.url}: {r.status_code} {r.text[:500]}")
                    self.sent[job] += len(events)
                    self.first_batch = self.first_batch or events
                    self.batches += 1
                time.sleep(0.05)
        except Exception as exc:  # the test reads it
            self.error = repr(exc)


def launch(job, attempt, ts):
    return [
        {"id": f"s{attempt}", "job": job, "kind": "attempt_started", "ts": ts, "attempt": attempt}
        | {"data": {"world_size": 8, "gpus_per_node": 8, "nodes": [f"{job}-n"]}},
        {"id": f"r{attempt}", "job": job, "kind": "ready", "ts": ts + 0.5, "attempt": attempt},
    ]


def crash(job, attempt, ts):
    return [
        {"id": f"f{attempt}", "job": job, "kind": "fault", "ts": ts, "attempt": attempt}
        | {"node": f"{job}-n", "data": {"type": "crash", "message": "segfault"}},
        {"id": f"e{attempt}", "job": job, "kind": "attempt_ended", "ts": ts + 0.001}
        | {"attempt": attempt, "data": {"reason": "failed", "exit_code": 139}},
    ]


def post(server, token, events):
    return requests.post(
        server.url + "/api/v1/ingest",
        json={"events": events},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def until(predicate, what, timeout_s, check=lambda: None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check()
        result = predicate()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def crash_incidents(job):
    return Incident.objects.filter(job__key=job, fault_type="crash")


def detection_waiting() -> int:
    """Detection work asked for and not yet taken by a worker (the outbox's rows)."""
    return OutboxEntry.objects.filter(task__in=DETECTION_TASKS).count()


def test_a_detection_backlog_delays_no_recovery_and_loses_nothing(tmp_path, personas):
    need_program("pgbouncer", "apt-get install pgbouncer")
    began = time.monotonic()
    bouncer = PgBouncer(tmp_path / "pgbouncer", pool_size=4)
    bouncer.start()
    env = {
        "DATABASE_URL": bouncer.url,
        "REBOUND_DB_POOLER": "transaction",
        "REBOUND_DETECT_DEBOUNCE_S": "0.5",
        "REBOUND_LEDGER_DEBOUNCE_S": "0.5",
    }
    prefix = queue_prefix()
    detect_queue = f"{prefix}.detect"
    logs = {name: tmp_path / f"{name}.log" for name in ("recovery", "detect", "detect-2")}
    east = Cluster.objects.get(name="east")  # the ingest persona's
    Node.objects.create(cluster=east, name="idle-1")
    _, token = token_issue(scope="ingest", cluster_name="east")
    operator2 = UserFactory(username="operator2", role="operator")
    _, operator2_token = token_issue(scope="operator", username=operator2.username)
    servers = [Server(tmp_path / f"web-{i}", env=env) for i in range(2)]
    load = None
    worker_kw = {"prefix": prefix, "env": env, "loglevel": "INFO"}
    try:
        with (
            celery_worker(
                roles=RECOVERING,
                beat_schedule=tmp_path / "beat",
                logfile=logs["recovery"],
                **worker_kw,
            ) as recovery_worker,
            celery_worker(roles=DETECTING, logfile=logs["detect"], **worker_kw) as detect_worker,
        ):
            with ThreadPoolExecutor(len(servers)) as pool:  # both start at once
                for started in [pool.submit(s.start, timeout=90) for s in servers]:
                    started.result()

            def alive():
                assert not load.error, load.error
                assert recovery_worker.poll() is None, logs["recovery"].read_text()[-3000:]

            load = Load(servers, token)
            load.start()
            up_s = time.monotonic() - began
            # Through PgBouncer, end to end: a crash becomes its incident.
            load.crash("dep-a")
            until(lambda: crash_incidents("dep-a").exists(), "dep-a's incident", 30, alive)

            os.kill(detect_worker.pid, signal.SIGKILL)
            detect_worker.wait()
            killed = time.monotonic()
            load.crash("dep-b")
            load.crash("dep-c")
            until(lambda: {"dep-b", "dep-c"} <= set(load.crashed), "the crashes posted", 10, alive)

            # An operator asks, on one web process, to cordon a node; another approves
            # on the other; the recovery worker carries it out with detection down.
            headers = {"Authorization": f"Bearer {personas['operator'].token}"}
            body = {"kind": "cordon_node", "cluster": "east", "node": "idle-1", "reason": "test"}
            r = requests.post(
                servers[0].url + "/api/v1/actions/", json=body, headers=headers, timeout=30
            )
            assert r.status_code == 201, r.text
            action_id = r.json()["id"]
            if r.json()["state"] == Action.State.AWAITING_APPROVAL:
                r = requests.post(
                    f"{servers[1].url}/api/v1/actions/{action_id}/approve",
                    json={"comment": "go"},
                    headers={"Authorization": f"Bearer {operator2_token}"},
                    timeout=30,
                )
                assert r.status_code == 200, r.text
            action = until(
                lambda: Action.objects.filter(
                    pk=action_id, state__in=Action.TERMINAL_STATES
                ).first(),
                "the cordon to end",
                20,
                alive,
            )
            assert action.state == Action.State.SUCCEEDED, (action.error, action.output)
            acted_s = time.monotonic() - killed
            # ... while detection was down: its work waited, the crashes had no incident yet.
            assert detect_worker.poll() is not None
            assert queue_depth(detect_queue) > 0
            assert detection_waiting() > 0
            assert not crash_incidents("dep-b").exists() and not crash_incidents("dep-c").exists()
            backlog = queue_depth(detect_queue)

            with celery_worker(roles=DETECTING, logfile=logs["detect-2"], **worker_kw):
                back = time.monotonic()
                # What the dead worker held (debounced work it had taken) is sent again by
                # the outbox's drain (beat, on the other worker) RESEND_S after it was due.
                until(
                    lambda: all(crash_incidents(j).exists() for j in ("dep-b", "dep-c")),
                    "the incidents of the crashes reported while detection was down",
                    45,
                    alive,
                )
                opened_s = time.monotonic() - back
                load.stop.set()
                load.join(30)
                assert not load.error, load.error
                until(
                    lambda: detection_waiting() == 0 and queue_depth(detect_queue) == 0,
                    "the detection backlog to drain",
                    45,
                )
                drained_s = time.monotonic() - back
                # A batch sent again is stored once.
                r = post(servers[1], token, load.first_batch)
                assert r.json() == {"accepted": 0, "duplicates": len(load.first_batch)}, r.text
    finally:
        if load is not None:
            load.stop.set()
            load.join(30)
        for server in servers:
            server.stop()
        pgbouncer_log = bouncer.log()
        bouncer.stop()
    for job in JOBS:
        assert Event.objects.filter(job__key=job).count() == load.sent[job], job
    assert set(load.crashed) == {"dep-a", "dep-b", "dep-c"}
    for job in JOBS:
        opened = list(Incident.objects.filter(job__key=job).values_list("fault_type", flat=True))
        assert opened == (["crash"] if job in load.crashed else []), (job, opened)
    for name, log in logs.items():
        assert "Traceback" not in log.read_text(), (name, log.read_text()[-3000:])
    for server in servers:
        assert "Traceback" not in server.output, server.output[-3000:]
    assert "prepared statement" not in pgbouncer_log
    print(
        f"stack up in {up_s:.1f} s; {sum(load.sent.values())} events in {load.batches} batches;"
        " the cordon done"
        f" {acted_s:.1f} s after the kill with {backlog} message(s) waiting for detection;"
        f" incidents {opened_s:.1f} s and backlog drained {drained_s:.1f} s after the return"
    )
