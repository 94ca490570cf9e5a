"""The `local` driver: the machine's own LocalCluster (agent.cluster) of real
processes standing for nodes; the demo and the end-to-end tests run on it.

- cordon / uncordon / drain are flags in the node's flags file
  (`nodes/<node>.json`: `cordoned`, `drained`, `by`), read by nothing that
  places work yet; drain also stops every launch with ranks on the node;
- restart_job relaunches the job from its latest complete checkpoint (or, for a
  rollback, from a named step) through LocalCluster.relaunch;
- replace_node and scale_down are LocalCluster's own;
- checkpoint_job writes a checkpoint request (the action's key) into the job's
  control file (agent.control.request_checkpoint), read by its ranks every step;
- validate_node runs a short torch burn-in (recovery.drivers.burnin) in a
  subprocess; without torch it fails with a clear error.

Idempotent: each call looks first. A relaunch records which launch it started
from under the action's key (`jobs/<job>/rebound-actions.json`), so a second
run of the same action after a lost worker does not relaunch again. Every
change actually made is appended to `rebound-driver.jsonl` in the cluster's
directory (one line per change; a repeat that changes nothing adds none).

Options (ClusterRecoverySettings.driver_options): `root` (default
$REBOUND_CLUSTER_DIR or var/cluster), `burnin_seconds`, `burnin_size`,
`min_gflops`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path

from agent import control
from agent.cluster import ClusterError, LocalCluster
from recovery.drivers import DriverError, DriverTransientError, burnin


class LocalDriver:
    name = "local"

    def __init__(
        self,
        *,
        root=None,
        burnin_seconds: float = 3.0,
        burnin_size: int = 512,
        min_gflops: float = 0.0,
        **_ignored,
    ):
        self.root = root
        self.burnin_seconds = float(burnin_seconds)
        self.burnin_size = int(burnin_size)
        self.min_gflops = float(min_gflops)

    @cached_property
    def cluster(self) -> LocalCluster:
        try:
            return LocalCluster(self.root)
        except ClusterError as exc:
            raise DriverError(str(exc)) from exc

    # bookkeeping

    def _log(self, op: str, key: str, **details) -> None:
        line = json.dumps({"at": time.time(), "op": op, "key": key, **details})
        with open(self.cluster.root / "rebound-driver.jsonl", "a") as f:
            f.write(line + "\n")

    def _node(self, node: str) -> Path:
        if node not in self.cluster.nodes:
            raise DriverError(f"node {node} is not a node of the local cluster")
        return self.cluster.node_flags_path(node)

    def flags(self, node: str) -> dict:
        return control.read_json(self._node(node), {}) or {}

    def _set_flags(self, node: str, op: str, key: str, **wanted) -> dict:
        path = self._node(node)
        with control.update_json(path) as flags:
            changed = {k: v for k, v in wanted.items() if flags.get(k, False) != v}
            if changed:
                flags.update(changed)
                flags["by"] = key
        if changed:
            self._log(op, key, node=node, flags=changed)
        return {"node": node, "changed": bool(changed), "flags": self.flags(node)}

    # nodes

    def cordon(self, node, *, key):
        return self._set_flags(node, "cordon", key, cordoned=True)

    def uncordon(self, node, *, key):
        flags = self.flags(node)
        if (
            flags.get("cordoned")
            and flags.get("by")
            and not str(flags["by"]).startswith("rebound:")
        ):
            raise DriverError(f"node {node} was cordoned by {flags['by']}, not by rebound")
        return self._set_flags(node, "uncordon", key, cordoned=False, drained=False)

    def drain(self, node, *, key):
        out = self._set_flags(node, "drain", key, cordoned=True, drained=True)
        stopped = []
        for st in self._call(self.cluster.running):
            if node in st["nodes"]:
                self._call(self.cluster.stop, st["job"], by=key)
                stopped.append(st["job"])
                self._log("stop", key, job=st["job"], attempt=st["attempt"])
        return {**out, "stopped": stopped}

    # jobs

    def _intents_path(self, job: str) -> Path:
        return self._call(self.cluster.job_dir, job) / "rebound-actions.json"

    def restart_job(self, job, from_step, nodes, *, key):
        c = self.cluster
        path = self._intents_path(job)
        current = self._call(c.current_attempt, job)
        if current is None:
            raise DriverError(f"job {job} was never launched on the local cluster")
        intents = control.read_json(path, {}) or {}
        if key in intents and current > intents[key]["attempt_before"]:
            return {"changed": False, "already": True, **self._summary(job)}
        with control.update_json(path) as value:
            value.setdefault(key, {"attempt_before": current, "from_step": from_step})
        plan = self._call(c.plan, job)
        if nodes and set(nodes) == set(plan["nodes"]):
            nodes = None  # the same nodes: keep the launch's own order and world size
        st = self._call(c.relaunch, job, nodes=nodes or None, resume_step=from_step, by=key)
        self._log("restart_job", key, job=job, attempt=st["attempt"], resume_step=from_step)
        return {"changed": True, **self._summary(job, st)}

    def replace_node(self, job, node, spare, *, key):
        plan = self._call(self.cluster.plan, job)
        if node not in plan["nodes"] and spare in plan["nodes"]:
            return {"changed": False, "already": True, **self._summary(job)}
        if node not in plan["nodes"]:
            raise DriverError(f"job {job} does not run on {node}")
        st = self._call(self.cluster.replace_node, job, node, spare, by=key)
        self._log("replace_node", key, job=job, node=node, spare=spare, attempt=st["attempt"])
        self._set_flags(node, "cordon", key, cordoned=True)
        return {"changed": True, **self._summary(job, st)}

    def scale_down(self, job, nodes, *, key):
        plan = self._call(self.cluster.plan, job)
        drop = [n for n in nodes if n in plan["nodes"]]
        if not drop:
            return {"changed": False, "already": True, **self._summary(job)}
        st = self._call(self.cluster.scale_down, job, drop, by=key)
        self._log("scale_down", key, job=job, nodes=drop, attempt=st["attempt"])
        return {"changed": True, **self._summary(job, st)}

    def checkpoint_job(self, job, *, key):
        """The request in the job's control file, named by the action's key (a repeat
        asks nothing new); its ranks see it at their next step (docs/checkpoint-now.md)."""
        st = self._call(self.cluster.status, job)
        if st["state"] not in ("starting", "running"):
            raise DriverError(
                f"job {job} is {st['state']} on the local cluster: only a running job can"
                " save a checkpoint"
            )
        path = self._call(self.cluster.control_path, job)
        made = self._call(control.request_checkpoint, path, key)
        if made:
            self._log("checkpoint_job", key, job=job, attempt=st["attempt"])
        return {"changed": made, "request": key, **self._summary(job, st)}

    def validate_node(self, node, *, key):
        self._node(node)
        if importlib.util.find_spec("torch") is None:
            raise DriverError(
                "validate_node: torch is not installed here, so the burn-in cannot run",
                output={"node": node, "passed": False, "error": "torch is not installed"},
            )
        cmd = burnin.command(
            seconds=self.burnin_seconds,
            size=self.burnin_size,
            min_gflops=self.min_gflops,
            python=sys.executable,
        )
        try:
            proc = subprocess.run(
                cmd,
                cwd=burnin.REPO,
                capture_output=True,
                text=True,
                timeout=self.burnin_seconds * 4 + 120,
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverError(f"validate_node: the burn-in of {node} hung") from exc
        result = {"node": node, **(burnin.result_from(proc.stdout) or {})}
        if proc.returncode != 0 or not result.get("passed"):
            why = (
                "; ".join(result.get("problems") or [])
                or result.get("error")
                or (f"exit code {proc.returncode}: {proc.stderr.strip()[-500:]}")
            )
            raise DriverError(f"validate_node: {node} failed the burn-in: {why}", output=result)
        self._log("validate_node", key, node=node, gflops=result.get("gflops"))
        return result

    # fault injection (this driver only: a lab cluster)

    def inject_fault(self, kind: str, *, job=None, rank=None, node=None, **params) -> dict:
        """Do to the cluster what the fault would (see recovery.faults.FAULTS)."""
        c = self.cluster
        if node is not None:
            self._node(node)
        actions = {
            "crash": lambda: {"pid": c.kill_rank(job, rank)},
            "hang": lambda: {"pid": c.hang_rank(job, rank)},
            "resume": lambda: {"pid": c.resume_rank(job, rank)},
            "slow": lambda: c.slow_rank(job, rank, params["factor"]),
            "nan": lambda: c.corrupt_loss(job, "nan", from_step=params["from_step"], rank=rank),
            "spike": lambda: c.corrupt_loss(
                job, "spike", from_step=params["from_step"], factor=params["factor"], rank=rank
            ),
            "clear": lambda: c.clear_faults(job),
            "xid": lambda: {"jobs": c.report_xid(node, params["xid"], kill=params["kill"])},
            "silence": lambda: c.stop_heartbeats(node),
            "unsilence": lambda: c.start_heartbeats(node),
        }
        result = self._call(actions[kind])
        self._log("inject_fault", "", kind=kind, job=job, rank=rank, node=node, **params)
        return result if isinstance(result, dict) else {}

    # status

    def node_status(self, node):
        running = [st["job"] for st in self._call(self.cluster.running) if node in st["nodes"]]
        return {
            "node": node,
            "slots": self.cluster.nodes.get(node),
            "flags": self.flags(node),
            "jobs": running,
        }

    def job_status(self, job):
        try:
            return self.cluster.status(job)
        except ClusterError:
            return {"job": job, "state": "unknown"}

    # helpers

    def _summary(self, job: str, st: dict | None = None) -> dict:
        st = st or self._call(self.cluster.status, job)
        return {
            "job": job,
            "attempt": st["attempt"],
            "state": st["state"],
            "nodes": st["nodes"],
            "world_size": st["world_size"],
            "resume_step": st.get("resume_step"),
        }

    @staticmethod
    def _call(fn, *args, **kwargs):
        """LocalCluster's errors as the driver's: a timeout may pass, a refusal will not."""
        try:
            return fn(*args, **kwargs)
        except ClusterError as exc:
            raise DriverError(str(exc)) from exc
        except (TimeoutError, OSError) as exc:
            raise DriverTransientError(f"{type(exc).__name__}: {exc}") from exc
