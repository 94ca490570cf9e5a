"""The slurm driver's way to the cluster: `SlurmClient` runs every Slurm
command (a subprocess with a timeout and SLURM_CONF, logged on the
`rebound.recovery.slurm` logger; a timeout or an unreachable controller is a
DriverTransientError, another failure a DriverError) and reads the nodes and
jobs; `Commands` is one driver call's record of the changes it made. A call
makes every change through its own recorder, so two calls never share it."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import time

from recovery.drivers import DriverError, DriverTransientError
from recovery.drivers.slurm import parse
from recovery.drivers.slurm.options import SlurmOptions

log = logging.getLogger("rebound.recovery.slurm")

# What a controller says when it is busy or away: worth a retry.
TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Zero Bytes were transmitted"
    r"|Connection refused|connect failure|Resource temporarily unavailable"
    r"|Communication connection failure|backup controller in standby"
    r"|Slurm temporarily unable|Transaction still active|Job is completing",
    re.IGNORECASE,
)


class SlurmClient:
    def __init__(self, options: SlurmOptions):
        self.options = options
        # Whether this Slurm answers --json: the option, until a command says it cannot.
        self.use_json = options.json

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run one Slurm command. A timeout or an unreachable controller:
        DriverTransientError; another failure, with `check`: DriverError."""
        opts = self.options
        exe = os.path.join(opts.bin_dir, args[0]) if opts.bin_dir else args[0]
        cmd = [exe, *args[1:]]
        env = dict(os.environ)
        if opts.slurm_conf:
            env["SLURM_CONF"] = str(opts.slurm_conf)
        shown = shlex.join(args)
        log.info("slurm: %s", shown)
        try:
            proc = subprocess.run(
                cmd, env=env, input=stdin, capture_output=True, text=True, timeout=opts.timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverTransientError(f"{shown}: no answer in {opts.timeout:g} s") from exc
        except FileNotFoundError as exc:
            raise DriverError(f"{args[0]} not found: is the Slurm client installed?") from exc
        if proc.returncode != 0:
            message = (proc.stderr.strip() or proc.stdout.strip())[-1000:]
            log.info("slurm: %s -> exit %s: %s", shown, proc.returncode, message)
            if TRANSIENT.search(message):
                raise DriverTransientError(f"{shown}: {message}")
            if check:
                raise DriverError(f"{shown}: {message}")
        return proc

    def json(self, *args: str) -> dict | None:
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

    # nodes

    def nodes(self) -> dict[str, dict]:
        """Every node: {name: {node, state, flags, drained, reason, reason_by, ours}}."""
        data = self.json("sinfo")
        if data is not None:
            return {n["name"]: parse.node_from_json(n) for n in data.get("nodes", [])}
        out = {}
        for line in self.run("scontrol", "-o", "show", "node").stdout.splitlines():
            rec = parse.parse_scontrol_line(line)
            if "NodeName" in rec:
                out[rec["NodeName"]] = parse.node_from_scontrol(rec)
        return out

    def node(self, node: str) -> dict:
        nodes = self.nodes()
        if node not in nodes:
            raise DriverError(f"node {node} is not a node of the Slurm cluster")
        return nodes[node]

    def has_reservation(self, name: str) -> bool:
        proc = self.run("scontrol", "show", f"reservation={name}", check=False)
        return proc.returncode == 0 and f"ReservationName={name}" in proc.stdout

    # jobs

    def jobs(self) -> list[dict]:
        """Every job slurmctld remembers, oldest first."""
        data = self.json("squeue")
        if data is not None:
            out = [parse.job_from_json(j) for j in data.get("jobs", [])]
        else:
            out = []
            for line in self.run("scontrol", "-o", "show", "job").stdout.splitlines():
                rec = parse.parse_scontrol_line(line)
                if "JobId" in rec:
                    out.append(parse.job_from_scontrol(rec))
        return sorted(out, key=lambda j: j["job_id"])

    def jobs_named(self, job: str) -> list[dict]:
        return [j for j in self.jobs() if j["job"] == job]

    def job(self, job: str) -> dict | None:
        """The job of that name: the newest active one, else the newest remembered."""
        named = self.jobs_named(job)
        active = [j for j in named if j["state"] in parse.ACTIVE]
        return (active or named or [None])[-1]

    def job_by_id(self, job_id) -> dict:
        for j in self.jobs():
            if j["job_id"] == int(job_id):
                return j
        raise DriverTransientError(f"job {job_id} vanished from slurmctld")

    def settled(self, j: dict) -> dict:
        """The job once it is no longer COMPLETING (bounded by `timeout`)."""
        deadline = time.monotonic() + self.options.timeout
        while j["state"] == "COMPLETING":
            if time.monotonic() > deadline:
                raise DriverTransientError(f"job {j['job']} ({j['job_id']}) is still completing")
            time.sleep(min(self.options.poll_interval, 0.2))
            j = self.job_by_id(j["job_id"])
        return j


class Commands:
    """One driver call's changes to the cluster, in order: made through `change`,
    listed under `commands` in the call's result. Created per call."""

    def __init__(self, client: SlurmClient):
        self.client = client
        self.commands: list[str] = []

    def change(self, *args: str, check: bool = True, stdin: str | None = None):
        """Run a command that alters the cluster; listed when it succeeded."""
        proc = self.client.run(*args, check=check, stdin=stdin)
        if proc.returncode == 0:
            self.commands.append(shlex.join(args))
        return proc

    def result(self, **fields) -> dict:
        """The call's result: `fields` and the commands that changed something."""
        return {**fields, "commands": list(self.commands)}
