"""Batches of stream events (steps, rank windows, heartbeats) of one job are stored side
by side on PostgreSQL: many clients of a large job post at once, resends race their
originals, and nothing is lost, doubled or counted twice; a reader that takes the
job's row FOR UPDATE (detection reading the tables' highest ids) never sees a batch
half-stored; any other batch runs alone."""

import random
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from incidents.detectors.engine import _bounds
from jobs.models import Cluster, Event, HeartbeatBucket, RankWindow, StepRecord, TrainingJob
from jobs.services import events_ingest
from jobs.wire import validate_events

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

T0 = 1_790_000_000.0
NODES, GPUS = 8, 4


def wire(raw: list[dict]):
    events, errors = validate_events(raw, 5000)
    assert not errors, errors
    return events


def start() -> list[dict]:
    nodes = [f"n{n}" for n in range(NODES)]
    return [
        {"id": "start", "job": "big", "kind": "attempt_started", "ts": T0, "attempt": 1,
         "data": {"world_size": NODES * GPUS, "gpus_per_node": GPUS, "nodes": nodes}},
        {"id": "ready", "job": "big", "kind": "ready", "ts": T0 + 1, "attempt": 1, "data": {}},
    ]  # fmt: skip


def stream_batches(client: int, clients: int, windows: int) -> list[list[dict]]:
    """Client `client`'s share of the job's nodes: per window, a rank_window of each of
    its ranks and a heartbeat of each of its nodes; client 0 also sends the steps."""
    mine = range(client, NODES, clients)
    batches = []
    for w in range(windows):
        first, last = w * 10 + 1, w * 10 + 10
        ts = T0 + 10 + last
        batch = []
        if client == 0:
            batch += [
                {"id": f"s{s}", "job": "big", "kind": "step", "ts": T0 + 10 + s, "attempt": 1,
                 "data": {"step": s, "loss": 2.0}}
                for s in range(first, last + 1)
            ]  # fmt: skip
        for n in mine:
            batch.append({"id": f"hb{n}-{w}", "job": "big", "kind": "heartbeat", "ts": ts,
                          "node": f"n{n}", "data": {}})  # fmt: skip
            for rank in range(n * GPUS, (n + 1) * GPUS):
                batch.append(
                    {"id": f"w{rank}-{first}", "job": "big", "kind": "rank_window", "ts": ts,
                     "attempt": 1, "node": f"n{n}", "rank": rank,
                     "data": {"first_step": first, "last_step": last, "compute_s": 0.8,
                              "step_s": 1.0}}
                )  # fmt: skip
        batches.append(batch)
    return batches


def started(targets) -> tuple[list[threading.Thread], list[BaseException]]:
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # raised in the test's thread, below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    return threads, errors


def joined(threads, errors) -> None:
    for t in threads:
        t.join(60)
    assert not errors, errors


def waiting(*statements: str, timeout_s: float = 30.0) -> None:
    """Until, for each of `statements` (how a statement begins), another session of the
    database is inside one, waiting for a lock."""
    deadline = time.monotonic() + timeout_s
    while True:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
            )
            blocked = [q.lstrip() for (q,) in cur.fetchall()]
        if all(any(q.startswith(s) for q in blocked) for s in statements):
            return
        assert time.monotonic() < deadline, f"nobody waits in {statements}: {blocked}"
        time.sleep(0.02)


def test_clients_of_one_job_and_their_resends_store_each_event_once():
    cluster = Cluster.objects.create(name="east")
    events_ingest(cluster=cluster, events=wire(start()))
    clients, windows = 4, 12
    shares = [stream_batches(c, clients, windows) for c in range(clients)]
    accepted = []
    lock = threading.Lock()

    def post(batches, seed):
        rng = random.Random(seed)
        for batch in batches:
            result = events_ingest(cluster=cluster, events=wire(batch))
            beats = sum(1 for e in batch if e["kind"] == "heartbeat")
            with lock:  # heartbeats count as accepted every time: only stored ones here
                accepted.append(result.accepted - beats)
            if rng.random() < 0.2:
                connection.close()  # a new session now and then, as gunicorn's are

    # Each client's share posted twice at once: a resend racing its original.
    joined(*started([lambda b=b, s=s: post(b, s) for s, b in enumerate(shares + shares)]))

    stored_windows = NODES * GPUS * windows
    steps = windows * 10
    assert RankWindow.objects.count() == stored_windows
    assert StepRecord.objects.count() == steps
    assert Event.objects.filter(kind="rank_window").count() == stored_windows
    assert sum(accepted) == stored_windows + steps  # no event counted new twice
    assert HeartbeatBucket.objects.count() == NODES * windows
    job = TrainingJob.objects.get(key="big")
    assert job.events_count == Event.objects.count() == stored_windows + steps + 2
    assert (job.last_step, job.last_step_ts) == (steps, T0 + 10 + steps)
    assert (job.first_event_ts, job.last_event_ts) == (T0, T0 + 10 + steps)
    assert job.status == TrainingJob.Status.RUNNING


def test_stream_batches_of_a_job_go_side_by_side_and_a_reader_waits_for_them():
    cluster = Cluster.objects.create(name="east")
    events_ingest(cluster=cluster, events=wire(start()))
    first, second = stream_batches(0, 2, 2)[0], stream_batches(1, 2, 2)[0]
    job = TrainingJob.objects.get(key="big")
    stored, release, read = threading.Event(), threading.Event(), {}

    def open_batch():  # a batch stored and not yet committed, until released
        with transaction.atomic():
            events_ingest(cluster=cluster, events=wire(first))
            stored.set()
            assert release.wait(30)

    def other():  # another client's batch of the job, meanwhile
        assert stored.wait(30)
        events_ingest(cluster=cluster, events=wire(second))

    def reader():  # detection's bounds: taken once no batch of the job is in flight
        assert stored.wait(30)
        read["bounds"] = _bounds(job)

    threads = started([open_batch, other, reader])
    assert stored.wait(30)
    # The other batch stored its rows beside the open one and waits only to move the
    # job's summary; the reader waits for the job's row.
    waiting('UPDATE "jobs_trainingjob"', 'SELECT "jobs_trainingjob"."id"')
    release.set()
    joined(*threads)
    windows = RankWindow.objects.filter(job=job)
    assert windows.count() == sum(1 for e in first + second if e["kind"] == "rank_window")
    assert read["bounds"]["window"] >= max(windows.values_list("id", flat=True))
    job.refresh_from_db()
    assert job.events_count == Event.objects.filter(job=job).count()


def test_a_lifecycle_batch_waits_for_the_stream_batches_in_flight():
    cluster = Cluster.objects.create(name="east")
    events_ingest(cluster=cluster, events=wire(start()))
    batch = stream_batches(0, 1, 1)[0]
    saved = [
        {"id": "ck", "job": "big", "kind": "checkpoint_saved", "ts": T0 + 30, "attempt": 1,
         "data": {"step": 10, "blocking_s": 1.0}}
    ]  # fmt: skip
    stored, release = threading.Event(), threading.Event()

    def open_batch():
        with transaction.atomic():
            events_ingest(cluster=cluster, events=wire(batch))
            stored.set()
            assert release.wait(30)

    def lifecycle():
        assert stored.wait(30)
        events_ingest(cluster=cluster, events=wire(saved))

    threads = started([open_batch, lifecycle])
    assert stored.wait(30)
    waiting('SELECT "jobs_trainingjob"."id"')  # the checkpoint's batch, for the job's row
    release.set()
    joined(*threads)
    job = TrainingJob.objects.get(key="big")
    assert job.checkpoints.get().step == 10
    assert job.events_count == Event.objects.filter(job=job).count()


def test_a_batch_refused_for_a_deadlock_is_stored_again(monkeypatch):
    """PostgreSQL refuses one of two batches that meet in a cycle (rows no key orders):
    that batch is stored again, whole, and counted once. (The refusal is raised here:
    two batches meet in one only by chance.)"""
    from psycopg.errors import DeadlockDetected

    from jobs.services import ingest

    cluster = Cluster.objects.create(name="east")
    events_ingest(cluster=cluster, events=wire(start()))
    real, calls = ingest._ingest, []

    def once_refused(*args):
        calls.append(1)
        if len(calls) == 1:  # as Django raises PostgreSQL's refusal
            try:
                raise DeadlockDetected("deadlock detected")
            except DeadlockDetected as exc:
                raise OperationalError(str(exc)) from exc
        return real(*args)

    monkeypatch.setattr(ingest, "_ingest", once_refused)
    batch = stream_batches(0, 1, 1)[0]
    result = events_ingest(cluster=cluster, events=wire(batch))
    assert len(calls) == 2
    assert result.accepted == len(batch) and result.duplicates == 0
    assert RankWindow.objects.count() == NODES * GPUS
