"""Jobs on a real single-host Slurm (tests/slurm_cluster.py: two emulated nodes) whose
nodes run Rebound's prolog and epilog (agent/slurm/*.sh, through wrappers that name
this test's node.env), reporting to a live console (gunicorn, tests/processes.py).

- A job's start and end on each node reach the console, and a node drained under it
  with a reason Rebound did not set is reported as the node's fault.
- A console that is away costs the job nothing: the hooks exit 0 at once, no node drains.
- The README's sbatch script (--requeue, srun + torchrun, a requeue when a rank dies)
  runs a 2-rank CPU job using agent.init; a rank is killed mid-run: the requeued run is
  a new launch with a higher number, and the job finishes.

Without Slurm installed (or without root) these tests skip, unless REBOUND_REQUIRE_SLURM
is set: then they fail. A requeued job starts again after AuthInfo=cred_expire (10 s).
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.services import token_issue
from jobs.models import Attempt, Event, LaunchReservation, StepRecord
from tests import slurm_cluster
from tests.agent.torchrun import launch_environ
from tests.processes import Server, free_port
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "slurm-test"
README_MARKER = "<!-- readme-snippet: sbatch"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        if os.environ.get("REBOUND_REQUIRE_SLURM"):
            pytest.fail(f"REBOUND_REQUIRE_SLURM is set, but {why}")
        pytest.skip(why)
    base = tmp_path_factory.mktemp("slurm-hooks")
    hooks = {}
    for name in ("prolog", "epilog"):
        # slurmd gives its hooks a bare environment: the wrapper names the test's file.
        hooks[name] = base / name
        hooks[name].write_text(
            f"#!/bin/sh\nREBOUND_NODE_ENV={base / 'node.env'} exec {ROOT}/agent/slurm/{name}.sh\n"
        )
        hooks[name].chmod(0o755)
    cluster = SlurmCluster(
        base / "cluster",
        nodes=2,
        cred_expire=10,
        prolog=hooks["prolog"],
        epilog=hooks["epilog"],
        prolog_flags="Alloc",
    )
    cluster.node_env = base / "node.env"
    cluster.hook_log = base / "hooks.log"
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.running_daemons() == [], "a Slurm daemon outlived the tests"


@pytest.fixture
def console(tmp_path, slurm):
    """A live console, an ingest token of the cluster, and the nodes' node.env for it."""
    server = Server(tmp_path / "var")
    server.start()
    _, token = token_issue(scope="ingest", cluster_name=CLUSTER)
    server.token = token
    # REBOUND_PYTHON unset: the hooks run on the system python3 (standard library only).
    slurm.node_env.write_text(
        f"REBOUND_URL={server.url}\nREBOUND_TOKEN={token}\nREBOUND_HOOK_LOG={slurm.hook_log}\n"
    )
    slurm.hook_log.write_text("")
    try:
        yield server
    finally:
        server.stop()
        slurm.reset()


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def job_record(slurm, job_id) -> str:
    return slurm.run("scontrol", "-o", "show", "job", str(job_id))


def job_state(slurm, job_id) -> str:
    return re.search(r"JobState=(\S+)", job_record(slurm, job_id)).group(1)


def submit(slurm, *args) -> int:
    out = slurm.run("sbatch", "--parsable", f"--output={slurm.out_dir}/%x-%j.out", *args)
    return int(out.strip().split(";")[0])


def node_events(job: str, **filters):
    return Event.objects.filter(job__key=job, kind__in=("heartbeat", "fault"), **filters)


def test_a_jobs_start_and_end_on_each_node_and_a_drain_reach_the_console(slurm, console, personas):
    job_id = submit(slurm, "--nodes=2", "--job-name=node-facts", "--wrap=sleep 3")
    wait_for(lambda: job_state(slurm, job_id) == "RUNNING", 30, "the job to run")
    # Drained under the job: by someone else (a health check), and by Rebound itself.
    slurm.run("scontrol", "update", "nodename=node2", "state=drain", "reason=Xid 79 on GPU 3")
    slurm.run("scontrol", "update", "nodename=node1", "state=drain", "reason=rebound:action-9")
    wait_for(lambda: job_state(slurm, job_id) == "COMPLETED", 30, "the job to end")
    wait_for(lambda: node_events("node-facts").count() >= 5, 20, "the epilogs' events")
    time.sleep(1)  # nothing more comes

    beats = node_events("node-facts", kind="heartbeat")
    seen = sorted((e.node, e.data["slurm"]["hook"]) for e in beats)
    assert seen == [
        ("node1", "epilog"),
        ("node1", "prolog"),
        ("node2", "epilog"),
        ("node2", "prolog"),
    ], slurm.hook_log.read_text()
    for e in beats:
        assert e.data["slurm"]["job_id"] == str(job_id)
        assert e.data["slurm"]["restart_count"] == 0
        assert e.data["slurm"]["user"] == "root"
    assert {e.data["slurm"].get("exit_code") for e in beats.filter(data__slurm__hook="epilog")} == {
        "0:0"
    }
    # Only the drain Rebound did not set is reported, with Slurm's reason and state.
    fault = node_events("node-facts", kind="fault").get()
    assert fault.node == "node2"
    assert (fault.data["type"], fault.data["xid"]) == ("gpu_xid", 79)
    assert fault.data["message"] == "Slurm drained node node2: Xid 79 on GPU 3"
    assert "DRAIN" in fault.data["slurm"]["state"]
    assert fault.data["slurm"]["reason_by"].startswith("root@")

    listed = personas["viewer"].client().get("/api/v1/nodes/", {"cluster": CLUSTER}).json()
    nodes = {n["name"]: n["last_heartbeat_at"] for n in listed.get("results", listed)}
    assert nodes.keys() == {"node1", "node2"} and all(nodes.values())
    log = slurm.hook_log.read_text()
    assert log.count(f"job {job_id} node node2: job node-facts: sent heartbeat, fault in") == 1


def test_a_console_away_costs_the_job_nothing(slurm, console):
    console.stop()
    t0 = time.monotonic()
    job_id = submit(slurm, "--nodes=2", "--job-name=no-console", "--wrap=true")
    wait_for(lambda: job_state(slurm, job_id) == "COMPLETED", 30, "the job to end")
    took = time.monotonic() - t0
    log = wait_for(
        lambda: (text := slurm.hook_log.read_text()).count("ConnectionRefusedError") >= 4 and text,
        15,
        "both hooks on both nodes",
    )
    runs = re.findall(
        rf"rebound slurm (prolog|epilog) job {job_id} node (node\d): failed"
        r" \(ConnectionRefusedError: .*\) in (\d+\.\d+) s",
        log,
    )
    assert sorted((hook, node) for hook, node, _ in runs) == [
        ("epilog", "node1"),
        ("epilog", "node2"),
        ("prolog", "node1"),
        ("prolog", "node2"),
    ], log
    assert max(float(s) for *_, s in runs) < 1.0
    assert "ExitCode=0:0" in job_record(slurm, job_id)
    # A failing prolog or epilog would have drained its node ("Prolog error").
    states = slurm.run("sinfo", "-h", "-N", "-o", "%N %T")
    assert sorted(states.split()) == sorted(["node1", "idle", "node2", "idle"]), states
    print(f"job with the console away: submitted to completed in {took:.1f} s")


TRAIN = """\
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import agent

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
inst = agent.init(model, window=5)
run = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
rank = dist.get_rank()
os.makedirs("pids", exist_ok=True)
with open(f"pids/r{run}-rank{rank}.pid", "w") as f:
    f.write(str(os.getpid()))
print(f"run {run} rank {rank} attempt {inst.attempt} node {os.environ['SLURMD_NODENAME']}",
      flush=True)
for step in range(1, 41):
    with inst.step(step) as s:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.report(loss=loss)
    time.sleep(0.15 if run == 0 else 0.01)  # the first run lasts until the test kills a rank
inst.finish()
dist.destroy_process_group()
"""


def readme_sbatch() -> str:
    """The README's sbatch script, without its `--gpus-per-node` line (no GPUs here)."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(README_MARKER) :]
    script = re.search(r"```bash\n(.*?)\n```", after, re.S).group(1) + "\n"
    lines = script.splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("#SBATCH --gpus-per-node")]
    assert len(kept) == len(lines) - 1
    return "".join(kept)


def test_a_requeued_torch_job_is_a_new_launch_each_run_and_finishes(
    tmp_path, slurm, console, personas
):
    job = "slurm-requeue"
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "train.sbatch").write_text(readme_sbatch())
    environ = launch_environ(
        **slurm.env,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # torchrun
        REBOUND_URL=console.url,
        REBOUND_TOKEN=console.token,
        REBOUND_HEARTBEAT_S="1",
        REBOUND_LAUNCH_RETRY_S="20",
        OMP_NUM_THREADS="1",
        # The emulated nodes share this host: the rendezvous is on loopback.
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    t0 = time.monotonic()
    cmd = [slurm_cluster.which("sbatch"), "--parsable", f"--job-name={job}"]
    cmd += ["--nodes=2", f"--chdir={tmp_path}", f"--output={slurm.out_dir}/%x-%j.out"]
    done = subprocess.run(
        [*cmd, str(tmp_path / "train.sbatch")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip().split(";")[0])
    output = slurm.out_dir / f"{job}-{job_id}.out"

    def first_run_training():
        pid = tmp_path / "pids" / "r0-rank1.pid"
        steps = StepRecord.objects.filter(job__key=job, attempt=1).count()
        return pid.exists() and steps >= 5 and int(pid.read_text())

    victim = wait_for(first_run_training, 90, "the first run to train")
    os.kill(victim, signal.SIGKILL)  # a rank dies: its torchrun fails, srun ends the step
    killed_at = time.monotonic() - t0

    def finished():
        state = job_state(slurm, job_id)
        assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), (
            state,
            output.read_text() if output.exists() else "",
        )
        return state == "COMPLETED"

    wait_for(finished, 120, "the requeued job to finish")
    wall = time.monotonic() - t0
    text = output.read_text()
    assert "Restarts=1" in job_record(slurm, job_id), text
    assert re.search(r"run 0 rank 1 attempt 1 node node[12]\n", text), text
    assert re.search(r"run 1 rank 0 attempt 2 node node[12]\n", text), text

    api = personas["viewer"].client()
    assert api.get(f"/api/v1/jobs/{job}/").json()["status"] == "completed"
    launches = api.get(f"/api/v1/jobs/{job}/attempts").json()
    launches = launches.get("results", launches)
    assert [a["number"] for a in launches] == [1, 2]
    last = launches[1]
    assert (last["world_size"], last["gpus_per_node"], last["end_reason"]) == (2, 1, "completed")
    assert sorted(last["nodes"]) == ["node1", "node2"]
    assert launches[0]["started_at"] < launches[0]["ready_at"] < last["started_at"]
    # It died: the wrapper beside rank 0 ended it failed, or else the next launch's start.
    assert launches[0]["end_reason"] != "completed" and launches[0]["ended_at"]
    assert launches[0]["ended_at"] <= last["started_at"]

    # Each run of the script is its own launch identity: the requeue count, a new nonce.
    reserved = dict(
        LaunchReservation.objects.filter(job__key=job).values_list("attempt", "identity")
    )
    assert sorted(reserved) == [1, 2]
    assert f"/slurm:{job_id}:r0/n:" in reserved[1]
    assert f"/slurm:{job_id}:r1/n:" in reserved[2]
    assert StepRecord.objects.filter(job__key=job, attempt=2).count() == 40

    # The prolog and epilog saw both runs on both nodes (an epilog's restart count may
    # already be the requeue's: Slurm counts the requeue before the epilog runs).
    slurm_beats = node_events(job, kind="heartbeat").filter(data__has_key="slurm")
    epilogs = slurm_beats.filter(data__slurm__hook="epilog")
    wait_for(lambda: epilogs.count() == 4, 20, "the epilogs of both runs")
    hooks = sorted(
        (e.node, e.data["slurm"]["hook"], e.data["slurm"]["restart_count"])
        for e in slurm_beats.filter(data__slurm__hook="prolog")
    )
    assert hooks == [("node1", "prolog", 0), ("node1", "prolog", 1)] + [
        ("node2", "prolog", 0),
        ("node2", "prolog", 1),
    ]
    assert sorted(e.node for e in epilogs) == ["node1", "node1", "node2", "node2"]
    # Node reports after the finish change nothing of the job's.
    assert api.get(f"/api/v1/jobs/{job}/").json()["status"] == "completed"
    print(f"requeued torch job: a rank killed at {killed_at:.1f} s, finished at {wall:.1f} s")

    # The same script submitted again under the finished job's name: the console refuses
    # the launch, the wrapper exits 78 and the script does not requeue it.
    again = subprocess.run(
        [*cmd, str(tmp_path / "train.sbatch")], env=environ, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    again_id = int(again.stdout.strip().split(";")[0])
    wait_for(lambda: job_state(slurm, again_id) == "FAILED", 90, "the refused job to end")
    record = job_record(slurm, again_id)
    assert "ExitCode=78:0" in record and "Restarts=0" in record, record
    text = (slurm.out_dir / f"{job}-{again_id}.out").read_text()
    assert "refused a new launch (job_finished)" in text, text
    assert Attempt.objects.filter(job__key=job).count() == 2
