"""The factories build what the tests built by hand: required columns filled, every
optional one at its model default, related rows on the same cluster."""

import pytest

from console.roles import user_role
from incidents.models import Incident
from jobs.models import Cluster, Node
from recovery.models import Action
from tests.factories import (
    ActionFactory,
    AttemptFactory,
    ClusterFactory,
    IncidentFactory,
    NodeFactory,
    TrainingJobFactory,
    UserFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db


def test_a_cluster_is_found_by_its_name_rather_than_made_twice():
    assert ClusterFactory() == ClusterFactory(name="east") == Cluster.objects.get(name="east")
    assert Cluster.objects.count() == 1


def test_optional_columns_keep_their_model_defaults():
    node = NodeFactory()
    assert (node.state, node.gpus, node.registered) == (Node.State.ACTIVE, None, True)
    action = ActionFactory()
    assert (action.state, action.reason, action.mode) == (
        Action.State.PROPOSED,
        "",
        Action.Mode.APPROVAL,
    )


def test_related_rows_share_the_cluster():
    west = ClusterFactory(name="west")
    node = NodeFactory(cluster=west)
    assert ActionFactory(node=node).cluster == west
    job = TrainingJobFactory(cluster=west)
    assert ActionFactory(kind="restart_job", job=job).cluster == west
    assert IncidentFactory(job=job).cluster == west


def test_launches_number_themselves_and_take_their_nodes():
    job = TrainingJobFactory()
    a, b = NodeFactory(cluster=job.cluster), NodeFactory(cluster=job.cluster)
    first = AttemptFactory(job=job, nodes=[a, b])
    second = AttemptFactory(job=job)
    assert (first.number, second.number) == (1, 2)
    assert set(first.nodes.all()) == {a, b} and not second.nodes.exists()


def test_incidents_get_episodes_of_their_own():
    job = TrainingJobFactory()
    one, two = incident_row(job), IncidentFactory(job=job)
    assert one.episode != two.episode
    assert Incident.objects.filter(job=job).count() == 2


def test_users_get_their_role_and_no_password_unless_given():
    assert user_role(UserFactory(role="operator")) == "operator"
    plain = UserFactory()
    assert user_role(plain) is None and not plain.has_usable_password()
    assert UserFactory(password="correct-horse-battery-staple-42").check_password(
        "correct-horse-battery-staple-42"
    )
