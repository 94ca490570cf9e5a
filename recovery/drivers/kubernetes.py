"""The `kubernetes` driver: actions carried out through the Kubernetes API with the
official Python client (`pip install 'rebound[k8s]'`, package `kubernetes`).

TESTED AGAINST RECORDED API RESPONSES ONLY. No API server can run on the
machines this project is built on (no kube-apiserver package, no container
runtime for kind or k3d), so tests/recovery/test_kubernetes_driver.py replays
JSON bodies written by hand in the shape a Kubernetes API server returns
(tests/recovery/k8s_recordings/, none captured from a live cluster) from a
small local HTTP server, and the real client talks to it: its request
building, serialization and HTTP path are exercised and every request is
checked, but no real cluster has ever answered this code. Run it against a
staging cluster before trusting it with a production one. Tested with the
client 37.0.1 and 29.0.0.

What each operation does, in Kubernetes terms:

- cordon: GET the Node; when it is schedulable, a strategic-merge PATCH sets
  `spec.unschedulable: true` (the node then carries the taint
  `node.kubernetes.io/unschedulable:NoSchedule`; running pods stay) and marks
  it ours: annotation `rebound.dev/cordoned-by: <action key>` (the key,
  "rebound:action-<id>", is not a valid label value), `rebound.dev/cordoned-at`,
  and the label `rebound.dev/cordoned: "true"` (so `kubectl get nodes -l
  rebound.dev/cordoned` lists our cordons). A node already cordoned (by us or
  by anyone) is left as it is: a success that changes nothing, and a cordon we
  did not make is never marked as ours.
- uncordon: only our own cordon. When the node carries our annotation, a PATCH
  sets `spec.unschedulable: false` and removes the annotations and the label;
  a node cordoned without our mark (by a person, another operator) raises
  DriverError and is not touched; a schedulable node is a no-op success.
  Both patches carry the `resourceVersion` that was read, so a concurrent
  change makes the API answer 409 (transient: the retry reads again) instead of
  us overwriting it.
- drain: cordon, then list the pods on the node (`fieldSelector
  spec.nodeName=<node>`, all namespaces) and evict each through the Eviction
  API (POST .../pods/<pod>/eviction, policy/v1), which honours
  PodDisruptionBudgets. Skipped: DaemonSet pods (they would come straight
  back), mirror (static) pods (the kubelet owns them), finished pods
  (Succeeded/Failed hold nothing) and pods already terminating. A 429 means a
  disruption budget said no (or the API server is throttling): the blocked
  pods are tried again in rounds with exponential backoff (`eviction_retries`,
  `eviction_backoff_s`, `eviction_backoff_max_s`, at least any Retry-After);
  pods still blocked after the last round are reported in a
  DriverTransientError that names them. A 404 (already gone) counts as
  evicted. Then it waits, at most `drain_wait_s`, for the evicted pods to be
  gone; pods still terminating after that are a DriverTransientError too (the
  retry skips them while they terminate, and waits again).
- restart_job: the job's pods are the pods labelled `<job_label>=<job key>`
  (default `rebound.dev/job=<key>`) in `namespace`; its workload object (a
  batch/v1 Job, a jobset.x-k8s.io/v1alpha2 JobSet, or none: `workload`) is the
  one object of that kind carrying the same label. The driver DELETEs the live
  pods (with a UID precondition, so a pod recreated under the same name is
  never hit) and the controller recreates them; the scheduler places them
  (the `nodes` argument cannot pin them; cordoned nodes are avoided). With
  `restart_with: "evict"` it evicts them instead (Eviction API, the same UID
  precondition; a 429 is a DriverTransientError naming the pods): the pods then
  carry the `DisruptionTarget` condition, which a Job's podFailurePolicy can
  ignore, and PodDisruptionBudgets are honoured.
  Before deleting, it writes on the workload object the annotations
  `rebound.dev/restart-by: <key>` and `rebound.dev/restart-pods: <uids>`: a
  repeat of the same action deletes only those pods still alive, never their
  replacements. The resume step goes the same way: `<resume_annotation>:
  "<step>"` (default `rebound.dev/resume-step`) for a rollback, removed for a
  plain restart (the trainer then resumes from its latest complete checkpoint,
  as it does by itself). The driver cannot rewrite pod templates (immutable on
  a Job), so the training side must read that annotation from its workload
  object at start-up (the downward API shows only the pod's own annotations).
  A rollback with no workload object, or with `resume_annotation` set to "",
  is refused: the step would be silently lost.
  Limits: with `workload: "none"` there is nowhere to keep the mark, so a repeat
  deletes the new pods again. On a batch Job, a pod removed by a plain DELETE
  counts as a failed pod against `backoffLimit` (a DELETE adds no
  `DisruptionTarget` condition), so give the Job room for restarts, or use
  `restart_with: "evict"` with a podFailurePolicy rule `Ignore` on
  `DisruptionTarget` (Kubernetes >= 1.26). On a JobSet whose child Jobs have
  `backoffLimit: 0` (the usual gang setup), a removed pod fails its child Job
  and the JobSet's failurePolicy restarts the whole gang (set `maxRestarts`
  high enough); with a higher backoffLimit only that pod is recreated.
- replace_node: checks the spare (404: DriverError; cordoned by us: our cordon
  is lifted so the scheduler may use it; cordoned by anyone else: DriverError,
  before anything is changed), cordons the node (ours), and DELETEs the job's
  pods that ran on it (label selector + `spec.nodeName=<node>`); the controller
  recreates them and the scheduler places them, usually on the spare, but it
  is not pinned there. A repeat finds nothing left on the node: a no-op.
- scale_down: batch/v1 Jobs only. `spec.parallelism` is lowered by the number
  of the job's pods on the dropped nodes; on an Indexed Job whose completions
  equal its parallelism (an "elastic" Indexed Job, Kubernetes >= 1.27)
  `spec.completions` goes down with it. The Job is marked
  `rebound.dev/scaled-by: <key>`, `rebound.dev/scaled-from: <old parallelism>`;
  the dropped nodes are cordoned (ours) and the job's pods restarted as in
  restart_job so the ranks start again with the smaller world size.
  Limits: a non-indexed Job keeps its completions (it still needs that many
  successes); older clusters refuse a completions change (422: DriverError
  with the API's message); JobSet replicas are immutable, and `none` has no
  object: both are refused with DriverError.
- validate_node: creates a burn-in pod pinned to the node (`spec.nodeName`,
  bypassing the scheduler, so a cordoned node can run it; tolerates every
  taint; restartPolicy Never; `activeDeadlineSeconds`), image `burnin_image`,
  command `burnin_command` (default: `python -m recovery.drivers.burnin`, so
  the image must hold Rebound and torch), `burnin_gpus` GPUs
  (`nvidia.com/gpu`). It polls the pod, at most `burnin_timeout_s`: Succeeded
  labels the node `rebound.dev/validated=<unix seconds>` (annotation
  `rebound.dev/validated-by: <key>`) and deletes the pod; Failed raises
  DriverError with the pod's exit code and its last log lines (the pod is kept
  for inspection); still running at the deadline is a DriverTransientError (the
  retry finds the same pod by its name, made from the node and the key, and
  waits on). A node already validated by this action is a no-op success.
- node_status / job_status: read the node (conditions, taints, our marks, the
  pods on it) or the job's pods and workload object.

Ownership rule: the driver marks what it does with the action's key and undoes
only what carries a "rebound:" mark. It never lifts a cordon without our
annotation.

Errors: 5xx, 429, 409 (a concurrent change), timeouts and connection failures
are DriverTransientError; 400/401/403/404/422 are DriverError carrying the API's
own message (`.status` holds the HTTP status).

Options (ClusterRecoverySettings.driver_options):
- connection: `kubeconfig` (a path; default $KUBECONFIG or ~/.kube/config) and
  `context`; or `in_cluster: true` (the pod's service account; chosen by
  itself when no kubeconfig is given and $KUBERNETES_SERVICE_HOST is set); or
  `host` with optional `token`, `ca_cert`, `verify_ssl`. `request_timeout_s`
  (30) bounds every request.
- `namespace` ("default"): where the jobs' pods and workload objects live.
- `job_label` ("rebound.dev/job"), `workload` ("job" | "jobset" | "none"),
  `resume_annotation` ("rebound.dev/resume-step"; "" to refuse rollbacks),
  `restart_with` ("delete" | "evict": how restart_job, replace_node and
  scale_down remove the job's pods).
- eviction: `eviction_retries` (5 more rounds after the first),
  `eviction_backoff_s` (5), `eviction_backoff_max_s` (60),
  `eviction_grace_period_s` (None: each pod's own), `drain_wait_s` (120; 0: do
  not wait), `poll_interval_s` (2).
- burn-in: `burnin_image` (required for validate_node), `burnin_command`,
  `burnin_gpus` (1), `burnin_seconds` (60), `burnin_size` (4096),
  `burnin_min_gflops` (0), `burnin_timeout_s` (600), `burnin_namespace`
  (default `namespace`).

RBAC it needs: nodes get/list/patch; pods get/list/delete/create in
`namespace` (pods list cluster-wide for drain); pods/eviction create;
pods/log get; jobs get/list/patch (batch) or jobsets get/list/patch
(jobset.x-k8s.io).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from datetime import UTC, datetime
from functools import cached_property

from recovery.drivers import DriverError, DriverTransientError

try:  # the optional extra `k8s`
    import urllib3
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
except ImportError:  # pragma: no cover - exercised only without the extra
    k8s = k8s_config = urllib3 = None

    class ApiException(Exception):  # a stand-in so `except` clauses still work
        status = 0


PREFIX = "rebound.dev"
CORDONED_BY = f"{PREFIX}/cordoned-by"
CORDONED_AT = f"{PREFIX}/cordoned-at"
CORDONED_LABEL = f"{PREFIX}/cordoned"
RESTART_BY = f"{PREFIX}/restart-by"
RESTART_PODS = f"{PREFIX}/restart-pods"
RESTART_AT = f"{PREFIX}/restart-at"
SCALED_BY = f"{PREFIX}/scaled-by"
SCALED_FROM = f"{PREFIX}/scaled-from"
VALIDATED_LABEL = f"{PREFIX}/validated"
VALIDATED_BY = f"{PREFIX}/validated-by"
BURNIN_LABEL = f"{PREFIX}/burnin"
ACTION_ANNOTATION = f"{PREFIX}/action"
OURS = "rebound:"  # the prefix of every action key
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
TRANSIENT_STATUSES = {0, 408, 409, 429}
FINISHED_PHASES = {"Succeeded", "Failed"}


def _ours(value) -> bool:
    return isinstance(value, str) and value.startswith(OURS)


def _api_message(exc) -> tuple[str, dict]:
    """The API's own words from a Status body (falling back to the HTTP reason)."""
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    message = status.get("message") or getattr(exc, "reason", None) or "no message"
    return str(message), status


class KubernetesDriver:
    name = "kubernetes"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        host: str | None = None,
        token: str | None = None,
        ca_cert: str | None = None,
        verify_ssl: bool = True,
        request_timeout_s: float = 30.0,
        namespace: str = "default",
        job_label: str = f"{PREFIX}/job",
        workload: str = "job",
        resume_annotation: str = f"{PREFIX}/resume-step",
        restart_with: str = "delete",
        eviction_retries: int = 5,
        eviction_backoff_s: float = 5.0,
        eviction_backoff_max_s: float = 60.0,
        eviction_grace_period_s: int | None = None,
        drain_wait_s: float = 120.0,
        poll_interval_s: float = 2.0,
        burnin_image: str = "",
        burnin_command: list[str] | None = None,
        burnin_gpus: int = 1,
        burnin_seconds: float = 60.0,
        burnin_size: int = 4096,
        burnin_min_gflops: float = 0.0,
        burnin_timeout_s: float = 600.0,
        burnin_namespace: str | None = None,
        configuration=None,
        **_ignored,
    ):
        if workload not in ("job", "jobset", "none"):
            raise DriverError(f"workload must be job, jobset or none, not {workload!r}")
        if restart_with not in ("delete", "evict"):
            raise DriverError(f"restart_with must be delete or evict, not {restart_with!r}")
        self.kubeconfig = kubeconfig
        self.context = context
        self.in_cluster = in_cluster
        self.host = host
        self.token = token
        self.ca_cert = ca_cert
        self.verify_ssl = bool(verify_ssl)
        self.request_timeout_s = float(request_timeout_s)
        self.namespace = namespace
        self.job_label = job_label
        self.workload = workload
        self.resume_annotation = resume_annotation
        self.restart_with = restart_with
        self.eviction_retries = int(eviction_retries)
        self.eviction_backoff_s = float(eviction_backoff_s)
        self.eviction_backoff_max_s = float(eviction_backoff_max_s)
        self.eviction_grace_period_s = eviction_grace_period_s
        self.drain_wait_s = float(drain_wait_s)
        self.poll_interval_s = float(poll_interval_s)
        self.burnin_image = burnin_image
        self.burnin_command = list(burnin_command) if burnin_command else None
        self.burnin_gpus = int(burnin_gpus)
        self.burnin_seconds = float(burnin_seconds)
        self.burnin_size = int(burnin_size)
        self.burnin_min_gflops = float(burnin_min_gflops)
        self.burnin_timeout_s = float(burnin_timeout_s)
        self.burnin_namespace = burnin_namespace or namespace
        self._configuration = configuration
        # Seams for the tests (and nothing else): the clock and the sleep.
        self._now = time.time
        self._sleep = time.sleep

    # the client

    @cached_property
    def api_client(self):
        if k8s is None:
            raise DriverError(
                "the kubernetes driver needs the `kubernetes` package: pip install 'rebound[k8s]'"
            )
        cfg = self._configuration
        if cfg is None:
            cfg = k8s.Configuration()
            try:
                if self.host:
                    cfg.host = self.host.rstrip("/")
                    cfg.verify_ssl = self.verify_ssl
                    if self.ca_cert:
                        cfg.ssl_ca_cert = self.ca_cert
                    if self.token:
                        cfg.api_key = {"authorization": self.token}
                        cfg.api_key_prefix = {"authorization": "Bearer"}
                elif self.in_cluster or (
                    self.in_cluster is None
                    and not self.kubeconfig
                    and os.environ.get("KUBERNETES_SERVICE_HOST")
                ):
                    k8s_config.load_incluster_config(client_configuration=cfg)
                else:
                    k8s_config.load_kube_config(
                        config_file=self.kubeconfig,
                        context=self.context,
                        client_configuration=cfg,
                    )
            except (k8s_config.ConfigException, OSError, ValueError) as exc:
                raise DriverError(f"kubernetes configuration: {exc}") from exc
        return k8s.ApiClient(cfg)

    @cached_property
    def core(self):
        return k8s.CoreV1Api(self.api_client)

    @cached_property
    def batch(self):
        return k8s.BatchV1Api(self.api_client)

    @cached_property
    def custom(self):
        return k8s.CustomObjectsApi(self.api_client)

    def _call(self, what: str, fn, *args, **kwargs):
        """One API request; its failure as the driver's error (transient or not)."""
        # (connect, read): a lone float is ignored by the older clients (< 30).
        kwargs.setdefault("_request_timeout", (self.request_timeout_s, self.request_timeout_s))
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            status = int(getattr(exc, "status", 0) or 0)
            message, body = _api_message(exc)
            reason = body.get("reason") or getattr(exc, "reason", "") or ""
            cls = (
                DriverTransientError
                if status in TRANSIENT_STATUSES or status >= 500
                else DriverError
            )
            err = cls(
                f"{what}: {status} {reason or 'error'}: {message}",
                output={"status": status, "reason": reason, "message": message},
            )
            err.status = status
            err.api_reason = reason
            err.api_status = body
            err.headers = dict(getattr(exc, "headers", None) or {})
            raise err from exc
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as exc:
            err = DriverTransientError(f"{what}: {type(exc).__name__}: {exc}")
            err.status = 0
            raise err from exc

    # nodes

    def _read_node(self, node: str):
        return self._call(f"read node {node}", self.core.read_node, node)

    def _patch_node(self, node: str, body: dict):
        return self._call(f"patch node {node}", self.core.patch_node, node, body)

    def _stamp(self) -> str:
        return datetime.fromtimestamp(self._now(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @staticmethod
    def _cordon_state(obj) -> dict:
        ann = obj.metadata.annotations or {}
        return {
            "unschedulable": bool(obj.spec and obj.spec.unschedulable),
            "cordoned_by": ann.get(CORDONED_BY),
        }

    def cordon(self, node, *, key):
        obj = self._read_node(node)
        state = self._cordon_state(obj)
        if state["unschedulable"]:
            out = {"node": node, "changed": False, **state}
            if not _ours(state["cordoned_by"]):
                out["note"] = "already cordoned by someone else; left as it is, not marked ours"
            return out
        self._patch_node(
            node,
            {
                "metadata": {
                    "resourceVersion": obj.metadata.resource_version,
                    "labels": {CORDONED_LABEL: "true"},
                    "annotations": {CORDONED_BY: key, CORDONED_AT: self._stamp()},
                },
                "spec": {"unschedulable": True},
            },
        )
        return {"node": node, "changed": True, "unschedulable": True, "cordoned_by": key}

    def uncordon(self, node, *, key):
        obj = self._read_node(node)
        state = self._cordon_state(obj)
        labels = obj.metadata.labels or {}
        ours = _ours(state["cordoned_by"])
        if state["unschedulable"] and not ours:
            by = state["cordoned_by"] or "someone else (no rebound.dev/cordoned-by annotation)"
            raise DriverError(
                f"node {node} was cordoned by {by}, not by rebound; not ours to uncordon",
                output={"node": node, "changed": False, **state},
            )
        if not state["unschedulable"] and not ours and CORDONED_LABEL not in labels:
            return {"node": node, "changed": False, **state}
        self._patch_node(
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

    # drain

    def _pods_on(self, node: str, label_selector: str | None = None, namespace=None) -> list:
        selector = f"spec.nodeName={node}"
        if namespace is None:
            found = self._call(
                f"list pods on {node}",
                self.core.list_pod_for_all_namespaces,
                field_selector=selector,
            )
        else:
            kwargs = {"field_selector": selector}
            if label_selector:
                kwargs["label_selector"] = label_selector
            found = self._call(
                f"list pods on {node}", self.core.list_namespaced_pod, namespace, **kwargs
            )
        return list(found.items or [])

    @staticmethod
    def _pod_id(pod) -> str:
        return f"{pod.metadata.namespace}/{pod.metadata.name}"

    @staticmethod
    def _skip_reason(pod) -> str | None:
        meta = pod.metadata
        if MIRROR_ANNOTATION in (meta.annotations or {}):
            return "mirror"
        if any(ref.kind == "DaemonSet" for ref in meta.owner_references or []):
            return "daemonset"
        if meta.deletion_timestamp is not None:
            return "terminating"
        if pod.status is not None and pod.status.phase in FINISHED_PHASES:
            return "finished"
        return None

    def _evict(self, pod, *, same_uid: bool = False) -> tuple[str, dict]:
        """One Eviction POST: ("evicted", {}), ("gone", {}) when the pod (or, with
        `same_uid`, that very pod) no longer exists, or ("refused", why) on a 429."""
        meta = pod.metadata
        options = {}
        if self.eviction_grace_period_s is not None:
            options["grace_period_seconds"] = int(self.eviction_grace_period_s)
        if same_uid:
            options["preconditions"] = k8s.V1Preconditions(uid=meta.uid)
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=meta.name, namespace=meta.namespace),
            delete_options=k8s.V1DeleteOptions(**options) if options else None,
        )
        try:
            self._call(
                f"evict pod {self._pod_id(pod)}",
                self.core.create_namespaced_pod_eviction,
                meta.name,
                meta.namespace,
                body,
            )
        except DriverError as exc:
            status = getattr(exc, "status", None)
            if status == 404 or (same_uid and status == 409):  # gone, or a new pod by that name
                return "gone", {}
            if status == 429:
                causes = [
                    c.get("message", "")
                    for c in ((exc.api_status.get("details") or {}).get("causes") or [])
                ]
                retry_after = exc.headers.get("Retry-After") or exc.headers.get("retry-after")
                try:
                    retry_after = max(0.0, float(retry_after or 0))
                except ValueError:  # an HTTP date: fall back to our own backoff
                    retry_after = 0.0
                return "refused", {
                    "message": exc.output.get("message", ""),
                    "causes": [c for c in causes if c],
                    "retry_after": retry_after,
                }
            raise
        return "evicted", {}

    def drain(self, node, *, key):
        cordon = self.cordon(node, key=key)
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
        for pod in self._pods_on(node):
            why = self._skip_reason(pod)
            if why:
                skipped[why].append(self._pod_id(pod))
            else:
                todo.append(pod)
            if why in (None, "terminating"):
                watched.add(pod.metadata.uid)
        evicted: list[str] = []
        refusals: dict[str, dict] = {}
        rounds = 0
        delay = self.eviction_backoff_s
        while todo:
            refusals = {}
            blocked = []
            for pod in todo:
                try:
                    outcome, refusal = self._evict(pod)
                except DriverError as exc:
                    exc.output = {
                        **exc.output,
                        "node": node,
                        "cordon": cordon,
                        "evicted": evicted,
                        "pending": [self._pod_id(p) for p in todo if p is not pod],
                    }
                    raise
                if outcome != "refused":  # evicted, or already gone
                    evicted.append(self._pod_id(pod))
                else:
                    blocked.append(pod)
                    refusals[self._pod_id(pod)] = refusal
            todo = blocked
            if not todo:
                break
            if rounds >= self.eviction_retries:
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
            self._sleep(min(wait, self.eviction_backoff_max_s))
            delay = min(delay * 2, self.eviction_backoff_max_s)
        waited = self._wait_gone(node, watched)
        return {
            "node": node,
            "changed": bool(cordon["changed"] or evicted),
            "cordon": cordon,
            "evicted": evicted,
            "skipped": skipped,
            "retries": rounds,
            "waited_s": waited,
        }

    def _wait_gone(self, node: str, watched: set) -> float:
        """Wait, at most drain_wait_s, until none of the watched pods (uids) is on
        the node any more; the seconds waited."""
        if not watched or self.drain_wait_s <= 0:
            return 0.0
        start = self._now()
        deadline = start + self.drain_wait_s
        while True:
            left = [self._pod_id(p) for p in self._pods_on(node) if p.metadata.uid in watched]
            if not left:
                return round(self._now() - start, 3)
            if self._now() >= deadline:
                raise DriverTransientError(
                    f"drain {node}: evicted pods still terminating after "
                    f"{self.drain_wait_s:g}s: {', '.join(left)}",
                    output={"node": node, "terminating": left},
                )
            self._sleep(self.poll_interval_s)

    # jobs

    def _job_selector(self, job: str) -> str:
        return f"{self.job_label}={job}"

    def _workload(self, job: str):
        """The job's Job or JobSet (None with workload "none"): a model or a dict."""
        sel = self._job_selector(job)
        if self.workload == "none":
            return None
        if self.workload == "job":
            found = self._call(
                f"list jobs {sel}",
                self.batch.list_namespaced_job,
                self.namespace,
                label_selector=sel,
            )
            items = list(found.items or [])
        else:
            found = self._call(
                f"list jobsets {sel}",
                self.custom.list_namespaced_custom_object,
                *JOBSET[:2],
                self.namespace,
                JOBSET[2],
                label_selector=sel,
            )
            items = list(found.get("items") or [])
        kind = "Job" if self.workload == "job" else "JobSet"
        if not items:
            raise DriverError(f"no {kind} labelled {sel} in namespace {self.namespace}")
        if len(items) > 1:
            names = ", ".join(sorted(self._wl_name(i) for i in items))
            raise DriverError(f"more than one {kind} labelled {sel}: {names}")
        return items[0]

    @staticmethod
    def _wl_name(obj) -> str:
        return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name

    @staticmethod
    def _wl_annotations(obj) -> dict:
        if obj is None:
            return {}
        if isinstance(obj, dict):
            return dict(obj.get("metadata", {}).get("annotations") or {})
        return dict(obj.metadata.annotations or {})

    def _patch_workload(self, obj, body: dict):
        name = self._wl_name(obj)
        if self.workload == "job":
            return self._call(
                f"patch job {name}",
                self.batch.patch_namespaced_job,
                name,
                self.namespace,
                body,
            )
        return self._call(
            f"patch jobset {name}",
            self.custom.patch_namespaced_custom_object,
            *JOBSET[:2],
            self.namespace,
            JOBSET[2],
            name,
            body,
        )

    def _job_pods(self, job: str, node: str | None = None) -> list:
        sel = self._job_selector(job)
        if node is not None:
            return self._pods_on(node, label_selector=sel, namespace=self.namespace)
        found = self._call(
            f"list pods {sel}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=sel,
        )
        return list(found.items or [])

    @staticmethod
    def _live(pods) -> list:
        return [
            p
            for p in pods
            if p.metadata.deletion_timestamp is None
            and (p.status is None or p.status.phase not in FINISHED_PHASES)
        ]

    def _delete_pod(self, pod) -> bool:
        """DELETE one pod, only if it is still the same pod (uid precondition).
        False when it was already gone or replaced."""
        meta = pod.metadata
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=meta.uid))
        try:
            self._call(
                f"delete pod {self._pod_id(pod)}",
                self.core.delete_namespaced_pod,
                meta.name,
                meta.namespace,
                body=body,
            )
        except DriverError as exc:
            if getattr(exc, "status", None) in (404, 409):  # gone, or a new pod by that name
                return False
            raise
        return True

    def _remove_pods(self, pods, what: str) -> list[str]:
        """Delete (or, with restart_with "evict", evict) each pod so that its
        controller recreates it; the ones actually removed. Evictions a disruption
        budget refuses are a DriverTransientError once the rest are done."""
        removed, refused = [], {}
        for pod in pods:
            if self.restart_with == "evict":
                outcome, refusal = self._evict(pod, same_uid=True)
                if outcome == "evicted":
                    removed.append(self._pod_id(pod))
                elif outcome == "refused":
                    refused[self._pod_id(pod)] = refusal
            elif self._delete_pod(pod):
                removed.append(self._pod_id(pod))
        if refused:
            raise DriverTransientError(
                f"{what}: a disruption budget refused the eviction of {', '.join(refused)}",
                output={"deleted": removed, "blocked": refused},
            )
        return removed

    def _restart(self, job: str, key: str, from_step: int | None, workload=None) -> dict:
        if from_step is not None and (self.workload == "none" or not self.resume_annotation):
            raise DriverError(
                f"restart of {job} from step {from_step}: the kubernetes driver passes the "
                "step through an annotation on the job's Job/JobSet, and "
                + (
                    "workload is 'none'"
                    if self.workload == "none"
                    else "resume_annotation is not configured"
                )
            )
        wl = workload if workload is not None else self._workload(job)
        ann = self._wl_annotations(wl)
        pods = self._job_pods(job)
        repeat = wl is not None and ann.get(RESTART_BY) == key
        if repeat:
            wanted = set(filter(None, (ann.get(RESTART_PODS) or "").split(",")))
            targets = [p for p in self._live(pods) if p.metadata.uid in wanted]
        else:
            targets = self._live(pods)
            if not targets:
                raise DriverError(
                    f"job {job} has no live pods labelled {self._job_selector(job)} in "
                    f"namespace {self.namespace}: nothing for its controller to recreate",
                    output={"job": job, "pods": [self._pod_id(p) for p in pods]},
                )
            if wl is not None:
                annotations = {
                    RESTART_BY: key,
                    RESTART_PODS: ",".join(p.metadata.uid for p in targets),
                    RESTART_AT: self._stamp(),
                }
                if self.resume_annotation:
                    annotations[self.resume_annotation] = (
                        str(int(from_step)) if from_step is not None else None
                    )
                self._patch_workload(wl, {"metadata": {"annotations": annotations}})
        deleted = self._remove_pods(targets, f"restart of {job}")
        return {
            "job": job,
            "changed": bool(deleted) or not repeat,
            "already": repeat and not deleted,
            "workload": None if wl is None else f"{self._kind()}/{self._wl_name(wl)}",
            "deleted": deleted,
            "resume_step": from_step,
        }

    def _kind(self) -> str:
        return {"job": "Job", "jobset": "JobSet"}.get(self.workload, "none")

    def restart_job(self, job, from_step, nodes, *, key):
        out = self._restart(job, key, from_step)
        out["placement"] = "the scheduler's (nodes are not pinned)"
        if nodes:
            out["nodes_requested"] = list(nodes)
        return out

    def replace_node(self, job, node, spare, *, key):
        spare_obj = self._read_node(spare)
        spare_state = self._cordon_state(spare_obj)
        spare_out = {"node": spare, "changed": False, **spare_state}
        if spare_state["unschedulable"]:
            if not _ours(spare_state["cordoned_by"]):
                raise DriverError(
                    f"spare {spare} is cordoned by "
                    f"{spare_state['cordoned_by'] or 'someone else'}, not by rebound",
                    output={"spare": spare_out},
                )
            spare_out = self.uncordon(spare, key=key)
        cordon = self.cordon(node, key=key)
        pods = self._live(self._job_pods(job, node=node))
        deleted = self._remove_pods(pods, f"replace {node} in {job}")
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

    def scale_down(self, job, nodes, *, key):
        if self.workload != "job":
            raise DriverError(
                f"scale_down of {job}: only a batch/v1 Job's parallelism can be changed "
                f"(workload is {self.workload!r}; JobSet replicas are immutable)"
            )
        wl = self._workload(job)
        ann = self._wl_annotations(wl)
        nodes = list(nodes)
        scaled = {}
        if ann.get(SCALED_BY) != key:
            on = [p for p in self._live(self._job_pods(job)) if p.spec.node_name in nodes]
            if not on:
                return {"job": job, "changed": False, "note": f"no pods of {job} on {nodes}"}
            old = wl.spec.parallelism if wl.spec.parallelism is not None else 1
            new = old - len(on)
            if new < 1:
                raise DriverError(f"scale_down of {job}: {old} - {len(on)} pods leaves none")
            spec = {"parallelism": new}
            elastic = wl.spec.completion_mode == "Indexed" and wl.spec.completions == old
            if elastic:
                spec["completions"] = new
            wl = self._patch_workload(
                wl,
                {
                    "metadata": {"annotations": {SCALED_BY: key, SCALED_FROM: str(old)}},
                    "spec": spec,
                },
            )
            scaled = {"parallelism": [old, new]}
            if elastic:
                scaled["completions"] = [old, new]
        cordons = {n: self.cordon(n, key=key)["changed"] for n in nodes}
        restart = self._restart(job, key, None, workload=wl)
        return {
            "job": job,
            "changed": bool(scaled) or any(cordons.values()) or bool(restart["deleted"]),
            "already": not scaled,
            **scaled,
            "cordoned": cordons,
            "deleted": restart["deleted"],
        }

    # validation

    def _burnin_name(self, node: str, key: str) -> str:
        suffix = re.sub(r"[^a-z0-9-]+", "-", key.removeprefix(OURS).lower()).strip("-")
        name = re.sub(r"[^a-z0-9-]+", "-", f"rebound-burnin-{node.lower()}-{suffix}").strip("-")
        if len(name) > 63:
            digest = hashlib.sha1(name.encode()).hexdigest()[:8]
            name = f"{name[:54].rstrip('-')}-{digest}"
        return name

    def _burnin_pod(self, node: str, key: str, name: str):
        command = self.burnin_command or [
            "python",
            "-m",
            "recovery.drivers.burnin",
            "--seconds",
            f"{self.burnin_seconds:g}",
            "--size",
            str(self.burnin_size),
            "--min-gflops",
            f"{self.burnin_min_gflops:g}",
        ]
        limits = {"nvidia.com/gpu": str(self.burnin_gpus)} if self.burnin_gpus else None
        return k8s.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=k8s.V1ObjectMeta(
                name=name,
                namespace=self.burnin_namespace,
                labels={BURNIN_LABEL: "true"},
                annotations={ACTION_ANNOTATION: key},
            ),
            spec=k8s.V1PodSpec(
                node_name=node,
                restart_policy="Never",
                active_deadline_seconds=int(self.burnin_timeout_s),
                tolerations=[k8s.V1Toleration(operator="Exists")],
                containers=[
                    k8s.V1Container(
                        name="burnin",
                        image=self.burnin_image,
                        command=command,
                        resources=k8s.V1ResourceRequirements(limits=limits) if limits else None,
                    )
                ],
            ),
        )

    def validate_node(self, node, *, key):
        obj = self._read_node(node)
        ann = obj.metadata.annotations or {}
        labels = obj.metadata.labels or {}
        if ann.get(VALIDATED_BY) == key:
            return {
                "node": node,
                "passed": True,
                "changed": False,
                "already": True,
                "validated": labels.get(VALIDATED_LABEL),
            }
        if not self.burnin_image:
            raise DriverError(
                "validate_node: no burnin_image configured for the kubernetes driver",
                output={"node": node, "passed": False, "error": "no burnin_image"},
            )
        ns = self.burnin_namespace
        name = self._burnin_name(node, key)
        try:
            self._call(
                f"create burn-in pod {ns}/{name}",
                self.core.create_namespaced_pod,
                ns,
                self._burnin_pod(node, key, name),
            )
        except DriverError as exc:
            if getattr(exc, "status", None) != 409:  # 409: ours from an earlier run
                raise
        deadline = self._now() + self.burnin_timeout_s
        while True:
            pod = self._call(
                f"read burn-in pod {ns}/{name}", self.core.read_namespaced_pod, name, ns
            )
            phase = pod.status.phase if pod.status else None
            if phase in FINISHED_PHASES:
                break
            if self._now() >= deadline:
                raise DriverTransientError(
                    f"validate_node: burn-in pod {ns}/{name} still {phase or 'unknown'} after "
                    f"{self.burnin_timeout_s:g}s",
                    output={"node": node, "pod": f"{ns}/{name}", "phase": phase},
                )
            self._sleep(self.poll_interval_s)
        # The raw bytes: the older clients turn a JSON log line into a Python repr.
        raw = self._call(
            f"read burn-in log {ns}/{name}",
            self.core.read_namespaced_pod_log,
            name,
            ns,
            container="burnin",
            tail_lines=50,
            _preload_content=False,
        )
        data = getattr(raw, "data", raw)
        log = data if isinstance(data, str) else (data or b"").decode("utf-8", "replace")
        result = {}
        for line in reversed(log.strip().splitlines()):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
        result = result if isinstance(result, dict) else {}
        terminated = None
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            if cs.state and cs.state.terminated:
                terminated = cs.state.terminated
        out = {
            "node": node,
            "pod": f"{ns}/{name}",
            "phase": phase,
            "exit_code": terminated.exit_code if terminated else None,
            **result,
        }
        if phase != "Succeeded":
            problems = "; ".join(result.get("problems") or []) or result.get("error")
            why = problems or (terminated.message if terminated else None) or log[-500:]
            raise DriverError(
                f"validate_node: {node} failed the burn-in (pod {ns}/{name}, "
                f"exit code {out['exit_code']}): {why}",
                output={**out, "passed": False, "log_tail": log[-2000:]},
            )
        stamp = str(int(self._now()))
        self._patch_node(
            node,
            {
                "metadata": {
                    "labels": {VALIDATED_LABEL: stamp},
                    "annotations": {VALIDATED_BY: key},
                }
            },
        )
        self._delete_pod(pod)
        return {**out, "passed": True, "changed": True, "validated": stamp}

    # status

    def node_status(self, node):
        try:
            obj = self._read_node(node)
        except DriverError as exc:
            if getattr(exc, "status", None) == 404:
                return {"node": node, "exists": False, "state": "unknown"}
            raise
        meta, status = obj.metadata, obj.status
        conditions = {c.type: c.status for c in (status.conditions or [])} if status else {}
        pods = self._pods_on(node)
        return {
            "node": node,
            "exists": True,
            "ready": conditions.get("Ready") == "True",
            "conditions": conditions,
            "taints": [
                f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}"
                for t in (obj.spec.taints or [])
            ]
            if obj.spec
            else [],
            **self._cordon_state(obj),
            "validated": (meta.labels or {}).get(VALIDATED_LABEL),
            "gpus": ((status.allocatable or {}).get("nvidia.com/gpu") if status else None),
            "pods": [self._pod_id(p) for p in pods if self._skip_reason(p) is None],
        }

    def job_status(self, job):
        pods = self._job_pods(job)
        wl = None
        if self.workload != "none":
            try:
                wl = self._workload(job)
            except DriverError as exc:
                if getattr(exc, "status", None) is not None:
                    raise  # an API failure, not a missing object
        phases = [p.status.phase if p.status else "Unknown" for p in pods]
        live = self._live(pods)
        if wl is None and not pods:
            state = "unknown"
        elif self._wl_finished(wl):
            state = self._wl_finished(wl)
        elif any(p.status and p.status.phase == "Running" for p in live):
            state = "running"
        elif live:
            state = "pending"
        else:
            state = "stopped"
        out = {
            "job": job,
            "state": state,
            "nodes": sorted({p.spec.node_name for p in live if p.spec and p.spec.node_name}),
            "pods": [
                {
                    "name": self._pod_id(p),
                    "node": p.spec.node_name if p.spec else None,
                    "phase": phase,
                    "terminating": p.metadata.deletion_timestamp is not None,
                }
                for p, phase in zip(pods, phases, strict=True)
            ],
        }
        if wl is not None:
            ann = self._wl_annotations(wl)
            out["workload"] = f"{self._kind()}/{self._wl_name(wl)}"
            out["restart_by"] = ann.get(RESTART_BY)
            if self.resume_annotation:
                out["resume_step"] = ann.get(self.resume_annotation)
            if self.workload == "job":
                out["parallelism"] = wl.spec.parallelism
                out["completions"] = wl.spec.completions
        return out

    def _wl_finished(self, wl) -> str | None:
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
