"""The Slurm prolog and epilog (agent.slurm_node, agent/slurm/*.sh) without Slurm: their
configuration, what they read of `scontrol`, what they send to a live console, and
that they exit 0 at once whatever goes wrong. tests/agent/test_slurm_jobs.py runs them
under a real slurmd."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from agent import launch_env, slurm_node
from console.services import token_issue
from incidents.models import Incident
from incidents.services import incidents_detect
from jobs.models import Event, TrainingJob
from recovery.drivers.slurm import parse as slurm_parse

ROOT = Path(__file__).resolve().parents[2]

# `scontrol -o show node node2` of Slurm 22.05.8, drained while a job ran on it.
NODE_LINE = (
    "NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.85"
    " AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1"
    " NodeHostName=vm Port=41143 Version=22.05.8 RealMemory=1000 AllocMem=0 Sockets=2"
    " Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=batch  BootTime=2026-12-01T17:48:32 CfgTRES=cpu=2,mem=1000M,billing=2"
    " AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s"
    " ExtSensorsWatts=0 ExtSensorsTemp=n/s{reason}"
)
JOB_LINE = (
    "JobId=7 JobName=my run.sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A"
    " Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None"
)


def node_line(state="IDLE", reason=""):
    return NODE_LINE.format(state=state, reason=f" Reason={reason}" if reason else "")


def fake_scontrol(tmp_path, *, node=None, job=JOB_LINE, delay_s=0.0) -> str:
    """A directory holding an `scontrol` that prints these lines; for PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"/bin/sleep {delay_s}\n"
        'case "$3" in\n'
        f"  node) printf '%s\\n' '{node or node_line()}' ;;\n"
        f"  job) printf '%s\\n' '{job}' ;;\n"
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return str(bin_dir)


def hook_env(tmp_path, **more) -> dict:
    return {
        "REBOUND_NODE_ENV": str(tmp_path / "absent.env"),
        "REBOUND_HOOK_LOG": str(tmp_path / "hook.log"),
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "node2",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "batch",
        "SLURM_JOB_RESTART_COUNT": "1",
        **more,
    }


# --- configuration and what is read of Slurm -----------------------------------------


def test_the_node_file_with_the_environment_over_it(tmp_path):
    conf = tmp_path / "node.env"
    conf.write_text(
        "# Rebound on this node\n"
        "REBOUND_URL=http://console:8000\n"
        "export REBOUND_TOKEN_FILE='/etc/rebound/token'\n"
        'REBOUND_HOOK_TIMEOUT_S="3"\n'
        "not a line\n"
        "\n"
    )
    config = slurm_node.load_config({"REBOUND_NODE_ENV": str(conf), "REBOUND_URL": "http://b"})
    assert config == {
        "REBOUND_URL": "http://b",  # the environment wins
        "REBOUND_NODE_ENV": str(conf),
        "REBOUND_TOKEN_FILE": "/etc/rebound/token",
        "REBOUND_HOOK_TIMEOUT_S": "3",
    }
    assert slurm_node.read_env_file(str(tmp_path / "none.env")) == {}


def test_scontrol_lines_read_with_spaces_in_names_and_reasons():
    line = node_line("ALLOCATED+DRAIN", "bad dimm x=1 [root@2026-12-01T18:39:54]")
    assert slurm_node.field(line, "State") == "ALLOCATED+DRAIN"
    assert slurm_node.field(line, "Reason") == "bad dimm x=1 [root@2026-12-01T18:39:54]"
    assert slurm_node.field(JOB_LINE, "JobName", "UserId") == "my run.sbatch"
    # The key the agent gives a job of that name (SLURM_JOB_NAME in the job's steps).
    assert slurm_node.job_key("my run.sbatch") == "my-run"
    env = launch_env.read_env({"SLURM_JOB_NAME": "my run.sbatch", "SLURMD_NODENAME": "node2"})
    assert (env.job, env.node) == ("my-run", "node2")


@pytest.mark.parametrize(
    ("reason", "fault"),
    [
        ("Xid 79 on GPU 3 [root@2026-12-01T18:39:54]", {"type": "gpu_xid", "xid": 79}),
        ("NHC: check_nv_healthmon: XID=48", {"type": "gpu_xid", "xid": 48}),
        ("uncorrectable ECC errors", {"type": "ecc"}),
        ("Kill task failed", {"type": "other"}),
    ],
)
def test_a_drain_reason_points_to_a_fault_type(reason, fault):
    assert slurm_node.fault_of(reason) == fault


def test_rebound_marks_its_own_drains_as_its_slurm_driver_does():
    assert slurm_node.REBOUND_MARK == slurm_parse.PREFIX
    assert slurm_parse.mark("action-3").startswith(slurm_node.REBOUND_MARK)


# --- against a live console -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_prolog_and_epilog_report_the_node_and_a_drain_not_rebounds_own(
    tmp_path, live_server, personas
):
    _, token = token_issue(scope="ingest", cluster_name="east")
    console = {"REBOUND_URL": live_server.url, "REBOUND_TOKEN": token}

    def hook(name, node):
        path = fake_scontrol(tmp_path, node=node)
        assert slurm_node.main([name], hook_env(tmp_path, PATH=path, **console)) == 0

    hook("prolog", node_line("ALLOCATED"))
    launch = {"id": "a1", "job": "my-run", "kind": "attempt_started", "attempt": 1}
    launch.update(ts=time.time(), data={"world_size": 1, "gpus_per_node": 1, "nodes": ["node2"]})
    sent = requests.post(
        f"{live_server.url}/api/v1/ingest",
        json={"events": [launch]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert sent.status_code == 202, sent.text
    hook("epilog", node_line("IDLE"))  # in service: no fault
    # Drained by Rebound's own slurm driver: known to the console already, no fault.
    hook("epilog", node_line("IDLE+DRAIN", "rebound:action-4 [root@2026-12-01T18:39:54]"))
    hook("epilog", node_line("MIXED+DRAIN", "Xid 79 on GPU 3 [slurm@2026-12-01T18:39:54]"))

    events = Event.objects.filter(job__key="my-run").order_by("id")
    beats = events.filter(kind="heartbeat")
    assert [e.data["slurm"]["hook"] for e in beats] == ["prolog", "epilog", "epilog", "epilog"]
    assert {e.node for e in events.filter(kind__in=("heartbeat", "fault"))} == {"node2"}
    assert beats[0].data["slurm"] == {
        "hook": "prolog",
        "job_id": "7",
        "restart_count": 1,
        "user": "alice",
        "partition": "batch",
    }
    fault = events.get(kind="fault")
    assert fault.attempt is None
    assert fault.data["type"] == "gpu_xid" and fault.data["xid"] == 79
    assert fault.data["message"] == "Slurm drained node node2: Xid 79 on GPU 3"
    assert fault.data["slurm"]["state"] == "MIXED+DRAIN"
    assert fault.data["slurm"]["reason_by"] == "slurm@2026-12-01T18:39:54"
    log = (tmp_path / "hook.log").read_text()
    assert log.count("job my-run: sent heartbeat, fault in ") == 1
    assert log.count("job my-run: sent heartbeat in ") == 3

    listed = personas["viewer"].client().get("/api/v1/nodes/", {"cluster": "east"}).json()
    nodes = {n["name"]: n for n in listed.get("results", listed)}
    assert nodes["node2"]["last_heartbeat_at"]
    job = TrainingJob.objects.get(key="my-run")
    incidents_detect(job=job)
    incident = Incident.objects.get(job=job)  # the launch's fault: a drained node's Xid
    assert (incident.fault_type, incident.xid, incident.attempt) == ("gpu_xid", 79, 1)
    assert list(incident.nodes.values_list("name", flat=True)) == ["node2"]


def test_no_console_configured_reports_nothing_and_exits_0(tmp_path):
    assert slurm_node.main(["epilog"], hook_env(tmp_path)) == 0
    assert "REBOUND_URL is not set: nothing reported" in (tmp_path / "hook.log").read_text()
    assert slurm_node.main(["neither"], hook_env(tmp_path)) == 0
    assert "usage: python -m agent.slurm_node" in (tmp_path / "hook.log").read_text()


def test_a_console_away_or_silent_costs_the_job_no_more_than_the_timeout(tmp_path):
    """No one listening: at once. Listening but never answering: the hook's budget."""
    path = fake_scontrol(tmp_path)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    away = hook_env(tmp_path, PATH=path, REBOUND_URL=f"http://127.0.0.1:{port}", REBOUND_TOKEN="t")
    t0 = time.monotonic()
    assert slurm_node.main(["prolog"], away) == 0
    assert time.monotonic() - t0 < 1.0
    assert "ConnectionRefusedError" in (tmp_path / "hook.log").read_text()

    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {**away, "REBOUND_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        env["REBOUND_HOOK_TIMEOUT_S"] = "1.5"
        t0 = time.monotonic()
        assert slurm_node.main(["epilog"], env) == 0
        took = time.monotonic() - t0
    assert 1.0 < took < 2.5, took
    assert "failed (TimeoutError" in (tmp_path / "hook.log").read_text()


def test_an_scontrol_that_hangs_is_left_within_the_budget(tmp_path):
    path = fake_scontrol(tmp_path, delay_s=30)
    env = hook_env(tmp_path, PATH=path, REBOUND_URL="http://127.0.0.1:9", REBOUND_TOKEN="t")
    env["REBOUND_HOOK_TIMEOUT_S"] = "2"
    t0 = time.monotonic()
    assert slurm_node.main(["prolog"], env) == 0
    assert time.monotonic() - t0 < 3.0
    log = (tmp_path / "hook.log").read_text()
    assert "timed out" in log and "the job's name is unknown: nothing reported" in log


@pytest.mark.parametrize("name", ["prolog", "epilog"])
def test_the_shell_scripts_exit_0_in_slurmds_bare_environment(tmp_path, name):
    """As slurmd runs them: no PATH, the job's variables, a console away; and with a
    python that does not exist."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    conf = tmp_path / "node.env"
    conf.write_text(
        f"REBOUND_URL=http://127.0.0.1:{port}\nREBOUND_TOKEN=t\n"
        f"REBOUND_PYTHON={sys.executable}\nREBOUND_HOOK_LOG={tmp_path / 'hook.log'}\n"
    )
    env = {"REBOUND_NODE_ENV": str(conf), "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train"}
    env["SLURMD_NODENAME"] = "node2"
    script = ROOT / "agent" / "slurm" / f"{name}.sh"
    assert os.access(script, os.X_OK)
    t0 = time.monotonic()
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 5
    assert (
        f"rebound slurm {name} job 7 node node2: failed (ConnectionRefusedError"
        in (tmp_path / "hook.log").read_text()
    )

    conf.write_text("REBOUND_PYTHON=/nonexistent/python\n")
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
