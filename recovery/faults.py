"""Fault injection: do to a lab cluster what a fault would, to see Rebound find it and
recover. Only a driver that can (the `local` one) injects; each injection is
logged to `rebound.audit` with who asked."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from jobs.models import Cluster, TrainingJob
from recovery.drivers import DriverError, DriverTransientError, get_driver
from recovery.errors import FaultInvalid, FaultRefused

audit = logging.getLogger("rebound.audit")


@dataclass(frozen=True)
class Fault:
    needs: tuple[str, ...]  # the parameters it cannot do without
    what: str


FAULTS: dict[str, Fault] = {
    "crash": Fault(("job", "rank"), "kill the rank's process (SIGKILL)"),
    "hang": Fault(("job", "rank"), "stop the rank's process (SIGSTOP): its peers wait"),
    "resume": Fault(("job", "rank"), "continue a stopped rank (SIGCONT)"),
    "slow": Fault(("job", "rank", "factor"), "the rank computes `factor` times slower"),
    "nan": Fault(("job", "from_step"), "the loss is NaN from `from_step`"),
    "spike": Fault(("job", "from_step"), "the loss is `factor` (10) times itself from the step"),
    "clear": Fault(("job",), "take the job's slow and loss faults off"),
    "xid": Fault(("node", "xid"), "report a GPU Xid on the node; `kill` its ranks too"),
    "silence": Fault(("node",), "the node's heartbeats stop"),
    "unsilence": Fault(("node",), "the node's heartbeats start again"),
}


def fault_inject(
    *,
    cluster: Cluster,
    kind: str,
    actor: str,
    job: str | None = None,
    rank: int | None = None,
    node: str | None = None,
    factor: float | None = None,
    xid: int | None = None,
    from_step: int | None = None,
    kill: bool = False,
) -> dict:
    """Inject `kind` (one of FAULTS) on the cluster; returns what the driver did.
    Raises FaultInvalid for a request asked wrongly, FaultRefused for one the cluster
    cannot take."""
    fault = FAULTS.get(kind)
    if fault is None:
        raise FaultInvalid(f"unknown fault {kind!r}; one of {', '.join(FAULTS)}", field="kind")
    given = {"job": job, "rank": rank, "node": node, "factor": factor, "xid": xid}
    given["from_step"] = from_step
    for name in fault.needs:
        if given[name] is None:
            raise FaultInvalid(f"a {kind} fault needs `{name}`", field=name)
    if job is not None and not TrainingJob.objects.filter(key=job, cluster=cluster).exists():
        raise FaultInvalid(f"no job {job} on cluster {cluster.name}", field="job")
    if kind == "slow" and factor < 1:
        raise FaultInvalid("a slow factor is at least 1 (1 is back to normal)", field="factor")
    driver = get_driver(cluster)
    if not hasattr(driver, "inject_fault"):
        raise FaultRefused(f"the {driver.name} driver of {cluster.name} cannot inject faults")
    params = {}
    if kind in ("nan", "spike"):
        params["from_step"] = from_step
    if kind in ("slow", "spike"):
        params["factor"] = float(factor if factor is not None else 10.0)
    if kind == "xid":
        params.update(xid=int(xid), kill=bool(kill))
    try:
        result = driver.inject_fault(kind, job=job, rank=rank, node=node, **params)
    except (DriverError, DriverTransientError) as exc:
        raise FaultRefused(str(exc)) from exc
    audit.info(
        "fault %s injected on cluster %s by %s (job %s, rank %s, node %s, %s)",
        kind,
        cluster.name,
        actor,
        job,
        rank,
        node,
        params,
    )
    return {"kind": kind, "job": job, "rank": rank, "node": node, **params, "done": result}
