"""The periodic sweep: wall-clock checks for jobs and nodes that went silent, and the
console's own outages and a deaf path to a cluster not taken for faults."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from incidents import services, tasks
from incidents.models import DetectorState, Incident, SweepState
from jobs.models import Event, Node, TrainingJob

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)
T0 = NOW.timestamp() - 1000  # the jobs' own clock


def launch(job, steps=100, node="n0"):
    out = [
        {"id": "s", "job": job, "kind": "attempt_started", "ts": T0, "attempt": 1}
        | {"data": {"world_size": 2, "nodes": [node]}},
        {"id": "r", "job": job, "kind": "ready", "ts": T0 + 5, "attempt": 1, "data": {}},
    ]
    out += [
        {"id": f"p{i}", "job": job, "kind": "step", "ts": T0 + 10 + i, "attempt": 1}
        | {"data": {"step": i}}
        for i in range(1, steps + 1)
    ]
    out += [
        {"id": f"h{i}", "job": job, "kind": "heartbeat", "ts": T0 + 5 * i, "node": node}
        for i in range(1, steps // 5 + 3)
    ]
    return out


def received(job, seconds_ago):
    TrainingJob.objects.filter(key=job).update(
        last_received_at=NOW - timedelta(seconds=seconds_ago)
    )


def heard(node, seconds_ago):
    Node.objects.filter(name=node).update(last_heard_at=NOW - timedelta(seconds=seconds_ago))


@pytest.fixture
def sweeping():
    """A sweep that has run without a break for the last ten minutes."""
    services.incidents_sweep(now=NOW - timedelta(seconds=600))  # it began then
    # ... and ran every 15 s since (what the 39 runs in between leave behind).
    SweepState.objects.filter(pk=1).update(at=NOW - timedelta(seconds=15))


@pytest.fixture
def two_jobs(ingest):
    assert ingest(launch("quiet", node="n0") + launch("busy", node="n1")).status_code == 202
    received("quiet", 200)
    received("busy", 2)
    heard("n0", 200)
    heard("n1", 2)


def test_a_silent_job_is_judged_on_its_moved_clock(two_jobs, sweeping):
    result = services.incidents_sweep(now=NOW)
    assert result.judged == ["quiet"]
    [incident] = Incident.objects.filter(job__key="quiet")
    assert incident.fault_type in ("hang", "dead_node")
    assert incident.fault_at.timestamp() <= T0 + 110  # when it fell silent, on its clock
    assert not Incident.objects.filter(job__key="busy").exists()
    assert Node.objects.get(name="n0").state == Node.State.SUSPECT
    assert Node.objects.get(name="n1").state == Node.State.ACTIVE
    # The next sweep finds the same hang, longer now: the same incident, brought up to date.
    services.incidents_sweep(now=NOW + timedelta(seconds=15))
    [again] = Incident.objects.filter(job__key="quiet")
    assert again.pk == incident.pk
    assert again.timeline.filter(kind="detection").count() == 1


def test_a_job_silent_for_less_than_the_grace_is_not(two_jobs, sweeping):
    received("quiet", services.SILENT_AFTER_S - 5)
    assert services.incidents_sweep(now=NOW).judged == []
    assert not Incident.objects.exists()


def test_a_cluster_nothing_arrives_from_is_not_judged(two_jobs, sweeping):
    received("busy", 200)
    heard("n1", 200)
    result = services.incidents_sweep(now=NOW)
    assert result.judged == []
    assert result.deaf == [TrainingJob.objects.get(key="busy").cluster.name]
    assert not Incident.objects.exists()
    assert set(Node.objects.values_list("state", flat=True)) == {Node.State.ACTIVE}


def test_nothing_is_judged_until_the_sweep_has_run_without_a_break(two_jobs):
    assert services.incidents_sweep(now=NOW).judged == []  # the first run
    # The sweep stopped (the console was down) and came back: older silences are
    # the console's own deafness, not the job's.
    result = services.incidents_sweep(now=NOW + timedelta(seconds=300))
    assert result.judged == []
    assert not Incident.objects.exists()


def test_a_node_heard_long_ago_stays_as_it_is(two_jobs, sweeping):
    heard("n0", services.HEARD_WITHIN_S + 60)
    received("quiet", 2)
    services.incidents_sweep(now=NOW)
    assert Node.objects.get(name="n0").state == Node.State.ACTIVE


def test_a_node_is_suspect_only_past_its_timeout_and_the_liveness_granularity(
    two_jobs, sweeping, settings
):
    # last_heard_at may lag by REBOUND_NODE_LIVENESS_S (ingest rewrites it that
    # seldom): 30 s timeout + 4 s is within what a live node's row can show.
    settings.REBOUND_NODE_LIVENESS_S = 5.0
    received("quiet", 2)
    heard("n0", 34)
    assert services.incidents_sweep(now=NOW).suspect == []
    heard("n0", 36)
    assert services.incidents_sweep(now=NOW).suspect == ["n0"]


def test_the_worker_runs_the_sweep_on_a_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["incidents-sweep"]
    assert entry["task"] == tasks.incidents_sweep.name == "incidents.sweep"
    assert entry["schedule"] == services.SWEEP_EVERY_S
    tasks.incidents_sweep()  # and it runs (nothing to judge)


def test_the_sweeps_memory_outlives_a_wiped_cache(two_jobs, sweeping):
    """A Redis restart wipes the cache: the sweep's unbroken run is not forgotten with it,
    so the jobs that fell silent meanwhile are still judged."""
    cache.clear()
    assert services.incidents_sweep(now=NOW).judged == ["quiet"]
    assert Incident.objects.filter(job__key="quiet").exists()


def poison(job_key, attempt=1):
    """A fault whose xid no incident can hold (beyond the column's integer range),
    stored as if an older server had let it in."""
    job = TrainingJob.objects.get(key=job_key)
    Event.objects.create(
        job=job,
        client_id="poison",
        kind="fault",
        ts=T0 + 50,
        attempt=attempt,
        node="n0",
        data={"type": "gpu_xid", "xid": 2**31},
        received_at=NOW,
    )
    return job


@pytest.mark.postgres  # SQLite stores any integer: nothing is refused there
def test_a_job_whose_pass_fails_is_reported_and_stops_no_other(two_jobs, sweeping, caplog):
    assert connection.vendor == "postgresql"
    received("busy", 200)  # both silent now; n1 still heard, so the cluster is not deaf
    job = poison("quiet")
    result = services.incidents_sweep(now=NOW)
    assert sorted(result.judged) == ["busy", "quiet"]
    assert Incident.objects.filter(job__key="busy").exists()  # the other job was judged
    # The poisoned job's other findings are judged too; the one it cannot store is reported.
    state = DetectorState.objects.get(job=job)
    assert state.failed_at is not None and "out of range" in state.failure
    assert any(
        r.levelname == "ERROR" and "quiet" in r.getMessage() and "out of range" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.postgres
def test_a_crash_after_a_poison_row_still_opens_its_incident(ingest, caplog):
    """One bad row does not stop detection for its job: a later launch's crash opens."""
    assert ingest(launch("j", node="n0")).status_code == 202
    poison("j")
    later = [
        {"id": "s2", "job": "j", "kind": "attempt_started", "ts": T0 + 200, "attempt": 2}
        | {"data": {"world_size": 2, "nodes": ["n0"]}},
        {"id": "f2", "job": "j", "kind": "fault", "ts": T0 + 260, "attempt": 2}
        | {"data": {"type": "crash"}, "node": "n0"},
        {"id": "e2", "job": "j", "kind": "attempt_ended", "ts": T0 + 261, "attempt": 2}
        | {"data": {"reason": "failed"}},
    ]
    assert ingest(later).status_code == 202
    job = TrainingJob.objects.get(key="j")
    tasks.incidents_open_reported(job.id)
    tasks.incidents_detect_pass(job.id)
    assert Incident.objects.filter(job=job, attempt=2, fault_type="crash").exists()
    assert "out of range" in DetectorState.objects.get(job=job).failure
    assert any(r.levelname == "ERROR" and "j" in r.getMessage() for r in caplog.records)
