"""LocalCluster: virtual nodes on this machine and the launches running on them, all
state in a directory any process can read (its layout: agent.cluster). Launching,
stopping, fault injection and the node agents' lifecycle; the processes it starts
run agent.cluster.supervisor and agent.cluster.node_agent (through agent.cluster.cli).
No torch, no Django.

Long module: about 540 lines on purpose, one class whose methods are the cluster's whole API
(launch, stop, fault injection, node agents) over one state directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent import control
from agent.checkpoints import latest_checkpoint
from agent.cluster.procs import REPO, alive, child_env, free_port, proc_state, signal_group
from agent.sinks import make_sink

# agent.demo_train's exit codes: bad options (or a named checkpoint that is missing),
# and a collective that failed because of a peer (a symptom, not a crash of its own).
EXIT_CONFIG = 2
EXIT_PEER_LOST = 3
TERMINAL = frozenset({"completed", "failed", "killed", "lost"})
RUNNING = frozenset({"starting", "running", "stopping"})


def default_root() -> Path:
    return Path(os.environ.get("REBOUND_CLUSTER_DIR", "var/cluster"))


class ClusterError(Exception):
    pass


def spawn_detached(args: list[str], log: Path) -> None:
    """Starts `python -m agent.cluster ARGS --detach`, which forks its real work off and
    returns at once, so the real process is nobody's child here (no zombie to reap)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "agent.cluster", *args, "--detach"],
            cwd=REPO,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if p.wait(timeout=30) != 0:
        raise ClusterError(f"could not start {' '.join(args[:1])}: see {log}")


class LocalCluster:
    """Virtual nodes on this machine and the launches running on them; all state on disk."""

    def __init__(self, root=None):
        self.root = Path(root) if root is not None else default_root()
        self.root = self.root.resolve()
        config = control.read_json(self.root / "cluster.json")
        if config is None:
            raise ClusterError(f"no cluster at {self.root}: LocalCluster.create() it first")
        self.config = config

    @classmethod
    def create(
        cls, root=None, *, nodes: dict[str, int], sink: dict | None = None, heartbeat_s=5.0
    ) -> LocalCluster:
        """Writes (or rewrites) the cluster's configuration: nodes {name: slots}, where events
        go ({"events": path} and/or {"url": ..., "token": ...}), the node heartbeat period."""
        root = (Path(root) if root is not None else default_root()).resolve()
        for name, slots in nodes.items():
            if not control.SLUG.match(name) or int(slots) < 1:
                raise ClusterError(f"bad node {name!r}: a slug with slots >= 1")
        sink = dict(sink or {})
        if sink.get("events"):
            sink["events"] = str(Path(sink["events"]).resolve())
        root.mkdir(parents=True, exist_ok=True)
        path = root / "cluster.json"
        control.write_json(
            path,
            {
                "nodes": {n: int(s) for n, s in nodes.items()},
                "sink": sink,
                "heartbeat_s": float(heartbeat_s),
            },
        )
        os.chmod(path, 0o600)  # it may hold an ingest token
        return cls(root)

    # paths

    def job_dir(self, job: str) -> Path:
        if not control.SLUG.match(job):
            raise ClusterError(f"bad job key {job!r}")
        return self.root / "jobs" / job

    def attempt_dir(self, job: str, attempt: int) -> Path:
        return self.job_dir(job) / "attempts" / str(int(attempt))

    def control_path(self, job: str) -> Path:
        return self.job_dir(job) / "control.json"

    def checkpoint_dir(self, job: str) -> Path:
        return self.job_dir(job) / "checkpoints"

    def node_flags_path(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}.json"

    @property
    def nodes(self) -> dict[str, int]:
        return dict(control.read_json(self.root / "cluster.json", self.config)["nodes"])

    @property
    def sink_spec(self) -> dict:
        return dict(self.config.get("sink") or {})

    def sink(self, job: str, **defaults):
        return make_sink(self.sink_spec, job=job, **defaults)

    def latest_checkpoint(self, job: str) -> int | None:
        return latest_checkpoint(self.checkpoint_dir(job))

    # reading state

    def current_attempt(self, job: str) -> int | None:
        info = control.read_json(self.job_dir(job) / "job.json")
        return info["attempt"] if info else None

    def plan(self, job: str, attempt: int | None = None) -> dict:
        attempt = attempt or self.current_attempt(job)
        plan = control.read_json(self.attempt_dir(job, attempt) / "plan.json") if attempt else None
        if plan is None:
            raise ClusterError(f"job {job} has no launch {attempt or ''}".strip())
        return plan

    def status(self, job: str, attempt: int | None = None) -> dict:
        """The launch's state (starting, running, stopping, completed, failed, killed, or
        lost when its supervisor vanished) and each rank's: pid, node, state (running,
        stopped, exited) and exit code."""
        plan = self.plan(job, attempt)
        procs = control.read_json(self.attempt_dir(job, plan["attempt"]) / "procs.json") or {}
        state = procs.get("state", "starting")
        supervised = alive(procs.get("supervisor_pid"), procs.get("supervisor_start"))
        if (
            state in RUNNING
            and not supervised
            and (procs or time.time() - plan["launched_at"] > 30)
        ):
            state = "lost"  # its supervisor died (or never started) before recording an end
        ranks = []
        by_rank = {r["rank"]: r for r in procs.get("ranks", [])}
        for slot in plan["ranks"]:
            r = by_rank.get(slot["rank"], {})
            rc = r.get("returncode")
            ranks.append(
                {
                    "rank": slot["rank"],
                    "node": slot["node"],
                    "pid": r.get("pid"),
                    "state": proc_state(r.get("pid"), r.get("start")) if rc is None else "exited",
                    "returncode": rc,
                }
            )
        return {
            "job": job,
            "attempt": plan["attempt"],
            "state": state,
            "world_size": plan["world_size"],
            "nodes": plan["nodes"],
            "resume_step": plan.get("resume_step"),
            "launched_at": plan["launched_at"],
            "ended_at": procs.get("ended_at"),
            "failure": procs.get("failure"),
            "ranks": ranks,
        }

    def jobs(self) -> list[str]:
        try:
            return sorted(p.name for p in (self.root / "jobs").iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def running(self) -> list[dict]:
        """The status of every launch that is starting, running or stopping."""
        out = []
        for job in self.jobs():
            with contextlib.suppress(ClusterError):
                st = self.status(job)
                if st["state"] in RUNNING:
                    out.append(st)
        return out

    def used_slots(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for st in self.running():
            for r in st["ranks"]:
                used[r["node"]] = used.get(r["node"], 0) + 1
        return used

    def free_nodes(self) -> list[str]:
        """Nodes with no rank of a running launch (spares), in configuration order."""
        used = self.used_slots()
        return [n for n in self.nodes if not used.get(n)]

    def wait(self, job: str, timeout_s: float = 60.0, states=TERMINAL) -> dict:
        """Polls until the current launch is in one of `states`; returns its status."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(job)
            if st["state"] in states:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {st['state']} after {timeout_s} s")
            time.sleep(0.1)

    # launching

    def launch(
        self,
        job: str,
        *,
        nodes: list[str],
        world_size: int | None = None,
        attempt: int | None = None,
        resume_step: int | None = None,
        wait_s: float = 30.0,
        **train,
    ) -> dict:
        """Starts a launch of `job` on `nodes`: `world_size` ranks (default: every slot)
        spread evenly over them, continuing from the latest complete checkpoint or from
        `resume_step`. `train` are agent.demo_train options (steps=, global_batch=,
        micro_batch=, ckpt_every=, window=, heartbeat_s=, collective_timeout_s=, ...).
        Returns its status once every rank's process is started."""
        config_nodes = self.nodes
        unknown = [n for n in nodes if n not in config_nodes]
        if unknown or not nodes or len(set(nodes)) != len(nodes):
            raise ClusterError(f"nodes must be distinct nodes of the cluster; unknown: {unknown}")
        capacity = sum(config_nodes[n] for n in nodes)
        world = int(world_size or capacity)
        per_node = -(-world // len(nodes))
        if world < 1 or any(config_nodes[n] < min(per_node, world) for n in nodes):
            raise ClusterError(f"{world} ranks do not fit evenly on {nodes}")
        gb, mb = train.get("global_batch"), train.get("micro_batch")
        if gb and mb and gb % (world * mb):
            raise ClusterError(
                f"global batch {gb} is not a multiple of {world} ranks x micro-batch {mb}"
            )
        job_dir = self.job_dir(job)
        job_dir.mkdir(parents=True, exist_ok=True)
        with locked(job_dir / ".launch.lock"):
            last = self.current_attempt(job)
            if last is not None:
                prev = self.status(job)
                live = [r["rank"] for r in prev["ranks"] if r["state"] in ("running", "stopped")]
                if prev["state"] in RUNNING or live:
                    raise ClusterError(f"job {job} attempt {last} is still running: stop it first")
            if attempt is None:
                attempt = (last or 0) + 1
            elif last is not None and attempt <= last:
                raise ClusterError(f"attempt {attempt} is not after attempt {last}")
            used = self.used_slots()
            ranks, placed = [], []
            for node in nodes:
                n = min(per_node, world - len(ranks))
                if n <= 0:
                    break
                if used.get(node, 0) + n > config_nodes[node]:
                    raise ClusterError(f"node {node} has no {n} free slots")
                placed.append(node)
                base = len(ranks)
                ranks += [{"rank": base + i, "node": node, "local_rank": i} for i in range(n)]
            plan = {
                "job": job,
                "attempt": attempt,
                "world_size": world,
                "nodes": placed,
                "gpus_per_node": per_node,
                "ranks": ranks,
                "master_port": free_port(),
                "resume_step": resume_step,
                "launched_at": time.time(),
                "train": train,
            }
            adir = self.attempt_dir(job, attempt)
            adir.mkdir(parents=True, exist_ok=True)
            control.write_json(adir / "plan.json", plan)
            control.write_json(job_dir / "job.json", {"job": job, "attempt": attempt})
        spawn_detached(
            ["supervise", "--root", str(self.root), "--job", job, "--attempt", str(attempt)],
            adir / "supervisor.log",
        )
        return self.wait(job, wait_s, states=TERMINAL | {"running"})

    def relaunch(
        self,
        job: str,
        *,
        nodes: list[str] | None = None,
        world_size: int | None = None,
        resume_step: int | None = None,
        by: str = "agent.cluster",
        **train,
    ) -> dict:
        """Stops the current launch if it runs (on request of `by`), and launches the next
        attempt with the same training options (updated by `train`), on `nodes` (default:
        the same ones) with `world_size` ranks (default: as before, or every slot of the
        new nodes)."""
        plan = self.plan(job)
        self.stop(job, by=by)
        if world_size is None:
            world_size = plan["world_size"] if nodes is None else None
        return self.launch(
            job,
            nodes=nodes or plan["nodes"],
            world_size=world_size,
            resume_step=resume_step,
            **{**plan["train"], **train},
        )

    def replace_node(
        self, job: str, node: str, spare: str | None = None, *, by: str = "agent.cluster", **train
    ) -> dict:
        """Relaunches `job` with `node` swapped for `spare` (default: the first free node
        with as many slots), same world size, from the latest checkpoint."""
        plan = self.plan(job)
        if node not in plan["nodes"]:
            raise ClusterError(f"job {job} does not run on {node}")
        self.stop(job, by=by)
        if spare is None:
            need = sum(1 for r in plan["ranks"] if r["node"] == node)
            spares = [
                n for n in self.free_nodes() if n not in plan["nodes"] and self.nodes[n] >= need
            ]
            if not spares:
                raise ClusterError("no spare node free")
            spare = spares[0]
        nodes = [spare if n == node else n for n in plan["nodes"]]
        return self.relaunch(job, nodes=nodes, world_size=plan["world_size"], by=by, **train)

    def scale_down(
        self, job: str, drop: list[str] | str, *, by: str = "agent.cluster", **train
    ) -> dict:
        """Relaunches `job` without the `drop` node(s), on fewer ranks (those the other nodes
        ran). The global batch stays: each rank accumulates more micro-batches."""
        drop = [drop] if isinstance(drop, str) else list(drop)
        plan = self.plan(job)
        nodes = [n for n in plan["nodes"] if n not in drop]
        if not nodes:
            raise ClusterError("no node left")
        world = sum(1 for r in plan["ranks"] if r["node"] in nodes)
        return self.relaunch(job, nodes=nodes, world_size=world, by=by, **train)

    def stop(self, job: str, timeout_s: float = 20.0, *, by: str = "agent.cluster") -> dict:
        """Tears the current launch down; its end is reported as killed on request of `by`
        (so not taken for a fault). Returns its status."""
        if self.current_attempt(job) is None:
            raise ClusterError(f"job {job} was never launched")
        st = self.status(job)
        if st["state"] in TERMINAL and not any(r["state"] != "exited" for r in st["ranks"]):
            return st
        control.write_json(self.attempt_dir(job, st["attempt"]) / "stop.json", {"by": by})
        procs_path = self.attempt_dir(job, st["attempt"]) / "procs.json"
        procs = control.read_json(procs_path) or {}
        supervisor = (procs.get("supervisor_pid"), procs.get("supervisor_start"))
        if st["state"] in RUNNING:
            # Only a supervisor seen alive, by its pid and start time, is signalled: a
            # launch still starting has recorded none (and os.kill(0) would signal this
            # process's own group), and a pid recorded may be another process's by now.
            # One still starting reads stop.json as it runs.
            if alive(*supervisor):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(supervisor[0], signal.SIGTERM)
            try:
                return self.wait(job, timeout_s)
            except TimeoutError:
                pass
        # No supervisor to do it: kill the ranks here.
        for r in procs.get("ranks", []):
            if alive(r.get("pid"), r.get("start")):
                signal_group(r["pid"], signal.SIGKILL)
        return self.status(job)

    # fault injection

    def _rank(self, job: str, rank: int) -> dict:
        st = self.status(job)
        procs = control.read_json(self.attempt_dir(job, st["attempt"]) / "procs.json") or {}
        for r in procs.get("ranks", []):
            if r["rank"] == rank:
                if not alive(r.get("pid"), r.get("start")):
                    raise ClusterError(f"rank {rank} of {job} is not running")
                return r
        raise ClusterError(f"job {job} has no rank {rank}")

    def kill_rank(self, job: str, rank: int, sig: int = signal.SIGKILL) -> int:
        """Sends `sig` (SIGKILL: a crash) to a rank's process; returns its pid."""
        r = self._rank(job, rank)
        os.kill(r["pid"], sig)
        return r["pid"]

    def hang_rank(self, job: str, rank: int) -> int:
        """SIGSTOPs a rank: it holds its sockets open and answers nothing, like a hung GPU."""
        return self.kill_rank(job, rank, signal.SIGSTOP)

    def resume_rank(self, job: str, rank: int) -> int:
        """SIGCONTs a stopped rank."""
        return self.kill_rank(job, rank, signal.SIGCONT)

    def slow_rank(self, job: str, rank: int, factor: float) -> None:
        """Makes a rank's compute take `factor` times as long (1: back to normal)."""
        control.set_slow(self.control_path(job), rank, factor)

    def corrupt_loss(
        self,
        job: str,
        mode: str,
        *,
        from_step: int,
        until_step: int | None = None,
        factor: float = 10.0,
        rank: int | None = None,
    ) -> None:
        """From `from_step`, the loss is NaN (mode "nan") or `factor` times itself ("spike")."""
        control.set_loss_fault(
            self.control_path(job),
            mode,
            from_step=from_step,
            until_step=until_step,
            factor=factor,
            rank=rank,
        )

    def clear_faults(self, job: str) -> None:
        control.clear_faults(self.control_path(job))

    def report_xid(self, node: str, xid: int, *, message: str | None = None, kill=False) -> list:
        """Reports a GPU Xid on `node` as its node agent would: a `fault` of type gpu_xid with
        the node and no attempt, to every launch running there. With `kill`, the node's ranks
        then die (SIGKILL), as they do after Xid 79 (fallen off the bus). Returns the jobs."""
        jobs = []
        for st in self.running():
            if node not in st["nodes"]:
                continue
            sink = self.sink(st["job"])
            data = {"type": "gpu_xid", "xid": int(xid)}
            data["message"] = message or f"NVRM: Xid (PCI:0000:00:00): {int(xid)}"
            sink.emit("fault", data, node=node)
            sink.close()
            jobs.append(st["job"])
            if kill:
                for r in st["ranks"]:
                    if r["node"] == node and r["pid"]:
                        with contextlib.suppress(ClusterError, ProcessLookupError):
                            self.kill_rank(st["job"], r["rank"])
        return jobs

    def stop_heartbeats(self, node: str) -> None:
        """The node falls silent: its agent and the ranks on it stop sending heartbeats."""
        control.set_node_heartbeats(self.node_flags_path(node), False)

    def start_heartbeats(self, node: str) -> None:
        control.set_node_heartbeats(self.node_flags_path(node), True)

    # node agents

    def start_node_agents(self, nodes: list[str] | None = None) -> None:
        """Starts a heartbeat process for each node (those not already running one)."""
        for node in nodes or list(self.nodes):
            if self.node_agent_pid(node):
                continue
            spawn_detached(
                ["node-agent", "--root", str(self.root), "--node", node],
                self.root / "nodes" / f"{node}.agent.log",
            )
            deadline = time.monotonic() + 10
            while not self.node_agent_pid(node):
                if time.monotonic() > deadline:
                    raise ClusterError(f"node agent of {node} did not start")
                time.sleep(0.05)

    def node_agent_pid(self, node: str) -> int | None:
        info = control.read_json(self.root / "nodes" / f"{node}.agent.json") or {}
        return info["pid"] if alive(info.get("pid"), info.get("start")) else None

    def stop_node_agents(self, nodes: list[str] | None = None) -> None:
        for node in nodes or list(self.nodes):
            pid = self.node_agent_pid(node)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def shutdown(self, *, quick: bool = False, grace_s: float = 5.0) -> list[str]:
        """Stops every running launch and every node agent; returns what it stopped.

        `quick` is for the cluster's owner going away (the demo stopping, and the
        console with it, maybe): every launch and agent is told at once, a launch
        reports its end for a second or so (what it could not deliver stays in its
        reporter's spill file), and whatever still runs after `grace_s` is killed."""
        if not quick:
            running = self.running()
            for st in running:
                self.stop(st["job"])
            agents = [n for n in self.nodes if self.node_agent_pid(n)]
            self.stop_node_agents()
            return [f"{st['job']} launch {st['attempt']}" for st in running] + [
                f"node agent {n}" for n in agents
            ]
        stopped, procs = [], []  # procs: (pid, start, is a group leader)
        for st in self.running():
            adir = self.attempt_dir(st["job"], st["attempt"])
            control.write_json(adir / "stop.json", {"by": "agent.cluster", "quick": True})
            record = control.read_json(adir / "procs.json") or {}
            sup = (record.get("supervisor_pid"), record.get("supervisor_start"), False)
            if alive(*sup[:2]):
                os.kill(sup[0], signal.SIGTERM)
                procs.append(sup)
            for r in record.get("ranks", []):
                procs.append((r.get("pid"), r.get("start"), True))
            stopped.append(f"{st['job']} launch {st['attempt']}")
        for node in self.nodes:
            info = control.read_json(self.root / "nodes" / f"{node}.agent.json") or {}
            agent = (info.get("pid"), info.get("start"), False)
            if alive(*agent[:2]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent[0], signal.SIGTERM)
                procs.append(agent)
                stopped.append(f"node agent {node}")
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(p, s) for p, s, _ in procs):
            time.sleep(0.05)
        for pid, start, leader in procs:
            if alive(pid, start):
                if leader:
                    signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return stopped


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
