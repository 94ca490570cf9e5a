"""The API against its own OpenAPI schema: schemathesis generates requests for every
operation from /api/v1/schema and sends each one with a token of every scope and with
none, through Django's WSGI application. Every answer must be no server error, carry a
status the schema documents for that operation, and a body and headers that match it.

Deterministic (derandomized generation) and bounded: a fixed number of generated cases
per operation, each sent five times. The database holds a small world (a cluster, nodes,
a job with two launches, an incident, an action awaiting approval) and path parameters
are drawn from it as often as at random, so detail pages and commands reach their bodies.
"""

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.time import dt
from incidents import services as incident_services
from incidents.models import Incident
from jobs import services as job_services
from jobs.models import Cluster, TrainingJob
from recovery import services as recovery_services
from tests.conftest import examples

CLUSTER = "east"
JOB = "fuzz-job"
T0 = 1_790_000_000.0
# Each case goes out with each of these: the four scopes of tests/conftest.py and no token.
SCOPES = ("ingest", "viewer", "operator", "admin", None)
MAX_EXAMPLES = examples(20)  # generated cases per operation (20 under the ci profile)
CONFIG = schemathesis.Config.from_dict(
    {
        # a request must be expressible as a real request
        "generation": {"with-security-parameters": False},
        # No 5xx; status, content type, headers and body as the schema documents them.
        "checks": {
            "enabled": False,
            **{
                name: {"enabled": True}
                for name in (
                    "not_a_server_error",
                    "status_code_conformance",
                    "content_type_conformance",
                    "response_headers_conformance",
                    "response_schema_conformance",
                )
            },
        },
    }
)


def _events():
    """Two launches of a job on two nodes: a crash in the first, steps and a durable
    checkpoint in both."""
    ev = []

    def add(kind, ts, attempt=None, **fields):
        event = {"id": f"{JOB}-{len(ev)}", "job": JOB, "kind": kind, "ts": T0 + ts}
        if attempt is not None:
            event["attempt"] = attempt
        event.update(fields)
        ev.append(event)

    for attempt, start in ((1, 0), (2, 400)):
        add(
            "attempt_started",
            start,
            attempt,
            data={"world_size": 8, "gpus_per_node": 4, "nodes": ["n1", "n2"]},
        )
        add("ready", start + 10, attempt)
        for step in range(1, 21):
            add("step", start + 10 + step * 5, attempt, rank=0, data={"step": step})
        add("checkpoint_saved", start + 60, attempt, data={"step": 10, "blocking_s": 1.0})
    add("fault", 200, 1, node="n2", rank=3, data={"type": "crash", "exit_code": 1})
    add("attempt_ended", 201, 1, data={"reason": "failed", "exit_code": 1})
    return sorted(ev, key=lambda e: e["ts"])


@pytest.fixture
def in_test_transaction(world):
    """Keep the test's database connection across requests, as Django's test client does
    for each of its own: the WSGI handler would close it at each request's end, inside
    the test's transaction."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(ingest, personas):
    """The rows the fuzzer finds: path parameters it may use, by name."""
    assert ingest(_events()).status_code == 202
    job = TrainingJob.objects.get(key=JOB)
    incident_services.incidents_detect(job=job)
    incident_services.incidents_update_figures(job=job)
    cluster = Cluster.objects.get(name=CLUSTER)
    action = recovery_services.action_propose(
        cluster=cluster,
        kind="restart_job",
        job=job,
        reason="fuzz",
        requested_by="operator",
        requested_by_user=personas["operator"].user,
    )
    incidents = list(Incident.objects.filter(job=job).values_list("pk", flat=True))
    window = job_services.maintenance_window_create(
        cluster=cluster, starts_at=dt(T0 + 150), ends_at=dt(T0 + 250), nodes=["n2"]
    )
    KNOWN.clear()
    ids = [action.pk, *incidents, window.pk]
    KNOWN.update({"key": [JOB], "name": [CLUSTER], "id": ids})
    yield KNOWN
    KNOWN.clear()


def _load_schema():
    """The live schema, as the WSGI application serves it (generating it reads no table),
    and its operations by label; a schema that cannot be loaded fails one test below
    instead of stopping the suite's collection."""
    try:
        schema = schemathesis.openapi.from_wsgi(
            "/api/v1/schema", get_wsgi_application(), config=CONFIG
        )
        operations = {
            f"{op.method.upper()} {op.path}": op
            for op in (result.ok() for result in schema.get_all_operations())
        }
    except Exception as exc:
        return {}, exc
    return operations, None


OPERATIONS, LOAD_ERROR = _load_schema()
# Path parameters the world holds, filled by the `world` fixture of each test.
KNOWN: dict[str, list] = {}
PATH_PARAMETERS = ("key", "name", "id")


def _known(name, index):
    values = KNOWN[name]
    return values[index % len(values)]


@schemathesis.hook
def flatmap_path_parameters(context, path_parameters):
    """Half of the cases name a row that exists, so the fuzzer gets past the 404."""
    if not path_parameters or not all(name in PATH_PARAMETERS for name in path_parameters):
        return st.just(path_parameters)
    existing = st.fixed_dictionaries(
        {n: st.integers(0, 7).map(lambda i, n=n: _known(n, i)) for n in path_parameters}
    )
    return st.one_of(st.just(path_parameters), existing)


def test_the_schema_loads_with_every_operation():
    assert LOAD_ERROR is None, f"{type(LOAD_ERROR).__name__}: {LOAD_ERROR}"
    assert len(OPERATIONS) >= 20


# Schema-valid and schema-invalid requests alike.
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_answer_is_documented_and_no_server_error(operation, personas, in_test_transaction):
    op = OPERATIONS[operation]
    strategy = st.one_of(*(op.as_strategy(generation_mode=mode) for mode in MODES))

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,  # the same cases on every run
        database=None,
        deadline=None,
        # Health checks judge generation speed, which a loaded CI machine fails at random.
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def each_case(case):
        for scope in SCOPES:
            headers = {"Authorization": f"Bearer {personas[scope].token}"} if scope else {}
            try:
                case.call_and_validate(headers=headers)
            except Exception as exc:
                exc.add_note(f"scope: {scope or 'no token'}")
                raise

    each_case()
