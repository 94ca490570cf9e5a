"""The `local` driver on a LocalCluster made in a temporary directory, without
launching any torch process: node flags (cordon, uncordon, drain), idempotence,
refusals, the driver chosen per cluster, and the burn-in's own pieces."""

import json

import pytest

from agent.cluster import LocalCluster
from jobs.models import Node
from recovery import services
from recovery.drivers import Driver, DriverError, get_driver
from recovery.drivers.local import LocalDriver
from recovery.drivers.noop import NoopDriver
from recovery.models import ClusterRecoverySettings

KEY = "rebound:action-1"


@pytest.fixture
def local(tmp_path):
    LocalCluster.create(tmp_path / "cluster", nodes={"n01": 2, "n02": 2, "s1": 2})
    return LocalDriver(root=tmp_path / "cluster")


def driver_log(driver) -> list[dict]:
    path = driver.cluster.root / "rebound-driver.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_both_drivers_have_the_interface(local):
    assert isinstance(local, Driver)
    assert isinstance(NoopDriver(), Driver)


def test_cordon_is_a_flag_and_a_second_cordon_changes_nothing(local):
    first = local.cordon("n01", key=KEY)
    assert first["changed"] is True and first["flags"]["cordoned"] is True
    assert local.flags("n01") == {"cordoned": True, "by": KEY}
    again = local.cordon("n01", key="rebound:action-2")
    assert again["changed"] is False
    assert [e["op"] for e in driver_log(local)] == ["cordon"]  # cordoned once
    assert local.node_status("n01")["flags"]["cordoned"] is True


def test_uncordon_undoes_only_our_own(local):
    local.cordon("n01", key=KEY)
    assert local.uncordon("n01", key="rebound:action-2")["changed"] is True
    assert local.flags("n01")["cordoned"] is False
    # Someone else's cordon is not ours to lift.
    path = local.cluster.node_flags_path("n02")
    path.write_text(json.dumps({"cordoned": True, "by": "alice"}))
    with pytest.raises(DriverError, match="cordoned by alice"):
        local.uncordon("n02", key=KEY)


def test_drain_flags_the_node_and_stops_nothing_when_nothing_runs(local):
    out = local.drain("n01", key=KEY)
    assert out["stopped"] == [] and out["flags"]["drained"] is True


def test_unknown_nodes_and_jobs_are_refused(local):
    with pytest.raises(DriverError, match="not a node"):
        local.cordon("n99", key=KEY)
    with pytest.raises(DriverError, match="never launched"):
        local.restart_job("llm", None, None, key=KEY)
    assert local.job_status("llm")["state"] == "unknown"


def test_a_missing_cluster_directory_is_a_driver_error(tmp_path):
    with pytest.raises(DriverError, match="no cluster"):
        LocalDriver(root=tmp_path / "nothing").cordon("n01", key=KEY)


def test_validate_without_torch_fails_clearly(local, monkeypatch):
    import recovery.drivers.local as module

    real = module.importlib.util.find_spec
    monkeypatch.setattr(
        module.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name)
    )
    with pytest.raises(DriverError, match="torch is not installed") as exc:
        local.validate_node("n01", key=KEY)
    assert exc.value.output == {"node": "n01", "passed": False, "error": "torch is not installed"}


def test_the_burn_in_measures_and_checks_determinism():
    pytest.importorskip("torch")
    from recovery.drivers.burnin import burn_in

    result = burn_in(seconds=0.05, size=64, device="cpu")
    assert result["deterministic"] and result["finite"]
    assert result["gflops"] > 0 and len(result["checksum"]) == 64


@pytest.mark.django_db
def test_the_cluster_setting_picks_the_driver(cluster, tmp_path, settings):
    settings.REBOUND_RECOVERY_DRIVER = "local"
    assert isinstance(get_driver(cluster), LocalDriver)
    ClusterRecoverySettings.objects.create(
        cluster=cluster, driver="local", driver_options={"root": str(tmp_path)}
    )
    assert get_driver(cluster).root == str(tmp_path)
    ClusterRecoverySettings.objects.filter(cluster=cluster).update(driver="noop")
    assert isinstance(get_driver(cluster), NoopDriver)
    ClusterRecoverySettings.objects.filter(cluster=cluster).update(driver="martian")
    with pytest.raises(DriverError, match="unknown driver"):
        get_driver(cluster)


@pytest.mark.django_db
def test_a_cordon_action_through_the_local_driver(cluster, nodes, local, tmp_path):
    """The service with the local driver: the node's flag is set and its row cordoned."""
    ClusterRecoverySettings.objects.create(
        cluster=cluster, driver="local", driver_options={"root": str(local.cluster.root)}
    )
    action = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=nodes["n01"],
        reason="xid",
        requested_by="policy:hardware",
        mode="auto",
    )
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    action.refresh_from_db()
    assert action.output["changed"] is True and action.output["node_states"] == {"n01": "cordoned"}
    assert Node.objects.get(pk=nodes["n01"].pk).state == Node.State.CORDONED
    assert local.flags("n01")["cordoned"] is True


@pytest.mark.django_db
def test_a_worker_lost_mid_cordon_cordons_once(cluster, nodes, local):
    """The worker set the flag and died before recording it; the reconciler re-queues
    the row, the next run finds the node cordoned: success, and one cordon."""
    from datetime import timedelta

    from django.utils import timezone

    ClusterRecoverySettings.objects.create(
        cluster=cluster, driver="local", driver_options={"root": str(local.cluster.root)}
    )
    action = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=nodes["n01"],
        reason="xid",
        requested_by="policy:hardware",
        mode="auto",
    )
    services.action_transition(
        action=action, to="running", actor="rebound:worker", why="attempt 1", attempts=1
    )
    local.cordon("n01", key=f"rebound:action-{action.pk}")  # ... and then SIGKILL
    later = timezone.now() + timedelta(hours=1)
    assert services.actions_reconcile(now=later).requeued == [action.pk]
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    action.refresh_from_db()
    assert (action.state, action.attempts, action.output["changed"]) == ("succeeded", 2, False)
    assert Node.objects.get(pk=nodes["n01"].pk).state == Node.State.CORDONED
    assert [e["op"] for e in driver_log(local)] == ["cordon"]
