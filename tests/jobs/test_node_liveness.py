"""A node's liveness columns are rewritten at most once per REBOUND_NODE_LIVENESS_S:
heartbeats of the same nodes batch after batch leave one row version per node and
granularity, not one per batch, and the readers allow for that much staleness."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.models import Node

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
NODES = [f"n{i}" for i in range(8)]


def beats(t, seq):
    """One heartbeat of every node at job time T0 + t."""
    return [
        {"id": f"hb{seq}-{n}", "job": "live", "kind": "heartbeat", "ts": T0 + t, "node": n}
        for n in NODES
    ]


def stored():
    return {
        n.name: (n.last_heartbeat_at.timestamp(), n.last_heard_at)
        for n in Node.objects.filter(name__in=NODES)
    }


def row_versions():
    """Each node row's physical place: any UPDATE of a row (HOT or not) moves it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, ctid::text FROM jobs_node WHERE name = ANY(%s)", [NODES])
        return dict(cursor.fetchall())


def test_batches_within_the_granularity_do_not_move_the_nodes(ingest, settings):
    settings.REBOUND_NODE_LIVENESS_S = 5.0
    assert ingest(beats(0, 0)).status_code == 202
    first = stored()
    assert {t for t, _ in first.values()} == {T0}
    for k in range(1, 10):  # 0.5 s apart: all within 5 s of the first
        assert ingest(beats(k * 0.5, k)).status_code == 202
    assert stored() == first
    # Past the granularity the job clock moves; the console's clock moves once it too is
    # that far behind (set back here, as five seconds passing would).
    Node.objects.filter(name__in=NODES).update(last_heard_at=timezone.now() - timedelta(seconds=6))
    assert ingest(beats(5.6, 10)).status_code == 202
    moved = stored()
    assert {t for t, _ in moved.values()} == {T0 + 5.6}
    assert all(heard > first[n][1] for n, (_, heard) in moved.items())


def test_a_heartbeat_never_moves_a_node_back(ingest, settings):
    settings.REBOUND_NODE_LIVENESS_S = 5.0
    assert ingest(beats(60, 0)).status_code == 202
    assert ingest(beats(0, 1)).status_code == 202  # a late batch
    assert {t for t, _ in stored().values()} == {T0 + 60}


def test_no_granularity_moves_them_on_every_newer_heartbeat(ingest, settings):
    settings.REBOUND_NODE_LIVENESS_S = 0.0
    for k in range(3):
        assert ingest(beats(k * 0.5, k)).status_code == 202
        assert {t for t, _ in stored().values()} == {T0 + k * 0.5}


@pytest.mark.postgres
def test_one_row_version_per_node_within_the_granularity(ingest, settings):
    settings.REBOUND_NODE_LIVENESS_S = 5.0
    assert ingest(beats(0, 0)).status_code == 202
    before = row_versions()
    for k in range(1, 20):
        assert ingest(beats(k * 0.2, k)).status_code == 202
    assert row_versions() == before  # 19 batches, no UPDATE of any node
    assert ingest(beats(6, 20)).status_code == 202
    after = row_versions()
    assert all(after[n] != before[n] for n in NODES)  # past it: each node once
