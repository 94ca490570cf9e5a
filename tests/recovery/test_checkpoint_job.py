"""checkpoint_job, "checkpoint now": the request in the job's control file (once per
request id), SIGUSR1 as a request (agent.init's handler), the drivers' answers, and
the whole path on a real local cluster: a maintenance window's checkpoint_now
proposes the action, the local driver writes the request, and the demo job's torch
ranks save the very next step, off their cadence."""

import json
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agent import control
from agent.cluster import LocalCluster
from jobs import services as job_services
from recovery import services, tasks
from recovery.drivers import DriverError
from recovery.drivers.kubernetes import workloads as k8s_workloads
from recovery.drivers.local import LocalDriver
from recovery.drivers.noop import NoopDriver
from recovery.errors import InvalidAction
from recovery.models import Action, ClusterRecoverySettings
from tests.factories import AttemptFactory, ClusterFactory, NodeFactory, TrainingJobFactory

KEY = "rebound:action-7"
REPO = __file__.rsplit("/tests/", 1)[0]


# --- the request in the control file ----------------------------------------------------


def test_a_request_is_seen_once_per_id(tmp_path):
    path = tmp_path / "control.json"
    reader = control.JobControl(path)
    assert reader.checkpoint_requested() is None  # no file yet
    assert control.request_checkpoint(path, KEY) is True
    assert reader.checkpoint_requested() == KEY
    assert reader.checkpoint_requested() is None  # once
    # The same request again (a repeated action) asks nothing new.
    assert control.request_checkpoint(path, KEY) is False
    assert reader.checkpoint_requested() is None
    # A new request is seen, once.
    assert control.request_checkpoint(path, "rebound:action-8") is True
    assert reader.checkpoint_requested() == "rebound:action-8"
    assert reader.checkpoint_requested() is None


def test_a_request_made_before_the_process_started_is_not_asked_again(tmp_path):
    path = tmp_path / "control.json"
    control.request_checkpoint(path, KEY)
    assert control.JobControl(path).checkpoint_requested() is None  # a new launch
    assert control.JobControl(None).checkpoint_requested() is None  # no control file


def test_clearing_the_faults_keeps_the_request(tmp_path):
    path = tmp_path / "control.json"
    control.set_slow(path, 1, 4.0)
    control.request_checkpoint(path, KEY)
    control.clear_faults(path)
    assert set(control.read_json(path)) == {"checkpoint"}
    assert control.request_checkpoint(path, KEY) is False


# --- SIGUSR1 ----------------------------------------------------------------------------


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )


SIGNAL_ONCE = """
import os, signal
{setup}
os.kill(os.getpid(), signal.SIGUSR1)
print(agent.checkpoint_requested(), agent.checkpoint_requested())
os.kill(os.getpid(), signal.SIGUSR1)
print(agent.checkpoint_requested())
"""


def test_sigusr1_is_a_request_once_with_the_handler_installed():
    setup = "import agent\nfrom agent.checkpoint_request import install_signal_handler\n"
    setup += "assert install_signal_handler()"
    proc = python(SIGNAL_ONCE.format(setup=setup))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "True"]
    assert (
        "torch"
        not in python(
            "import sys, agent; agent.checkpoint_requested(); print(sorted(sys.modules))"
        ).stdout
    )  # stdlib only


def test_agent_init_installs_the_handler():
    pytest.importorskip("torch")
    # No console configured: init reports nothing, but the handler is in place.
    proc = python(SIGNAL_ONCE.format(setup="import agent\nagent.init(environ={})"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "True"]


def test_without_the_handler_sigusr1_ends_the_process():
    """Why the handler matters: Slurm's checkpoint_job signal kills a job that has none."""
    proc = python("import os, signal; os.kill(os.getpid(), signal.SIGUSR1); print('alive')")
    assert proc.returncode == -signal.SIGUSR1 and "alive" not in proc.stdout


def test_a_handler_set_before_is_still_called():
    code = """
import os, signal
calls = []
signal.signal(signal.SIGUSR1, lambda *a: calls.append(1))
from agent.checkpoint_request import checkpoint_requested, install_signal_handler
install_signal_handler()
os.kill(os.getpid(), signal.SIGUSR1)
print(checkpoint_requested(), len(calls))
"""
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "1"]


# --- the drivers ------------------------------------------------------------------------


def test_the_noop_driver_records_the_call():
    NoopDriver.reset()
    out = NoopDriver().checkpoint_job("llm", key=KEY)
    assert NoopDriver.calls == [{"op": "checkpoint_job", "job": "llm", "key": KEY}]
    assert out["op"] == "checkpoint_job"


def test_the_kubernetes_driver_refuses_plainly():
    with pytest.raises(DriverError, match="not supported by the kubernetes driver"):
        k8s_workloads.checkpoint_job(None, "llm", key=KEY)


def test_the_local_driver_refuses_a_job_that_does_not_run(tmp_path):
    LocalCluster.create(tmp_path / "cluster", nodes={"n1": 1})
    with pytest.raises(DriverError):
        LocalDriver(root=tmp_path / "cluster").checkpoint_job("never", key=KEY)


@pytest.mark.django_db
def test_a_person_may_be_asked_to_approve_it(
    client, personas, operator2, cluster, nodes, job, noop, run_on_commit
):
    """Proposed for approval (a policy in approval mode, or by hand): it waits on the
    approvals page like any action, and runs once approved."""
    action = services.action_propose(
        cluster=cluster,
        kind="checkpoint_job",
        job=job,
        reason="save before the switch firmware update",
        requested_by="operator",
        requested_by_user=personas["operator"].user,
    )
    assert action.state == Action.State.AWAITING_APPROVAL and action.node is None
    client.force_login(operator2.user)
    html = client.get("/approvals/").content.decode()
    assert f'data-live-action="{action.pk}"' in html and "checkpoint_job" in html
    with run_on_commit():
        r = client.post(
            f"/approvals/{action.pk}/decide",
            {"decision": "approve", "comment": ""},
            HTTP_ACCEPT="application/json",
        )
    assert r.status_code == 200, r.content
    action.refresh_from_db()
    assert action.state == Action.State.SUCCEEDED
    assert noop.calls == [
        {"op": "checkpoint_job", "job": "llm", "key": f"rebound:action-{action.pk}"}
    ]


def test_a_checkpoint_job_needs_a_job(cluster, nodes):
    with pytest.raises(InvalidAction, match="checkpoint_job needs a job"):
        services.action_propose(
            cluster=cluster, kind="checkpoint_job", reason="x", requested_by="operator"
        )


# --- the whole path on a real local cluster ----------------------------------------------

TRAIN = {
    "global_batch": 8,
    "micro_batch": 2,
    "window": 4,
    "heartbeat_s": 0.5,
    "collective_timeout_s": 30,
    "ckpt_every": 100_000,  # no save on the cadence while the test runs
}


def _events(path, kind):
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line being written
        if e.get("kind") == kind:
            out.append(e)
    return out


def _until(what, fn, cluster, job, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        st = cluster.status(job)
        assert st["state"] in ("starting", "running"), f"{what}: the job is {st['state']}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.engine_free
@pytest.mark.django_db
def test_checkpoint_now_makes_the_demo_job_save_its_next_step(tmp_path, run_on_commit):
    pytest.importorskip("torch")
    events = tmp_path / "events.jsonl"
    local = LocalCluster.create(
        tmp_path / "cluster", nodes={"n1": 1, "n2": 1}, sink={"events": events}, heartbeat_s=0.5
    )
    db_cluster = ClusterFactory(name="lab")
    n1, n2 = (NodeFactory(cluster=db_cluster, name=n) for n in ("n1", "n2"))
    job = TrainingJobFactory(key="ckpt-now", cluster=db_cluster, status="running")
    AttemptFactory(job=job, number=1, world_size=2, gpus_per_node=1, nodes=[n1, n2])
    ClusterRecoverySettings.objects.create(
        cluster=db_cluster, driver="local", driver_options={"root": str(local.root)}
    )
    try:
        local.launch("ckpt-now", nodes=["n1", "n2"], steps=100_000, **TRAIN)
        _until(
            "step 5",
            lambda: any(e["data"]["step"] >= 5 for e in _events(events, "step")),
            local,
            "ckpt-now",
        )
        now = timezone.now()
        job_services.maintenance_window_create(
            cluster=db_cluster,
            starts_at=now + timedelta(seconds=60),
            ends_at=now + timedelta(seconds=3600),
            nodes=["n1"],
            reason="kernel upgrade",
            pre_action="checkpoint_now",
        )
        with run_on_commit():
            tasks.maintenance_pre_actions()
        asked_after = max(e["data"]["step"] for e in _events(events, "step"))
        [action] = Action.objects.all()
        assert (action.kind, action.state) == ("checkpoint_job", Action.State.SUCCEEDED)
        assert action.output["changed"] is True and action.output["request"] == (
            f"rebound:action-{action.pk}"
        )
        request = control.read_json(local.control_path("ckpt-now"))["checkpoint"]
        assert request["id"] == f"rebound:action-{action.pk}"

        saved = _until(
            "checkpoint_saved",
            lambda: _events(events, "checkpoint_saved"),
            local,
            "ckpt-now",
        )
        # One save, of a step off the cadence (none is due before step 100,000), after
        # the request was written: the ranks read it at the start of a step and save at
        # its end. (How soon is not bounded here: the events file trails the ranks by
        # the reporter's batching, more so on a loaded machine.)
        steps = sorted({e["data"]["step"] for e in saved})
        assert len(steps) == 1 and steps[0] % TRAIN["ckpt_every"] != 0
        assert asked_after <= steps[0]
        assert local.latest_checkpoint("ckpt-now") == steps[0]
        # Delivered again (a repeat of the action): no second request, no second save.
        driver = LocalDriver(root=local.root)
        assert driver.checkpoint_job("ckpt-now", key=action.output["request"])["changed"] is False
        time.sleep(1.0)
        assert sorted({e["data"]["step"] for e in _events(events, "checkpoint_saved")}) == steps
        log = (local.root / "rebound-driver.jsonl").read_text().splitlines()
        assert [json.loads(line)["op"] for line in log] == ["checkpoint_job"]
    finally:
        local.shutdown(quick=True)
