"""The launcher wrapper (`python -m agent.launch -- torchrun ...`) around a real 2-rank
CPU job (gloo, agent.init) against a live console with a real Celery worker detecting:
torchrun restarts a killed rank by itself and the console shows both launches, the
crash and its cost; a crash loop the console sees stops torchrun's restarts at once;
a paused cluster stops the job before its first step."""

import re
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

from agent.launch_env import EXIT_REFUSED, read_state
from console.services import token_issue
from incidents.models import DetectorSetting
from jobs.models import Cluster, Event, LaunchReservation
from recovery.services.pause import cluster_pause
from tests.agent.torchrun import launch_environ
from tests.live import until
from tests.processes import celery_worker

# PostgreSQL: a Celery worker and the live server write the test database beside the
# test process, as in tests/agent/test_end_to_end.py.
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Rank 1 of the first launch SIGKILLs itself at step KILL_AT (0: never); every later
# launch trains STEPS steps and finishes the job. CRASH_EVERY=1: every launch dies so.
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
    kill_at = int(os.environ.get("KILL_AT", "0"))
    every = os.environ.get("CRASH_EVERY") == "1"
    print(f"rank {dist.get_rank()} restart {restart} attempt {inst.attempt}", flush=True)
    for step in range(1, int(os.environ.get("STEPS", "60")) + 1):
        with inst.step(step) as s:
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.report(loss=loss)
        time.sleep(0.05)
        if step == kill_at and dist.get_rank() == 1 and (restart == 0 or every):
            os.kill(os.getpid(), signal.SIGKILL)
    inst.finish()
    dist.destroy_process_group()
    """
)


def launch(tmp_path, url, token, job, *, max_restarts, env=None, timeout_s=300):
    """`python -m agent.launch -- torchrun --standalone --nproc-per-node 2 ... train.py`."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environ = launch_environ(
        REBOUND_URL=url,
        REBOUND_TOKEN=token,
        REBOUND_JOB=job,
        REBOUND_HEARTBEAT_S="1",
        REBOUND_LAUNCH_RETRY_S="20",
        OMP_NUM_THREADS="1",
        **(env or {}),
    )
    cmd = [sys.executable, "-m", "agent.launch", "--state-dir", str(tmp_path / "state"), "--"]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node=2", f"--max-restarts={max_restarts}", str(script)]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    done.wall_s = time.monotonic() - t0
    done.output = done.stdout
    return done


def results(body):
    return body.get("results", body) if isinstance(body, dict) else body


def test_torchrun_restarts_a_killed_rank_and_the_console_shows_the_crash_and_its_cost(
    tmp_path, live_server, personas, quick_passes
):
    job = "wrapped-restart"
    _, token = token_issue(scope="ingest", cluster_name="wrap-a")
    with celery_worker():
        run = launch(tmp_path, live_server.url, token, job, max_restarts=2, env={"KILL_AT": "20"})
        assert run.returncode == 0, run.output
        assert "rank 1 restart 1 attempt 2" in run.output
        api = personas["viewer"].client()

        launches = results(api.get(f"/api/v1/jobs/{job}/attempts").json())
        assert [x["number"] for x in launches] == [1, 2], launches
        first, second = launches
        assert first["end_reason"] == "failed" and second["end_reason"] == "completed"
        assert (first["world_size"], second["world_size"]) == (2, 2)
        # The wrapper ended launch 1 (its ranks could not), dated at rank 1's death,
        # before launch 2 started.
        end = Event.objects.get(job__key=job, kind="attempt_ended", attempt=1)
        assert end.data["launcher"] == "agent.launch" and end.data["reason"] == "failed"
        assert end.data["ready"] is True and end.data["node"]
        assert "restarted" in end.data["message"]
        start2 = Event.objects.get(job__key=job, kind="attempt_started", attempt=2)
        assert end.ts < start2.ts

        def incident_recovered():
            found = results(api.get("/api/v1/incidents/", {"job": job}).json())
            done = [i for i in found if i["recovered_at"] and i["lost_gpu_hours"]]
            return done or None

        [incident] = until(incident_recovered, "the crash incident's recovery", timeout_s=60)
        assert incident["attempt"] == 1
        assert incident["detected_at"] and incident["fault_at"]
        assert incident["time_to_recover_s"] > 0
        assert incident["lost_gpu_hours"] > 0

        def ledger():
            body = api.get(f"/api/v1/jobs/{job}/goodput").json()
            return body if body.get("categories", {}).get("productive") else None

        goodput = until(ledger, "the ledger", timeout_s=30)
    elapsed = goodput["elapsed_s"]
    assert sum(goodput["categories"].values()) == pytest.approx(elapsed, abs=1.0)
    assert 0 < elapsed <= run.wall_s + 0.5
    assert goodput["goodput"] < 1.0
    assert api.get(f"/api/v1/jobs/{job}/").json()["status"] == "completed"


def test_a_crash_loop_the_console_sees_stops_torchruns_restarts_at_once(
    tmp_path, live_server, personas, quick_passes
):
    job = "wrapped-loop"
    _, token = token_issue(scope="ingest", cluster_name="wrap-c")
    # Two launches within the window make a storm: the second one's start opens the loop.
    DetectorSetting.objects.create(
        cluster=Cluster.objects.get(name="wrap-c"), name="crash_loop.launches", value=2
    )
    with celery_worker():
        run = launch(
            tmp_path,
            live_server.url,
            token,
            job,
            max_restarts=8,
            env={"KILL_AT": "40", "CRASH_EVERY": "1", "STEPS": "200"},
        )
    assert run.returncode == EXIT_REFUSED, run.output
    # The wrapper says why it stopped torchrun, naming the crash loop and what to do.
    assert re.search(
        r"refused a new launch \(crash_loop\): job wrapped-loop is in a crash loop"
        r" \(incident #\d+",
        run.output,
    ), run.output
    assert "stopping" in run.output and "resolve" in run.output
    # Stopped at the first refusal: one refused launch, never a second, far from 8 restarts.
    assert run.output.count("the console refused launch") == 1, run.output
    state = read_state(str(tmp_path / "state"))
    assert state["refused"]["code"] == "crash_loop"
    stored = sorted(
        LaunchReservation.objects.filter(job__key=job).values_list("attempt", flat=True)
    )
    assert 2 <= len(stored) <= 4, stored
    assert (
        sorted(
            Event.objects.filter(job__key=job, kind="attempt_started").values_list(
                "attempt", flat=True
            )
        )
        == stored
    )
    # Every launch that died was ended failed (the last by the wrapper at the refusal).
    ends = dict(
        Event.objects.filter(job__key=job, kind="attempt_ended").values_list("attempt", "data")
    )
    assert sorted(ends) == stored and {d["reason"] for d in ends.values()} == {"failed"}
    assert "preempted" not in run.output


def test_a_paused_cluster_stops_the_job_before_its_first_launch(tmp_path, live_server):
    job = "wrapped-paused"
    _, token = token_issue(scope="ingest", cluster_name="wrap-p")
    cluster_pause(cluster=Cluster.objects.get(name="wrap-p"), actor="ops", reason="maintenance")
    t0 = time.monotonic()
    run = launch(tmp_path, live_server.url, token, job, max_restarts=3)
    assert run.returncode == EXIT_REFUSED, run.output
    assert "refused a new launch (cluster_paused): recovery on cluster wrap-p is paused" in (
        run.output
    )
    assert run.output.count("the console refused launch") == 1, run.output
    assert time.monotonic() - t0 < 60
    assert not LaunchReservation.objects.filter(job__key=job).exists()
    assert not Event.objects.filter(job__key=job).exists()
