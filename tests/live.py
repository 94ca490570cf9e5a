"""A live stack for end-to-end tests: a local cluster of real torch ranks reporting to
a console under test, and ways to wait for what they do. Its fixtures are loaded
for every test (tests/conftest.py) and used by the end-to-end modules."""

import time

import pytest
from django.db.models import Max

from agent.cluster import LocalCluster
from console.services import token_issue
from incidents import receivers
from jobs.models import StepRecord
from jobs.services import follow_up as job_follow_up

TRAIN = {
    "global_batch": 8,
    "micro_batch": 2,
    "window": 4,
    "heartbeat_s": 0.5,
    "collective_timeout_s": 60,
    "ckpt_every": 25,
}


@pytest.fixture
def quick_passes(monkeypatch):
    """Detection and ledger passes a second after a batch, not five: here, and in the
    worker processes a test starts (which ask for that work after an ingest)."""
    monkeypatch.setattr(receivers, "DEBOUNCE_S", 1)
    monkeypatch.setattr(job_follow_up, "LEDGER_REFRESH_DEBOUNCE_S", 1)
    monkeypatch.setenv("REBOUND_DETECT_DEBOUNCE_S", "1")
    monkeypatch.setenv("REBOUND_LEDGER_DEBOUNCE_S", "1")


def make_cluster(tmp_path, url, nodes=("n1", "n2", "n3", "n4")) -> LocalCluster:
    _, token = token_issue(scope="ingest", cluster_name="local")
    cluster = LocalCluster.create(
        tmp_path / "cluster",
        nodes=dict.fromkeys(nodes, 1),
        sink={"url": url, "token": token},
        heartbeat_s=0.5,
    )
    cluster.start_node_agents()
    return cluster


@pytest.fixture
def live_cluster(tmp_path, live_server, quick_passes):
    """A local cluster of four 1-slot nodes whose ranks report to the live server."""
    cluster = make_cluster(tmp_path, live_server.url)
    yield cluster
    # Quick: every launch and node agent is told at once and waited for (killed past
    # the grace), so none is still posting when the test's tables are flushed.
    cluster.shutdown(quick=True)
    database_quiet()


def database_quiet(timeout_s: float = 15.0, quiet_s: float = 1.0) -> None:
    """Waits until no other connection to the test database has been inside a
    statement or transaction for `quiet_s`: a request of the stopped ranks still being
    served (or still in a socket's queue) would otherwise deadlock with the test's
    flush (TRUNCATE) of the tables."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state NOT IN ('idle')"
            )
            busy = cur.fetchone()[0]
        if busy:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.05)


def until(condition, what: str, timeout_s: float = 60.0, cluster=None, job=None, describe=None):
    """`condition()`'s first true value; on timeout an error saying what was awaited,
    with the job's state on the cluster and what `describe()` tells."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            state = cluster.status(job) if cluster is not None else ""
            seen = describe() if describe is not None else ""
            raise AssertionError(f"timed out waiting for {what} {state} {seen}")
        time.sleep(0.2)


def stored_step(job: str, attempt: int = 1) -> int:
    agg = StepRecord.objects.filter(job__key=job, attempt=attempt).aggregate(m=Max("step"))
    return agg["m"] or 0
