"""Node validation, for the slurm driver: a burn-in job pinned to the node,
waited for (bounded by `validate_timeout`), passed when it completes with exit
code 0 (and its JSON answer, when readable, does not say otherwise). A node we
drained runs it inside a maintenance reservation of its own, resumed for the
burn-in and drained again afterwards with our reason."""

from __future__ import annotations

import os
import pwd
import shlex
import sys
import tempfile
import time
from pathlib import Path

from recovery.drivers import DriverError, burnin
from recovery.drivers.slurm.client import Commands
from recovery.drivers.slurm.parse import ACTIVE, mark, node_brief, stamp


def validate_node(rec: Commands, node: str, *, key: str) -> dict:
    client = rec.client
    n = client.node(node)
    name = f"rebound-validate-{node}"
    reservation = None
    if n["drained"] or n["down"]:
        if not n["ours"]:
            raise DriverError(
                f"node {node} was drained by someone else ({n['reason'] or 'no reason'}); "
                "rebound validates only nodes it isolated",
                output={"node": node, "passed": False, **node_brief(n)},
            )
        reservation = name
    elif client.has_reservation(name):
        reservation = name  # a lost worker's burn-in: finish it, then drain again
    reason = n["reason"] if n["ours"] else f"{mark(key)} cordon"
    try:
        if reservation:
            _reserve(rec, node, reservation)
            if n["drained"] or n["down"]:
                rec.change("scontrol", "update", f"nodename={node}", "state=resume")
        j = _validation_job(rec, node, name, key, reservation)
        j = _wait_done(rec, j)
    finally:
        if reservation:
            rec.change(
                "scontrol",
                "update",
                f"nodename={node}",
                "state=drain",
                f"reason={reason}",
                check=False,
            )
            rec.change("scontrol", "delete", f"reservation={reservation}", check=False)
    result = {"node": node, "job_id": j["job_id"], **_burnin_output(j)}
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
            f"validate_node: {node} failed the burn-in: {why}", output=rec.result(**result)
        )
    return rec.result(**result)


def _reserve(rec: Commands, node: str, name: str) -> None:
    """A maintenance reservation of the node for the burn-in (no other job lands there)."""
    if rec.client.has_reservation(name):
        return
    user = pwd.getpwuid(os.geteuid()).pw_name
    minutes = max(5, int(rec.client.options.validate_timeout // 60) + 5)
    rec.change(
        "scontrol",
        "create",
        "reservation",
        f"reservationname={name}",
        f"nodes={node}",
        "starttime=now",
        f"duration={minutes}",
        f"users={user}",
        "flags=maint,ignore_jobs",
    )


def validation_command(options) -> str:
    """`validate_command`, else the torch burn-in with this console's interpreter
    and checkout (which exist only on a single-host cluster)."""
    if options.validate_command:
        return options.validate_command
    cmd = burnin.command(
        seconds=options.burnin_seconds,
        size=options.burnin_size,
        min_gflops=options.min_gflops,
        python=sys.executable,
    )
    return f"cd {shlex.quote(str(burnin.REPO))} && {shlex.join(cmd)}"


def _validation_job(rec: Commands, node: str, name: str, key: str, reservation) -> dict:
    """Our burn-in job on the node: the one this action started, else a new one."""
    opts = rec.client.options
    for j in reversed(rec.client.jobs_named(name)):
        if stamp(j, key) == "validate_node":
            return j
    out_dir = Path(opts.output).parent if opts.output else Path(tempfile.gettempdir())
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
    args += [f"--partition={opts.partition}"] if opts.partition else []
    args += [f"--wrap={validation_command(opts)}"]
    proc = rec.change(*args)
    return rec.client.job_by_id(int(proc.stdout.strip().split(";")[0]))


def _wait_done(rec: Commands, j: dict) -> dict:
    """The burn-in job once ended; one past `validate_timeout` is cancelled and fails."""
    opts = rec.client.options
    deadline = time.monotonic() + opts.validate_timeout
    while j["state"] in ACTIVE:
        if time.monotonic() > deadline:
            rec.change("scancel", str(j["job_id"]), check=False)
            raise DriverError(
                f"validate_node: the burn-in job {j['job_id']} did not finish in "
                f"{opts.validate_timeout:g} s ({j['state']}, {j['reason']}); cancelled",
                output={"job_id": j["job_id"], "passed": False, "state": j["state"]},
            )
        time.sleep(opts.poll_interval)
        j = rec.client.job_by_id(j["job_id"])
    return j


def _burnin_output(j: dict) -> dict:
    """The burn-in's JSON answer, when its output file is readable from here."""
    path = j.get("stdout")
    if not path:
        return {}
    path = path.replace("%j", str(j["job_id"])).replace("%x", j["job"])
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return {}
    answer = burnin.result_from(text)
    if answer is not None:
        return answer
    lines = text.strip().splitlines()
    return {"output": "\n".join(lines[-5:])} if lines else {}
