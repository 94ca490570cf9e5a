"""Factories (factory_boy) for the rows the suite builds: clusters, nodes, jobs and
their launches and checkpoints, incidents and their timelines, recovery actions and
users with a role.

Each factory fills only what its model requires, with values any test may rely on
(a cluster `east`, a `crash` incident of cause `software`, a `cordon_node` action);
every optional column keeps its model default, so `XFactory(field=...)` builds the
same row as `X.objects.create(field=...)` did. Many-to-many `nodes` are given as a
list: `AttemptFactory(job=job, nodes=[n1, n2])`.

`incident_row` is the console tests' shorthand for an incident at a fault time.
"""

from __future__ import annotations

import factory
from django.conf import settings
from django.utils import timezone
from factory.django import DjangoModelFactory

from console.services import user_set_role
from incidents.models import Incident, TimelineEntry
from jobs.models import (
    Attempt,
    Checkpoint,
    Cluster,
    LedgerSnapshot,
    Node,
    RankWindow,
    StepRecord,
    TrainingJob,
)
from jobs.selectors.prices import nodes_by_pool
from recovery.models import Action, ActionAudit, ClusterRecoverySettings


def _set_nodes(obj, create, extracted):
    """`nodes=[...]` on a model whose `nodes` is many-to-many."""
    if create and extracted is not None:
        obj.nodes.set(extracted)


class ClusterFactory(DjangoModelFactory):
    """`east` by default, and the existing row when one has the name (the ingest
    personas' tokens create `east` and `west`)."""

    class Meta:
        model = Cluster
        django_get_or_create = ("name",)

    name = "east"


class NodeFactory(DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node{n:04d}")


class TrainingJobFactory(DjangoModelFactory):
    class Meta:
        model = TrainingJob

    key = factory.Sequence(lambda n: f"job-{n}")
    cluster = factory.SubFactory(ClusterFactory)


class AttemptFactory(DjangoModelFactory):
    """A launch of its job: the next number unless given."""

    class Meta:
        model = Attempt
        skip_postgeneration_save = True

    job = factory.SubFactory(TrainingJobFactory)
    number = factory.LazyAttribute(lambda o: o.job.attempts.count() + 1)

    @factory.post_generation
    def nodes(obj, create, extracted, **kwargs):
        _set_nodes(obj, create, extracted)
        if create and extracted is not None:  # as ingest keeps them (jobs.services.lifecycle)
            obj.pool_counts = nodes_by_pool(n.pk for n in extracted)
            obj.save(update_fields=["pool_counts"])


class CheckpointFactory(DjangoModelFactory):
    class Meta:
        model = Checkpoint

    job = factory.SubFactory(TrainingJobFactory)
    attempt = 1
    step = factory.Sequence(lambda n: (n + 1) * 10)


class StepRecordFactory(DjangoModelFactory):
    class Meta:
        model = StepRecord

    job = factory.SubFactory(TrainingJobFactory)
    attempt = 1
    step = factory.Sequence(lambda n: n + 1)
    ts = factory.LazyFunction(lambda: timezone.now().timestamp())


class RankWindowFactory(DjangoModelFactory):
    class Meta:
        model = RankWindow

    job = factory.SubFactory(TrainingJobFactory)
    attempt = 1
    rank = 0
    first_step = 1
    last_step = 10
    ts = factory.LazyFunction(lambda: timezone.now().timestamp())
    compute_s = 1.0
    step_s = 1.0


class LedgerSnapshotFactory(DjangoModelFactory):
    class Meta:
        model = LedgerSnapshot

    job = factory.SubFactory(TrainingJobFactory)
    revision = 0
    figures = factory.LazyFunction(dict)


class IncidentFactory(DjangoModelFactory):
    """A major software crash of its job's first launch, found when it happened."""

    class Meta:
        model = Incident
        skip_postgeneration_save = True

    job = factory.SubFactory(TrainingJobFactory)
    cluster = factory.SelfAttribute("job.cluster")
    detector = "launch_fault"
    episode = factory.Sequence(lambda n: f"e{n + 1}")
    attempt = 1
    cause = "software"
    fault_type = "crash"
    severity = "major"
    summary = "crash on a node"
    fault_at = factory.LazyFunction(timezone.now)
    detected_at = factory.SelfAttribute("fault_at")

    @factory.post_generation
    def nodes(obj, create, extracted, **kwargs):
        _set_nodes(obj, create, extracted)


class TimelineEntryFactory(DjangoModelFactory):
    class Meta:
        model = TimelineEntry

    incident = factory.SubFactory(IncidentFactory)
    kind = "note"
    at = factory.LazyFunction(timezone.now)
    actor = "test"
    message = factory.Sequence(lambda n: f"entry {n}")


def _action_cluster(o):
    """An action's cluster is its node's, else its job's, else `east`."""
    if o.node is not None:
        return o.node.cluster
    if o.job is not None:
        return o.job.cluster
    return ClusterFactory()


class ActionFactory(DjangoModelFactory):
    """A proposed `cordon_node` (of `node`, when given) that `someone` requested."""

    class Meta:
        model = Action

    kind = "cordon_node"
    node = None
    job = None
    cluster = factory.LazyAttribute(_action_cluster)
    requested_by = "someone"


class ActionAuditFactory(DjangoModelFactory):
    class Meta:
        model = ActionAudit

    action = factory.SubFactory(ActionFactory)
    at = factory.LazyFunction(timezone.now)
    actor = "test"
    to_state = factory.SelfAttribute("action.state")


class ClusterRecoverySettingsFactory(DjangoModelFactory):
    class Meta:
        model = ClusterRecoverySettings

    cluster = factory.SubFactory(ClusterFactory)


class UserFactory(DjangoModelFactory):
    """A user made as `create_user` makes one (no password: an unusable one), with
    `role=` one of admin, operator, viewer (none: a user allowed nothing)."""

    class Meta:
        model = settings.AUTH_USER_MODEL
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = None

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        return model_class._default_manager.create_user(*args, **kwargs)

    @factory.post_generation
    def role(obj, create, extracted, **kwargs):
        if create and extracted:
            user_set_role(user=obj, role=extracted)


def incident_row(job, *, fault_at=None, nodes=(), lost_s=0.0, **fields) -> Incident:
    """An incident of `job`: a software crash found at its fault time, unless `fields`
    say otherwise."""
    fault_at = fault_at or timezone.now()
    fields = {"lost_gpu_seconds": lost_s, **fields}
    return IncidentFactory(job=job, fault_at=fault_at, nodes=list(nodes), **fields)
