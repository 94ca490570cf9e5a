"""Storm protection: many nodes failing at once get at most the allowed automatic
isolations; the rest wait for approval with the guardrail named."""

import pytest

from incidents.models import Incident
from incidents.signals import incident_opened
from jobs.models import Node
from recovery.models import Action
from tests.recovery.conftest import make_incident, make_job

pytestmark = pytest.mark.django_db

S = Action.State


@pytest.fixture
def big(cluster):
    """20 active nodes and 2 spares: 10% of 22 allows 2 automatic isolations."""
    nodes = {f"g{i:02d}": Node.objects.create(cluster=cluster, name=f"g{i:02d}") for i in range(20)}
    for name in ("s1", "s2"):
        nodes[name] = Node.objects.create(cluster=cluster, name=name, state=Node.State.SPARE)
    return nodes


def test_a_storm_of_hardware_faults_isolates_at_most_the_allowed_share(
    cluster, big, noop, run_on_commit
):
    failing = [f"g{i:02d}" for i in range(6)]
    incidents = []
    for i, name in enumerate(failing):
        job = make_job(cluster, big, key=f"job{i}", on=(name,), world_size=8)
        incidents.append(
            make_incident(
                job, cause="gpu", fault_type="gpu_xid", xid=79, nodes=[big[name]], attempt=1
            )
        )
    with run_on_commit():
        for incident in incidents:
            incident_opened.send(sender=Incident, incident=incident)

    cordons = Action.objects.filter(kind="cordon_node").order_by("id")
    assert cordons.count() == 6
    ran = [a for a in cordons if a.state == S.SUCCEEDED]
    waiting = [a for a in cordons if a.state == S.AWAITING_APPROVAL]
    assert len(ran) == 2 and len(waiting) == 4
    assert {a.blocked_by for a in waiting} == {"storm"}
    assert all(a.blocked_reason.startswith("storm: 3 of 22 nodes") for a in waiting)
    # The two isolated nodes went on to their replacement, one spare each.
    replaced = Action.objects.filter(kind="replace_node", state=S.SUCCEEDED)
    assert sorted(a.node.name for a in replaced) == sorted(a.node.name for a in ran)
    assert sorted(a.spare.name for a in replaced) == ["s1", "s2"]
    assert [c["op"] for c in noop.calls].count("cordon") == 2
    isolated = Node.objects.exclude(state__in=[Node.State.ACTIVE, Node.State.SPARE])
    assert isolated.count() == 2
    # Nothing was done to the nodes still waiting for a person.
    assert {Node.objects.get(pk=a.node_id).state for a in waiting} == {Node.State.ACTIVE}


def test_a_person_may_approve_isolations_during_a_storm(cluster, big, noop, run_on_commit):
    from recovery import services

    for i in range(3):
        job = make_job(cluster, big, key=f"job{i}", on=(f"g{i:02d}",), world_size=8)
        make_incident(job, cause="memory", fault_type="ecc", nodes=[big[f"g{i:02d}"]])
    with run_on_commit():
        for incident in Incident.objects.order_by("id"):
            incident_opened.send(sender=Incident, incident=incident)
    [waiting] = Action.objects.filter(state=S.AWAITING_APPROVAL, kind="cordon_node")
    assert waiting.blocked_by == "storm"
    with run_on_commit():
        services.action_approve(action=waiting, actor="operator2", comment="checked: bad GPU")
    waiting.refresh_from_db()
    assert waiting.state == S.SUCCEEDED
