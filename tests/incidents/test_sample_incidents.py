"""The worked example's three faults: one incident each, with the contract's times and costs."""

import random

import pytest

from incidents.models import Incident, TimelineEntry
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db


def assert_matches(incidents, expected):
    assert len(incidents) == len(expected["incidents"])
    for got, want in zip(incidents, expected["incidents"], strict=True):
        assert got.fault_type == want["type"]
        assert got.xid == want["xid"]
        assert [n.name for n in got.nodes.all()] == ([want["node"]] if want["node"] else [])
        assert got.fault_at.timestamp() == pytest.approx(want["fault_at"], abs=1e-5)
        assert got.resumed_at.timestamp() == pytest.approx(want["resumed_at"], abs=1e-5)
        assert got.recovered_at.timestamp() == pytest.approx(want["recovered_at"], abs=1e-5)
        assert got.time_to_resume_s == pytest.approx(want["time_to_resume_s"], abs=1e-5)
        assert got.time_to_recover_s == pytest.approx(want["time_to_recover_s"], abs=1e-5)
        assert got.lost_gpu_hours == pytest.approx(want["lost_gpu_hours"], abs=1e-6)
        assert sum(got.lost_breakdown.values()) == pytest.approx(got.lost_gpu_seconds)
        assert got.state == Incident.State.RECOVERED


def test_the_sample_gives_the_contract_incidents(ingest, sample):
    events, expected = sample
    assert ingest(events).status_code == 202
    incidents = detect("sample-small")
    assert_matches(incidents, expected)
    crash, spike, xid = incidents
    assert (crash.cause, crash.severity) == (Incident.Cause.GPU, Incident.Severity.CRITICAL)
    assert spike.cause == Incident.Cause.TRAINING_INSTABILITY
    assert xid.cause == Incident.Cause.GPU
    kinds = list(crash.timeline.values_list("kind", flat=True))
    assert kinds.count(TimelineEntry.Kind.DETECTION) == 1
    assert TimelineEntry.Kind.STATE_CHANGE in kinds  # open -> recovered


def test_shuffled_batches_and_a_second_pass_give_the_same_incidents(ingest, sample):
    events, expected = sample
    shuffled = events[:]
    random.Random(3).shuffle(shuffled)
    for i in range(0, len(shuffled), 61):
        ingest(shuffled[i : i + 61])
        detect("sample-small")  # detection after every batch, as it runs live
    ingest(events)  # and everything again
    incidents = detect("sample-small")
    assert_matches(incidents, expected)
    entries = TimelineEntry.objects.count()
    detect("sample-small")
    assert TimelineEntry.objects.count() == entries


def test_figures_follow_the_ledger_refresh(ingest, sample):
    """A detection pass that opens nothing new leaves figures alone; the ledger's
    refresh task brings them up to date from the same reading of the history."""
    from incidents import services
    from jobs.models import TrainingJob
    from jobs.tasks import ledger_snapshot_refresh

    events, expected = sample
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="sample-small")
    services.incidents_detect(job=job)  # opened, no figures yet
    assert all(i.recovered_at is None for i in Incident.objects.filter(job=job))
    ledger_snapshot_refresh(job.id)
    assert_matches(list(Incident.objects.filter(job=job).order_by("fault_at")), expected)
    ledger_snapshot_refresh(job.id)  # nothing new: nothing recomputed, nothing changes
    assert_matches(list(Incident.objects.filter(job=job).order_by("fault_at")), expected)
