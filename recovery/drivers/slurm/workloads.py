"""The job, for the slurm driver: restart, replace a node, scale down, and ask it
to checkpoint (SIGUSR1). A
queued or running job is requeued (held while its node list or count is
changed, then released); a rollback, or a job slurmctld no longer has, is
submitted again with sbatch. Every relaunch stamps the job's Comment with the
action key, the restart count before it and its changes, so a repeat changes
nothing and a relaunch a lost worker left held is finished."""

from __future__ import annotations

from pathlib import Path

from recovery.drivers import DriverError
from recovery.drivers.slurm.client import Commands, SlurmClient
from recovery.drivers.slurm.parse import ACTIVE, RUNNING, exactly, job_brief, mark, stamp


def restart_job(rec: Commands, job: str, from_step, nodes, *, key: str) -> dict:
    j = rec.client.job(job)
    if j is not None and stamp(j, key) == "restart_job submitted":
        return finish_submission(rec, j, key)
    if (done := relaunched(rec, j, key, "restart_job")) is not None:
        return done
    if j is not None and from_step is None and j["state"] in ACTIVE:
        updates = {}
        if nodes and set(nodes) != set(j["nodes"] or j["required"]):
            updates = {"nodelist": ",".join(nodes), "numnodes": exactly(len(nodes))}
        return relaunch(rec, j, key, "restart_job", updates)
    return submit(rec, job, key, "restart_job", previous=j, step=from_step, nodes=nodes)


def replace_node(rec: Commands, job: str, node: str, spare: str | None, *, key: str) -> dict:
    j = _known_job(rec, job)
    if stamp(j, key) == "replace_node submitted":
        return finish_submission(rec, j, key)
    if (done := relaunched(rec, j, key, "replace_node")) is not None:
        return done
    placed = j["nodes"] or j["required"]
    if node not in placed:
        if node in j["excluded"] and (not spare or not placed or spare in placed):
            return rec.result(changed=False, already=True, **job_brief(j))
        raise DriverError(f"job {job} does not run on {node}", output=job_brief(j))
    keep = [n for n in placed if n != node]
    new_nodes = keep + ([spare] if spare and spare not in keep else [])
    # Excluded rather than drained: isolating the node is a cordon action of its own.
    excluded = sorted(set(j["excluded"]) | {node})
    if j["state"] not in ACTIVE:
        return submit(
            rec,
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
        updates.update(nodelist=",".join(new_nodes), numnodes=exactly(len(new_nodes)))
    elif j["required"]:
        updates["nodelist"] = ",".join(keep)
    return relaunch(rec, j, key, "replace_node", updates)


def scale_down(rec: Commands, job: str, nodes, *, key: str) -> dict:
    j = _known_job(rec, job)
    if stamp(j, key) == "scale_down submitted":
        return finish_submission(rec, j, key)
    if (done := relaunched(rec, j, key, "scale_down")) is not None:
        return done
    placed = j["nodes"] or j["required"]
    drop = [n for n in nodes if n in placed]
    if not drop:
        if all(n in j["excluded"] for n in nodes):
            return rec.result(changed=False, already=True, **job_brief(j))
        raise DriverError(f"job {job} does not run on {', '.join(nodes)}")
    count = (j["node_count"] or len(placed)) - len(drop)
    if count < 1:
        raise DriverError(f"job {job} would be left with no node", output=job_brief(j))
    excluded = sorted(set(j["excluded"]) | set(drop))
    if j["state"] not in ACTIVE:
        return submit(
            rec,
            job,
            key,
            "scale_down",
            previous=j,
            count=count,
            exclude=excluded,
            nodes=[n for n in j["required"] if n not in drop] or None,
        )
    updates = {"excnodelist": ",".join(excluded), "numnodes": exactly(count)}
    if j["required"]:
        updates["nodelist"] = ",".join(n for n in j["required"] if n not in drop)
    return relaunch(rec, j, key, "scale_down", updates)


def checkpoint_job(rec: Commands, job: str, *, key: str) -> dict:
    """Ask a running job to save a checkpoint: the option `checkpoint_signal` (USR1)
    to its steps (the processes srun started; not the batch shell, which would die
    of it), which agent.init's handler turns into agent.checkpoint_requested(). Off
    unless that option is set: every process of the job's steps must survive the
    signal (srun python train.py with agent.init does; torchrun does not).
    Signalled first and stamped in the Comment after, so a worker lost in between
    signals again (one extra save) rather than never; a stamped job is not signalled
    twice."""
    sig = rec.client.options.checkpoint_signal
    if not sig:
        raise DriverError(
            f"checkpoint_job of job {job}: off on this Slurm cluster: set the driver option"
            ' checkpoint_signal ("USR1") once its jobs\' step processes survive that'
            " signal (srun python train.py with agent.init; not srun torchrun, which dies"
            " of it): docs/checkpoint-now.md"
        )
    if not sig.isalnum():
        raise DriverError(f"driver option checkpoint_signal {sig!r} is not a signal name")
    j = _known_job(rec, job)
    jid = str(j["job_id"])
    if stamp(j, key) == "checkpoint_job signalled":
        return rec.result(changed=False, already=True, **job_brief(j))
    if j["state"] not in RUNNING:
        raise DriverError(
            f"job {j['job']} ({jid}) is {j['state']}: only a running job can save a checkpoint",
            output=job_brief(j),
        )
    rec.change("scancel", f"--signal={sig}", jid)
    comment = f"comment={mark(key)} checkpoint_job signalled"
    rec.change("scontrol", "update", f"jobid={jid}", comment)
    return rec.result(changed=True, signal=sig, **job_brief(j))


def job_status(client: SlurmClient, job: str) -> dict:
    j = client.job(job)
    if j is None:
        return {"job": job, "state": "unknown"}
    return {**j, "state": j["state"].lower(), "slurm_state": j["state"]}


def _known_job(rec: Commands, job: str) -> dict:
    j = rec.client.job(job)
    if j is None:
        raise DriverError(f"job {job} is not known to the Slurm cluster")
    return j


# requeue


def relaunched(rec: Commands, j: dict | None, key: str, op: str) -> dict | None:
    """The result when this action has requeued the job already (None: it has not).
    A hold left by a lost worker is finished with the changes the stamp recorded."""
    if j is None or j["state"] not in ACTIVE:
        return None
    words = (stamp(j, key) or "").split()
    if len(words) < 2 or words[0] != op or not words[1].startswith("restarts:"):
        return None
    j = rec.client.settled(j)
    if j["restarts"] <= int(words[1].split(":", 1)[1]):
        return None  # stamped, but the requeue itself did not happen
    if not j["held"]:
        return rec.result(changed=False, already=True, **job_brief(j))
    jid = str(j["job_id"])
    _apply(rec, jid, dict(w.split(":", 1) for w in words[2:] if ":" in w))
    rec.change("scontrol", "release", jid)
    return rec.result(changed=True, **job_brief(rec.client.job_by_id(jid)))


def relaunch(rec: Commands, j: dict, key: str, op: str, updates: dict[str, str]) -> dict:
    """Requeue the job (held while `updates` are applied), stamped with `key`,
    the restart count before and the updates (to finish them after a lost worker)."""
    client = rec.client
    jid = str(j["job_id"])
    j = client.settled(j)
    if j["state"] not in RUNNING and j["state"] != "PENDING":
        raise DriverError(f"job {j['job']} ({jid}) is {j['state']}: it cannot be requeued")
    if j["state"] != "PENDING" and not j["requeue"]:
        raise DriverError(
            f"job {j['job']} ({jid}) does not allow requeueing (submitted with --no-requeue)",
            output=job_brief(j),
        )
    stored = "".join(f" {k}:{v}" for k, v in updates.items())
    comment = f"comment={mark(key)} {op} restarts:{j['restarts']}{stored}"
    rec.change("scontrol", "update", f"jobid={jid}", comment)
    if j["state"] == "PENDING":
        # Not started (or already requeued): nothing to stop, only to change.
        if updates:
            rec.change("scontrol", "hold", jid)
            _apply(rec, jid, updates)
            rec.change("scontrol", "release", jid)
        return rec.result(changed=bool(updates), pending=True, **job_brief(client.job_by_id(jid)))
    if not updates:
        rec.change("scontrol", "requeue", jid)
        return rec.result(changed=True, **job_brief(client.job_by_id(jid)))
    rec.change("scontrol", "requeuehold", jid)
    # Changes made while the job is still completing are undone when it
    # becomes pending (its node count is reset from the request): wait.
    client.settled(client.job_by_id(jid))
    _apply(rec, jid, updates)
    rec.change("scontrol", "release", jid)
    return rec.result(changed=True, **job_brief(client.job_by_id(jid)))


def _apply(rec: Commands, jid: str, updates: dict[str, str]) -> None:
    if updates:
        rec.change("scontrol", "update", f"jobid={jid}", *[f"{k}={v}" for k, v in updates.items()])


# submission


def script_text(client: SlurmClient, job: str, previous: dict | None) -> str:
    """The batch script for a new submission: the `script` option, else the old job's."""
    script = client.options.script
    if script:
        text = str(script)
        if text.startswith("#!"):
            return text
        path = Path(text.replace("{job}", job))
        try:
            return path.read_text()
        except OSError as exc:
            raise DriverError(f"cannot read the batch script {path}: {exc}") from exc
    if previous is not None:
        proc = client.run(
            "scontrol", "write", "batch_script", str(previous["job_id"]), "-", check=False
        )
        if proc.returncode == 0 and proc.stdout.startswith("#!"):
            return proc.stdout
    raise DriverError(
        f"no batch script to launch job {job}: slurmctld no longer has it; "
        "set the driver option `script`"
    )


def submit(
    rec: Commands,
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
    opts = rec.client.options
    script = script_text(rec.client, job, previous)
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
    partition = opts.partition or (previous or {}).get("partition")
    workdir = opts.workdir or (previous or {}).get("workdir")
    output = opts.output or (previous or {}).get("stdout")
    count = count or (len(nodes) if nodes else None) or (previous or {}).get("node_count")
    args += [f"--partition={partition}"] if partition else []
    args += [f"--chdir={workdir}"] if workdir else []
    args += [f"--output={output}"] if output else []
    args += [f"--nodes={count}"] if count else []
    args += [f"--nodelist={','.join(nodes)}"] if nodes else []
    args += [f"--exclude={','.join(exclude)}"] if exclude else []
    args += list(opts.sbatch_args)
    proc = rec.change(*args, stdin=script)
    new_id = int(proc.stdout.strip().split(";")[0])
    return finish_submission(rec, rec.client.job_by_id(new_id), key)


def finish_submission(rec: Commands, new: dict, key: str) -> dict:
    """Cancel the job's other active runs and release the new one (both only
    if still needed: a repeat after a lost worker finishes what is missing)."""
    cancelled = []
    for old in rec.client.jobs_named(new["job"]):
        if old["job_id"] != new["job_id"] and old["state"] in ACTIVE:
            rec.change("scancel", str(old["job_id"]))
            cancelled.append(old["job_id"])
    if new["held"]:
        rec.change("scontrol", "release", str(new["job_id"]))
    changed = bool(rec.commands)
    return rec.result(
        changed=changed,
        **({} if changed else {"already": True}),
        submitted=True,
        cancelled=cancelled,
        **job_brief(rec.client.job_by_id(new["job_id"])),
    )
