"""The crash-loop detector: restart storms and launches that never advance the checkpoint."""

import pytest

from incidents import services
from incidents.models import DetectorSetting, Incident
from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def ev(kind, ts, attempt, **data):
    return {
        "id": f"e{next(_n)}",
        "job": "j1",
        "kind": kind,
        "ts": T0 + ts,
        "attempt": attempt,
        "data": data,
    }


def launch(attempt, t, *, restore=None, save=None, reason="failed", length=60):
    """A launch at t that restores `restore`, saves `save`, and ends `reason` after `length` s."""
    out = [ev("attempt_started", t, attempt, world_size=8), ev("ready", t + 5, attempt)]
    if restore is not None:
        out.append(ev("checkpoint_loaded", t + 8, attempt, step=restore))
    if save is not None:
        out.append(ev("checkpoint_saved", t + length - 10, attempt, step=save, blocking_s=1.0))
    out.append(ev("attempt_ended", t + length, attempt, reason=reason))
    return out


def loops(ingest, events):
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="j1")
    services.incidents_detect(job=job)
    return list(Incident.objects.filter(job=job, detector="crash_loop").order_by("fault_at"))


def test_five_launches_in_thirty_minutes_are_a_storm(ingest):
    events = []
    for a in range(1, 6):  # every 5 minutes, each saves progress: only the pace is wrong
        events += launch(a, (a - 1) * 300, restore=(a - 1) * 10 or None, save=a * 10)
    [loop] = loops(ingest, events)
    assert loop.severity == Incident.Severity.CRITICAL
    assert "5 launches within 30 min" in loop.summary
    assert loop.fault_at.timestamp() == pytest.approx(T0)
    assert loop.detected_at.timestamp() == pytest.approx(T0 + 1200)
    assert len(loop.evidence) == 5


def test_launches_that_never_advance_the_checkpoint_are_a_loop(ingest):
    events = launch(1, 0, save=100, length=3600)
    for a, t in ((2, 4000), (3, 8000), (4, 12000)):  # hours apart, never past step 100
        events += launch(a, t, restore=100)
    [loop] = loops(ingest, events)
    assert "3 launches in a row ended without advancing the checkpoint" in loop.summary
    assert loop.fault_at.timestamp() == pytest.approx(T0 + 4000)  # launch 2's start
    assert loop.detected_at.timestamp() == pytest.approx(T0 + 12060)  # launch 4's end
    # the launches' own faults take the loop's cause
    assert loop.cause == Incident.Cause.UNKNOWN


def test_restarts_that_make_progress_are_not_a_loop(ingest):
    events = []
    for a in range(1, 5):  # four launches, an hour apart, each saving further
        events += launch(a, (a - 1) * 3600, restore=(a - 1) * 100 or None, save=a * 100)
    assert loops(ingest, events) == []
    # four failed launches: four launch incidents, no loop
    assert Incident.objects.filter(detector="launch_fault").count() == 4


def test_progress_ends_a_loop_and_a_later_one_is_a_new_incident(ingest):
    events = launch(1, 0, save=100, length=3600)
    events += launch(2, 4000, restore=100) + launch(3, 8000, restore=100)
    events += launch(4, 12000, restore=100)  # loop 1 detected here
    events += launch(5, 16000, restore=100, save=200, length=3600)  # progress: loop over
    events += launch(6, 24000, restore=200) + launch(7, 28000, restore=200)
    events += launch(8, 32000, restore=200)  # loop 2
    first, second = loops(ingest, events)
    assert (first.episode, second.episode) == ("loop-2", "loop-6")


def test_thresholds_are_set_per_job_at_run_time(ingest):
    events = launch(1, 0, save=100, length=3600) + launch(2, 4000, restore=100)
    assert loops(ingest, events) == []
    job = TrainingJob.objects.get(key="j1")
    DetectorSetting.objects.create(job=job, name="crash_loop.no_progress_launches", value=1)
    services.incidents_detect(job=job)
    assert Incident.objects.filter(detector="crash_loop").count() == 1


def test_a_cluster_setting_applies_unless_the_job_has_its_own(ingest):
    events = launch(1, 0, save=100, length=3600) + launch(2, 4000, restore=100)
    loops(ingest, events)
    job = TrainingJob.objects.get(key="j1")
    DetectorSetting.objects.create(
        cluster=job.cluster, name="crash_loop.no_progress_launches", value=1
    )
    DetectorSetting.objects.create(job=job, name="crash_loop.no_progress_launches", value=2)
    services.incidents_detect(job=job)
    assert not Incident.objects.filter(detector="crash_loop").exists()
    DetectorSetting.objects.filter(job=job).delete()
    services.incidents_detect(job=job)
    assert Incident.objects.filter(detector="crash_loop").count() == 1
