"""The `slurm` driver against a real single-host Slurm (tests/slurm_cluster.py:
munged, slurmctld and four `slurmd -N nodeX`, started once for this module and
stopped by their pid files at its end).

Without Slurm installed (or without root) these tests skip, unless
REBOUND_REQUIRE_SLURM is set (CI sets it): then they fail.

A requeued job may start again only after AuthInfo=cred_expire (here 5 s, so
about 6-8 s); the tests that wait for a restart take that long.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from recovery.drivers import DRIVERS, Driver, DriverError, DriverTransientError, get_driver
from recovery.drivers.slurm import SlurmDriver, expand_hostlist, parse_scontrol_line
from tests import slurm_cluster
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.engine_free

KEY = "rebound:action-1"
LONG = "echo start restart=${SLURM_RESTART_COUNT:-0} step=${REBOUND_RESUME_STEP:-none}; sleep 300"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        if os.environ.get("REBOUND_REQUIRE_SLURM"):
            pytest.fail(f"REBOUND_REQUIRE_SLURM is set, but {why}")
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=4, cred_expire=5)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.running_daemons() == [], "a Slurm daemon outlived the tests"


@pytest.fixture
def driver(slurm):
    """A driver on the test cluster; every job, drain and reservation is gone after."""
    yield SlurmDriver(
        slurm_conf=str(slurm.conf),
        output=str(slurm.out_dir / "%x-%j.out"),
        poll_interval=0.3,
        validate_timeout=60,
        burnin_seconds=0.5,
        burnin_size=128,
    )
    slurm.reset()


def submit(slurm, name, *args, wrap=LONG) -> int:
    out = slurm.run(
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        "--requeue",
        "--open-mode=append",
        f"--output={slurm.out_dir}/%x-%j.out",
        *args,
        f"--wrap={wrap}",
    )
    return int(out.strip().split(";")[0])


def wait_for(check, timeout=30.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def running(driver, job, restarts=0) -> dict:
    """Wait until `job` runs (after `restarts` restarts) and has printed its start line."""

    def ready():
        st = driver.job_status(job)
        if st["state"] != "running" or st["restarts"] != restarts:
            return None
        out = Path(st["stdout"].replace("%x", job).replace("%j", str(st["job_id"])))
        return st if out.exists() and f"restart={restarts}" in out.read_text() else None

    return wait_for(ready, timeout=40, what=f"{job} running (restart {restarts})")


def output(st) -> str:
    return Path(st["stdout"].replace("%x", st["job"]).replace("%j", str(st["job_id"]))).read_text()


# without a cluster


def test_hostlists_and_scontrol_lines():
    assert expand_hostlist("node[1-3,5],gpu07") == ["node1", "node2", "node3", "node5", "gpu07"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("(null)") == [] and expand_hostlist("") == []
    rec = parse_scontrol_line(
        "NodeName=node1 State=IDLE+DRAIN TRES=cpu=2,mem=1G Reason=psu = bad, see x [root@2026]"
    )
    assert rec["State"] == "IDLE+DRAIN" and rec["TRES"] == "cpu=2,mem=1G"
    assert rec["Reason"] == "psu = bad, see x [root@2026]"


def test_errors_are_transient_or_permanent(tmp_path):
    """A controller that does not answer is worth a retry; a refusal is not; SLURM_CONF
    from the option reaches every command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(
        '#!/bin/sh\necho "$SLURM_CONF" > "$(dirname $0)/conf-seen"\n'
        "echo 'slurm_load_node error: Socket timed out on send/recv operation' >&2; exit 1\n"
    )
    errors = '{"errors": [{"error": "Unspecified error", "errno": -1}], "jobs": []}'
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{errors}'\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'Invalid node name specified' >&2; exit 1\n")
    (bin_dir / "sbatch").write_text("#!/bin/sh\nsleep 5\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    d = SlurmDriver(bin_dir=str(bin_dir), slurm_conf="/etc/x/slurm.conf", timeout=0.5)
    with pytest.raises(DriverTransientError, match="Socket timed out"):
        d.cordon("node1", key=KEY)
    assert (bin_dir / "conf-seen").read_text().strip() == "/etc/x/slurm.conf"
    with pytest.raises(DriverTransientError, match="Unspecified error"):
        d.job_status("llm")
    with pytest.raises(DriverTransientError, match="no answer"):
        d.run("sbatch", "--wrap=true")
    with pytest.raises(DriverError, match="Invalid node name") as info:
        d.run("scontrol", "update", "nodename=x", "state=drain")
    assert not isinstance(info.value, DriverTransientError)


def test_each_call_records_only_its_own_commands(tmp_path):
    """Two calls at once on one driver (two worker threads) each list only the
    changes they made: the recorder is per call, not on the driver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nodes = {"nodes": [{"name": n, "state": "idle", "state_flags": []} for n in ("n1", "n2")]}
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\necho '{json.dumps(nodes)}'\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nsleep 0.5\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    d = SlurmDriver(bin_dir=str(bin_dir))
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda n: d.cordon(n, key=KEY), ["n1", "n2"]))
    assert [o["commands"] for o in outs] == [
        [f"scontrol update nodename={n} state=drain 'reason={KEY} cordon'"] for n in ("n1", "n2")
    ]


def test_registered_and_chosen_per_cluster(db, tmp_path):
    from jobs.models import Cluster
    from recovery.models import ClusterRecoverySettings

    assert DRIVERS["slurm"] == "recovery.drivers.slurm.SlurmDriver"
    cluster = Cluster.objects.create(name="hpc")
    ClusterRecoverySettings.objects.create(
        cluster=cluster,
        driver="slurm",
        driver_options={"slurm_conf": "/etc/slurm/x.conf", "partition": "gpu", "timeout": 5},
    )
    d = get_driver(cluster)
    assert isinstance(d, SlurmDriver) and isinstance(d, Driver)
    assert (d.options.slurm_conf, d.options.partition, d.options.timeout) == (
        "/etc/slurm/x.conf",
        "gpu",
        5.0,
    )


# on the real cluster


def test_node_and_job_status(slurm, driver):
    submit(slurm, "llm", "--nodes=2")
    st = running(driver, "llm")
    assert st["node_count"] == 2 and len(st["nodes"]) == 2 and st["restarts"] == 0
    node = driver.node_status(st["nodes"][0])
    assert node["jobs"] == ["llm"] and node["state"] in ("mixed", "allocated")
    assert node["drained"] is False and node["reason"] == ""
    assert driver.job_status("nothing") == {"job": "nothing", "state": "unknown"}
    with pytest.raises(DriverError, match="not a node"):
        driver.node_status("node99")
    # The same, read from `scontrol -o show` where --json is missing.
    plain = SlurmDriver(slurm_conf=str(slurm.conf), json=False)
    assert {k: plain.job_status("llm")[k] for k in ("job_id", "state", "nodes", "restarts")} == {
        k: st[k] for k in ("job_id", "state", "nodes", "restarts")
    }
    assert plain.node_status(st["nodes"][0])["jobs"] == ["llm"]


def test_cordon_keeps_the_running_job_and_takes_no_new_one(slurm, driver):
    submit(slurm, "llm", "--nodelist=node1")
    st = running(driver, "llm")
    out = driver.cordon("node1", key=KEY)
    assert out["changed"] is True and out["ours"] is True
    assert out["reason"] == f"{KEY} cordon"
    assert out["commands"] == [f"scontrol update nodename=node1 state=drain 'reason={KEY} cordon'"]
    node = driver.node_status("node1")
    assert node["drained"] and node["jobs"] == ["llm"]  # still running there
    # A new job asking for the node waits; one that does not lands elsewhere.
    submit(slurm, "new", "--nodelist=node1", wrap="sleep 60")
    submit(slurm, "other", wrap="sleep 60")
    wait_for(lambda: "ReqNodeNotAvail" in driver.job_status("new")["reason"], what="new held off")
    assert driver.job_status("new")["state"] == "pending"
    other = wait_for(lambda: driver.job_status("other")["nodes"], what="other placed")
    assert "node1" not in other
    # Idempotent: a second cordon (even by another action) changes nothing.
    again = driver.cordon("node1", key="rebound:action-2")
    assert again["changed"] is False and again["commands"] == []
    assert driver.node_status("node1")["reason"] == f"{KEY} cordon"
    assert driver.job_status("llm")["job_id"] == st["job_id"]
    assert driver.job_status("llm")["state"] == "running"


def test_uncordon_resumes_only_our_own_drain(slurm, driver):
    driver.cordon("node2", key=KEY)
    out = driver.uncordon("node2", key="rebound:action-2")
    assert out["changed"] is True and out["commands"] == [
        "scontrol update nodename=node2 state=resume"
    ]
    assert driver.node_status("node2")["drained"] is False
    assert driver.uncordon("node2", key="rebound:action-2")["changed"] is False
    # Someone else's drain is theirs: not resumed, not relabelled by a cordon.
    slurm.run("scontrol", "update", "nodename=node3", "state=drain", "reason=hw: psu swap")
    with pytest.raises(DriverError, match="drained by someone else") as info:
        driver.uncordon("node3", key=KEY)
    assert info.value.output["ours"] is False
    assert driver.cordon("node3", key=KEY)["changed"] is False
    node = driver.node_status("node3")
    assert node["drained"] and node["reason"] == "hw: psu swap" and node["ours"] is False


def test_drain_requeues_the_job_on_the_node(slurm, driver):
    submit(slurm, "llm", "--nodes=2")
    submit(slurm, "fragile", "--no-requeue", "--nodes=1", wrap="sleep 300")
    st = running(driver, "llm")
    wait_for(lambda: driver.job_status("fragile")["state"] == "running", what="fragile")
    node = st["nodes"][0]
    fragile_on = driver.job_status("fragile")["nodes"][0]
    out = driver.drain(node, key=KEY)
    assert out["changed"] is True and out["requeued"] == ["llm"]
    assert out["reason"] == f"{KEY} drain"
    assert out["cancelled"] == (["fragile"] if fragile_on == node else [])
    after = driver.job_status("llm")
    assert after["restarts"] == 1 and after["state"] in ("pending", "completing")
    wait_for(lambda: driver.node_status(node)["jobs"] == [], what=f"{node} emptied")
    again = driver.drain(node, key=KEY)
    assert again["changed"] is False and again["commands"] == []
    # (That a requeued job starts again, elsewhere: the restart_job and replace_node tests.)


def test_restart_job_requeues_and_the_job_starts_again(slurm, driver):
    submit(slurm, "llm", "--nodes=2")
    st = running(driver, "llm")
    out = driver.restart_job("llm", None, None, key=KEY)
    assert out["changed"] is True and out["restarts"] == 1
    assert out["commands"][-1] == f"scontrol requeue {st['job_id']}"
    # The same action again (a worker lost after the call): nothing more.
    assert driver.restart_job("llm", None, None, key=KEY)["changed"] is False
    again = running(driver, "llm", restarts=1)
    assert again["job_id"] == st["job_id"]
    assert "restart=1" in output(again)
    assert driver.restart_job("llm", None, None, key=KEY)["changed"] is False


def test_rollback_submits_the_job_again_from_the_step(slurm, driver, tmp_path):
    old = submit(slurm, "llm", "--nodes=1")
    running(driver, "llm")
    out = driver.restart_job("llm", 40, None, key=KEY)
    assert out["changed"] is True and out["submitted"] is True and out["cancelled"] == [old]
    new = running(driver, "llm")
    assert new["job_id"] != old and "step=40" in output(new)
    assert new["comment"] == f"{KEY} restart_job submitted"
    again = driver.restart_job("llm", 40, None, key=KEY)
    assert again["changed"] is False and again["job_id"] == new["job_id"]
    assert [j["state"] for j in driver.jobs() if j["job_id"] == old] == ["CANCELLED"]
    # A job slurmctld does not know: launched from the `script` option, where asked.
    (tmp_path / "fresh.sbatch").write_text(f"#!/bin/sh\n{LONG}\n")
    scripted = SlurmDriver(
        slurm_conf=str(slurm.conf),
        script=str(tmp_path / "{job}.sbatch"),
        output=driver.options.output,
    )
    out = scripted.restart_job("fresh", None, ["node4"], key=KEY)
    assert out["submitted"] is True and out["cancelled"] == []
    fresh = running(driver, "fresh")
    assert fresh["nodes"] == ["node4"] and "step=none" in output(fresh)  # the latest
    with pytest.raises(DriverError, match="set the driver option `script`"):
        driver.restart_job("unknown", None, None, key=KEY)


def test_replace_node_moves_the_job_to_the_spare(slurm, driver):
    submit(slurm, "llm", "--nodes=2")
    st = running(driver, "llm")
    bad, keep = st["nodes"]
    spare = next(n for n in slurm.node_names if n not in st["nodes"])
    out = driver.replace_node("llm", bad, spare, key=KEY)
    assert out["changed"] is True and out["excluded"] == [bad]
    assert driver.replace_node("llm", bad, spare, key=KEY)["changed"] is False
    moved = running(driver, "llm", restarts=1)
    assert sorted(moved["nodes"]) == sorted([keep, spare])
    assert driver.node_status(bad)["drained"] is False  # excluded from the job only
    assert driver.replace_node("llm", bad, spare, key="rebound:action-2")["changed"] is False
    other = next(n for n in slurm.node_names if n not in (bad, keep, spare))
    with pytest.raises(DriverError, match="does not run on"):
        driver.replace_node("llm", other, bad, key="rebound:action-3")


def test_scale_down_requeues_on_fewer_nodes(slurm, driver):
    submit(slurm, "llm", "--nodes=2")
    st = running(driver, "llm")
    drop = st["nodes"][1]
    out = driver.scale_down("llm", [drop], key=KEY)
    assert out["changed"] is True and out["node_count"] == 1 and out["excluded"] == [drop]
    assert out["state"] == "PENDING" and out["restarts"] == 1
    assert driver.scale_down("llm", [drop], key=KEY)["changed"] is False
    assert driver.job_status("llm")["node_count"] == 1
    smaller = running(driver, "llm", restarts=1)
    assert smaller["nodes"] == [st["nodes"][0]]
    with pytest.raises(DriverError, match="no node"):
        driver.scale_down("llm", [st["nodes"][0]], key="rebound:action-2")


def test_validate_node_runs_a_burn_in_on_the_node(slurm, driver):
    out = driver.validate_node("node4", key=KEY)
    assert out["passed"] is True and out["node"] == "node4"
    if "gflops" not in out:  # no torch in this interpreter: the burn-in said so
        pytest.fail(f"the burn-in did not report: {out}")
    job = next(j for j in driver.jobs() if j["job_id"] == out["job_id"])
    assert job["nodes"] == ["node4"] and job["state"] == "COMPLETED"


def test_validate_node_fails_and_keeps_our_drain(slurm, driver):
    driver.cordon("node3", key=KEY)
    bad = SlurmDriver(
        slurm_conf=str(slurm.conf), validate_command="echo broken; exit 3", poll_interval=0.3
    )
    with pytest.raises(DriverError, match="exit code 3") as info:
        bad.validate_node("node3", key="rebound:action-2")
    assert info.value.output["passed"] is False
    node = driver.node_status("node3")
    assert node["drained"] and node["reason"] == f"{KEY} cordon"  # drained again, as it was
    good = SlurmDriver(slurm_conf=str(slurm.conf), validate_command="true", poll_interval=0.3)
    assert good.validate_node("node3", key="rebound:action-3")["passed"] is True
    assert driver.node_status("node3")["reason"] == f"{KEY} cordon"
    assert "rebound-validate" not in slurm.run("scontrol", "show", "reservation")
    slurm.run("scontrol", "update", "nodename=node2", "state=drain", "reason=hw: dimm")
    with pytest.raises(DriverError, match="someone else"):
        good.validate_node("node2", key=KEY)


def test_a_relaunch_left_held_by_a_lost_worker_is_finished(slurm, driver):
    """The worker died between `requeuehold` and `release`: the same action run again
    applies the changes its stamp recorded and releases the job."""
    submit(slurm, "llm", "--nodes=2")
    st = running(driver, "llm")
    drop = st["nodes"][1]
    stamp = f"{KEY} scale_down restarts:0 excnodelist:{drop} numnodes:1-1"
    jid = str(st["job_id"])
    slurm.run("scontrol", "update", f"jobid={jid}", f"comment={stamp}")
    slurm.run("scontrol", "requeuehold", jid)
    out = driver.scale_down("llm", [drop], key=KEY)
    assert out["changed"] is True and out["commands"] == [
        f"scontrol update jobid={jid} excnodelist={drop} numnodes=1-1",
        f"scontrol release {jid}",
    ]
    st = driver.job_status("llm")
    assert st["held"] is False and st["node_count"] == 1 and st["excluded"] == [drop]
    assert driver.scale_down("llm", [drop], key=KEY)["changed"] is False


HONOURS = """\
import sys, time
sys.path.insert(0, {repo!r})
from agent.checkpoint_request import checkpoint_requested, install_signal_handler
install_signal_handler()
print("start restart=0", flush=True)
while True:
    if checkpoint_requested():
        print("checkpoint requested", flush=True)
    time.sleep(0.05)
"""


def test_checkpoint_job_signals_the_steps_once(slurm, driver, tmp_path):
    # Off unless the cluster's options name the signal: torchrun would die of it.
    with pytest.raises(DriverError, match="off on this Slurm cluster"):
        driver.checkpoint_job("llm", key=KEY)
    script = tmp_path / "honour.py"
    script.write_text(HONOURS.format(repo=str(Path(__file__).resolve().parents[2])))
    submit(slurm, "llm", wrap=f"srun {sys.executable} {script}")
    st = running(driver, "llm")
    on = SlurmDriver(slurm_conf=str(slurm.conf), checkpoint_signal="USR1")
    out = on.checkpoint_job("llm", key=KEY)
    assert out["changed"] is True and out["signal"] == "USR1"
    assert out["commands"][0] == f"scancel --signal=USR1 {st['job_id']}"
    wait_for(lambda: "checkpoint requested" in output(st), what="the step to see the request")
    # A repeat of the action (a lost worker) signals nothing more.
    again = on.checkpoint_job("llm", key=KEY)
    assert again["changed"] is False and again["commands"] == []
    time.sleep(1.0)
    assert output(st).count("checkpoint requested") == 1
    assert driver.job_status("llm")["state"] == "running"  # the job lives on
    # A job that does not run cannot save anything.
    submit(slurm, "held", "--hold", wrap="sleep 60")
    with pytest.raises(DriverError, match="only a running job"):
        on.checkpoint_job("held", key=KEY)
