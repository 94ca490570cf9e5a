"""The supervisor: one process per launch (the torchrun of the local cluster).

It starts one process per rank (agent.demo_train), each in its own process group,
records their pids and exit codes in the attempt's procs.json; when one rank fails
it tears the others down (SIGTERM, then SIGKILL) and reports the launch's end
(`attempt_ended` failed, and a `fault` crash naming the rank and node that died
first, unless it died of a lost peer). Rank 0 reports a completed launch itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agent import control
from agent.cluster.local import EXIT_CONFIG, EXIT_PEER_LOST, LocalCluster
from agent.cluster.procs import REPO, child_env, proc_stat, signal_group


def rank_command(cluster: LocalCluster, plan: dict, slot: dict) -> list[str]:
    """The command line of one rank: agent.demo_train with the plan's options."""
    job, attempt = plan["job"], plan["attempt"]
    spec = cluster.sink_spec
    cmd = [
        sys.executable,
        "-m",
        "agent.demo_train",
        "--job",
        job,
        "--attempt",
        str(attempt),
        "--node",
        slot["node"],
        "--nodes",
        ",".join(plan["nodes"]),
        "--gpus-per-node",
        str(plan["gpus_per_node"]),
        "--launched-at",
        repr(plan["launched_at"]),
        "--ckpt-dir",
        str(cluster.checkpoint_dir(job)),
        "--control",
        str(cluster.control_path(job)),
        "--node-flags",
        str(cluster.node_flags_path(slot["node"])),
    ]
    if spec.get("events"):
        cmd += ["--events", spec["events"]]
    if spec.get("url"):
        cmd += ["--url", spec["url"]]
    if plan.get("resume_step") is not None:
        cmd += ["--resume-step", str(plan["resume_step"])]
    for key, value in plan["train"].items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (None, False):
            cmd += [flag, str(value)]
    return cmd


class Supervisor:
    """Runs one launch of a job to its end (`run`), recording it in the attempt's directory."""

    def __init__(self, cluster: LocalCluster, job: str, attempt: int):
        self.cluster = cluster
        self.plan = cluster.plan(job, attempt)
        self.job = job
        self.attempt = attempt
        self.dir = cluster.attempt_dir(job, attempt)
        self.procs: dict[int, subprocess.Popen] = {}
        self.record = {
            "state": "starting",
            "supervisor_pid": os.getpid(),
            "supervisor_start": proc_stat(os.getpid())[1],
            "ranks": [],
        }
        self.stop_requested = False
        self.failure = None

    def write(self):
        control.write_json(self.dir / "procs.json", self.record)

    def start(self):
        self.write()
        token = self.cluster.sink_spec.get("token")
        for slot in self.plan["ranks"]:
            env = child_env(
                {
                    "RANK": str(slot["rank"]),
                    "WORLD_SIZE": str(self.plan["world_size"]),
                    "LOCAL_RANK": str(slot["local_rank"]),
                    "LOCAL_WORLD_SIZE": str(self.plan["gpus_per_node"]),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(self.plan["master_port"]),
                    "GLOO_SOCKET_IFNAME": "lo",
                    **({"REBOUND_TOKEN": token} if token else {}),
                }
            )
            with open(self.dir / f"rank-{slot['rank']}.log", "ab") as log:
                p = subprocess.Popen(
                    rank_command(self.cluster, self.plan, slot),
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, signalled as one
                )
            self.procs[slot["rank"]] = p
            st = proc_stat(p.pid)
            self.record["ranks"].append(
                {
                    "rank": slot["rank"],
                    "node": slot["node"],
                    "pid": p.pid,
                    "start": st[1] if st else None,
                    "returncode": None,
                    "exited_at": None,
                }
            )
        self.record["state"] = "running"
        self.write()

    def poll(self) -> list[dict]:
        """Records ranks that exited since the last poll; returns them."""
        exited = []
        for r in self.record["ranks"]:
            if r["returncode"] is None:
                rc = self.procs[r["rank"]].poll()
                if rc is not None:
                    r["returncode"], r["exited_at"] = rc, time.time()
                    exited.append(r)
        if exited:
            self.write()
        return exited

    def teardown(self, grace_s: float = 5.0):
        live = [r for r in self.record["ranks"] if r["returncode"] is None]
        for r in live:
            signal_group(r["pid"], signal.SIGTERM)
            signal_group(r["pid"], signal.SIGCONT)  # a stopped rank must run to die
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        for r in live:
            if self.procs[r["rank"]].poll() is None:
                signal_group(r["pid"], signal.SIGKILL)
        for p in self.procs.values():
            p.wait()
        self.poll()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.start()
        except Exception as exc:
            self.record["failure"] = {"message": f"could not start: {exc!r}"}
            self.stop_requested = True
        while True:
            exited = self.poll()
            failed = [r for r in exited if r["returncode"] != 0]
            # A stop asked for before this supervisor was recorded came as stop.json only.
            if not self.stop_requested and (self.dir / "stop.json").exists():
                self.stop_requested = True
            if self.stop_requested:
                self.record["state"] = "stopping"
                self.write()
                stop = control.read_json(self.dir / "stop.json") or {}
                if stop.get("quick"):  # the cluster shuts down: a second or two for all
                    self.teardown(grace_s=1.5)
                    return self.end("killed", report_s=1.5)
                self.teardown()
                return self.end("killed")
            if failed:
                # The first to die is the cause; one that lost a peer is a symptom.
                failed.sort(key=lambda r: (r["returncode"] == EXIT_PEER_LOST, r["rank"]))
                self.failure = failed[0]
                self.record["state"] = "stopping"
                self.write()
                self.teardown()
                return self.end("failed")
            if all(r["returncode"] == 0 for r in self.record["ranks"]):
                return self.end("completed")
            time.sleep(0.05)

    def _on_signal(self, signum, frame):
        self.stop_requested = True

    def end(self, state: str, report_s: float = 10.0) -> int:
        """Records the launch's end and reports it, for at most about 2 x `report_s`."""
        ranks = {r["rank"]: r for r in self.record["ranks"]}
        sink = self.cluster.sink(self.job, attempt=self.attempt)
        f = self.failure
        if f is not None:
            rc = f["returncode"]
            if rc < 0:
                how = f"signal {signal.Signals(-rc).name}"
            elif rc == EXIT_PEER_LOST:
                how = f"exit code {rc} (a collective failed: a peer died or hung)"
            else:
                how = f"exit code {rc}"
            self.record["failure"] = {
                "rank": f["rank"],
                "node": f["node"],
                "returncode": rc,
                "message": f"rank {f['rank']} on {f['node']} exited with {how}",
            }
            if rc != EXIT_PEER_LOST:
                message = self.record["failure"]["message"]
                kind = "other" if rc == EXIT_CONFIG else "crash"
                sink.emit(
                    "fault",
                    {"type": kind, "exit_code": rc, "message": message},
                    attempt=self.attempt,
                    node=f["node"],
                    rank=f["rank"],
                )
        rank0 = ranks.get(0)
        if state != "completed" and not (rank0 and rank0["returncode"] == 0):
            data = {"reason": state}
            if f is not None:
                data["exit_code"] = f["returncode"]
            stop = control.read_json(self.cluster.attempt_dir(self.job, self.attempt) / "stop.json")
            if state == "killed" and stop:
                data["requested_by"] = stop["by"]
            sink.emit("attempt_ended", data, attempt=self.attempt)
        sink.flush(timeout_s=report_s)
        sink.close(timeout_s=report_s)
        self.record["state"] = state
        self.record["ended_at"] = time.time()
        self.write()
        return 0
