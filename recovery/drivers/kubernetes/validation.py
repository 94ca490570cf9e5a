"""Node validation, for the kubernetes driver: a burn-in pod pinned to the node
(bypassing the scheduler, so a cordoned node runs it), waited for, its JSON
answer read from its log; a pass labels the node validated and deletes the
pod, a failure keeps the pod for inspection. The pod's name comes from the
node and the action key, so a retry finds the same pod and waits on."""

from __future__ import annotations

import hashlib
import re

from recovery.drivers import DriverError, DriverTransientError, burnin
from recovery.drivers.kubernetes.client import KubeClient, k8s
from recovery.drivers.kubernetes.marks import (
    ACTION_ANNOTATION,
    BURNIN_LABEL,
    OURS,
    VALIDATED_BY,
    VALIDATED_LABEL,
)
from recovery.drivers.kubernetes.pods import FINISHED_PHASES, delete_pod


def validate_node(kube: KubeClient, node: str, *, key: str) -> dict:
    done = _already_validated(kube, node, key)
    if done is not None:
        return done
    if not kube.options.burnin_image:
        raise DriverError(
            "validate_node: no burnin_image configured for the kubernetes driver",
            output={"node": node, "passed": False, "error": "no burnin_image"},
        )
    name = burnin_pod_name(node, key)
    _start_burnin(kube, node, key, name)
    pod = _wait_finished(kube, node, name)
    log = _read_log(kube, name)
    out = _outcome(kube, node, name, pod, log)
    if out["phase"] != "Succeeded":
        _fail(node, pod, out, log)
    stamp = _mark_validated(kube, node, key)
    delete_pod(kube, pod)
    return {**out, "passed": True, "changed": True, "validated": stamp}


def burnin_pod_name(node: str, key: str) -> str:
    """A valid pod name (at most 63 characters) made from the node and the key."""
    suffix = re.sub(r"[^a-z0-9-]+", "-", key.removeprefix(OURS).lower()).strip("-")
    name = re.sub(r"[^a-z0-9-]+", "-", f"rebound-burnin-{node.lower()}-{suffix}").strip("-")
    if len(name) > 63:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}"
    return name


def burnin_pod(kube: KubeClient, node: str, key: str, name: str):
    opts = kube.options
    command = list(opts.burnin_command or ()) or burnin.command(
        seconds=opts.burnin_seconds, size=opts.burnin_size, min_gflops=opts.burnin_min_gflops
    )
    limits = {"nvidia.com/gpu": str(opts.burnin_gpus)} if opts.burnin_gpus else None
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=opts.burnin_namespace,
            labels={BURNIN_LABEL: "true"},
            annotations={ACTION_ANNOTATION: key},
        ),
        spec=k8s.V1PodSpec(
            node_name=node,
            restart_policy="Never",
            active_deadline_seconds=int(opts.burnin_timeout_s),
            tolerations=[k8s.V1Toleration(operator="Exists")],
            containers=[
                k8s.V1Container(
                    name="burnin",
                    image=opts.burnin_image,
                    command=command,
                    resources=k8s.V1ResourceRequirements(limits=limits) if limits else None,
                )
            ],
        ),
    )


def _already_validated(kube: KubeClient, node: str, key: str) -> dict | None:
    """The result when this action has validated the node already (None: it has not)."""
    obj = kube.read_node(node)
    if (obj.metadata.annotations or {}).get(VALIDATED_BY) != key:
        return None
    return {
        "node": node,
        "passed": True,
        "changed": False,
        "already": True,
        "validated": (obj.metadata.labels or {}).get(VALIDATED_LABEL),
    }


def _start_burnin(kube: KubeClient, node: str, key: str, name: str) -> None:
    ns = kube.options.burnin_namespace
    try:
        kube.call(
            f"create burn-in pod {ns}/{name}",
            kube.core.create_namespaced_pod,
            ns,
            burnin_pod(kube, node, key, name),
        )
    except DriverError as exc:
        if getattr(exc, "status", None) != 409:  # 409: ours from an earlier run
            raise


def _wait_finished(kube: KubeClient, node: str, name: str):
    """The burn-in pod once Succeeded or Failed; still running at the deadline is
    a DriverTransientError (the retry waits on the same pod)."""
    opts = kube.options
    ns = opts.burnin_namespace
    deadline = kube.now() + opts.burnin_timeout_s
    while True:
        pod = kube.call(f"read burn-in pod {ns}/{name}", kube.core.read_namespaced_pod, name, ns)
        phase = pod.status.phase if pod.status else None
        if phase in FINISHED_PHASES:
            return pod
        if kube.now() >= deadline:
            raise DriverTransientError(
                f"validate_node: burn-in pod {ns}/{name} still {phase or 'unknown'} after "
                f"{opts.burnin_timeout_s:g}s",
                output={"node": node, "pod": f"{ns}/{name}", "phase": phase},
            )
        kube.sleep(opts.poll_interval_s)


def _read_log(kube: KubeClient, name: str) -> str:
    """The tail of the burn-in container's log."""
    ns = kube.options.burnin_namespace
    # The raw bytes: the older clients turn a JSON log line into a Python repr.
    raw = kube.call(
        f"read burn-in log {ns}/{name}",
        kube.core.read_namespaced_pod_log,
        name,
        ns,
        container="burnin",
        tail_lines=50,
        _preload_content=False,
    )
    data = getattr(raw, "data", raw)
    return data if isinstance(data, str) else (data or b"").decode("utf-8", "replace")


def _terminated(pod):
    """The burn-in container's terminated state (None: it has none)."""
    terminated = None
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.state and cs.state.terminated:
            terminated = cs.state.terminated
    return terminated


def _outcome(kube: KubeClient, node: str, name: str, pod, log: str) -> dict:
    """The pod's phase and exit code, with the burn-in's own answer from its log."""
    terminated = _terminated(pod)
    return {
        "node": node,
        "pod": f"{kube.options.burnin_namespace}/{name}",
        "phase": pod.status.phase if pod.status else None,
        "exit_code": terminated.exit_code if terminated else None,
        **(burnin.result_from(log) or {}),
    }


def _fail(node: str, pod, out: dict, log: str):
    """A burn-in that did not succeed: DriverError with its own words, else the
    container's message, else the log's tail. The pod is kept for inspection."""
    terminated = _terminated(pod)
    problems = "; ".join(out.get("problems") or []) or out.get("error")
    why = problems or (terminated.message if terminated else None) or log[-500:]
    raise DriverError(
        f"validate_node: {node} failed the burn-in (pod {out['pod']}, "
        f"exit code {out['exit_code']}): {why}",
        output={**out, "passed": False, "log_tail": log[-2000:]},
    )


def _mark_validated(kube: KubeClient, node: str, key: str) -> str:
    """Label the node validated (unix seconds) by this action; the stamp."""
    stamp = str(int(kube.now()))
    kube.patch_node(
        node, {"metadata": {"labels": {VALIDATED_LABEL: stamp}, "annotations": {VALIDATED_BY: key}}}
    )
    return stamp
