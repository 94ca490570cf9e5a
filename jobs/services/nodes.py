"""Writes of nodes and clusters: a node's state moves by conditional updates, so of two
racing writers (a detector, a recovery action, an operator) exactly one wins."""

from django.utils import timezone

from jobs.models import Cluster, Node


def node_mark_suspect(*, node_id: int) -> bool:
    """An active node that stopped answering becomes suspect; other states stay."""
    changed = Node.objects.filter(pk=node_id, state=Node.State.ACTIVE).update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    return changed == 1


def node_set_state(*, node_id: int, to: str, from_states=None) -> bool:
    """Moves a node to `to` when it is in one of `from_states` (any state but `to`
    when None): a conditional update, so of two racing writers one wins."""
    nodes = Node.objects.filter(pk=node_id).exclude(state=to)
    if from_states is not None:
        nodes = nodes.filter(state__in=list(from_states))
    return nodes.update(state=to, state_changed_at=timezone.now()) == 1


def node_claim_spare(*, cluster_id: int, exclude_ids=()) -> Node | None:
    """Takes a spare node of the cluster into service (spare -> active), or None
    when none is left. Each spare is claimed by one caller only."""
    candidates = (
        Node.objects.filter(cluster_id=cluster_id, state=Node.State.SPARE)
        .exclude(pk__in=list(exclude_ids))
        .order_by("name")
        .values_list("pk", flat=True)
    )
    for pk in candidates:
        if node_set_state(node_id=pk, to=Node.State.ACTIVE, from_states=[Node.State.SPARE]):
            return Node.objects.get(pk=pk)
    return None


def cluster_get_or_create(*, name: str) -> Cluster:
    cluster, _ = Cluster.objects.get_or_create(name=name)
    return cluster
