"""The launch-fault detector on hand-built traces: what opens an incident, what does not,
and what attaches to an incident already open."""

import pytest
from django.test import override_settings

from incidents import services
from incidents.models import Incident
from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def ev(kind, ts, attempt=1, job="j1", node=None, rank=None, **data):
    e = {"id": f"e{next(_n)}", "job": job, "kind": kind, "ts": T0 + ts, "data": data}
    if attempt is not None:
        e["attempt"] = attempt
    if node is not None:
        e["node"] = node
    if rank is not None:
        e["rank"] = rank
    return e


def launch(attempt, t, nodes=("n0", "n1"), first_step=1, steps=5, world_size=8):
    out = [
        ev("attempt_started", t, attempt, world_size=world_size, nodes=list(nodes)),
        ev("ready", t + 10, attempt),
    ]
    out += [ev("step", t + 11 + i, attempt, step=first_step + i) for i in range(steps)]
    return out


def detect(ingest, events):
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="j1")
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
    return list(Incident.objects.filter(job=job).order_by("fault_at"))


def test_a_healthy_job_opens_nothing(ingest):
    events = launch(1, 0) + [ev("attempt_ended", 20, reason="completed"), ev("job_finished", 20)]
    assert detect(ingest, events) == []


def test_a_preempted_launch_without_a_fault_opens_nothing(ingest):
    assert detect(ingest, launch(1, 0) + [ev("attempt_ended", 20, reason="preempted")]) == []


def test_a_launch_stopped_on_request_opens_nothing(ingest):
    """A relaunch by a recovery action (or an operator) kills the launch it replaces."""
    end = ev("attempt_ended", 20, reason="killed", requested_by="rebound:action-7")
    assert detect(ingest, launch(1, 0) + [end] + launch(2, 30, first_step=6)) == []
    unasked = ev("attempt_ended", 60, 2, reason="killed")
    [incident] = detect(ingest, [unasked])
    assert incident.attempt == 2


def test_symptoms_attach_to_the_initiating_fault(ingest):
    events = launch(1, 0) + [
        ev("fault", 16.5, node="n1", rank=5, type="nccl_timeout"),
        ev("fault", 16.0, node="n0", rank=2, type="ecc"),
        ev("fault", 16.7, node="n1", rank=6, type="nccl_timeout"),
        ev("attempt_ended", 30, reason="failed", exit_code=1),
    ]
    [incident] = detect(ingest, events)
    assert incident.fault_type == "ecc"
    assert incident.cause == Incident.Cause.MEMORY
    assert [n.name for n in incident.nodes.all()] == ["n0"]
    assert incident.ranks == [2]
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 16.0)
    assert len(incident.evidence) == 4
    assert incident.timeline.filter(kind="signal").count() == 4


def test_an_nccl_timeout_alone_is_the_fault(ingest):
    events = launch(1, 0) + [ev("fault", 17, node="n1", rank=5, type="nccl_timeout")]
    [incident] = detect(ingest, events)
    assert incident.cause == Incident.Cause.NETWORK


def test_a_launch_that_fails_silently_is_an_incident_until_its_fault_arrives(ingest):
    events = launch(1, 0) + [ev("attempt_ended", 30, reason="failed", exit_code=137)]
    [incident] = detect(ingest, events)
    assert (incident.cause, incident.fault_type) == (Incident.Cause.UNKNOWN, "crash")
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 30)
    # the node agent's report comes late: the same incident now names the fault
    [same] = detect(ingest, [ev("fault", 16.2, attempt=None, node="n1", type="gpu_xid", xid=79)])
    assert same.pk == incident.pk
    assert (same.cause, same.xid) == (Incident.Cause.GPU, 79)
    assert same.fault_at.timestamp() == pytest.approx(T0 + 16.2)
    assert [n.name for n in same.nodes.all()] == ["n1"]


def test_a_fault_reported_without_attempt_joins_the_launch_running_then(ingest):
    events = launch(1, 0) + [ev("attempt_ended", 20, reason="failed")] + launch(2, 40, first_step=3)
    events.append(ev("fault", 55, attempt=None, node="n0", type="gpu_xid", xid=48))
    incidents = detect(ingest, events)
    assert [i.attempt for i in incidents] == [1, 2]


@pytest.mark.parametrize(
    ("xid", "cause", "severity"),
    [
        (79, Incident.Cause.GPU, Incident.Severity.CRITICAL),
        (13, Incident.Cause.SOFTWARE, Incident.Severity.MAJOR),
        (999, Incident.Cause.UNKNOWN, Incident.Severity.MAJOR),
    ],
)
def test_xid_classes_set_the_cause(ingest, xid, cause, severity):
    [incident] = detect(
        ingest, launch(1, 0) + [ev("fault", 17, node="n0", type="gpu_xid", xid=xid)]
    )
    assert (incident.cause, incident.severity) == (cause, severity)


@override_settings(REBOUND_XID_CLASSES={999: "hardware"})
def test_the_xid_table_can_be_extended(ingest):
    [incident] = detect(
        ingest, launch(1, 0) + [ev("fault", 17, node="n0", type="gpu_xid", xid=999)]
    )
    assert incident.cause == Incident.Cause.GPU


def test_an_incident_without_a_later_launch_has_no_resume_yet(ingest):
    events = launch(1, 0) + [
        ev("fault", 16.5, node="n1", type="crash"),
        ev("attempt_ended", 20, reason="failed"),
    ]
    [incident] = detect(ingest, events)
    assert incident.resumed_at is None and incident.recovered_at is None
    assert incident.state == Incident.State.OPEN
    # stalled 15 -> 20 on 8 GPUs, then downtime to the job's last event (20): 40 GPU-s
    assert incident.lost_breakdown["stalled"] == pytest.approx(40.0)
    assert incident.lost_gpu_seconds == pytest.approx(40.0)


def test_ingest_opens_the_incident_through_the_signal_and_task(
    ingest, django_capture_on_commit_callbacks
):
    """The path a live job takes: ingest commits, jobs announces, incidents detects."""
    with django_capture_on_commit_callbacks(execute=True):
        ingest(launch(1, 0))
    assert not Incident.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        ingest([ev("fault", 17, node="n1", rank=4, type="gpu_xid", xid=79)])
    incident = Incident.objects.get()
    assert incident.cause == Incident.Cause.GPU
    assert incident.opened_at is not None


def test_a_fault_after_training_went_on_is_a_new_episode(ingest):
    """A NaN the launch survived, then, 30 steps later, a GPU falls off the bus:
    two incidents; the launch's failure and its cost belong to the second."""
    events = launch(1, 0, steps=60)  # steps 1..60 at 11..70
    events += [
        ev("fault", 20.5, type="nan"),  # after step 10
        ev("fault", 50.5, node="n1", rank=5, type="gpu_xid", xid=79),  # after step 40
        ev("fault", 50.7, node="n0", rank=1, type="nccl_timeout"),
        ev("attempt_ended", 60, reason="failed"),
    ]
    events += launch(2, 100, first_step=31, steps=20)
    nan, xid = detect(ingest, events)
    assert (nan.fault_type, nan.episode) == ("nan", "launch-1")
    assert (xid.fault_type, xid.episode) == ("gpu_xid", "launch-1-1")
    assert len(xid.evidence) == 3  # the Xid, the timeout, the end
    assert nan.resumed_at.timestamp() == pytest.approx(T0 + 21)  # step 11, same launch
    assert nan.lost_gpu_seconds == 0
    assert xid.resumed_at.timestamp() == pytest.approx(T0 + 111)  # launch 2's first step
    assert xid.lost_gpu_seconds > 0


def test_a_fault_soon_after_another_is_part_of_its_episode(ingest):
    events = launch(1, 0, steps=20) + [
        ev("fault", 20.5, type="loss_spike"),
        ev("fault", 23.5, node="n1", type="gpu_xid", xid=79),  # 3 steps later: same episode
    ]
    [incident] = detect(ingest, events)
    assert incident.fault_type == "loss_spike" and len(incident.evidence) == 2
