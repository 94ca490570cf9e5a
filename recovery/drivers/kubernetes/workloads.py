"""The job, for the kubernetes driver: its pods (labelled `<job_label>=<job>`)
and its workload object (a batch/v1 Job, a JobSet, or none). Restart (the
controller recreates the pods we remove), replace a node, scale down (a Job's
parallelism), and the job's status. A restart marks the workload object with
the action's key and the pods it removes, so a repeat never hits their
replacements; a rollback's step travels in an annotation there."""

from __future__ import annotations

from recovery.drivers import DriverError
from recovery.drivers.kubernetes import nodes
from recovery.drivers.kubernetes.client import KubeClient
from recovery.drivers.kubernetes.marks import (
    RESTART_AT,
    RESTART_BY,
    RESTART_PODS,
    SCALED_BY,
    SCALED_FROM,
    ours,
)
from recovery.drivers.kubernetes.pods import live, pod_id, pods_on, remove_pods

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


def job_selector(kube: KubeClient, job: str) -> str:
    return f"{kube.options.job_label}={job}"


def find_workload(kube: KubeClient, job: str):
    """The job's Job or JobSet (None with workload "none"): a model or a dict."""
    opts = kube.options
    sel = job_selector(kube, job)
    if opts.workload == "none":
        return None
    if opts.workload == "job":
        found = kube.call(
            f"list jobs {sel}", kube.batch.list_namespaced_job, opts.namespace, label_selector=sel
        )
        items = list(found.items or [])
    else:
        found = kube.call(
            f"list jobsets {sel}",
            kube.custom.list_namespaced_custom_object,
            *JOBSET[:2],
            opts.namespace,
            JOBSET[2],
            label_selector=sel,
        )
        items = list(found.get("items") or [])
    kind = opts.workload_kind
    if not items:
        raise DriverError(f"no {kind} labelled {sel} in namespace {opts.namespace}")
    if len(items) > 1:
        names = ", ".join(sorted(workload_name(i) for i in items))
        raise DriverError(f"more than one {kind} labelled {sel}: {names}")
    return items[0]


def workload_name(obj) -> str:
    return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name


def workload_annotations(obj) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj.get("metadata", {}).get("annotations") or {})
    return dict(obj.metadata.annotations or {})


def patch_workload(kube: KubeClient, obj, body: dict):
    opts = kube.options
    name = workload_name(obj)
    if opts.workload == "job":
        return kube.call(
            f"patch job {name}", kube.batch.patch_namespaced_job, name, opts.namespace, body
        )
    return kube.call(
        f"patch jobset {name}",
        kube.custom.patch_namespaced_custom_object,
        *JOBSET[:2],
        opts.namespace,
        JOBSET[2],
        name,
        body,
    )


def job_pods(kube: KubeClient, job: str, node: str | None = None) -> list:
    """The job's pods (on `node` only, when given)."""
    sel = job_selector(kube, job)
    if node is not None:
        return pods_on(kube, node, label_selector=sel, namespace=kube.options.namespace)
    found = kube.call(
        f"list pods {sel}",
        kube.core.list_namespaced_pod,
        kube.options.namespace,
        label_selector=sel,
    )
    return list(found.items or [])


def restart(kube: KubeClient, job: str, key: str, from_step: int | None, workload=None) -> dict:
    """Remove the job's live pods for their controller to recreate; the first run
    of an action marks the workload object with the pods it removes (and the
    resume step), so a repeat removes only those still alive."""
    opts = kube.options
    if from_step is not None and (opts.workload == "none" or not opts.resume_annotation):
        raise DriverError(
            f"restart of {job} from step {from_step}: the kubernetes driver passes the "
            "step through an annotation on the job's Job/JobSet, and "
            + (
                "workload is 'none'"
                if opts.workload == "none"
                else "resume_annotation is not configured"
            )
        )
    wl = workload if workload is not None else find_workload(kube, job)
    ann = workload_annotations(wl)
    pods = job_pods(kube, job)
    repeat = wl is not None and ann.get(RESTART_BY) == key
    if repeat:
        wanted = set(filter(None, (ann.get(RESTART_PODS) or "").split(",")))
        targets = [p for p in live(pods) if p.metadata.uid in wanted]
    else:
        targets = live(pods)
        if not targets:
            raise DriverError(
                f"job {job} has no live pods labelled {job_selector(kube, job)} in "
                f"namespace {opts.namespace}: nothing for its controller to recreate",
                output={"job": job, "pods": [pod_id(p) for p in pods]},
            )
        if wl is not None:
            annotations = {
                RESTART_BY: key,
                RESTART_PODS: ",".join(p.metadata.uid for p in targets),
                RESTART_AT: kube.stamp(),
            }
            if opts.resume_annotation:
                # None removes it: a plain restart resumes from the latest checkpoint.
                annotations[opts.resume_annotation] = (
                    str(int(from_step)) if from_step is not None else None
                )
            patch_workload(kube, wl, {"metadata": {"annotations": annotations}})
    deleted = remove_pods(kube, targets, f"restart of {job}")
    return {
        "job": job,
        "changed": bool(deleted) or not repeat,
        "already": repeat and not deleted,
        "workload": None if wl is None else f"{opts.workload_kind}/{workload_name(wl)}",
        "deleted": deleted,
        "resume_step": from_step,
    }


def restart_job(kube: KubeClient, job: str, from_step, requested_nodes, *, key: str) -> dict:
    out = restart(kube, job, key, from_step)
    out["placement"] = "the scheduler's (nodes are not pinned)"
    if requested_nodes:
        out["nodes_requested"] = list(requested_nodes)
    return out


def replace_node(kube: KubeClient, job: str, node: str, spare: str, *, key: str) -> dict:
    spare_obj = kube.read_node(spare)
    spare_state = nodes.cordon_state(spare_obj)
    spare_out = {"node": spare, "changed": False, **spare_state}
    if spare_state["unschedulable"]:
        # Checked before anything changes: only our own cordon of the spare is lifted.
        if not ours(spare_state["cordoned_by"]):
            raise DriverError(
                f"spare {spare} is cordoned by "
                f"{spare_state['cordoned_by'] or 'someone else'}, not by rebound",
                output={"spare": spare_out},
            )
        spare_out = nodes.uncordon(kube, spare, key=key)
    cordon = nodes.cordon(kube, node, key=key)
    pods = live(job_pods(kube, job, node=node))
    deleted = remove_pods(kube, pods, f"replace {node} in {job}")
    return {
        "job": job,
        "node": node,
        "spare": spare,
        "changed": bool(cordon["changed"] or deleted or spare_out["changed"]),
        "cordon": cordon,
        "spare_uncordon": spare_out,
        "deleted": deleted,
        "placement": "the scheduler's (the spare is schedulable; pods are not pinned)",
    }


def scale_down(kube: KubeClient, job: str, dropped, *, key: str) -> dict:
    opts = kube.options
    if opts.workload != "job":
        raise DriverError(
            f"scale_down of {job}: only a batch/v1 Job's parallelism can be changed "
            f"(workload is {opts.workload!r}; JobSet replicas are immutable)"
        )
    wl = find_workload(kube, job)
    ann = workload_annotations(wl)
    dropped = list(dropped)
    scaled = {}
    if ann.get(SCALED_BY) != key:
        on = [p for p in live(job_pods(kube, job)) if p.spec.node_name in dropped]
        if not on:
            return {"job": job, "changed": False, "note": f"no pods of {job} on {dropped}"}
        old = wl.spec.parallelism if wl.spec.parallelism is not None else 1
        new = old - len(on)
        if new < 1:
            raise DriverError(f"scale_down of {job}: {old} - {len(on)} pods leaves none")
        spec = {"parallelism": new}
        # An "elastic" Indexed Job (completions == parallelism) shrinks both.
        elastic = wl.spec.completion_mode == "Indexed" and wl.spec.completions == old
        if elastic:
            spec["completions"] = new
        wl = patch_workload(
            kube,
            wl,
            {"metadata": {"annotations": {SCALED_BY: key, SCALED_FROM: str(old)}}, "spec": spec},
        )
        scaled = {"parallelism": [old, new]}
        if elastic:
            scaled["completions"] = [old, new]
    cordons = {n: nodes.cordon(kube, n, key=key)["changed"] for n in dropped}
    restarted = restart(kube, job, key, None, workload=wl)
    return {
        "job": job,
        "changed": bool(scaled) or any(cordons.values()) or bool(restarted["deleted"]),
        "already": not scaled,
        **scaled,
        "cordoned": cordons,
        "deleted": restarted["deleted"],
    }


def job_status(kube: KubeClient, job: str) -> dict:
    opts = kube.options
    pods = job_pods(kube, job)
    wl = None
    if opts.workload != "none":
        try:
            wl = find_workload(kube, job)
        except DriverError as exc:
            if getattr(exc, "status", None) is not None:
                raise  # an API failure, not a missing object
    phases = [p.status.phase if p.status else "Unknown" for p in pods]
    alive = live(pods)
    if wl is None and not pods:
        state = "unknown"
    elif workload_finished(wl):
        state = workload_finished(wl)
    elif any(p.status and p.status.phase == "Running" for p in alive):
        state = "running"
    elif alive:
        state = "pending"
    else:
        state = "stopped"
    out = {
        "job": job,
        "state": state,
        "nodes": sorted({p.spec.node_name for p in alive if p.spec and p.spec.node_name}),
        "pods": [
            {
                "name": pod_id(p),
                "node": p.spec.node_name if p.spec else None,
                "phase": phase,
                "terminating": p.metadata.deletion_timestamp is not None,
            }
            for p, phase in zip(pods, phases, strict=True)
        ],
    }
    if wl is not None:
        ann = workload_annotations(wl)
        out["workload"] = f"{opts.workload_kind}/{workload_name(wl)}"
        out["restart_by"] = ann.get(RESTART_BY)
        if opts.resume_annotation:
            out["resume_step"] = ann.get(opts.resume_annotation)
        if opts.workload == "job":
            out["parallelism"] = wl.spec.parallelism
            out["completions"] = wl.spec.completions
    return out


def workload_finished(wl) -> str | None:
    """ "succeeded" or "failed" from the workload object's conditions (None: neither)."""
    if wl is None:
        return None
    if isinstance(wl, dict):
        conditions = (wl.get("status") or {}).get("conditions") or []
        pairs = [(c.get("type"), c.get("status")) for c in conditions]
    else:
        conditions = (wl.status.conditions or []) if wl.status else []
        pairs = [(c.type, c.status) for c in conditions]
    for kind, state in (("Complete", "succeeded"), ("Completed", "succeeded")):
        if (kind, "True") in pairs:
            return state
    if ("Failed", "True") in pairs:
        return "failed"
    return None


def checkpoint_job(kube: KubeClient, job: str, *, key: str) -> dict:
    """Not supported: Kubernetes has no way to hand a running container a request
    that the training process would see without extra permissions or plumbing (an
    annotation on its pods is visible only to a process that may read the API, and
    `exec` to send a signal needs pods/exec). Refused plainly, so the action fails
    with the reason instead of pretending (docs/checkpoint-now.md)."""
    raise DriverError(
        f"checkpoint_job of job {job}: not supported by the kubernetes driver (a running"
        " pod cannot be asked to save a checkpoint without extra permissions: pods/exec"
        " to signal it, or API access from the job to read an annotation); ask the job's"
        " owners to save one, or use drain_at_next_checkpoint"
    )
