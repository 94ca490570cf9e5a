"""Recovery fixtures: a cluster `east` of ten active nodes and two spares, a running
job on two of them with a durable checkpoint, incidents made to order, a second
operator (approvals need one). The `noop` driver every cluster drives is
tests/conftest.py's."""

from datetime import UTC, datetime

import pytest

from console.services import token_issue
from jobs.models import Node, TrainingJob
from recovery.models import Action
from tests.conftest import Persona
from tests.factories import (
    AttemptFactory,
    CheckpointFactory,
    ClusterFactory,
    IncidentFactory,
    NodeFactory,
    TrainingJobFactory,
    UserFactory,
)

T0 = 1_790_000_000.0


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="east")


@pytest.fixture
def nodes(cluster):
    """n01..n10 active, s1 and s2 spare: {name: Node}."""
    out = {}
    for i in range(1, 11):
        out[f"n{i:02d}"] = NodeFactory(cluster=cluster, name=f"n{i:02d}", gpus=8)
    for name in ("s1", "s2"):
        out[name] = NodeFactory(cluster=cluster, name=name, gpus=8, state=Node.State.SPARE)
    return out


def make_job(cluster, nodes, key="llm", on=("n01", "n02"), world_size=16):
    """A running job at step 100 (T0 + 1000), launched at T0 on `on`, with a durable
    checkpoint of step 80 saved at T0 + 800."""
    job = TrainingJobFactory(
        key=key,
        cluster=cluster,
        status=TrainingJob.Status.RUNNING,
        first_event_ts=T0,
        last_event_ts=T0 + 1000,
        last_step=100,
        last_step_ts=T0 + 1000,
    )
    AttemptFactory(
        job=job,
        number=1,
        world_size=world_size,
        gpus_per_node=8,
        started_at=dt(T0),
        nodes=[nodes[n] for n in on],
    )
    CheckpointFactory(
        job=job, attempt=1, step=80, saved_at=dt(T0 + 800), durable=True, tier="remote"
    )
    return job


@pytest.fixture
def job(cluster, nodes):
    return make_job(cluster, nodes)


def make_incident(job, *, cause="software", fault_type="crash", nodes=(), **fields):
    """An incident of `job` on `nodes`, found at T0 + 995 of a fault at T0 + 990."""
    return IncidentFactory(
        job=job,
        cause=cause,
        fault_type=fault_type,
        nodes=list(nodes),
        summary=fields.pop("summary", f"{fault_type} on {', '.join(n.name for n in nodes)}"),
        fault_at=fields.pop("fault_at", dt(T0 + 990)),
        detected_at=fields.pop("detected_at", dt(T0 + 995)),
        **fields,
    )


def audit_moves(action) -> list[tuple[str, str]]:
    return list(action.audit.order_by("at", "id").values_list("from_state", "to_state"))


def states(**filters) -> list[str]:
    return list(Action.objects.filter(**filters).order_by("id").values_list("state", flat=True))


@pytest.fixture
def operator2(personas):
    """A second operator: the one who may approve what `operator` proposed."""
    user = UserFactory(username="operator2", role="operator")
    _, raw = token_issue(scope="operator", username="operator2")
    personas["operator2"] = Persona("operator2", raw, user)
    return personas["operator2"]


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks):
    """`with run_on_commit():` runs what was sent on commit (tasks run inline)."""

    def ctx():
        return django_capture_on_commit_callbacks(execute=True)

    return ctx
