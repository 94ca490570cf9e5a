"""The periodic sweep: wall-clock checks for jobs and nodes that went silent, and the
console's own outages and a deaf path to a cluster not taken for faults."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from incidents import services, tasks
from incidents.models import Incident
from jobs.models import Node, TrainingJob

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
    cache.delete(services._SWEEP_KEY)
    services.incidents_sweep(now=NOW - timedelta(seconds=600))  # it began then
    since = cache.get(services._SWEEP_KEY)["since"]
    # ... and ran every 15 s since (what the 39 runs in between leave behind).
    cache.set(services._SWEEP_KEY, {"at": NOW.timestamp() - 15, "since": since})
    yield
    cache.delete(services._SWEEP_KEY)


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
    cache.delete(services._SWEEP_KEY)
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


def test_the_worker_runs_the_sweep_on_a_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["incidents-sweep"]
    assert entry["task"] == tasks.sweep.name == "incidents.sweep"
    assert entry["schedule"] == services.SWEEP_EVERY_S
    tasks.sweep()  # and it runs (nothing to judge)
