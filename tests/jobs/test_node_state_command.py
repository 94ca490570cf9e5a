"""manage.py set_node_state: register spares, move nodes between states."""

import pytest
from django.core.management import CommandError, call_command

from jobs.models import Node

pytestmark = pytest.mark.django_db


def test_spares_are_registered_and_nodes_moved():
    call_command("set_node_state", "spare", "s1", "s2", "--cluster", "lab", "--create")
    assert set(Node.objects.values_list("name", "state")) == {("s1", "spare"), ("s2", "spare")}
    call_command("set_node_state", "cordoned", "s1", "--cluster", "lab")
    assert Node.objects.get(name="s1").state == "cordoned"
    with pytest.raises(CommandError, match="no node s3"):
        call_command("set_node_state", "spare", "s3", "--cluster", "lab")


def test_nodes_are_put_in_a_pool_and_taken_out():
    call_command("set_node_state", "active", "a", "b", "--cluster", "lab", "--create")
    call_command("set_node_state", "active", "a", "b", "--cluster", "lab", "--pool", "h100")
    assert set(Node.objects.values_list("name", "pool")) == {("a", "h100"), ("b", "h100")}
    call_command("set_node_state", "spare", "b", "--cluster", "lab", "--pool", "")
    assert Node.objects.get(name="b").pool == "" and Node.objects.get(name="a").pool == "h100"
    with pytest.raises(CommandError, match="pool name"):
        call_command("set_node_state", "active", "a", "--cluster", "lab", "--pool", "bad pool")
    assert Node.objects.get(name="a").pool == "h100"
