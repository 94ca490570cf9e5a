"""Pods, for the kubernetes driver: listing them, telling which a drain leaves
alone, and removing them the two ways the driver knows: an Eviction (honours
PodDisruptionBudgets; a 429 is a refusal, not an error) and a DELETE with a
uid precondition (a pod recreated under the same name is never hit)."""

from __future__ import annotations

from recovery.drivers import DriverError, DriverTransientError
from recovery.drivers.kubernetes.client import KubeClient, k8s

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED_PHASES = {"Succeeded", "Failed"}


def pod_id(pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def pods_on(kube: KubeClient, node: str, label_selector: str | None = None, namespace=None):
    """The pods on `node`: in every namespace, or in `namespace` matching `label_selector`."""
    selector = f"spec.nodeName={node}"
    if namespace is None:
        found = kube.call(
            f"list pods on {node}", kube.core.list_pod_for_all_namespaces, field_selector=selector
        )
    else:
        kwargs = {"field_selector": selector}
        if label_selector:
            kwargs["label_selector"] = label_selector
        found = kube.call(
            f"list pods on {node}", kube.core.list_namespaced_pod, namespace, **kwargs
        )
    return list(found.items or [])


def skip_reason(pod) -> str | None:
    """Why a drain leaves the pod alone (None: it is evicted)."""
    meta = pod.metadata
    if MIRROR_ANNOTATION in (meta.annotations or {}):
        return "mirror"  # the kubelet owns it
    if any(ref.kind == "DaemonSet" for ref in meta.owner_references or []):
        return "daemonset"  # it would come straight back
    if meta.deletion_timestamp is not None:
        return "terminating"
    if pod.status is not None and pod.status.phase in FINISHED_PHASES:
        return "finished"
    return None


def live(pods) -> list:
    """The pods neither terminating nor finished."""
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None
        and (p.status is None or p.status.phase not in FINISHED_PHASES)
    ]


def evict(kube: KubeClient, pod, *, same_uid: bool = False) -> tuple[str, dict]:
    """One Eviction POST: ("evicted", {}), ("gone", {}) when the pod (or, with
    `same_uid`, that very pod) no longer exists, or ("refused", why) on a 429."""
    meta = pod.metadata
    options = {}
    if kube.options.eviction_grace_period_s is not None:
        options["grace_period_seconds"] = int(kube.options.eviction_grace_period_s)
    if same_uid:
        options["preconditions"] = k8s.V1Preconditions(uid=meta.uid)
    body = k8s.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=k8s.V1ObjectMeta(name=meta.name, namespace=meta.namespace),
        delete_options=k8s.V1DeleteOptions(**options) if options else None,
    )
    try:
        kube.call(
            f"evict pod {pod_id(pod)}",
            kube.core.create_namespaced_pod_eviction,
            meta.name,
            meta.namespace,
            body,
        )
    except DriverError as exc:
        status = getattr(exc, "status", None)
        if status == 404 or (same_uid and status == 409):  # gone, or a new pod by that name
            return "gone", {}
        if status == 429:
            return "refused", _refusal(exc)
        raise
    return "evicted", {}


def _refusal(exc: DriverError) -> dict:
    """What a 429 said: the budget's message, its causes, and any Retry-After (s)."""
    causes = [
        c.get("message", "") for c in ((exc.api_status.get("details") or {}).get("causes") or [])
    ]
    retry_after = exc.headers.get("Retry-After") or exc.headers.get("retry-after")
    try:
        retry_after = max(0.0, float(retry_after or 0))
    except ValueError:  # an HTTP date: fall back to our own backoff
        retry_after = 0.0
    return {
        "message": exc.output.get("message", ""),
        "causes": [c for c in causes if c],
        "retry_after": retry_after,
    }


def delete_pod(kube: KubeClient, pod) -> bool:
    """DELETE one pod, only if it is still the same pod (uid precondition).
    False when it was already gone or replaced."""
    meta = pod.metadata
    body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=meta.uid))
    try:
        kube.call(
            f"delete pod {pod_id(pod)}",
            kube.core.delete_namespaced_pod,
            meta.name,
            meta.namespace,
            body=body,
        )
    except DriverError as exc:
        if getattr(exc, "status", None) in (404, 409):  # gone, or a new pod by that name
            return False
        raise
    return True


def remove_pods(kube: KubeClient, pods, what: str) -> list[str]:
    """Delete (or, with restart_with "evict", evict) each pod so that its
    controller recreates it; the ones actually removed. Evictions a disruption
    budget refuses are a DriverTransientError once the rest are done."""
    removed, refused = [], {}
    for pod in pods:
        if kube.options.restart_with == "evict":
            outcome, refusal = evict(kube, pod, same_uid=True)
            if outcome == "evicted":
                removed.append(pod_id(pod))
            elif outcome == "refused":
                refused[pod_id(pod)] = refusal
        elif delete_pod(kube, pod):
            removed.append(pod_id(pod))
    if refused:
        raise DriverTransientError(
            f"{what}: a disruption budget refused the eviction of {', '.join(refused)}",
            output={"deleted": removed, "blocked": refused},
        )
    return removed
