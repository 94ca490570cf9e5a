"""Policies: an incident opening proposes what its trigger's rules say, in their
mode; chains go one step at a time; overrides per cluster and job; a repeat
proposes nothing twice."""

import pytest

from incidents.models import Incident
from incidents.signals import incident_opened, incident_updated
from jobs.models import Attempt, Checkpoint, Node
from recovery import policies, services
from recovery.models import Action, RecoveryPolicy
from tests.recovery.conftest import T0, dt, make_incident, states

pytestmark = pytest.mark.django_db

S = Action.State


def opened(incident, run_on_commit):
    with run_on_commit():
        incident_opened.send(sender=Incident, incident=incident)


@pytest.mark.parametrize(
    ("cause", "fault_type", "trigger"),
    [
        ("software", "crash", "crash"),
        ("software", "oom", "crash"),
        ("unknown", "crash", "crash"),
        ("hang", "hang", "crash"),
        ("network", "nccl_timeout", "crash"),
        ("gpu", "gpu_xid", "hardware"),
        ("gpu", "sdc", "hardware"),
        ("memory", "ecc", "hardware"),
        ("host", "dead_node", "dead_node"),
        ("straggler", "straggler", "straggler"),
        ("training_instability", "loss_spike", "training_instability"),
        ("training_instability", "nan", "training_instability"),
        ("gpu", "repeat_offender", "repeat_offender"),
        ("software", "crash_loop", "crash_loop"),
        ("preemption", "preempted", "preemption"),
    ],
)
def test_incident_triggers(cause, fault_type, trigger):
    assert policies.incident_trigger(Incident(cause=cause, fault_type=fault_type)) == trigger


def test_the_defaults(cluster):
    table = {
        t: [(r.kind, r.mode) for r in rules]
        for t, rules in policies.policy_table(cluster_id=cluster.pk).items()
    }
    assert table == {
        "crash": [("restart_job", "auto")],
        "hardware": [("cordon_node", "auto"), ("replace_node", "auto")],
        "dead_node": [("cordon_node", "auto"), ("replace_node", "auto")],
        "straggler": [("replace_at_next_checkpoint", "approval")],
        "training_instability": [("rollback", "approval")],
        "repeat_offender": [("cordon_node", "approval")],
        "crash_loop": [],
        "preemption": [],
        "planned": [],
        "maintenance": [("replace_at_next_checkpoint", "approval"), ("checkpoint_job", "auto")],
    }


def test_a_crash_restarts_the_job_automatically(job, nodes, noop, run_on_commit):
    incident = make_incident(job, cause="software", fault_type="crash", nodes=[nodes["n01"]])
    opened(incident, run_on_commit)
    [action] = Action.objects.all()
    assert (action.kind, action.mode, action.state) == ("restart_job", "auto", S.SUCCEEDED)
    assert (action.incident, action.job, action.node) == (incident, job, None)
    assert action.requested_by == "policy:crash"
    assert action.policy == "crash/restart_job (default)"
    assert noop.calls == [
        {
            "op": "restart_job",
            "job": "llm",
            "from_step": None,
            "nodes": ["n01", "n02"],
            "key": f"rebound:action-{action.pk}",
        }
    ]
    kinds = list(incident.timeline.filter(source="recovery").values_list("kind", flat=True))
    assert kinds == ["action", "action", "action", "action"]  # proposed, queued, running, done


def test_a_hardware_fault_cordons_then_replaces(job, nodes, noop, run_on_commit):
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", xid=79, nodes=[nodes["n01"]])
    opened(incident, run_on_commit)
    cordon, replace = Action.objects.order_by("id")
    assert (cordon.kind, cordon.state, cordon.node.name, cordon.job) == (
        "cordon_node",
        S.SUCCEEDED,
        "n01",
        None,
    )
    assert (replace.kind, replace.state, replace.node.name, replace.job) == (
        "replace_node",
        S.SUCCEEDED,
        "n01",
        job,
    )
    assert replace.spare.name == "s1"
    assert [c["op"] for c in noop.calls] == ["cordon", "replace_node"]
    assert noop.calls[1]["spare"] == "s1"
    nodes["n01"].refresh_from_db()
    nodes["s1"].refresh_from_db()
    assert (nodes["n01"].state, nodes["s1"].state) == (Node.State.IN_REPAIR, Node.State.ACTIVE)
    assert replace.output["node_states"] == {"n01": "in_repair"}


def test_a_chain_stops_when_a_step_fails(job, nodes, noop, run_on_commit):
    from recovery.drivers import DriverError

    noop.errors.append(DriverError("the node does not answer"))
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes["n01"]])
    opened(incident, run_on_commit)
    [cordon] = Action.objects.all()
    assert (cordon.state, cordon.error) == (S.FAILED, "DriverError: the node does not answer")


def test_a_straggler_proposes_a_replacement_at_the_next_checkpoint(job, nodes, run_on_commit):
    incident = make_incident(
        job, cause="straggler", fault_type="straggler", nodes=[nodes["n02"]], attempt=None
    )
    opened(incident, run_on_commit)
    [action] = Action.objects.all()
    assert (action.kind, action.mode, action.state) == (
        "replace_at_next_checkpoint",
        "approval",
        S.AWAITING_APPROVAL,
    )
    assert (action.node.name, action.job, action.params) == ("n02", job, {"after_step": 80})


def test_a_loss_spike_proposes_a_rollback_to_the_checkpoint_before_it(job, nodes, run_on_commit):
    # A checkpoint saved after the spike began holds the bad state: not that one.
    Checkpoint.objects.create(job=job, attempt=1, step=99, saved_at=dt(T0 + 995), durable=True)
    incident = make_incident(job, cause="training_instability", fault_type="loss_spike")
    opened(incident, run_on_commit)
    [action] = Action.objects.all()
    assert (action.kind, action.state, action.params) == (
        "rollback",
        S.AWAITING_APPROVAL,
        {"step": 80},
    )


def test_a_loss_spike_with_nothing_to_roll_back_to_proposes_nothing(job, run_on_commit):
    Checkpoint.objects.all().delete()
    opened(make_incident(job, cause="training_instability", fault_type="nan"), run_on_commit)
    assert not Action.objects.exists()


def test_a_repeat_offender_is_proposed_for_quarantine(job, nodes, run_on_commit):
    incident = make_incident(
        job, cause="gpu", fault_type="repeat_offender", nodes=[nodes["n03"]], attempt=None
    )
    opened(incident, run_on_commit)
    [action] = Action.objects.all()
    assert (action.kind, action.node.name, action.job, action.state) == (
        "cordon_node",
        "n03",
        None,
        S.AWAITING_APPROVAL,
    )


def test_a_crash_loop_does_nothing_by_itself_and_escalates_the_restarts(
    job, nodes, noop, run_on_commit
):
    loop = make_incident(job, fault_type="crash_loop", detector="crash_loop", attempt=None)
    crash = make_incident(job, cause="software", fault_type="crash")
    opened(loop, run_on_commit)
    assert not Action.objects.exists()
    opened(crash, run_on_commit)
    [restart] = Action.objects.all()
    assert (restart.state, restart.blocked_by) == (S.AWAITING_APPROVAL, "crash_loop")
    assert noop.calls == []


def test_opening_twice_proposes_once(job, nodes, noop, run_on_commit):
    incident = make_incident(job, cause="gpu", fault_type="ecc", nodes=[nodes["n01"]])
    opened(incident, run_on_commit)
    opened(incident, run_on_commit)
    services.incident_propose(incident=incident)
    assert Action.objects.count() == 2
    assert [c["op"] for c in noop.calls] == ["cordon", "replace_node"]


def test_closed_incidents_propose_nothing(job, nodes, run_on_commit):
    incident = make_incident(job, state=Incident.State.RESOLVED)
    opened(incident, run_on_commit)
    assert not Action.objects.exists()


def test_a_finished_job_is_not_restarted(job, run_on_commit):
    job.status = "completed"
    job.save()
    opened(make_incident(job), run_on_commit)
    assert not Action.objects.exists()


def test_cluster_and_job_overrides(cluster, job, nodes, noop, run_on_commit):
    RecoveryPolicy.objects.create(
        cluster=cluster, trigger="hardware", kind="replace_node", mode="off"
    )
    RecoveryPolicy.objects.create(
        cluster=cluster, trigger="hardware", kind="drain_node", mode="approval", position=0
    )
    RecoveryPolicy.objects.create(
        cluster=cluster, job=job, trigger="crash", kind="restart_job", mode="approval"
    )
    rules = policies.policy_rules(cluster_id=cluster.pk, job_id=job.pk, trigger="hardware")
    assert [(r.kind, r.mode, r.source) for r in rules] == [
        ("drain_node", "approval", "cluster:east"),
        ("cordon_node", "auto", "default"),
    ]
    opened(make_incident(job, cause="software", fault_type="crash"), run_on_commit)
    [restart] = Action.objects.all()
    assert (restart.mode, restart.state, restart.policy) == (
        "approval",
        S.AWAITING_APPROVAL,
        "crash/restart_job (job:llm)",
    )


def test_a_waiting_approval_does_not_hold_back_an_automatic_restart(
    job, nodes, noop, run_on_commit
):
    """A straggler's replacement waits for approval on the job; the job then crashes:
    its restart runs at once. Approved afterwards, the replacement finds the job
    relaunched since it was proposed, and goes back to the queue saying so."""
    straggler = make_incident(
        job, cause="straggler", fault_type="straggler", nodes=[nodes["n02"]], attempt=None
    )
    opened(straggler, run_on_commit)
    replace = Action.objects.get(kind="replace_at_next_checkpoint")
    assert replace.state == S.AWAITING_APPROVAL
    crash = make_incident(job, cause="software", fault_type="crash")
    opened(crash, run_on_commit)
    restart = Action.objects.get(kind="restart_job")
    assert (restart.incident, restart.state) == (crash, S.SUCCEEDED)
    Attempt.objects.create(
        job=job, number=2, world_size=16, gpus_per_node=8, started_at=dt(T0 + 1000)
    )
    with run_on_commit(), pytest.raises(services.Refused) as exc:
        services.action_approve(action=replace, actor="operator2")
    assert exc.value.code == "stale" and "job launch 1 -> 2" in exc.value.detail
    replace.refresh_from_db()
    assert (replace.state, replace.blocked_by) == (S.AWAITING_APPROVAL, "stale")


def test_an_incident_that_turns_out_to_be_hardware_proposes_the_isolation(
    job, nodes, noop, run_on_commit
):
    incident = make_incident(job, cause="unknown", fault_type="crash")
    opened(incident, run_on_commit)
    assert states(kind="restart_job") == [S.SUCCEEDED]
    # The full pass names an Xid on n01 as the cause.
    Incident.objects.filter(pk=incident.pk).update(cause="gpu", fault_type="gpu_xid", xid=79)
    incident.refresh_from_db()
    incident.nodes.set([nodes["n01"]])
    with run_on_commit():
        incident_updated.send(sender=Incident, incident=incident)
    assert states(kind="cordon_node") == [S.SUCCEEDED]
    assert states(kind="replace_node") == [S.SUCCEEDED]


def test_from_ingest_to_a_cordoned_node(ingest, cluster, noop, run_on_commit):
    """The live path: a GPU falls off the bus; ingest commits, incidents detect and
    announce, the policy cordons the node and moves the job to a spare."""
    Node.objects.create(cluster=cluster, name="spare-1", state=Node.State.SPARE)

    def ev(i, kind, t, **data):
        e = {"id": f"e{i}", "job": "j1", "kind": kind, "ts": T0 + t, "attempt": 1, "data": data}
        if kind == "fault":
            e.update(node="n1", rank=3)
        return e

    events = [
        ev(1, "attempt_started", 0, world_size=8, gpus_per_node=4, nodes=["n0", "n1"]),
        ev(2, "ready", 5),
        ev(3, "step", 10, step=1),
        ev(4, "checkpoint_saved", 11, step=1, tier="remote"),
        ev(5, "step", 12, step=2),
    ]
    with run_on_commit():
        assert ingest(events).status_code == 202
    assert not Action.objects.exists()
    with run_on_commit():
        assert ingest([ev(6, "fault", 13, type="gpu_xid", xid=79)]).status_code == 202
    cordon, replace = Action.objects.order_by("id")
    assert (cordon.kind, cordon.node.name, cordon.state) == ("cordon_node", "n1", S.SUCCEEDED)
    assert (replace.kind, replace.spare.name, replace.state) == (
        "replace_node",
        "spare-1",
        S.SUCCEEDED,
    )
    assert noop.calls[1] == {
        "op": "replace_node",
        "job": "j1",
        "node": "n1",
        "spare": "spare-1",
        "key": f"rebound:action-{replace.pk}",
    }
    assert Node.objects.get(name="n1").state == Node.State.IN_REPAIR
