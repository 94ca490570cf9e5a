"""A job of two nodes, each with its own launcher wrapper (`python -m agent.launch --
torchrun --nnodes 2 ...`, one rank per node, an elastic c10d rendezvous), on this host
against a live console: the wrapper of the node without rank 0 reports no launch of its
own, rank 0's node ends the launch a death cut short, and a refusal stops both nodes."""

import re
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

from agent.launch_env import EXIT_REFUSED
from console.services import token_issue
from jobs.models import Cluster, Event, LaunchReservation
from recovery.services.pause import cluster_pause
from tests.agent.torchrun import launch_environ
from tests.processes import free_port

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

NODES = ("mn-a", "mn-b")

# Rank 1 of the first launch SIGKILLs itself at step 15; the next launch finishes the job.
SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import agent

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    inst = agent.init(model, window=5)
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = dist.get_rank()
    print(f"rank {rank} restart {restart} attempt {inst.attempt}"
          f" node {os.environ['REBOUND_NODE']}", flush=True)
    for step in range(1, 31):
        with inst.step(step) as s:
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.report(loss=loss)
        time.sleep(0.05)
        if step == 15 and rank == 1 and restart == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    inst.finish()
    dist.destroy_process_group()
    """
)


def two_nodes(tmp_path, url, token, job, *, max_restarts, timeout_s=240):
    """Both nodes' wrappers, started together; (returncode, output) of each."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_port()
    procs = []
    for node in NODES:
        environ = launch_environ(
            REBOUND_URL=url,
            REBOUND_TOKEN=token,
            REBOUND_JOB=job,
            REBOUND_NODE=node,
            REBOUND_HEARTBEAT_S="1",
            REBOUND_LAUNCH_RETRY_S="20",
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, "-m", "agent.launch", "--state-dir", str(tmp_path / node), "--"]
        cmd += [sys.executable, "-m", "torch.distributed.run", "--nnodes=2"]
        cmd += ["--nproc-per-node=1", f"--max-restarts={max_restarts}", "--rdzv-backend=c10d"]
        cmd += [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={job}", str(script)]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=environ,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_rank_zeros_node_ends_a_launch_and_the_other_node_reports_nothing_of_its_own(
    tmp_path, live_server, personas
):
    job = "two-nodes"
    _, token = token_issue(scope="ingest", cluster_name="mn")
    runs = two_nodes(tmp_path, live_server.url, token, job, max_restarts=2)
    output = "\n".join(text for _, text in runs)
    assert [code for code, _ in runs] == [0, 0], output
    first = re.search(r"rank 0 restart 0 attempt 1 node (\S+)", output)
    assert first and "rank 1 restart 1 attempt 2" in output, output

    api = personas["viewer"].client()
    launches = api.get(f"/api/v1/jobs/{job}/attempts").json()["results"]
    assert [a["number"] for a in launches] == [1, 2], launches
    assert [a["end_reason"] for a in launches] == ["failed", "completed"]
    assert all(a["nodes"] == list(NODES) and a["world_size"] == 2 for a in launches)
    assert launches[1]["gpus_per_node"] == 1
    # The wrapper beside rank 0 ended launch 1; the other node sent no end and no
    # launch of its own (no `never_started`: it cannot know the job's launches).
    [end] = Event.objects.filter(job__key=job, kind="attempt_ended", attempt=1)
    assert end.data["launcher"] == "agent.launch" and end.data["node"] == first.group(1)
    assert LaunchReservation.objects.filter(job__key=job).count() == 2
    sent = Event.objects.filter(job__key=job, data__launcher="agent.launch")
    assert list(sent.values_list("node", flat=True)) == [first.group(1)]
    assert not Event.objects.filter(job__key=job, data__never_started=True).exists()
    assert api.get(f"/api/v1/jobs/{job}/").json()["status"] == "completed"


def test_a_refused_launch_stops_the_wrappers_of_both_nodes(tmp_path, live_server):
    job = "two-nodes-paused"
    _, token = token_issue(scope="ingest", cluster_name="mn-p")
    cluster_pause(cluster=Cluster.objects.get(name="mn-p"), actor="ops", reason="maintenance")
    t0 = time.monotonic()
    runs = two_nodes(tmp_path, live_server.url, token, job, max_restarts=3)
    output = "\n".join(text for _, text in runs)
    # Both stop at the first refusal: neither torchrun restarts into a rendezvous the
    # other will never join.
    assert [code for code, _ in runs] == [EXIT_REFUSED, EXIT_REFUSED], output
    for _, text in runs:
        assert "refused a new launch (cluster_paused)" in text, text
    assert output.count("the console refused launch") == 1, output
    assert time.monotonic() - t0 < 90
    assert not LaunchReservation.objects.filter(job__key=job).exists()
    assert not Event.objects.filter(job__key=job).exists()
