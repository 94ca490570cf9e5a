"""The zero-config agent under a real torchrun (2 ranks, CPU, gloo) against a live
console: rank 0's launch number is every rank's, a torchrun restart is a new launch
with a new number, and heartbeats come from one process per node."""

import textwrap

import pytest

from console.services import token_issue
from jobs.models import Attempt, Event, HeartbeatBucket, LaunchReservation, TrainingJob
from tests.agent.torchrun import torchrun

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

JOB = "torchrun-restart"

# A rank dies in the first launch; torchrun restarts the worker group by itself.
SCRIPT = textwrap.dedent(
    """
    import os, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import agent

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    inst = agent.init(model, window=5)
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"rank {dist.get_rank()} restart {restart} attempt {inst.attempt}", flush=True)
    for step in range(1, 41):
        with inst.step(step) as s:
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.report(loss=loss)
        time.sleep(0.02)
        if restart == 0 and step == 20 and dist.get_rank() == 1:
            inst.reporter.flush()
            os._exit(1)
    inst.finish()
    dist.destroy_process_group()
    """
)


def test_a_torchrun_restart_is_a_new_launch_and_every_rank_reports_its_number(
    tmp_path, live_server, personas
):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    _, token = token_issue(scope="ingest", cluster_name="east")
    # Two launches handed out before (another launcher): this one's number is the console's.
    ingest = personas["ingest"].client()
    for identity in ("earlier:1", "earlier:2"):
        r = ingest.post("/api/v1/launches", {"job": JOB, "launch": identity}, format="json")
        assert r.status_code == 201
    run = torchrun(
        script,
        url=live_server.url,
        token=token,
        job=JOB,
        max_restarts=1,
        # A store per rendezvous round: with torchrun's shared one, a gloo group restarted
        # after a peer died under a DDP comm hook (torch's own allreduce_hook too) reads
        # the dead round's addresses and cannot connect (torch 2.13, CPU).
        env={"REBOUND_HEARTBEAT_S": "0.2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert run.returncode == 0, run.output
    assert "rank 0 restart 0 attempt 3" in run.output
    assert "rank 1 restart 0 attempt 3" in run.output
    assert "rank 1 restart 1 attempt 4" in run.output

    job = TrainingJob.objects.get(key=JOB)
    assert job.status == "completed"
    assert list(Attempt.objects.filter(job=job).values_list("number", flat=True)) == [3, 4]
    last = Attempt.objects.get(job=job, number=4)
    assert (last.world_size, last.gpus_per_node, last.end_reason) == (2, 2, "completed")

    reserved = dict(LaunchReservation.objects.filter(job=job).values_list("attempt", "identity"))
    assert reserved[3].startswith("te:") and ":r0/n:" in reserved[3]
    assert reserved[4].startswith("te:") and ":r1/n:" in reserved[4]

    events = Event.objects.filter(job=job)
    # Every rank's steps and windows carry its launch's number, the one rank 0 was given.
    windows = events.filter(kind="rank_window", attempt=4)
    assert set(windows.values_list("rank", flat=True)) == {0, 1}
    assert set(events.filter(kind="step").values_list("attempt", flat=True)) == {3, 4}
    assert set(events.filter(kind="rank_window").values_list("attempt", flat=True)) == {3, 4}
    assert events.filter(kind="step", attempt=4).count() == 40
    assert 1 <= events.filter(kind="step", attempt=3).count() <= 21
    assert set(events.filter(kind="rank_window", attempt=3).values_list("rank", flat=True)) == {
        0,
        1,
    }
    # One attempt_started per launch, with its id stable per launch.
    starts = dict(events.filter(kind="attempt_started").values_list("attempt", "client_id"))
    assert set(starts) == {3, 4}
    assert starts[4].startswith("launch-4-") and starts[4].endswith("-attempt_started")
    assert events.filter(kind="attempt_started", attempt=4).get().data["launch"] == reserved[4]
    # Heartbeats reached the node's buckets (a plain heartbeat is not stored as an event;
    # that only LOCAL_RANK 0 sends them is agent.auto's, tests/agent/test_auto.py).
    assert not events.filter(kind="heartbeat").exists()
    buckets = HeartbeatBucket.objects.filter(job=job)
    assert set(buckets.values_list("node", flat=True)) == {last.nodes.get().name}
    assert buckets.count() >= 1
