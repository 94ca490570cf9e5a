"""Stopping the demo (as scripts/run does when it stops) leaves nothing running: its
node agents, the launch's supervisor and the ranks are gone within seconds, even
when the console they report to is already gone. A fresh job key per run, so a
second run never adds a launch to the first run's job."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from agent import control
from agent.cluster import LocalCluster
from agent.cluster.procs import alive
from tests.processes import ROOT, free_port

STOPPED_WITHIN_S = 8  # what "promptly" means on a loaded two-core machine


def start_demo(root: Path, token_file: Path) -> subprocess.Popen:
    """The demo, posting to a console that is not there (a port nobody listens on)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agent.demo", "--url", f"http://127.0.0.1:{free_port()}"]
        + ["--token-file", str(token_file), "--root", str(root), "--recovery-wait-s", "5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def processes_of(cluster: LocalCluster) -> dict[str, tuple[int, int | None]]:
    """Every process the cluster's state names: {what: (pid, start)}."""
    out = {}
    for info in (cluster.root / "nodes").glob("*.agent.json"):
        agent = control.read_json(info) or {}
        out[f"agent {info.name}"] = (agent.get("pid"), agent.get("start"))
    for procs_path in (cluster.root / "jobs").glob("*/attempts/*/procs.json"):
        procs = control.read_json(procs_path) or {}
        out[f"supervisor {procs_path}"] = (procs["supervisor_pid"], procs["supervisor_start"])
        for r in procs.get("ranks", []):
            out[f"rank {r['rank']} {procs_path}"] = (r["pid"], r["start"])
    return out


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_stopping_the_demo_stops_its_node_agents_supervisor_and_ranks_within_seconds(tmp_path):
    root, token = tmp_path / "cluster", tmp_path / "token"
    token.write_text("rbd_not-a-real-token\n")
    demo = start_demo(root, token)
    try:

        def training():
            cluster = LocalCluster(root) if (root / "cluster.json").exists() else None
            jobs = cluster.jobs() if cluster else []
            return jobs and cluster.status(jobs[0])["state"] == "running"

        wait_until(training, 120, "the demo's job never ran")
        cluster = LocalCluster(root)
        before = processes_of(cluster)
        assert len(before) == 4 + 1 + 4, before  # 4 node agents, a supervisor, 4 ranks
        assert all(alive(pid, start) for pid, start in before.values())

        demo.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out = demo.communicate(timeout=STOPPED_WITHIN_S)[0]

        def left():
            return {w: p for w, (p, s) in processes_of(cluster).items() if alive(p, s)} | {
                w: p for w, (p, s) in before.items() if alive(p, s)
            }

        wait_until(lambda: not left(), STOPPED_WITHIN_S - (time.monotonic() - t0), str(left()))
        assert "remove" not in out  # no message tells anyone to delete state
    finally:
        if demo.poll() is None:
            demo.kill()
        if (root / "cluster.json").exists():  # whatever a failure left: never let it linger
            for pid, start in processes_of(LocalCluster(root)).values():
                if alive(pid, start):
                    os.kill(pid, signal.SIGKILL)


def test_each_demo_run_trains_a_job_of_its_own():
    from agent.demo import job_key

    first, second = job_key(1796025600.0), job_key(1796025601.0)
    assert first == "demo-live-20261130-080000" and second == "demo-live-20261130-080001"
    assert control.SLUG.match(first)
