"""The engine's stored state: typed, versioned, and rebuilt (never trusted, never a crash)
when a row holds another version's shape or one that does not read back; and the
detector settings are read once per pass."""

import pytest

from incidents import services
from incidents.detectors.engine import SETTINGS
from incidents.detectors.state import VERSION, EngineState, Rebuild
from incidents.models import DetectorState
from jobs.models import TrainingJob
from tests.incidents.test_incremental import one_pass, summary, trace, watch

pytestmark = pytest.mark.django_db


def old_shape(job) -> dict:
    """A state as the untyped engine (version 1) stored it, claiming every row was read:
    trusted, it would hide what the rows stored since show."""
    cfg = {k: float(v) for k, v in services.detector_settings(job).items() if k in SETTINGS}
    far = 10**12
    return {
        "v": 1,
        "cfg": cfg,
        "cursor": {"step": far, "window": far, "beat": far, "event": far},
        "launches": {"1": {"first_ts": 0.0, "steps": {"n": 5, "last_ts": 0.0, "hang": None}}},
        "beats": {},
        "stragglers": {},
        "baseline": [],
        "undecided": {},
        "order": [1],
        "splits": {},
    }


def test_an_older_shape_is_rebuilt_and_loses_no_detection(ingest):
    expected = one_pass(ingest, "whole")
    events = trace("old")
    half = len(events) // 2
    assert ingest(events[:half]).status_code == 202
    services.incidents_detect(job=TrainingJob.objects.get(key="old"))
    job = TrainingJob.objects.get(key="old")
    DetectorState.objects.filter(job=job).update(data=old_shape(job))
    assert ingest(events[half:]).status_code == 202
    w = watch("old")
    assert w.rebuilt
    assert DetectorState.objects.get(job=job).data["v"] == VERSION
    job.refresh_from_db()
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
    assert summary("old") == expected


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: d.pop("launches"),
        lambda d: d.update(launches={"1": {"first_ts": 1.0}}),
        lambda d: d.update(beats={"n0": [1, 2, 3]}),
        lambda d: d.update(v="2"),
    ],
    ids=["no launches", "a launch missing its fields", "beats of a wrong type", "a version"],
)
def test_a_state_that_does_not_read_back_is_rebuilt(ingest, spoil):
    assert ingest(trace("spoilt")).status_code == 202
    first = watch("spoilt")
    row = DetectorState.objects.get(job__key="spoilt")
    data = row.data
    spoil(data)
    DetectorState.objects.filter(pk=row.pk).update(data=data)
    again = watch("spoilt")
    assert again.rebuilt
    assert (again.hangs, again.losses, again.dead_nodes, again.stragglers) == (
        first.hangs,
        first.losses,
        first.dead_nodes,
        first.stragglers,
    )


def test_the_stored_state_reads_back_as_it_was_written(ingest):
    assert ingest(trace("round")).status_code == 202
    watch("round")
    data = DetectorState.objects.get(job__key="round").data
    state = EngineState.from_dict(data)
    assert state.to_dict() == data
    assert state.launches[1].steps.closed.hang.step == 300  # typed all the way down
    assert state.stragglers["n3"].windows > 0
    with pytest.raises(Rebuild):
        EngineState.from_dict({**data, "v": VERSION - 1})


def test_settings_are_read_once_per_pass(ingest, monkeypatch):
    """The full pass (hangs, losses, stragglers, dead nodes, episodes, crash loops and
    the repeat offenders of the nodes it names) reads the settings once."""
    assert ingest(trace("once")).status_code == 202
    reads = []
    real = services.detector_settings

    def counted(*args, **kwargs):
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "detector_settings", counted)
    changed = services.incidents_detect(job=TrainingJob.objects.get(key="once"))
    assert {i.fault_type for i in changed} >= {"hang", "dead_node", "straggler"}
    assert len(reads) == 1
