"""The `slurm` driver: acts on a Slurm cluster through its command-line tools.

Mutations go through `scontrol`, `sbatch` and `scancel`; reads through
`sinfo --json` and `squeue --json` where the installed Slurm has them (21.08+;
22.05 here), else `scontrol -o show node|job` parsed line by line. (slurmrestd
v0.0.38, the one in Debian 12, can neither drain, resume nor requeue.) Every
command goes through one runner (`SlurmDriver.run`): a subprocess with a timeout,
`SLURM_CONF` from the option `slurm_conf`, each call logged on the
`rebound.recovery.slurm` logger; the changes a call made are listed in its
result under `commands`.

Names: a Rebound node is a Slurm node name; a Rebound job key is a Slurm job
name (`--job-name=<key>`); the job is found by name (the newest active job of
that name, else the newest one slurmctld still remembers: MinJobAge).

Operations, in Slurm terms:

- cordon: `scontrol update nodename=N state=drain reason="rebound:<action> cordon"`.
  DRAIN lets the running jobs finish and places no new ones: a cordon. A node
  already drained (by us or by anyone) is left as it is: success, no change,
  and its reason is kept (an admin's drain is never relabelled as ours).
- uncordon: `scontrol update nodename=N state=resume`, only when the node's
  drain reason starts with `rebound:`. Someone else's drain (any other reason)
  raises DriverError and is left alone. A node not drained: success, no change.
- drain: the cordon (reason "rebound:<action> drain"), then every job running
  on the node is requeued (`scontrol requeue`; it restarts from the top of its
  batch script elsewhere, the node being drained) or, for a job that does not
  allow requeueing (`--no-requeue`), cancelled (`scancel`).
- restart_job, from the latest checkpoint (from_step None) while the job is
  queued or running: `scontrol requeue <id>`; with `nodes`, the job is requeued
  held (`requeuehold`), pinned there (`scontrol update jobid=… nodelist=…
  numnodes=…`) and released. The batch script runs again with
  SLURM_RESTART_COUNT set; finding the latest checkpoint is its own business.
  From a named step (a rollback), or when the job is gone: a new job is
  submitted with `sbatch --job-name=<key> --export=ALL,REBOUND_RESUME_STEP=<step>,…`
  (the step is empty for "the latest"), from the option `script` or else the
  job's own batch script (`scontrol write batch_script`), with the old job's
  node count, partition, working directory and output; it is submitted held,
  the old job cancelled, then the new one released.
- replace_node: the job is requeued held, `scontrol update jobid=…
  excnodelist=<node,…> nodelist=<its other nodes + spare>`, released. The bad
  node is excluded from the job rather than drained: isolating it is a cordon
  action of its own (Rebound's policies propose both), and the job must not
  come back to it even if someone resumes the node.
- scale_down: the job is requeued held, its `numnodes` lowered by the dropped
  nodes, which are excluded (and taken out of its required node list), then
  released. Limits: Slurm only resizes what the request allows: a job
  submitted with a fixed task count that no longer fits (`--ntasks` with
  `--ntasks-per-node`) is refused (DriverError), and the batch script must
  read its world size from SLURM_NNODES / SLURM_NTASKS. Slurm does not move
  a running job: every relaunch is a requeue, and a requeued job starts again
  only after `AuthInfo=cred_expire` (default 120 s).
- validate_node: a burn-in job pinned to the node (`sbatch -w N -N1 --wrap
  <validate_command>`), waited for (bounded by `validate_timeout`; a job that
  does not finish in time is cancelled and the call fails), and the call fails
  when the job does not complete with exit code 0. The default command is the
  torch burn-in `python -m recovery.drivers.burnin` with this console's
  interpreter and checkout, which only exists on a single-host cluster: on a
  real cluster set `validate_command` (a torch burn-in, `dcgmi diag -r 2`, …).
  A node drained by us (the usual case: cordoned, repaired, validated, then
  uncordoned) cannot run jobs, so for the burn-in it is put in a maintenance
  reservation of its own (`rebound-validate-<node>`, flags maint,ignore_jobs:
  no other job lands there), resumed, and drained again afterwards with our
  reason; the reservation is deleted. A node drained by someone else is
  refused (DriverError).
- node_status / job_status: state, flags, reason, whether the drain is ours,
  the jobs on a node; a job's id, state, reason, nodes, restarts, exit code.

Idempotent: each call reads first and does only what is missing. A relaunch
stamps the job's Comment with the action key, the restart count before it and
the changes it makes ("rebound:action-7 replace_node restarts:2
excnodelist:node3 nodelist:node1,node4 numnodes:2-2"), a submission with
"… submitted": a second run of the same action that finds its stamp (and a
higher restart count) changes nothing, and finishes a relaunch that was held
but not yet released.

Ownership: Rebound marks its drains with the reason prefix `rebound:` (the key
"rebound:action-<id>" followed by the operation) and resumes only drains that
carry it.

Errors: a command that times out, or a controller that does not answer
("Socket timed out", "Unable to contact slurm controller", …) raise
DriverTransientError; a refusal by Slurm, an unknown node or job raise DriverError.

Options (ClusterRecoverySettings.driver_options):
`slurm_conf` (SLURM_CONF for every command; default: the environment's),
`bin_dir` (where the Slurm commands are; default: PATH), `partition` (for
submissions), `script` (the batch script for a submission: a path, which may
hold `{job}`, or the script's text starting with `#!`), `workdir` and `output`
(sbatch --chdir and --output for submissions), `sbatch_args` (a list of more
sbatch arguments), `timeout` (seconds per command, default 30),
`validate_command`, `validate_timeout` (default 600), `burnin_seconds`,
`burnin_size`, `min_gflops` (the default burn-in's), `poll_interval` (default 1),
`json` (false: parse `scontrol -o` even where --json exists).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recovery.drivers import DriverError, DriverTransientError

log = logging.getLogger("rebound.recovery.slurm")

REPO = Path(__file__).resolve().parents[2]
PREFIX = "rebound:"

# What a controller says when it is busy or away: worth a retry.
TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Zero Bytes were transmitted"
    r"|Connection refused|connect failure|Resource temporarily unavailable"
    r"|Communication connection failure|backup controller in standby"
    r"|Slurm temporarily unable|Transaction still active|Job is completing",
    re.IGNORECASE,
)
RUNNING = {"RUNNING", "CONFIGURING", "SUSPENDED", "SIGNALING", "RESIZING"}
ACTIVE = RUNNING | {
    "PENDING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
    "STAGE_OUT",
}
DOWN = {"down", "fail", "failing", "future", "unknown"}


def mark(key: str) -> str:
    """The action key as it appears in Slurm: always with the `rebound:` prefix."""
    key = str(key).strip().replace(" ", "-")
    return key if key.startswith(PREFIX) else PREFIX + key


def expand_hostlist(expr: str | None) -> list[str]:
    """Slurm's compressed host lists: "node[1-3,5],gpu07" -> node1..node3, node5, gpu07."""
    if not expr or expr in ("(null)", "None"):
        return []
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    parts.append(cur)
    out: list[str] = []
    for part in filter(None, (p.strip() for p in parts)):
        m = re.match(r"^(.*?)\[([^\]]+)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        head, body, tail = m.groups()
        for rng in body.split(","):
            lo, _, hi = rng.partition("-")
            if hi:
                width = len(lo) if lo.startswith("0") else 0
                names = [f"{head}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
            else:
                names = [f"{head}{lo}"]
            for name in names:
                out.extend(expand_hostlist(name + tail) if "[" in tail else [name + tail])
    return out


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:()]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """One `scontrol -o show` record: Key=value pairs, values may hold spaces."""
    matches = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def _exit_status(value) -> tuple[int, int]:
    """(exit code, signal) from squeue --json: a wait status (22.05) or an object (23.02+)."""
    if isinstance(value, dict):
        sig = value.get("signal") or {}
        return int(value.get("return_code") or 0), int(
            (sig.get("id") if isinstance(sig, dict) else sig) or 0
        )
    raw = int(value or 0)
    return (raw >> 8) & 0xFF, raw & 0x7F


def _node_count(j: dict) -> int:
    """A job's node count; for a pending job the requested one (squeue's node_count
    keeps a requeued job's last allocation)."""
    if str(j.get("job_state")).upper() == "PENDING":
        m = re.search(r"(?:^|,)node=(\d+)", j.get("tres_req_str") or "")
        if m:
            return int(m.group(1))
    return int(j.get("node_count") or 0)


def _exactly(count: int) -> str:
    """`numnodes=N-N`: with `N` alone the job keeps its old maximum and may get more."""
    return f"{count}-{count}"


def _null(value):
    return None if value in (None, "", "(null)", "None", "N/A") else value


class SlurmDriver:
    name = "slurm"

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        partition: str | None = None,
        script: str | None = None,
        workdir: str | None = None,
        output: str | None = None,
        sbatch_args: list[str] | None = None,
        timeout: float = 30,
        validate_command: str | None = None,
        validate_timeout: float = 600,
        burnin_seconds: float = 3.0,
        burnin_size: int = 512,
        min_gflops: float = 0.0,
        poll_interval: float = 1.0,
        json: bool = True,
        **_ignored,
    ):
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self.partition = partition
        self.script = script
        self.workdir = workdir
        self.output = output
        self.sbatch_args = list(sbatch_args or [])
        self.timeout = float(timeout)
        self.validate_command = validate_command
        self.validate_timeout = float(validate_timeout)
        self.burnin_seconds = float(burnin_seconds)
        self.burnin_size = int(burnin_size)
        self.min_gflops = float(min_gflops)
        self.poll_interval = float(poll_interval)
        self.use_json = bool(json)
        self.commands: list[str] = []  # the changes made by the current call

    # the runner

    def run(
        self, *args: str, change: bool = False, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run one Slurm command. `change`: it alters the cluster (listed in the result).
        A timeout or an unreachable controller: DriverTransientError; another
        failure, with `check`: DriverError."""
        exe = os.path.join(self.bin_dir, args[0]) if self.bin_dir else args[0]
        cmd = [exe, *args[1:]]
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = str(self.slurm_conf)
        shown = shlex.join(args)
        log.info("slurm: %s", shown)
        try:
            proc = subprocess.run(
                cmd,
                env=env,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverTransientError(f"{shown}: no answer in {self.timeout:g} s") from exc
        except FileNotFoundError as exc:
            raise DriverError(f"{args[0]} not found: is the Slurm client installed?") from exc
        if change and proc.returncode == 0:
            self.commands.append(shown)
        if proc.returncode != 0:
            message = (proc.stderr.strip() or proc.stdout.strip())[-1000:]
            log.info("slurm: %s -> exit %s: %s", shown, proc.returncode, message)
            if TRANSIENT.search(message):
                raise DriverTransientError(f"{shown}: {message}")
            if check:
                raise DriverError(f"{shown}: {message}")
        return proc

    def _begin(self) -> None:
        self.commands = []

    def _result(self, **fields) -> dict:
        return {**fields, "commands": list(self.commands)}

    # reads

    def _json(self, *args: str) -> dict | None:
        """A command's --json output; None where this Slurm has no --json."""
        if not self.use_json:
            return None
        proc = self.run(*args, "--json", check=False)
        if proc.returncode != 0:
            message = proc.stderr + proc.stdout
            if re.search(r"unrecognized option|invalid option|not supported", message):
                self.use_json = False
                return None
            raise DriverError(f"{shlex.join(args)} --json: {message.strip()[-1000:]}")
        try:
            data = json.loads(proc.stdout)
        except ValueError as exc:
            raise DriverTransientError(f"{shlex.join(args)} --json: unreadable output") from exc
        errors = data.get("errors") or []
        if errors:
            # 22.05 exits 0 with an empty list and an "errors" entry when the
            # controller does not answer (after ~9 s of retries): worth a retry.
            text = "; ".join(str(e.get("error") or e) for e in errors)
            raise DriverTransientError(f"{shlex.join(args)} --json: {text}")
        return data

    def nodes(self) -> dict[str, dict]:
        """Every node: {name: {node, state, flags, drained, reason, reason_by, ours}}."""
        data = self._json("sinfo")
        out = {}
        if data is not None:
            for n in data.get("nodes", []):
                out[n["name"]] = self._node_record(
                    n["name"],
                    str(n.get("state") or "").lower(),
                    [str(f).upper() for f in n.get("state_flags") or []],
                    n.get("reason") or "",
                    n.get("reason_set_by_user"),
                )
            return out
        proc = self.run("scontrol", "-o", "show", "node")
        for line in proc.stdout.splitlines():
            rec = parse_scontrol_line(line)
            if "NodeName" not in rec:
                continue
            base, *flags = rec.get("State", "").split("+")
            reason = rec.get("Reason") or ""
            m = re.search(r"\s*\[([^\]@]*)@[^\]]*\]$", reason)
            by = m.group(1) if m else None
            reason = reason[: m.start()] if m else reason
            out[rec["NodeName"]] = self._node_record(
                rec["NodeName"], base.rstrip("*").lower(), [f.upper() for f in flags], reason, by
            )
        return out

    @staticmethod
    def _node_record(name, state, flags, reason, by) -> dict:
        reason = "" if reason in ("(null)", "none", "None") else reason
        drained = "DRAIN" in flags or state in ("drained", "draining")
        return {
            "node": name,
            "state": state,
            "flags": flags,
            "drained": drained,
            "down": state in DOWN,
            "reason": reason,
            "reason_by": by,
            "ours": reason.startswith(PREFIX),
        }

    def _node(self, node: str) -> dict:
        nodes = self.nodes()
        if node not in nodes:
            raise DriverError(f"node {node} is not a node of the Slurm cluster")
        return nodes[node]

    def jobs(self) -> list[dict]:
        """Every job slurmctld remembers, oldest first."""
        data = self._json("squeue")
        out = []
        if data is not None:
            for j in data.get("jobs", []):
                res = j.get("job_resources") or {}
                hosts = [a["nodename"] for a in res.get("allocated_nodes") or [] if "nodename" in a]
                code, sig = _exit_status(j.get("exit_code"))
                out.append(
                    {
                        "job": j.get("name") or "",
                        "job_id": int(j["job_id"]),
                        "state": str(j.get("job_state") or "").upper(),
                        "reason": j.get("state_reason") or "",
                        "nodes": hosts or expand_hostlist(j.get("nodes")),
                        "node_count": _node_count(j),
                        "restarts": int(j.get("restart_cnt") or 0),
                        "requeue": bool(j.get("requeue")),
                        "held": int(j.get("priority") or 0) == 0
                        and str(j.get("job_state")).upper() == "PENDING",
                        "excluded": expand_hostlist(j.get("excluded_nodes")),
                        "required": expand_hostlist(j.get("required_nodes")),
                        "comment": j.get("comment") or "",
                        "exit_code": code,
                        "signal": sig,
                        "partition": j.get("partition") or None,
                        "workdir": j.get("current_working_directory") or None,
                        "stdout": j.get("standard_output") or None,
                    }
                )
        else:
            proc = self.run("scontrol", "-o", "show", "job")
            for line in proc.stdout.splitlines():
                rec = parse_scontrol_line(line)
                if "JobId" not in rec:
                    continue
                code, _, sig = (rec.get("ExitCode") or "0:0").partition(":")
                state = rec.get("JobState", "").upper()
                out.append(
                    {
                        "job": rec.get("JobName") or "",
                        "job_id": int(rec["JobId"]),
                        "state": state,
                        "reason": rec.get("Reason") or "",
                        "nodes": expand_hostlist(_null(rec.get("NodeList"))),
                        "node_count": int((rec.get("NumNodes") or "0").split("-")[0] or 0),
                        "restarts": int(rec.get("Restarts") or 0),
                        "requeue": rec.get("Requeue") == "1",
                        "held": rec.get("Priority") == "0" and state == "PENDING",
                        "excluded": expand_hostlist(_null(rec.get("ExcNodeList"))),
                        "required": expand_hostlist(_null(rec.get("ReqNodeList"))),
                        "comment": _null(rec.get("Comment")) or "",
                        "exit_code": int(code or 0),
                        "signal": int(sig or 0),
                        "partition": _null(rec.get("Partition")),
                        "workdir": _null(rec.get("WorkDir")),
                        "stdout": _null(rec.get("StdOut")),
                    }
                )
        return sorted(out, key=lambda j: j["job_id"])

    def _jobs_named(self, job: str) -> list[dict]:
        return [j for j in self.jobs() if j["job"] == job]

    def _job(self, job: str) -> dict | None:
        """The job of that name: the newest active one, else the newest remembered."""
        named = self._jobs_named(job)
        active = [j for j in named if j["state"] in ACTIVE]
        return (active or named or [None])[-1]

    def _active_job(self, job: str) -> dict:
        j = self._job(job)
        if j is None:
            raise DriverError(f"job {job} is not known to the Slurm cluster")
        return j

    @staticmethod
    def _stamp(job: dict, key: str) -> str | None:
        """What our action `key` wrote in the job's comment, if it wrote there."""
        words = (job.get("comment") or "").split()
        return " ".join(words[1:]) if words and words[0] == mark(key) else None

    # nodes

    def cordon(self, node, *, key):
        self._begin()
        return self._cordon(node, key, "cordon")

    def _cordon(self, node: str, key: str, op: str) -> dict:
        n = self._node(node)
        if n["drained"] or (n["down"] and n["reason"] and not n["ours"]):
            # Isolated already; by someone else its reason stays theirs.
            return self._result(node=node, changed=False, already=True, **self._brief(n))
        reason = f"{mark(key)} {op}"
        self.run(
            "scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}", change=True
        )
        return self._result(node=node, changed=True, **self._brief(self._node(node)))

    def uncordon(self, node, *, key):
        self._begin()
        n = self._node(node)
        if not n["drained"] and not n["down"]:
            return self._result(node=node, changed=False, already=True, **self._brief(n))
        if not n["ours"]:
            raise DriverError(
                f"node {node} was drained by someone else ({n['reason'] or 'no reason'}"
                f"{', by ' + n['reason_by'] if n['reason_by'] else ''}); rebound resumes only "
                f"drains whose reason starts with {PREFIX!r}",
                output={"node": node, "ours": False, **self._brief(n)},
            )
        self.run("scontrol", "update", f"nodename={node}", "state=resume", change=True)
        return self._result(node=node, changed=True, **self._brief(self._node(node)))

    def drain(self, node, *, key):
        self._begin()
        out = self._cordon(node, key, "drain")
        requeued, cancelled = [], []
        for j in self.jobs():
            if j["state"] not in RUNNING or node not in j["nodes"]:
                continue
            if j["requeue"]:
                proc = self.run("scontrol", "requeue", str(j["job_id"]), change=True, check=False)
                if proc.returncode == 0:
                    requeued.append(j["job"] or str(j["job_id"]))
                    continue
            self.run("scancel", str(j["job_id"]), change=True)
            cancelled.append(j["job"] or str(j["job_id"]))
        changed = out["changed"] or bool(requeued or cancelled)
        fields = {k: v for k, v in out.items() if k != "commands"}
        fields.update(changed=changed, requeued=requeued, cancelled=cancelled)
        return self._result(**fields)

    # jobs

    def restart_job(self, job, from_step, nodes, *, key):
        self._begin()
        j = self._job(job)
        if j is not None and self._stamp(j, key) == "restart_job submitted":
            return self._finish_submission(j, key)
        if (done := self._relaunched(j, key, "restart_job")) is not None:
            return done
        if j is not None and from_step is None and j["state"] in ACTIVE:
            updates = {}
            if nodes and set(nodes) != set(j["nodes"] or j["required"]):
                updates = {"nodelist": ",".join(nodes), "numnodes": _exactly(len(nodes))}
            return self._relaunch(j, key, "restart_job", updates)
        return self._submit(job, key, "restart_job", previous=j, step=from_step, nodes=nodes)

    def replace_node(self, job, node, spare, *, key):
        self._begin()
        j = self._job(job)
        if j is None:
            raise DriverError(f"job {job} is not known to the Slurm cluster")
        if self._stamp(j, key) == "replace_node submitted":
            return self._finish_submission(j, key)
        if (done := self._relaunched(j, key, "replace_node")) is not None:
            return done
        placed = j["nodes"] or j["required"]
        if node not in placed:
            if node in j["excluded"] and (not spare or not placed or spare in placed):
                return self._result(changed=False, already=True, **self._job_brief(j))
            raise DriverError(f"job {job} does not run on {node}", output=self._job_brief(j))
        keep = [n for n in placed if n != node]
        new_nodes = keep + ([spare] if spare and spare not in keep else [])
        excluded = sorted(set(j["excluded"]) | {node})
        if j["state"] not in ACTIVE:
            return self._submit(
                job,
                key,
                "replace_node",
                previous=j,
                nodes=new_nodes if spare else None,
                count=len(new_nodes) if spare else j["node_count"],
                exclude=excluded,
            )
        updates = {"excnodelist": ",".join(excluded)}
        if spare:
            updates.update(nodelist=",".join(new_nodes), numnodes=_exactly(len(new_nodes)))
        elif j["required"]:
            updates["nodelist"] = ",".join(keep)
        return self._relaunch(j, key, "replace_node", updates)

    def scale_down(self, job, nodes, *, key):
        self._begin()
        j = self._job(job)
        if j is None:
            raise DriverError(f"job {job} is not known to the Slurm cluster")
        if self._stamp(j, key) == "scale_down submitted":
            return self._finish_submission(j, key)
        if (done := self._relaunched(j, key, "scale_down")) is not None:
            return done
        placed = j["nodes"] or j["required"]
        drop = [n for n in nodes if n in placed]
        if not drop:
            if all(n in j["excluded"] for n in nodes):
                return self._result(changed=False, already=True, **self._job_brief(j))
            raise DriverError(f"job {job} does not run on {', '.join(nodes)}")
        count = (j["node_count"] or len(placed)) - len(drop)
        if count < 1:
            raise DriverError(f"job {job} would be left with no node", output=self._job_brief(j))
        excluded = sorted(set(j["excluded"]) | set(drop))
        if j["state"] not in ACTIVE:
            return self._submit(
                job,
                key,
                "scale_down",
                previous=j,
                count=count,
                exclude=excluded,
                nodes=[n for n in j["required"] if n not in drop] or None,
            )
        updates = {"excnodelist": ",".join(excluded), "numnodes": _exactly(count)}
        if j["required"]:
            updates["nodelist"] = ",".join(n for n in j["required"] if n not in drop)
        return self._relaunch(j, key, "scale_down", updates)

    def _relaunched(self, j: dict | None, key: str, op: str) -> dict | None:
        """The result when this action has requeued the job already (None: it has not).
        A hold left by a lost worker is finished with the changes the stamp recorded."""
        if j is None or j["state"] not in ACTIVE:
            return None
        words = (self._stamp(j, key) or "").split()
        if len(words) < 2 or words[0] != op or not words[1].startswith("restarts:"):
            return None
        j = self._settled(j)
        if j["restarts"] <= int(words[1].split(":", 1)[1]):
            return None  # stamped, but the requeue itself did not happen
        if not j["held"]:
            return self._result(changed=False, already=True, **self._job_brief(j))
        jid = str(j["job_id"])
        self._apply(jid, dict(w.split(":", 1) for w in words[2:] if ":" in w))
        self.run("scontrol", "release", jid, change=True)
        return self._result(changed=True, **self._job_brief(self._job_by_id(jid)))

    def _relaunch(self, j: dict, key: str, op: str, updates: dict[str, str]) -> dict:
        """Requeue the job (held while `updates` are applied), stamped with `key`,
        the restart count before and the updates (to finish them after a lost worker)."""
        jid = str(j["job_id"])
        j = self._settled(j)
        if j["state"] not in RUNNING and j["state"] != "PENDING":
            raise DriverError(f"job {j['job']} ({jid}) is {j['state']}: it cannot be requeued")
        if j["state"] != "PENDING" and not j["requeue"]:
            raise DriverError(
                f"job {j['job']} ({jid}) does not allow requeueing (submitted with --no-requeue)",
                output=self._job_brief(j),
            )
        stored = "".join(f" {k}:{v}" for k, v in updates.items())
        comment = f"comment={mark(key)} {op} restarts:{j['restarts']}{stored}"
        self.run("scontrol", "update", f"jobid={jid}", comment, change=True)
        if j["state"] == "PENDING":
            # Not started (or already requeued): nothing to stop, only to change.
            if updates:
                self.run("scontrol", "hold", jid, change=True)
                self._apply(jid, updates)
                self.run("scontrol", "release", jid, change=True)
            return self._result(
                changed=bool(updates), pending=True, **self._job_brief(self._job_by_id(jid))
            )
        if not updates:
            self.run("scontrol", "requeue", jid, change=True)
            return self._result(changed=True, **self._job_brief(self._job_by_id(jid)))
        self.run("scontrol", "requeuehold", jid, change=True)
        # Changes made while the job is still completing are undone when it
        # becomes pending (its node count is reset from the request): wait.
        self._settled(self._job_by_id(jid))
        self._apply(jid, updates)
        self.run("scontrol", "release", jid, change=True)
        return self._result(changed=True, **self._job_brief(self._job_by_id(jid)))

    def _settled(self, j: dict) -> dict:
        """The job once it is no longer COMPLETING (bounded by `timeout`)."""
        deadline = time.monotonic() + self.timeout
        while j["state"] == "COMPLETING":
            if time.monotonic() > deadline:
                raise DriverTransientError(f"job {j['job']} ({j['job_id']}) is still completing")
            time.sleep(min(self.poll_interval, 0.2))
            j = self._job_by_id(j["job_id"])
        return j

    def _apply(self, jid: str, updates: dict[str, str]) -> None:
        if updates:
            args = [f"{k}={v}" for k, v in updates.items()]
            self.run("scontrol", "update", f"jobid={jid}", *args, change=True)

    def _job_by_id(self, job_id) -> dict:
        for j in self.jobs():
            if j["job_id"] == int(job_id):
                return j
        raise DriverTransientError(f"job {job_id} vanished from slurmctld")

    def _script_text(self, job: str, previous: dict | None) -> str:
        if self.script:
            text = str(self.script)
            if text.startswith("#!"):
                return text
            path = Path(text.replace("{job}", job))
            try:
                return path.read_text()
            except OSError as exc:
                raise DriverError(f"cannot read the batch script {path}: {exc}") from exc
        if previous is not None:
            proc = self.run(
                "scontrol", "write", "batch_script", str(previous["job_id"]), "-", check=False
            )
            if proc.returncode == 0 and proc.stdout.startswith("#!"):
                return proc.stdout
        raise DriverError(
            f"no batch script to launch job {job}: slurmctld no longer has it; "
            "set the driver option `script`"
        )

    def _submit(
        self,
        job: str,
        key: str,
        op: str,
        *,
        previous: dict | None,
        step: int | None = None,
        nodes: list[str] | None = None,
        count: int | None = None,
        exclude: list[str] | None = None,
    ) -> dict:
        """A new job named `job` (held), the old active ones cancelled, then released."""
        script = self._script_text(job, previous)
        args = [
            "sbatch",
            "--parsable",
            "--hold",
            f"--job-name={job}",
            f"--comment={mark(key)} {op} submitted",
            "--requeue",
            "--open-mode=append",
            f"--export=ALL,REBOUND_JOB={job},REBOUND_ACTION={mark(key)},"
            f"REBOUND_RESUME_STEP={'' if step is None else int(step)}",
        ]
        partition = self.partition or (previous or {}).get("partition")
        workdir = self.workdir or (previous or {}).get("workdir")
        output = self.output or (previous or {}).get("stdout")
        count = count or (len(nodes) if nodes else None) or (previous or {}).get("node_count")
        args += [f"--partition={partition}"] if partition else []
        args += [f"--chdir={workdir}"] if workdir else []
        args += [f"--output={output}"] if output else []
        args += [f"--nodes={count}"] if count else []
        args += [f"--nodelist={','.join(nodes)}"] if nodes else []
        args += [f"--exclude={','.join(exclude)}"] if exclude else []
        args += self.sbatch_args
        proc = self.run(*args, stdin=script, change=True)
        new_id = int(proc.stdout.strip().split(";")[0])
        return self._finish_submission(self._job_by_id(new_id), key)

    def _finish_submission(self, new: dict, key: str) -> dict:
        cancelled = []
        for old in self._jobs_named(new["job"]):
            if old["job_id"] != new["job_id"] and old["state"] in ACTIVE:
                self.run("scancel", str(old["job_id"]), change=True)
                cancelled.append(old["job_id"])
        if new["held"]:
            self.run("scontrol", "release", str(new["job_id"]), change=True)
        changed = bool(self.commands)
        return self._result(
            changed=changed,
            **({} if changed else {"already": True}),
            submitted=True,
            cancelled=cancelled,
            **self._job_brief(self._job_by_id(new["job_id"])),
        )

    # validation

    def validate_node(self, node, *, key):
        self._begin()
        n = self._node(node)
        name = f"rebound-validate-{node}"
        reservation = None
        if n["drained"] or n["down"]:
            if not n["ours"]:
                raise DriverError(
                    f"node {node} was drained by someone else ({n['reason'] or 'no reason'}); "
                    "rebound validates only nodes it isolated",
                    output={"node": node, "passed": False, **self._brief(n)},
                )
            reservation = name
        elif self._has_reservation(name):
            reservation = name  # a lost worker's burn-in: finish it, then drain again
        reason = n["reason"] if n["ours"] else f"{mark(key)} cordon"
        try:
            if reservation:
                self._reserve(node, reservation)
                if n["drained"] or n["down"]:
                    self.run("scontrol", "update", f"nodename={node}", "state=resume", change=True)
            j = self._validation_job(node, name, key, reservation)
            j = self._wait_done(j)
        finally:
            if reservation:
                self.run(
                    "scontrol",
                    "update",
                    f"nodename={node}",
                    "state=drain",
                    f"reason={reason}",
                    change=True,
                    check=False,
                )
                self.run(
                    "scontrol", "delete", f"reservation={reservation}", change=True, check=False
                )
        result = {"node": node, "job_id": j["job_id"], **self._burnin_output(j)}
        passed = j["state"] == "COMPLETED" and j["exit_code"] == 0
        if passed and result.get("passed") is False:
            passed = False
        result["passed"] = passed
        if not passed:
            why = (
                "; ".join(result.get("problems") or [])
                or result.get("error")
                or f"job {j['job_id']} ended {j['state']} with exit code {j['exit_code']}"
            )
            raise DriverError(
                f"validate_node: {node} failed the burn-in: {why}",
                output={**result, "commands": list(self.commands)},
            )
        return self._result(**result)

    def _has_reservation(self, name: str) -> bool:
        proc = self.run("scontrol", "show", f"reservation={name}", check=False)
        return proc.returncode == 0 and f"ReservationName={name}" in proc.stdout

    def _reserve(self, node: str, name: str) -> None:
        if self._has_reservation(name):
            return
        user = pwd.getpwuid(os.geteuid()).pw_name
        minutes = max(5, int(self.validate_timeout // 60) + 5)
        self.run(
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            f"nodes={node}",
            "starttime=now",
            f"duration={minutes}",
            f"users={user}",
            "flags=maint,ignore_jobs",
            change=True,
        )

    def _validation_command(self) -> str:
        if self.validate_command:
            return self.validate_command
        return (
            f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m "
            f"recovery.drivers.burnin --seconds {self.burnin_seconds:g} "
            f"--size {self.burnin_size} --min-gflops {self.min_gflops:g}"
        )

    def _validation_job(self, node: str, name: str, key: str, reservation: str | None) -> dict:
        """Our burn-in job on the node: the one this action started, else a new one."""
        for j in reversed(self._jobs_named(name)):
            if self._stamp(j, key) == "validate_node":
                return j
        out_dir = Path(self.output).parent if self.output else Path(tempfile.gettempdir())
        args = [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--comment={mark(key)} validate_node",
            f"--nodelist={node}",
            "--nodes=1",
            "--no-requeue",
            f"--output={out_dir / (name + '-%j.out')}",
        ]
        args += [f"--reservation={reservation}"] if reservation else []
        args += [f"--partition={self.partition}"] if self.partition else []
        args += [f"--wrap={self._validation_command()}"]
        proc = self.run(*args, change=True)
        return self._job_by_id(int(proc.stdout.strip().split(";")[0]))

    def _wait_done(self, j: dict) -> dict:
        deadline = time.monotonic() + self.validate_timeout
        while j["state"] in ACTIVE:
            if time.monotonic() > deadline:
                self.run("scancel", str(j["job_id"]), change=True, check=False)
                raise DriverError(
                    f"validate_node: the burn-in job {j['job_id']} did not finish in "
                    f"{self.validate_timeout:g} s ({j['state']}, {j['reason']}); cancelled",
                    output={"job_id": j["job_id"], "passed": False, "state": j["state"]},
                )
            time.sleep(self.poll_interval)
            j = self._job_by_id(j["job_id"])
        return j

    @staticmethod
    def _burnin_output(j: dict) -> dict:
        """The burn-in's JSON line, when its output file is readable from here."""
        path = j.get("stdout")
        if not path:
            return {}
        path = path.replace("%j", str(j["job_id"])).replace("%x", j["job"])
        try:
            lines = Path(path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return {}
        for line in reversed(lines):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
        return {"output": "\n".join(lines[-5:])} if lines else {}

    # status

    def node_status(self, node):
        n = self._node(node)
        jobs = [
            j for j in self.jobs() if node in j["nodes"] and j["state"] in RUNNING | {"COMPLETING"}
        ]
        return {
            **n,
            "jobs": [j["job"] for j in jobs],
            "job_ids": [j["job_id"] for j in jobs],
        }

    def job_status(self, job):
        j = self._job(job)
        if j is None:
            return {"job": job, "state": "unknown"}
        return {**j, "state": j["state"].lower(), "slurm_state": j["state"]}

    # helpers

    @staticmethod
    def _brief(n: dict) -> dict:
        return {k: n[k] for k in ("state", "flags", "drained", "reason", "ours")}

    @staticmethod
    def _job_brief(j: dict) -> dict:
        keys = ("job", "job_id", "state", "reason", "nodes", "node_count", "restarts", "excluded")
        return {k: j[k] for k in keys}
