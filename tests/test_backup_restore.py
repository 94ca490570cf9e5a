"""Backup and restore, as the README's "Backup and restore" says, of a live console.

A gunicorn server and a Celery worker ingest the worked example (tests/data/samples)
through the API. With the first part of job `sample-small` stored and followed up,
`pg_dump` runs while another job streams into the console (writes in flight); then
the rest of `sample-small` goes to the original. The dump is restored into a new
database with the README's commands, and a second console and worker run on it:

- `sample-small`'s ledger, incidents and reliability figures there are what the
  original answered just before the dump (and a fresh computation of its ledger
  from the restored events agrees), not what the original answers since;
- the job caught mid-stream is consistent: its counters match its stored events,
  and its ledger is what its restored events give;
- the outbox restored with it drains on the restored worker;
- a resend of stored events is taken as duplicates, the rest of the trace as new,
  and the restored console ends where the original did: the worked example's figures.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import requests

from console.services import token_issue
from tests.live import database_quiet
from tests.processes import ROOT, Server, celery_worker, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

JOB = "sample-small"
STREAMED = "sample-streamed"  # the job in flight while pg_dump runs
# The first part of the trace: two faults (a crash, recovered; a loss spike, resumed).
CUT_TS = 1_790_000_500.0
# Reliability over a window holding the whole trace (the default, the last 30 days, does not).
WINDOW = {"start": "2026-09-01T00:00:00Z", "end": "2026-10-01T00:00:00Z"}


def readme_commands() -> list[str]:
    """The shell blocks of the README's "Backup and restore": back up, restore, after."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^### Backup and restore\n(.*?)(?=^#{2,3} )", text, re.M | re.S)
    assert section, "README.md has no '### Backup and restore' section"
    blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S)
    assert len(blocks) == 3, blocks
    return blocks


def sh(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


class Console:
    """The API of one console process, read as a viewer and posted to with ingest tokens."""

    def __init__(self, url: str, viewer: str):
        self.url = url
        self.viewer = {"Authorization": f"Bearer {viewer}"}

    def post(self, token: str, events: list) -> dict:
        r = requests.post(
            f"{self.url}/api/v1/ingest",
            json={"events": events},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code in (200, 202), r.text
        return r.json()

    def post_all(self, token: str, events: list, batch: int = 5000) -> dict:
        """`events` in requests of `batch`: by default one, so that a fault's incident is
        opened before the ledger refresh that gives it its figures (due a debounce later)."""
        total = {"accepted": 0, "duplicates": 0}
        for i in range(0, len(events), batch):
            answer = self.post(token, events[i : i + batch])
            for k in total:
                total[k] += answer[k]
        return total

    def get(self, path: str, **params):
        r = requests.get(f"{self.url}{path}", params=params, headers=self.viewer, timeout=30)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def read(self, job: str, cluster: str) -> dict:
        """What automation reads of a job: its ledger, its incidents (each in detail),
        and its cluster's reliability figures."""
        incidents = self.get("/api/v1/incidents/", job=job)
        assert incidents["next"] is None
        return {
            "goodput": self.get(f"/api/v1/jobs/{job}/goodput"),
            "incidents": [
                self.get(f"/api/v1/incidents/{i['id']}")
                for i in sorted(incidents["results"], key=lambda i: i["fault_at"])
            ],
            "reliability": self.get("/api/v1/reliability", cluster=cluster, **WINDOW),
        }


def settled(console: Console, job: str, cluster: str, db: str, *, refreshed: bool = True) -> dict:
    """The console's reading of `job` once its worker has nothing left to do for it: no
    work waiting in the outbox, the ledger snapshot current (when `refreshed`), and two
    readings a while apart the same. The API is read only once the worker stored the
    snapshot: a read of the ledger before that would store it first, and the worker's
    refresh, finding it current, would leave the incidents' figures as they were."""
    deadline = time.monotonic() + 90
    last = None
    while True:
        if not outbox(db) and (not refreshed or ledger_current(db, job)):
            reading = console.read(job, cluster)
            if reading == last:
                return reading
            last = reading
        else:
            last = None
        assert time.monotonic() < deadline, (
            f"{job} did not settle: outbox {outbox(db)}, ledger current"
            f" {ledger_current(db, job)}, last reading {last}"
        )
        time.sleep(1.5)


def in_database(db: str, code: str):
    """Runs `code` (which sets `result`) in a Django process on database `db`; its result."""
    script = (
        "import django, json\ndjango.setup()\n"
        + code
        + "\nprint('RESULT=' + json.dumps(result, sort_keys=True))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": db, "DJANGO_SETTINGS_MODULE": "console.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.rsplit("RESULT=", 1)[1])


def sql(db: str, query: str, *params):
    """The first row of `query` on database `db`, on a connection of its own."""
    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()


def outbox(db: str) -> int:
    return sql(db, "SELECT count(*) FROM common_outboxentry")[0]


def ledger_current(db: str, job: str) -> bool:
    row = sql(
        db,
        "SELECT s.revision = j.revision FROM jobs_trainingjob j"
        " JOIN jobs_ledgersnapshot s ON s.job_id = j.id WHERE j.key = %s",
        job,
    )
    return bool(row and row[0])


def recomputed(db: str, job: str) -> dict:
    """The job's cumulative ledger computed afresh from the events stored in `db` (as the
    goodput API answers it), and its stored counters against its stored rows."""
    return in_database(
        db,
        "from jobs.models import Event, StepRecord, TrainingJob\n"
        "from jobs.selectors.ledger import job_ledger\n"
        f"j = TrainingJob.objects.get(key={job!r})\n"
        # The goodput answer is the ledger and its badput in money (no price here: null).
        "result = {'ledger': {**job_ledger(j).as_dict(), 'badput_cost': None, 'currency': None},\n"
        "  'events_count': j.events_count,\n"
        "  'events': Event.objects.filter(job=j).count(),\n"
        "  'steps': StepRecord.objects.filter(job=j).count()}",
    )


def assert_is_the_worked_example(reading: dict, expected: dict) -> None:
    """The figures of samples/small-job.expected.json, within the tolerance of
    tests/jobs/test_sample.py."""
    goodput = reading["goodput"]
    assert goodput["elapsed_s"] == pytest.approx(expected["elapsed_s"], abs=1e-4)
    assert goodput["categories"] == pytest.approx(expected["categories"], abs=1e-4)
    assert goodput["gpu_seconds"] == pytest.approx(expected["gpu_categories"], abs=8e-4)
    incidents = reading["incidents"]
    assert [i["fault_type"] for i in incidents] == [i["type"] for i in expected["incidents"]]
    for got, want in zip(incidents, expected["incidents"], strict=True):
        assert got["time_to_recover_s"] == pytest.approx(want["time_to_recover_s"], abs=1e-5)
        assert got["lost_gpu_hours"] == pytest.approx(want["lost_gpu_hours"], abs=1e-6)


def without_server_clock(reading: dict) -> dict:
    """A reading less what the server's own clock and history decided: when an incident
    and its timeline entries (its signals aside) were written, its id, and the recovery
    actions proposed for it (numbered among the cluster's other actions, and judged by
    guardrails that count what happened in the last minutes of wall-clock time)."""
    out = json.loads(json.dumps(reading))
    for incident in out["incidents"]:
        incident.pop("opened_at")
        incident.pop("id")
        incident["timeline"] = [
            {k: v for k, v in entry.items() if k != "at" or entry["kind"] == "signal"}
            for entry in incident["timeline"]
            if entry["kind"] not in ("action", "approval")
        ]
    return out


def differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(a.keys() | b.keys())
            for d in differences(a.get(k), b.get(k), f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_a_dump_of_a_live_console_restores_its_ledgers_and_incidents(
    tmp_path, sample, quick_passes
):
    events, expected = sample
    before_cut = [e for e in events if e["ts"] < CUT_TS]
    after_cut = [e for e in events if e["ts"] >= CUT_TS]
    streamed = [{**e, "job": STREAMED} for e in events[:320]]  # up to its first fault
    backup, restore, migrate = readme_commands()

    _, east = token_issue(scope="ingest", cluster_name="east")
    _, west = token_issue(scope="ingest", cluster_name="west")
    _, viewer = token_issue(scope="viewer")
    source = database_url()
    restored = f"{source}_restored"
    env = {"DATABASE_URL": source, "BACKUP": str(tmp_path / "rebound.dump")}
    env["RESTORE_URL"] = restored
    drop = f'DROP DATABASE IF EXISTS "{restored.rsplit("/", 1)[1]}" WITH (FORCE)'
    admin = source.rsplit("/", 1)[0] + "/postgres"
    subprocess.run(["psql", admin, "-qc", drop], check=True)

    servers = []
    try:
        with celery_worker() as worker:
            original = Server(tmp_path / "original")
            servers.append(original)
            original.start(timeout=90)
            console = Console(original.url, viewer)
            assert console.post_all(east, before_cut) == {
                "accepted": len(before_cut),
                "duplicates": 0,
            }
            at_dump = settled(console, JOB, "east", source)
            assert [i["fault_type"] for i in at_dump["incidents"]] == ["crash", "loss_spike"]
            assert at_dump["incidents"][0]["recovered_at"] is not None
            assert at_dump["reliability"]["incidents"] == 2

            # pg_dump while another job streams in, a few events a request.
            posted_during_dump = []
            dumping = threading.Event()
            dumped = threading.Event()

            failures = []

            def stream():
                try:
                    for i in range(0, len(streamed), 8):
                        console.post(west, streamed[i : i + 8])
                        if dumping.is_set() and not dumped.is_set():
                            posted_during_dump.append(i)
                        if i == 32:
                            dumping.wait(30)
                except Exception as exc:
                    failures.append(exc)

            streaming = threading.Thread(target=stream)
            streaming.start()
            time.sleep(0.5)
            dumping.set()
            done = sh(backup, env)
            dumped.set()
            streaming.join(120)
            assert not streaming.is_alive() and not failures, failures
            assert done.returncode == 0, done.stderr
            assert len(posted_during_dump) >= 2, "no write was in flight during the dump"

            # The original goes on: once it is done with the streamed job, the rest of
            # the trace, in one request, gives the worked example's figures.
            settled(console, STREAMED, "west", source)
            assert console.post_all(east, after_cut)["accepted"] == len(after_cut)
            original_final = settled(console, JOB, "east", source)
            assert_is_the_worked_example(original_final, expected)
            assert original_final != at_dump
            original.stop()
            assert worker.poll() is None
        database_quiet()

        # Restore into a new database, migrate, and run a console and a worker on it.
        done = sh(restore, env)
        assert done.returncode == 0, done.stderr
        done = sh(migrate, env)
        assert done.returncode == 0, done.stderr
        waiting = outbox(restored)
        beat = tmp_path / "beat"  # as scripts/run starts it: the outbox drain runs on beat
        with celery_worker(env={"DATABASE_URL": restored}, beat_schedule=beat) as worker:
            second = Server(tmp_path / "restored", env={"DATABASE_URL": restored})
            servers.append(second)
            second.start(timeout=90)
            console = Console(second.url, viewer)  # the tokens came with the backup

            # What the original answered for the stored events, and what they give afresh.
            assert console.read(JOB, "east") == at_dump
            fresh = recomputed(restored, JOB)
            assert fresh["ledger"] == at_dump["goodput"]
            assert fresh["events"] == fresh["events_count"] == len(before_cut)

            # The job caught mid-stream: some of it, consistently.
            caught = recomputed(restored, STREAMED)
            assert 0 < caught["events"] < len(streamed)
            assert caught["events"] == caught["events_count"]
            # The work the original had yet to do came with the backup, in the outbox
            # (a ledger refresh, a detection pass): the restored worker drains it. (A
            # refresh the worker had taken but not finished at the snapshot is not in
            # it: the ledger is then its reader's to compute, as below.)
            assert waiting > 0
            settled(console, STREAMED, "west", restored, refreshed=False)
            assert worker.poll() is None
            assert console.get(f"/api/v1/jobs/{STREAMED}/goodput") == caught["ledger"]

            # Idempotency survives: what it holds is a duplicate, the rest is new.
            assert console.post_all(east, before_cut) == {
                "accepted": 0,
                "duplicates": len(before_cut),
            }
            assert console.post_all(east, after_cut) == {
                "accepted": len(after_cut),
                "duplicates": 0,
            }
            restored_final = settled(console, JOB, "east", restored)
            assert_is_the_worked_example(restored_final, expected)
            ours, theirs = (
                without_server_clock(restored_final),
                without_server_clock(original_final),
            )
            assert ours == theirs, differences(ours, theirs)
            second.stop()
    finally:
        for server in servers:
            server.stop()
        database_quiet()
        subprocess.run(["psql", admin, "-qc", drop], check=False)
