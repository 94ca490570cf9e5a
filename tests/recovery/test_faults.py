"""Fault injection through the API and the management command, on a real local cluster
(its nodes' flag files, its jobs' control files, and one real torch launch)."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from agent import control
from agent.cluster import LocalCluster
from jobs.models import Cluster, TrainingJob
from recovery.models import ClusterRecoverySettings

pytestmark = pytest.mark.django_db
URL = "/api/v1/clusters/lab/faults"


@pytest.fixture
def lab(tmp_path):
    """Cluster `lab` driven by the local driver over a LocalCluster under tmp_path."""
    local = LocalCluster.create(
        tmp_path, nodes={"a": 1, "b": 1}, sink={"events": tmp_path / "events.jsonl"}
    )
    cluster = Cluster.objects.create(name="lab")
    ClusterRecoverySettings.objects.create(
        cluster=cluster, driver="local", driver_options={"root": str(tmp_path)}
    )
    TrainingJob.objects.create(key="j1", cluster=cluster)
    yield local
    local.shutdown()


def inject(personas, body, persona="admin"):
    return personas[persona].client().post(URL, body, format="json")


def test_only_admins_inject(personas, lab):
    body = {"kind": "silence", "node": "a"}
    assert personas["outsider"].client().post(URL, body, format="json").status_code == 403
    for persona in ("viewer", "operator", "ingest"):
        assert inject(personas, body, persona).status_code == 403, persona
    assert inject(personas, body).status_code == 200
    assert APIClient().post(URL, body, format="json").status_code == 401


def test_silence_and_a_slow_rank_reach_the_cluster(personas, lab):
    assert inject(personas, {"kind": "silence", "node": "b"}).status_code == 200
    assert control.NodeFlags(lab.node_flags_path("b")).heartbeats() is False
    assert inject(personas, {"kind": "unsilence", "node": "b"}).status_code == 200
    assert control.NodeFlags(lab.node_flags_path("b")).heartbeats() is True
    r = inject(personas, {"kind": "slow", "job": "j1", "rank": 1, "factor": 3})
    assert r.status_code == 200, r.content
    assert control.JobControl(lab.control_path("j1")).slow_factor(1) == 3
    assert inject(personas, {"kind": "clear", "job": "j1"}).status_code == 200
    assert control.JobControl(lab.control_path("j1")).slow_factor(1) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "crash", "job": "j1"}, "rank"),
        ({"kind": "xid", "node": "a"}, "xid"),
        ({"kind": "slow", "job": "j1", "rank": 0, "factor": 0.5}, "factor"),
        ({"kind": "crash", "job": "nope", "rank": 0}, "job"),
    ],
)
def test_what_a_fault_needs_is_named(personas, lab, body, field):
    r = inject(personas, body)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field


def test_an_unknown_fault_or_node_is_refused(personas, lab):
    assert inject(personas, {"kind": "meteor"}).status_code == 400
    r = inject(personas, {"kind": "silence", "node": "zz"})
    assert r.status_code == 409 and "not a node" in r.json()["detail"]


def test_a_driver_that_cannot_inject_says_so(personas, lab):
    ClusterRecoverySettings.objects.filter(cluster__name="lab").update(driver="noop")
    r = inject(personas, {"kind": "silence", "node": "a"})
    assert r.status_code == 409 and "cannot inject" in r.json()["detail"]


def test_the_command_kills_a_real_rank(lab):
    pytest.importorskip("torch")
    train = {"global_batch": 4, "micro_batch": 2, "heartbeat_s": 0.5, "collective_timeout_s": 20}
    lab.launch("j1", nodes=["a", "b"], steps=100_000, ckpt_every=10_000, **train)
    out = StringIO()
    args = ["--cluster", "lab", "--job", "j1"]
    call_command("inject_fault", "crash", *args, "--rank", "1", stdout=out)
    assert json.loads(out.getvalue())["kind"] == "crash"
    assert lab.wait("j1", 30)["state"] == "failed"
    with pytest.raises(CommandError, match="needs `rank`"):
        call_command("inject_fault", "hang", *args)


def test_the_command_sets_a_clusters_driver():
    call_command("set_cluster_driver", "slurm", "--cluster", "far", "--option", "partition=gpu")
    row = ClusterRecoverySettings.objects.get(cluster__name="far")
    assert (row.driver, row.driver_options) == ("slurm", {"partition": "gpu"})
    with pytest.raises(CommandError, match="NAME=VALUE"):
        call_command("set_cluster_driver", "noop", "--cluster", "far", "--option", "oops")
