"""The demo: a real DDP job on the local cluster, with a schedule of faults.

    python -m agent.demo --url http://127.0.0.1:8000 --token-file var/ingest-token

Creates (or reuses) a local cluster of four 2-slot nodes under --root, three
for the job and one spare, starts a heartbeat agent per node, and launches
the demo transformer (`agent.demo_train`) as 4 ranks on two of them,
reporting to the console. Then, by the step the job has reached:

1. a straggler: one rank's compute slows 4x for a while;
2. a crash: a rank is killed;
3. a hardware fault: Xid 79 on a node, whose ranks then die.

After each failure it waits for the console's recovery to relaunch the job;
when nothing relaunches it within --recovery-wait-s (no recovery running,
or a policy that waits for approval), it relaunches the job itself (on the
spare after the hardware fault) and says so. It returns once the job has
completed. Neither Django nor torch is imported here: the ranks import torch.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from agent.cluster import LocalCluster
from agent.sinks import read_events

JOB = "demo-live"
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


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Demo:
    def __init__(self, cluster: LocalCluster, steps: int, recovery_wait_s: float):
        self.cluster = cluster
        self.steps = steps
        self.recovery_wait_s = recovery_wait_s
        self.events = Path(cluster.sink_spec["events"])

    def step(self) -> int:
        """The highest step the job reported (its events file, a copy of what it posts)."""
        seen = [e["data"]["step"] for e in read_events(self.events, kind="step", job=JOB)]
        return max(seen, default=0)

    def wait_for_step(self, step: int) -> None:
        while self.step() < step:
            state = self.cluster.status(JOB)["state"]
            if state in ("failed", "killed", "lost"):
                self.recover(hardware=None)
            time.sleep(1)

    def recover(self, hardware: str | None) -> None:
        """Wait for the console's recovery to relaunch the job, else relaunch it here."""
        attempt = self.cluster.current_attempt(JOB)
        self.cluster.wait(JOB, 120)
        deadline = time.monotonic() + self.recovery_wait_s
        while time.monotonic() < deadline:
            if self.cluster.current_attempt(JOB) != attempt:
                say(f"recovery relaunched the job: launch {self.cluster.current_attempt(JOB)}")
                return
            time.sleep(1)
        if hardware:
            say(f"no recovery acted in {self.recovery_wait_s:.0f} s: moving off {hardware}")
            self.cluster.replace_node(JOB, hardware)
        else:
            say(f"no recovery acted in {self.recovery_wait_s:.0f} s: relaunching")
            self.cluster.relaunch(JOB)

    def run(self) -> int:
        c = self.cluster
        if c.current_attempt(JOB) is not None:
            say(f"{JOB} ran here before ({c.status(JOB)['state']}); remove {c.root} to run again")
            return 0
        say(f"launching {JOB}: 4 ranks on node-a and node-b, {self.steps} steps")
        c.launch(JOB, nodes=["node-a", "node-b"], steps=self.steps, **TRAIN)
        s = self.steps
        self.wait_for_step(s // 6)
        say("fault 1: rank 3 computes 4x slower (a straggler on node-b)")
        c.slow_rank(JOB, 3, 4.0)
        self.wait_for_step(s // 6 + 60)
        c.slow_rank(JOB, 3, 1.0)
        say("rank 3 back to normal")
        self.wait_for_step(s // 2)
        say("fault 2: rank 1 is killed (a crash)")
        c.kill_rank(JOB, 1)
        self.recover(hardware=None)
        self.wait_for_step(3 * s // 4)
        node = c.plan(JOB)["nodes"][-1]
        say(f"fault 3: Xid 79 on {node}, its ranks die (a hardware fault)")
        c.report_xid(node, 79, kill=True)
        self.recover(hardware=node)
        while c.status(JOB)["state"] != "completed":
            if c.status(JOB)["state"] in ("failed", "killed", "lost"):
                self.recover(hardware=None)
            time.sleep(1)
        say(f"{JOB} completed {self.steps} steps")
        return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the console")
    p.add_argument("--token-file", required=True, help="an ingest token for cluster `local`")
    p.add_argument("--root", default="var/cluster")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--recovery-wait-s", type=float, default=60)
    args = p.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    root = Path(args.root)
    cluster = LocalCluster.create(
        root,
        nodes=NODES,
        sink={"url": args.url, "token": token, "events": root / "demo-events.jsonl"},
        heartbeat_s=2.0,
    )
    cluster.start_node_agents()
    # Stopped by its parent (scripts/run exits): tear the cluster down on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return Demo(cluster, args.steps, args.recovery_wait_s).run()
    except KeyboardInterrupt:
        return 130
    finally:
        cluster.shutdown()  # no torch process outlives the demo


if __name__ == "__main__":
    sys.exit(main())
