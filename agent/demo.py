"""The demo: a real DDP job on the local cluster, with a schedule of faults.

    python -m agent.demo --url http://127.0.0.1:8000 --token-file var/ingest-token

Creates (or reuses) a local cluster of four 2-slot nodes under --root
(node-a..node-d: the job starts on two, the other two are free for a
relaunch; the console lists a node once it reports or is registered, as
scripts/run registers node-d as the spare), starts a heartbeat agent per
node, and launches the demo transformer (`agent.demo_train`) as 4 ranks on
node-a and node-b, reporting to the console. Each run trains a job of its own,
`demo-live-<UTC date-time>`, so a second run never adds a launch to a job the
first one finished. Then, by the step the job has reached:

1. a straggler: one rank's compute slows 4x for a while;
2. a crash: a rank is killed;
3. a hardware fault: Xid 79 on a node, whose ranks then die.

After each failure it waits for the console's recovery to relaunch the job;
when nothing relaunches it within --recovery-wait-s (no recovery running,
or a policy that waits for approval), it relaunches the job itself (on the
spare after the hardware fault) and says so. It returns once the job has
completed. Neither Django nor torch is imported here: the ranks import torch.

Stopped (SIGTERM or SIGINT, or its parent gone), it tears the cluster down at
once: the launch, its ranks and the node agents are gone within seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from agent.cluster import LocalCluster
from agent.sinks import read_events

JOB_PREFIX = "demo-live-"
NODES = {"node-a": 2, "node-b": 2, "node-c": 2, "node-d": 2}
TRAIN = {
    "global_batch": 16,
    "micro_batch": 2,
    "d_model": 128,
    "layers": 4,
    "seq_len": 64,
    "window": 10,
    "heartbeat_s": 2.0,
    "ckpt_every": 50,
    "collective_timeout_s": 60,
}


def job_key(when: float | None = None) -> str:
    """This run's job: the prefix and the UTC date and time it started."""
    return JOB_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.gmtime(when))


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Demo:
    def __init__(self, cluster: LocalCluster, job: str, steps: int, recovery_wait_s: float):
        self.cluster = cluster
        self.job = job
        self.steps = steps
        self.recovery_wait_s = recovery_wait_s
        self.events = Path(cluster.sink_spec["events"])

    def step(self) -> int:
        """The highest step the job reported (its events file, a copy of what it posts)."""
        seen = [e["data"]["step"] for e in read_events(self.events, kind="step", job=self.job)]
        return max(seen, default=0)

    def wait_for_step(self, step: int) -> None:
        while self.step() < step:
            state = self.cluster.status(self.job)["state"]
            if state in ("failed", "killed", "lost"):
                self.recover(hardware=None)
            time.sleep(1)

    def recover(self, hardware: str | None) -> None:
        """Wait for the console's recovery to relaunch the job, else relaunch it here."""
        attempt = self.cluster.current_attempt(self.job)
        self.cluster.wait(self.job, 120)
        deadline = time.monotonic() + self.recovery_wait_s
        while time.monotonic() < deadline:
            if self.cluster.current_attempt(self.job) != attempt:
                say(f"recovery relaunched the job: launch {self.cluster.current_attempt(self.job)}")
                return
            time.sleep(1)
        if hardware:
            say(f"no recovery acted in {self.recovery_wait_s:.0f} s: moving off {hardware}")
            self.cluster.replace_node(self.job, hardware)
        else:
            say(f"no recovery acted in {self.recovery_wait_s:.0f} s: relaunching")
            self.cluster.relaunch(self.job)

    def run(self) -> int:
        c = self.cluster
        say(f"launching {self.job}: 4 ranks on node-a and node-b, {self.steps} steps")
        c.launch(self.job, nodes=["node-a", "node-b"], steps=self.steps, **TRAIN)
        s = self.steps
        self.wait_for_step(s // 6)
        say("fault 1: rank 3 computes 4x slower (a straggler on node-b)")
        c.slow_rank(self.job, 3, 4.0)
        self.wait_for_step(s // 6 + 60)
        c.slow_rank(self.job, 3, 1.0)
        say("rank 3 back to normal")
        self.wait_for_step(s // 2)
        say("fault 2: rank 1 is killed (a crash)")
        c.kill_rank(self.job, 1)
        self.recover(hardware=None)
        self.wait_for_step(3 * s // 4)
        node = c.plan(self.job)["nodes"][-1]
        say(f"fault 3: Xid 79 on {node}, its ranks die (a hardware fault)")
        c.report_xid(node, 79, kill=True)
        self.recover(hardware=node)
        while c.status(self.job)["state"] != "completed":
            if c.status(self.job)["state"] in ("failed", "killed", "lost"):
                self.recover(hardware=None)
            time.sleep(1)
        say(f"{self.job} completed {self.steps} steps")
        return 0


def _stop_when_orphaned() -> None:
    """Its parent (scripts/run) gone without a word, say killed: stop as if told to."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the console")
    p.add_argument("--token-file", required=True, help="an ingest token for cluster `local`")
    p.add_argument("--root", default="var/cluster")
    p.add_argument("--job", help="the job's key (default: demo-live-<UTC date-time>, new per run)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--recovery-wait-s", type=float, default=60)
    args = p.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    root = Path(args.root)
    # Stopped by its parent (scripts/run exits): tear the cluster down on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    _stop_when_orphaned()
    cluster = LocalCluster.create(
        root,
        nodes=NODES,
        sink={"url": args.url, "token": token, "events": root / "demo-events.jsonl"},
        heartbeat_s=2.0,
    )
    try:
        cluster.start_node_agents()
        return Demo(cluster, args.job or job_key(), args.steps, args.recovery_wait_s).run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut this short
            signal.signal(sig, signal.SIG_IGN)
        stopped = cluster.shutdown(quick=True)  # no process of the cluster outlives the demo
        if stopped:
            say(f"stopped: {', '.join(stopped)}")


if __name__ == "__main__":
    sys.exit(main())
