"""Nodes, for the kubernetes driver: cordon and uncordon (only our own cordon,
marked with the action's key), drain (cordon, then evict the node's pods in
rounds with backoff, then wait for them to be gone) and a node's status."""

from __future__ import annotations

from recovery.drivers import DriverError, DriverTransientError
from recovery.drivers.kubernetes.client import KubeClient
from recovery.drivers.kubernetes.marks import (
    CORDONED_AT,
    CORDONED_BY,
    CORDONED_LABEL,
    VALIDATED_LABEL,
    ours,
)
from recovery.drivers.kubernetes.pods import evict, pod_id, pods_on, skip_reason


def cordon_state(obj) -> dict:
    ann = obj.metadata.annotations or {}
    return {
        "unschedulable": bool(obj.spec and obj.spec.unschedulable),
        "cordoned_by": ann.get(CORDONED_BY),
    }


def cordon(kube: KubeClient, node: str, *, key: str) -> dict:
    obj = kube.read_node(node)
    state = cordon_state(obj)
    if state["unschedulable"]:
        out = {"node": node, "changed": False, **state}
        if not ours(state["cordoned_by"]):
            out["note"] = "already cordoned by someone else; left as it is, not marked ours"
        return out
    # The resourceVersion read: a concurrent change makes the API answer 409
    # (transient: the retry reads again) instead of us overwriting it.
    kube.patch_node(
        node,
        {
            "metadata": {
                "resourceVersion": obj.metadata.resource_version,
                "labels": {CORDONED_LABEL: "true"},
                "annotations": {CORDONED_BY: key, CORDONED_AT: kube.stamp()},
            },
            "spec": {"unschedulable": True},
        },
    )
    return {"node": node, "changed": True, "unschedulable": True, "cordoned_by": key}


def uncordon(kube: KubeClient, node: str, *, key: str) -> dict:
    obj = kube.read_node(node)
    state = cordon_state(obj)
    labels = obj.metadata.labels or {}
    is_ours = ours(state["cordoned_by"])
    if state["unschedulable"] and not is_ours:
        by = state["cordoned_by"] or "someone else (no rebound.dev/cordoned-by annotation)"
        raise DriverError(
            f"node {node} was cordoned by {by}, not by rebound; not ours to uncordon",
            output={"node": node, "changed": False, **state},
        )
    if not state["unschedulable"] and not is_ours and CORDONED_LABEL not in labels:
        return {"node": node, "changed": False, **state}
    kube.patch_node(
        node,
        {
            "metadata": {
                "resourceVersion": obj.metadata.resource_version,
                "labels": {CORDONED_LABEL: None},
                "annotations": {CORDONED_BY: None, CORDONED_AT: None},
            },
            "spec": {"unschedulable": False},
        },
    )
    return {
        "node": node,
        "changed": True,
        "unschedulable": False,
        "cordoned_by": None,
        "was_cordoned_by": state["cordoned_by"],
    }


def drain(kube: KubeClient, node: str, *, key: str) -> dict:
    cordoned = cordon(kube, node, key=key)
    skipped: dict[str, list[str]] = {
        "daemonset": [],
        "mirror": [],
        "finished": [],
        "terminating": [],
    }
    todo = []
    # Watched until gone: the pods we evict, and those an earlier run evicted
    # that are still terminating.
    watched = set()
    for pod in pods_on(kube, node):
        why = skip_reason(pod)
        if why:
            skipped[why].append(pod_id(pod))
        else:
            todo.append(pod)
        if why in (None, "terminating"):
            watched.add(pod.metadata.uid)
    evicted, rounds = _evict_all(kube, node, todo, cordon=cordoned, skipped=skipped)
    waited = _wait_gone(kube, node, watched)
    return {
        "node": node,
        "changed": bool(cordoned["changed"] or evicted),
        "cordon": cordoned,
        "evicted": evicted,
        "skipped": skipped,
        "retries": rounds,
        "waited_s": waited,
    }


def _evict_all(kube: KubeClient, node: str, todo: list, *, cordon: dict, skipped: dict):
    """Evict every pod in `todo`; those a disruption budget refuses are tried
    again in rounds with exponential backoff (at least any Retry-After). The
    pods evicted (or already gone) and the number of extra rounds."""
    opts = kube.options
    evicted: list[str] = []
    rounds = 0
    delay = opts.eviction_backoff_s
    while todo:
        refusals = {}
        blocked = []
        for pod in todo:
            try:
                outcome, refusal = evict(kube, pod)
            except DriverError as exc:
                exc.output = {
                    **exc.output,
                    "node": node,
                    "cordon": cordon,
                    "evicted": evicted,
                    "pending": [pod_id(p) for p in todo if p is not pod],
                }
                raise
            if outcome != "refused":  # evicted, or already gone
                evicted.append(pod_id(pod))
            else:
                blocked.append(pod)
                refusals[pod_id(pod)] = refusal
        todo = blocked
        if not todo:
            break
        if rounds >= opts.eviction_retries:
            names = ", ".join(refusals)
            why = "; ".join(
                sorted({c for r in refusals.values() for c in (r["causes"] or [r["message"]])})
            )
            raise DriverTransientError(
                f"drain {node}: a disruption budget refused the eviction of {names} "
                f"after {rounds + 1} tries ({why})",
                output={
                    "node": node,
                    "cordon": cordon,
                    "evicted": evicted,
                    "blocked": refusals,
                    "skipped": skipped,
                },
            )
        rounds += 1
        wait = max(delay, *(r["retry_after"] for r in refusals.values()))
        kube.sleep(min(wait, opts.eviction_backoff_max_s))
        delay = min(delay * 2, opts.eviction_backoff_max_s)
    return evicted, rounds


def _wait_gone(kube: KubeClient, node: str, watched: set) -> float:
    """Wait, at most drain_wait_s, until none of the watched pods (uids) is on
    the node any more; the seconds waited."""
    opts = kube.options
    if not watched or opts.drain_wait_s <= 0:
        return 0.0
    start = kube.now()
    deadline = start + opts.drain_wait_s
    while True:
        left = [pod_id(p) for p in pods_on(kube, node) if p.metadata.uid in watched]
        if not left:
            return round(kube.now() - start, 3)
        if kube.now() >= deadline:
            raise DriverTransientError(
                f"drain {node}: evicted pods still terminating after "
                f"{opts.drain_wait_s:g}s: {', '.join(left)}",
                output={"node": node, "terminating": left},
            )
        kube.sleep(opts.poll_interval_s)


def node_status(kube: KubeClient, node: str) -> dict:
    try:
        obj = kube.read_node(node)
    except DriverError as exc:
        if getattr(exc, "status", None) == 404:
            return {"node": node, "exists": False, "state": "unknown"}
        raise
    meta, status = obj.metadata, obj.status
    conditions = {c.type: c.status for c in (status.conditions or [])} if status else {}
    pods = pods_on(kube, node)
    return {
        "node": node,
        "exists": True,
        "ready": conditions.get("Ready") == "True",
        "conditions": conditions,
        "taints": [
            f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in (obj.spec.taints or [])
        ]
        if obj.spec
        else [],
        **cordon_state(obj),
        "validated": (meta.labels or {}).get(VALIDATED_LABEL),
        "gpus": ((status.allocatable or {}).get("nvidia.com/gpu") if status else None),
        "pods": [pod_id(p) for p in pods if skip_reason(p) is None],
    }
