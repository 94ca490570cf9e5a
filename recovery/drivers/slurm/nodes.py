"""Nodes, for the slurm driver: cordon (DRAIN with our reason), uncordon (RESUME,
only a drain whose reason is ours), drain (the cordon, then the node's jobs
requeued or, if they refuse requeueing, cancelled) and a node's status."""

from __future__ import annotations

from recovery.drivers import DriverError
from recovery.drivers.slurm.client import Commands, SlurmClient
from recovery.drivers.slurm.parse import PREFIX, RUNNING, mark, node_brief


def cordon(rec: Commands, node: str, *, key: str, op: str = "cordon") -> dict:
    n = rec.client.node(node)
    if n["drained"] or (n["down"] and n["reason"] and not n["ours"]):
        # Isolated already; by someone else its reason stays theirs.
        return rec.result(node=node, changed=False, already=True, **node_brief(n))
    reason = f"{mark(key)} {op}"
    rec.change("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    return rec.result(node=node, changed=True, **node_brief(rec.client.node(node)))


def uncordon(rec: Commands, node: str, *, key: str) -> dict:
    n = rec.client.node(node)
    if not n["drained"] and not n["down"]:
        return rec.result(node=node, changed=False, already=True, **node_brief(n))
    if not n["ours"]:
        raise DriverError(
            f"node {node} was drained by someone else ({n['reason'] or 'no reason'}"
            f"{', by ' + n['reason_by'] if n['reason_by'] else ''}); rebound resumes only "
            f"drains whose reason starts with {PREFIX!r}",
            output={"node": node, "ours": False, **node_brief(n)},
        )
    rec.change("scontrol", "update", f"nodename={node}", "state=resume")
    return rec.result(node=node, changed=True, **node_brief(rec.client.node(node)))


def drain(rec: Commands, node: str, *, key: str) -> dict:
    out = cordon(rec, node, key=key, op="drain")
    requeued, cancelled = [], []
    for j in rec.client.jobs():
        if j["state"] not in RUNNING or node not in j["nodes"]:
            continue
        if j["requeue"]:
            proc = rec.change("scontrol", "requeue", str(j["job_id"]), check=False)
            if proc.returncode == 0:
                requeued.append(j["job"] or str(j["job_id"]))
                continue
        rec.change("scancel", str(j["job_id"]))
        cancelled.append(j["job"] or str(j["job_id"]))
    changed = out["changed"] or bool(requeued or cancelled)
    fields = {k: v for k, v in out.items() if k != "commands"}
    fields.update(changed=changed, requeued=requeued, cancelled=cancelled)
    return rec.result(**fields)


def node_status(client: SlurmClient, node: str) -> dict:
    n = client.node(node)
    jobs = [
        j for j in client.jobs() if node in j["nodes"] and j["state"] in RUNNING | {"COMPLETING"}
    ]
    return {**n, "jobs": [j["job"] for j in jobs], "job_ids": [j["job_id"] for j in jobs]}
