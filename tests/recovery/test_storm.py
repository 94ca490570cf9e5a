"""Storm protection: many nodes failing at once get at most the allowed automatic
isolations; the rest wait for approval with the guardrail named."""

import pytest

from incidents.models import Incident
from incidents.signals import incident_opened
from jobs.models import Node
from recovery.models import Action
from tests.factories import ClusterRecoverySettingsFactory, NodeFactory
from tests.recovery.conftest import make_incident, make_job

pytestmark = pytest.mark.django_db

S = Action.State


@pytest.fixture
def big(cluster):
    """20 active nodes and 2 spares: 10% of 22 allows 2 automatic isolations."""
    nodes = {f"g{i:02d}": NodeFactory(cluster=cluster, name=f"g{i:02d}") for i in range(20)}
    for name in ("s1", "s2"):
        nodes[name] = NodeFactory(cluster=cluster, name=name, state=Node.State.SPARE)
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
    from recovery import queue, services

    for i in range(3):
        job = make_job(cluster, big, key=f"job{i}", on=(f"g{i:02d}",), world_size=8)
        make_incident(job, cause="memory", fault_type="ecc", nodes=[big[f"g{i:02d}"]])
    with run_on_commit():
        for incident in Incident.objects.order_by("id"):
            incident_opened.send(sender=Incident, incident=incident)
    [waiting] = Action.objects.filter(state=S.AWAITING_APPROVAL, kind="cordon_node")
    assert waiting.blocked_by == "storm"
    with run_on_commit():
        approved = services.action_approve(
            action=waiting, actor="operator2", comment="checked: bad GPU"
        )
        queue.action_send(approved)
    waiting.refresh_from_db()
    assert waiting.state == S.SUCCEEDED


# --- the nodes a cluster really has -------------------------------------------------


def _hardware_storm(cluster, big, count: int) -> list[Action]:
    """`count` GPU faults on g00.. of `big`, each on its own job, opened at once."""
    incidents = []
    for i in range(count):
        name = f"g{i:02d}"
        job = make_job(cluster, big, key=f"job{i}", on=(name,), world_size=8)
        incidents.append(
            make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[big[name]], attempt=1)
        )
    return incidents


def test_nodes_a_batch_merely_names_do_not_raise_the_storm_limit(
    cluster, big, personas, ingest, run_on_commit
):
    # One attempt_started naming 2,000 made-up nodes: ingest creates them all.
    ghosts = [f"ghost-{i:04d}" for i in range(2000)]
    event = {
        "id": "start-1",
        "job": "ghostly",
        "kind": "attempt_started",
        "ts": 1_790_000_000.0,
        "attempt": 1,
        "data": {"world_size": 16000, "gpus_per_node": 8, "nodes": ghosts},
    }
    assert ingest([event]).status_code in (200, 202)
    assert Node.objects.filter(cluster=cluster).count() == 2022

    with run_on_commit():
        for incident in _hardware_storm(cluster, big, 6):
            incident_opened.send(sender=Incident, incident=incident)
    cordons = Action.objects.filter(kind="cordon_node")
    # The 22 registered nodes set the limit (10%: 2), not the 2,022 rows.
    assert cordons.filter(state=S.SUCCEEDED).count() == 2
    waiting = cordons.filter(state=S.AWAITING_APPROVAL)
    assert waiting.count() == 4 and {a.blocked_by for a in waiting} == {"storm"}
    assert all(a.blocked_reason.startswith("storm: 3 of 22 nodes") for a in waiting)


def test_nodes_heard_from_lately_count_and_silent_unregistered_ones_do_not(cluster, run_on_commit):
    from datetime import timedelta

    from django.utils import timezone

    from recovery import guardrails
    from recovery.selectors import cluster_settings

    now = timezone.now()
    for i in range(30):  # made by ingest: counted while heard from
        NodeFactory(
            cluster=cluster,
            name=f"h{i:02d}",
            registered=False,
            last_heard_at=now - timedelta(seconds=30),
        )
    for i in range(50):  # made by ingest, never heard from, or not for hours
        NodeFactory(
            cluster=cluster,
            name=f"q{i:02d}",
            registered=False,
            last_heard_at=None if i % 2 else now - timedelta(hours=3),
        )
    NodeFactory(cluster=cluster, name="spare1", state=Node.State.SPARE)  # registered
    state = guardrails.storm_state(
        cluster.pk, guardrails.Context(cluster_settings(cluster.pk), now)
    )
    assert (state.nodes, state.allowed) == (31, 3)


def test_an_absolute_cap_holds_whatever_the_clusters_size(cluster, run_on_commit):
    nodes = {f"g{i:03d}": NodeFactory(cluster=cluster, name=f"g{i:03d}") for i in range(200)}
    ClusterRecoverySettingsFactory(cluster=cluster, storm_max_nodes=3)  # 10%: 20
    incidents = []
    for i in range(5):
        name = f"g{i:03d}"
        job = make_job(cluster, nodes, key=f"job{i}", on=(name,), world_size=8)
        incidents.append(make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes[name]]))
    with run_on_commit():
        for incident in incidents:
            incident_opened.send(sender=Incident, incident=incident)
    cordons = Action.objects.filter(kind="cordon_node")
    assert cordons.filter(state=S.SUCCEEDED).count() == 3
    waiting = list(cordons.filter(state=S.AWAITING_APPROVAL))
    assert len(waiting) == 2 and {a.blocked_by for a in waiting} == {"storm"}
    assert all("of 200 nodes" in a.blocked_reason for a in waiting)
    assert all("more than the cap of 3 nodes" in a.blocked_reason for a in waiting)


def test_the_default_absolute_cap_is_ten_nodes(cluster):
    from recovery.selectors import cluster_settings

    assert cluster_settings(cluster.pk).storm_max_nodes == 10
