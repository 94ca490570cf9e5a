"""The `kubernetes` driver against RECORDED API responses.

No API server can run here (no kube-apiserver package, no container runtime for
kind or k3d); these tests replay recorded responses. The bodies under
k8s_recordings/ were written by hand in the shape a Kubernetes 1.31 API server
returns (Node, PodList, Job, JobSet, Pod, Eviction and Status objects); none was
captured from a live cluster (see the README there). `ApiReplay` serves them
from a small HTTP server on 127.0.0.1 in a thread, and the real `kubernetes`
client talks to it through a Configuration whose host points at it, so the
client's own request building, serialization and HTTP path run; each test
asserts the exact requests the driver made (method, path, query, content type
and body). What a real API
server would do with those requests (admission, PDB arithmetic, controllers
recreating pods) is not tested here.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

pytest.importorskip("kubernetes")

from jobs.models import Node
from recovery import services
from recovery.drivers import (
    DRIVERS,
    Driver,
    DriverError,
    DriverTransientError,
    get_driver,
)
from recovery.drivers.kubernetes import KubernetesDriver, KubernetesOptions
from recovery.models import ClusterRecoverySettings

RECORDINGS = Path(__file__).parent / "k8s_recordings"
KEY = "rebound:action-7"
T0 = datetime(2026, 11, 30, 8, 20, 40, tzinfo=UTC).timestamp()
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

UID = {i: f"d0a1b2c3-{str(i) * 4}-4a5b-8c6d-7e8f9a0b1c2d" for i in range(4)}
POD = {
    0: "llm-pretrain-0-x7k2p",
    1: "llm-pretrain-1-m4t9w",
    2: "llm-pretrain-2-q8d4n",
    3: "llm-pretrain-3-b2v6z",
}
TB = "tensorboard-6d5f7c9b8-wq2lx"
NODES = "/api/v1/nodes"
ML_PODS = "/api/v1/namespaces/ml/pods"
JOBS = "/apis/batch/v1/namespaces/ml/jobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets"
BY_JOB = {"labelSelector": "rebound.dev/job=llm"}
ON_N01 = {"fieldSelector": "spec.nodeName=gpu-n01"}


def recording(name: str):
    path = RECORDINGS / name
    return path.read_text() if path.suffix == ".txt" else json.loads(path.read_text())


class Reply:
    """One recorded answer: a recording's name (a Status carries its own code),
    an HTTP status, extra headers, and an optional delay before answering."""

    def __init__(self, name: str, status: int | None = None, headers=None, delay: float = 0):
        self.name, self.headers, self.delay = name, dict(headers or {}), delay
        body = recording(name + (".json" if "." not in name else ""))
        self.text = body if isinstance(body, str) else None
        self.body = None if isinstance(body, str) else body
        code = self.body.get("code") if self.body and self.body.get("kind") == "Status" else None
        self.status = status or code or 200


class ApiReplay:
    """A stand-in API server: each (method, path) answers with its scripted replies
    in turn, the last one repeating. Every request is recorded; one that was not
    scripted is answered 404 and kept in `unexpected` (the fixture fails on it)."""

    def __init__(self):
        self.script: dict[tuple[str, str], list[Reply]] = {}
        self.requests: list[dict] = []
        self.unexpected: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                replay._serve(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def on(self, method: str, path: str, *replies):
        self.script[(method, path)] = [r if isinstance(r, Reply) else Reply(r) for r in replies]
        return self

    def _serve(self, h: BaseHTTPRequestHandler):
        url = urlsplit(h.path)
        size = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(size) if size else b""
        with self._lock:
            self.requests.append(
                {
                    "method": h.command,
                    "path": url.path,
                    "query": dict(parse_qsl(url.query)),
                    "content_type": h.headers.get("Content-Type"),
                    "authorization": h.headers.get("Authorization"),
                    "body": json.loads(raw) if raw else None,
                }
            )
            replies = self.script.get((h.command, url.path))
            reply = (replies.pop(0) if len(replies) > 1 else replies[0]) if replies else None
            if reply is None:
                self.unexpected.append((h.command, url.path))
        if reply is None:
            status, ctype = 404, "application/json"
            data = json.dumps({"kind": "Status", "code": 404, "message": "not recorded"}).encode()
            headers = {}
        else:
            time.sleep(reply.delay)
            status, headers = reply.status, reply.headers
            if reply.text is not None:
                ctype, data = "text/plain", reply.text.encode()
            else:
                ctype, data = "application/json", json.dumps(reply.body).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (the timeout test)

    def calls(self) -> list[tuple]:
        """(method, path) of each request, with its query when it had one."""
        return [
            (r["method"], r["path"], r["query"]) if r["query"] else (r["method"], r["path"])
            for r in self.requests
        ]

    def sent(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if (r["method"], r["path"]) == (method, path)]


class Clock:
    """The driver's clock and sleep: sleeping moves the clock, and nothing waits."""

    def __init__(self, t: float = T0):
        self.t, self.sleeps = t, []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


@pytest.fixture
def api():
    server = ApiReplay()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()
    assert not server.unexpected, f"requests nobody recorded an answer for: {server.unexpected}"


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make(api, clock):
    def make(**options) -> KubernetesDriver:
        options = {
            "host": api.url,
            "namespace": "ml",
            "request_timeout_s": 5,
            "burnin_image": "registry.example.internal/infra/rebound-burnin:0.1.0",
            **options,
        }
        driver = KubernetesDriver(**options)
        driver.kube.now, driver.kube.sleep = clock.now, clock.sleep
        return driver

    return make


@pytest.fixture
def k8s(make):
    return make()


def evict_path(ns: str, pod: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{pod}/eviction"


def eviction_body(ns: str, pod: str) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": ns},
    }


# cordon and uncordon


def test_cordon_sets_unschedulable_and_marks_the_node_ours(api, k8s):
    """No API server can run here; these replay recorded responses. A schedulable
    node is read, then patched: unschedulable, our annotation and label, guarded by
    the resourceVersion that was read."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    out = k8s.cordon("gpu-n01", key=KEY)
    assert out == {"node": "gpu-n01", "changed": True, "unschedulable": True, "cordoned_by": KEY}
    assert api.calls() == [("GET", f"{NODES}/gpu-n01"), ("PATCH", f"{NODES}/gpu-n01")]
    patch = api.requests[1]
    assert patch["content_type"] == STRATEGIC
    assert patch["body"] == {
        "metadata": {
            "resourceVersion": "481516",
            "labels": {"rebound.dev/cordoned": "true"},
            "annotations": {
                "rebound.dev/cordoned-by": KEY,
                "rebound.dev/cordoned-at": "2026-11-30T08:20:40Z",
            },
        },
        "spec": {"unschedulable": True},
    }


def test_cordon_of_a_node_we_cordoned_is_a_no_op(api, k8s):
    """No API server can run here; these replay recorded responses. A node that
    carries our cordon is only read: a success that changes nothing."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    out = k8s.cordon("gpu-n01", key="rebound:action-8")
    assert out["changed"] is False and out["cordoned_by"] == KEY
    assert api.calls() == [("GET", f"{NODES}/gpu-n01")]


def test_another_cordon_is_left_alone_and_never_lifted(api, k8s):
    """No API server can run here; these replay recorded responses. A node cordoned
    without our annotation: cordon succeeds without marking it ours, uncordon refuses
    (a permanent error), and neither patches it."""
    api.on("GET", f"{NODES}/gpu-n02", "node-gpu-n02-cordoned-by-other")
    out = k8s.cordon("gpu-n02", key=KEY)
    assert out["changed"] is False and out["cordoned_by"] is None
    assert "someone else" in out["note"]
    with pytest.raises(DriverError, match="gpu-n02 was cordoned by someone else") as err:
        k8s.uncordon("gpu-n02", key=KEY)
    assert not isinstance(err.value, DriverTransientError)
    assert [c[0] for c in api.calls()] == ["GET", "GET"]


def test_uncordon_lifts_only_our_cordon(api, k8s):
    """No API server can run here; these replay recorded responses. Our cordon (made
    by another action: any rebound: key is ours) is lifted and our marks removed
    (null deletes a key in a merge patch)."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01")
    out = k8s.uncordon("gpu-n01", key="rebound:action-8")
    assert out["changed"] is True and out["was_cordoned_by"] == KEY
    assert api.sent("PATCH", f"{NODES}/gpu-n01")[0]["body"] == {
        "metadata": {
            "resourceVersion": "481530",
            "labels": {"rebound.dev/cordoned": None},
            "annotations": {"rebound.dev/cordoned-by": None, "rebound.dev/cordoned-at": None},
        },
        "spec": {"unschedulable": False},
    }


def test_uncordon_of_a_schedulable_node_is_a_no_op(api, k8s):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    assert k8s.uncordon("gpu-n01", key=KEY)["changed"] is False
    assert api.calls() == [("GET", f"{NODES}/gpu-n01")]


# drain


def script_drain(api, *, tensorboard, pods_after="pods-on-gpu-n01-drained"):
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("GET", "/api/v1/pods", "pods-on-gpu-n01", pods_after)
    api.on("POST", evict_path("ml", POD[0]), Reply("eviction-201"))
    api.on("POST", evict_path("ml", TB), *tensorboard)


def test_drain_evicts_through_the_eviction_api_and_retries_a_pdb_429(api, k8s, clock):
    """No API server can run here; these replay recorded responses. Cordon, list the
    node's pods, evict all but the DaemonSet, mirror and finished pods; the
    tensorboard pod's budget says no once (429), the next round evicts it; then the
    node's pods are listed again until the evicted ones are gone."""
    script_drain(api, tensorboard=[Reply("eviction-429-pdb"), Reply("eviction-201")])
    out = k8s.drain("gpu-n01", key=KEY)
    assert api.calls() == [
        ("GET", f"{NODES}/gpu-n01"),
        ("PATCH", f"{NODES}/gpu-n01"),
        ("GET", "/api/v1/pods", ON_N01),
        ("POST", evict_path("ml", POD[0])),
        ("POST", evict_path("ml", TB)),
        ("POST", evict_path("ml", TB)),
        ("GET", "/api/v1/pods", ON_N01),
    ]
    assert api.requests[3]["body"] == eviction_body("ml", POD[0])
    assert api.requests[4]["body"] == api.requests[5]["body"] == eviction_body("ml", TB)
    assert out["evicted"] == [f"ml/{POD[0]}", f"ml/{TB}"]
    assert out["skipped"] == {
        "daemonset": ["gpu-operator/nvidia-device-plugin-daemonset-4xq9z"],
        "mirror": ["kube-system/gpu-health-gpu-n01"],
        "finished": ["ml/tokenize-shard-17-8kq2d"],
        "terminating": [],
    }
    assert (out["changed"], out["retries"], clock.sleeps) == (True, 1, [5.0])


def test_drain_gives_up_after_its_retries_naming_the_blocked_pods(api, make, clock):
    """No API server can run here; these replay recorded responses. A budget that
    keeps saying no: after the first round and `eviction_retries` more (backoff 5 s,
    then 10 s) the drain reports a transient error that names the pod and the
    budget's own words; what was evicted is in its output."""
    script_drain(api, tensorboard=[Reply("eviction-429-pdb")])
    with pytest.raises(DriverTransientError) as err:
        make(eviction_retries=2).drain("gpu-n01", key=KEY)
    message = str(err.value)
    assert f"ml/{TB}" in message and "after 3 tries" in message
    assert "tensorboard-pdb needs 1 healthy pods and has 1 currently" in message
    assert err.value.output["evicted"] == [f"ml/{POD[0]}"]
    assert list(err.value.output["blocked"]) == [f"ml/{TB}"]
    assert len(api.sent("POST", evict_path("ml", TB))) == 3
    assert clock.sleeps == [5.0, 10.0]
    assert api.calls()[-1] == ("POST", evict_path("ml", TB))  # no wait for the rest


def test_drain_honours_retry_after_and_caps_the_backoff(api, make, clock):
    """No API server can run here; these replay recorded responses. A throttling 429
    with Retry-After: 30 waits 30 s rather than the 1 s backoff, capped at 20 s."""
    throttled = Reply("status-429-throttled", headers={"Retry-After": "30"})
    script_drain(api, tensorboard=[throttled, Reply("eviction-201")])
    make(eviction_backoff_s=1, eviction_backoff_max_s=20).drain("gpu-n01", key=KEY)
    assert clock.sleeps == [20.0]


def test_drain_again_skips_terminating_pods_and_waits_for_them(api, k8s, clock):
    """No API server can run here; these replay recorded responses. The repeat of a
    drain whose worker died: the node is ours already, the training pod is
    terminating from the first run's eviction; nothing is evicted twice, and the drain
    waits until that pod is gone."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on(
        "GET",
        "/api/v1/pods",
        "pods-on-gpu-n01-terminating",
        "pods-on-gpu-n01-terminating",
        "pods-on-gpu-n01-drained",
    )
    out = k8s.drain("gpu-n01", key=KEY)
    assert api.calls() == [("GET", f"{NODES}/gpu-n01")] + [("GET", "/api/v1/pods", ON_N01)] * 3
    assert out["evicted"] == [] and out["skipped"]["terminating"] == [f"ml/{POD[0]}"]
    assert out["changed"] is False and clock.sleeps == [2.0] and out["waited_s"] == 2.0


def test_drain_reports_pods_that_do_not_go_in_time(api, make):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("GET", "/api/v1/pods", "pods-on-gpu-n01-terminating")
    with pytest.raises(DriverTransientError, match=r"still terminating after 10s: ml/llm-pre"):
        make(drain_wait_s=10).drain("gpu-n01", key=KEY)


# restart_job


def test_restart_job_deletes_the_jobs_pods_and_marks_the_job(api, k8s):
    """No API server can run here; these replay recorded responses. The Job labelled
    rebound.dev/job=llm and its pods are listed; the Job is marked with the action and
    the pods it is about to delete (and a stale resume step is removed); each pod is
    deleted with a uid precondition so that only that very pod can go."""
    api.on("GET", JOBS, "jobs-llm")
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on("PATCH", f"{JOBS}/llm-pretrain", "job-llm-pretrain-restart-marked")
    for i in range(4):
        api.on("DELETE", f"{ML_PODS}/{POD[i]}", f"pod-{POD[i]}-deleted")
    out = k8s.restart_job("llm", None, ["gpu-n01", "gpu-n02"], key="rebound:action-12")
    assert api.calls() == [
        ("GET", JOBS, BY_JOB),
        ("GET", ML_PODS, BY_JOB),
        ("PATCH", f"{JOBS}/llm-pretrain"),
    ] + [("DELETE", f"{ML_PODS}/{POD[i]}") for i in range(4)]
    patch = api.requests[2]
    assert patch["content_type"] == STRATEGIC
    assert patch["body"] == {
        "metadata": {
            "annotations": {
                "rebound.dev/restart-by": "rebound:action-12",
                "rebound.dev/restart-pods": ",".join(UID[i] for i in range(4)),
                "rebound.dev/restart-at": "2026-11-30T08:20:40Z",
                "rebound.dev/resume-step": None,
            }
        }
    }
    assert [r["body"] for r in api.requests[3:]] == [
        {"preconditions": {"uid": UID[i]}} for i in range(4)
    ]
    assert out["deleted"] == [f"ml/{POD[i]}" for i in range(4)]
    assert (out["changed"], out["already"], out["workload"]) == (True, False, "Job/llm-pretrain")
    assert out["nodes_requested"] == ["gpu-n01", "gpu-n02"]


def test_restart_job_repeat_deletes_only_the_pods_it_meant_to(api, k8s):
    """No API server can run here; these replay recorded responses. The worker died
    after deleting pods 0 and 1: the repeat reads its own mark on the Job and deletes
    pods 2 and 3 only, never the recreated 0 and 1; a third run deletes nothing."""
    api.on("GET", JOBS, "jobs-llm-restart-marked")
    api.on("GET", ML_PODS, "pods-of-llm-half-restarted", "pods-of-llm-restarted")
    api.on("DELETE", f"{ML_PODS}/{POD[2]}", f"pod-{POD[2]}-deleted")
    api.on("DELETE", f"{ML_PODS}/{POD[3]}", f"pod-{POD[3]}-deleted")
    out = k8s.restart_job("llm", None, None, key="rebound:action-12")
    assert out["deleted"] == [f"ml/{POD[2]}", f"ml/{POD[3]}"] and out["changed"] is True
    again = k8s.restart_job("llm", None, None, key="rebound:action-12")
    assert (again["deleted"], again["changed"], again["already"]) == ([], False, True)
    assert [c[0] for c in api.calls()] == ["GET", "GET", "DELETE", "DELETE", "GET", "GET"]


def test_a_pod_already_gone_counts_as_deleted_by_someone(api, k8s):
    """No API server can run here; these replay recorded responses. A 404 on DELETE
    (the pod went between the list and the delete) is not an error."""
    api.on("GET", JOBS, "jobs-llm-restart-marked")
    api.on("GET", ML_PODS, "pods-of-llm-half-restarted")
    api.on("DELETE", f"{ML_PODS}/{POD[2]}", "status-404-pod")
    api.on("DELETE", f"{ML_PODS}/{POD[3]}", f"pod-{POD[3]}-deleted")
    out = k8s.restart_job("llm", None, None, key="rebound:action-12")
    assert out["deleted"] == [f"ml/{POD[3]}"]


def test_restart_by_eviction_keeps_the_uid_precondition_and_reports_a_refusal(api, make):
    """No API server can run here; these replay recorded responses. With
    restart_with "evict" the pods go through the Eviction API (so they carry the
    DisruptionTarget condition a podFailurePolicy can ignore), each guarded by its
    uid; one refused by a disruption budget makes the restart a transient error
    that names it, after the others were evicted."""
    api.on("GET", JOBS, "jobs-llm")
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on("PATCH", f"{JOBS}/llm-pretrain", "job-llm-pretrain-restart-marked")
    for i in range(3):
        api.on("POST", evict_path("ml", POD[i]), "eviction-201")
    api.on("POST", evict_path("ml", POD[3]), "eviction-429-pdb")
    with pytest.raises(DriverTransientError, match=f"refused the eviction of ml/{POD[3]}") as err:
        make(restart_with="evict").restart_job("llm", None, None, key="rebound:action-12")
    assert [c[:2] for c in api.calls()[3:]] == [
        ("POST", evict_path("ml", POD[i])) for i in range(4)
    ]
    assert api.requests[3]["body"] == {
        **eviction_body("ml", POD[0]),
        "deleteOptions": {"preconditions": {"uid": UID[0]}},
    }
    assert err.value.output["deleted"] == [f"ml/{POD[i]}" for i in range(3)]
    assert not api.sent("DELETE", f"{ML_PODS}/{POD[0]}")


def test_a_rollback_on_a_jobset_passes_its_step_in_an_annotation(api, make):
    """No API server can run here; these replay recorded responses. The JobSet
    labelled for the job is patched with a JSON merge patch (a custom resource takes
    no strategic merge) carrying the step; then its pods are deleted."""
    api.on("GET", JOBSETS, "jobsets-llm")
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on("PATCH", f"{JOBSETS}/llm-js", "jobset-llm-js-restart-marked")
    for i in range(4):
        api.on("DELETE", f"{ML_PODS}/{POD[i]}", f"pod-{POD[i]}-deleted")
    out = make(workload="jobset").restart_job("llm", 400, None, key="rebound:action-13")
    patch = api.sent("PATCH", f"{JOBSETS}/llm-js")[0]
    assert patch["content_type"] == MERGE
    annotations = patch["body"]["metadata"]["annotations"]
    assert annotations["rebound.dev/resume-step"] == "400"
    assert annotations["rebound.dev/restart-by"] == "rebound:action-13"
    assert (out["workload"], out["resume_step"], len(out["deleted"])) == ("JobSet/llm-js", 400, 4)


def test_a_rollback_without_a_place_for_its_step_is_refused_before_any_request(api, make):
    """No API server can run here; these replay recorded responses (none here)."""
    with pytest.raises(DriverError, match="workload is 'none'"):
        make(workload="none").restart_job("llm", 400, None, key=KEY)
    with pytest.raises(DriverError, match="resume_annotation is not configured"):
        make(resume_annotation="").restart_job("llm", 400, None, key=KEY)
    assert api.requests == []


def test_a_job_without_its_object_or_pods_is_a_permanent_error(api, k8s):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", JOBS, "jobs-none")
    with pytest.raises(DriverError, match=r"no Job labelled rebound\.dev/job=llm in namespace ml"):
        k8s.restart_job("llm", None, None, key=KEY)


# replace_node and scale_down


def test_replace_node_cordons_it_and_deletes_the_jobs_pods_there(api, k8s):
    """No API server can run here; these replay recorded responses. The spare is
    checked, the node cordoned as ours, the job's pod on it deleted (the scheduler
    places its replacement); the repeat finds the node ours and empty: no change."""
    api.on("GET", f"{NODES}/gpu-s1", "node-gpu-s1")
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("GET", ML_PODS, "pods-of-llm-on-gpu-n01", "pods-of-llm-on-gpu-n01-none")
    api.on("DELETE", f"{ML_PODS}/{POD[0]}", f"pod-{POD[0]}-deleted")
    out = k8s.replace_node("llm", "gpu-n01", "gpu-s1", key=KEY)
    assert api.calls() == [
        ("GET", f"{NODES}/gpu-s1"),
        ("GET", f"{NODES}/gpu-n01"),
        ("PATCH", f"{NODES}/gpu-n01"),
        ("GET", ML_PODS, {**BY_JOB, **ON_N01}),
        ("DELETE", f"{ML_PODS}/{POD[0]}"),
    ]
    assert api.requests[4]["body"] == {"preconditions": {"uid": UID[0]}}
    assert out["changed"] is True and out["deleted"] == [f"ml/{POD[0]}"]
    assert out["cordon"]["changed"] is True
    again = k8s.replace_node("llm", "gpu-n01", "gpu-s1", key=KEY)
    assert again["changed"] is False and again["deleted"] == []
    assert [c[0] for c in api.calls()[5:]] == ["GET", "GET", "GET"]


def test_replace_node_lifts_our_hold_on_the_spare_and_refuses_anothers(api, k8s):
    """No API server can run here; these replay recorded responses. A spare we
    cordoned is uncordoned so the scheduler may use it; a spare cordoned by someone
    else stops the action before anything is changed."""
    api.on("GET", f"{NODES}/gpu-s1", "node-gpu-s1-cordoned-by-rebound")
    api.on("PATCH", f"{NODES}/gpu-s1", "node-gpu-s1")
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("GET", ML_PODS, "pods-of-llm-on-gpu-n01-none")
    out = k8s.replace_node("llm", "gpu-n01", "gpu-s1", key=KEY)
    assert out["spare_uncordon"]["changed"] is True
    assert api.sent("PATCH", f"{NODES}/gpu-s1")[0]["body"]["spec"] == {"unschedulable": False}
    api.requests.clear()
    api.on("GET", f"{NODES}/gpu-n02", "node-gpu-n02-cordoned-by-other")
    with pytest.raises(DriverError, match="spare gpu-n02 is cordoned by someone else"):
        k8s.replace_node("llm", "gpu-n01", "gpu-n02", key=KEY)
    assert api.calls() == [("GET", f"{NODES}/gpu-n02")]


def test_scale_down_lowers_an_elastic_indexed_jobs_size_and_restarts_it(api, k8s):
    """No API server can run here; these replay recorded responses. One pod of the
    4-wide Indexed Job ran on gpu-n01: parallelism and completions go to 3 (its
    completions equal its parallelism), gpu-n01 is cordoned, and the job's pods are
    restarted so the ranks start again with the smaller world."""
    key = "rebound:action-15"
    api.on("GET", JOBS, "jobs-llm")
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on(
        "PATCH",
        f"{JOBS}/llm-pretrain",
        "job-llm-pretrain-scaled",
        "job-llm-pretrain-restart-marked",
    )
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    for i in range(4):
        api.on("DELETE", f"{ML_PODS}/{POD[i]}", f"pod-{POD[i]}-deleted")
    out = k8s.scale_down("llm", ["gpu-n01"], key=key)
    scale, restart = api.sent("PATCH", f"{JOBS}/llm-pretrain")
    assert scale["body"] == {
        "metadata": {"annotations": {"rebound.dev/scaled-by": key, "rebound.dev/scaled-from": "4"}},
        "spec": {"parallelism": 3, "completions": 3},
    }
    assert restart["body"]["metadata"]["annotations"]["rebound.dev/restart-by"] == key
    assert (out["parallelism"], out["completions"]) == ([4, 3], [4, 3])
    assert out["cordoned"] == {"gpu-n01": True} and len(out["deleted"]) == 4


def test_scale_down_refused_by_the_api_is_a_permanent_error_with_its_message(api, k8s):
    """No API server can run here; these replay recorded responses. A cluster that
    cannot change completions answers 422; the driver's error carries its words."""
    api.on("GET", JOBS, "jobs-llm")
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on("PATCH", f"{JOBS}/llm-pretrain", "status-422-job-completions")
    with pytest.raises(DriverError) as err:
        k8s.scale_down("llm", ["gpu-n01"], key="rebound:action-15")
    assert not isinstance(err.value, DriverTransientError)
    assert "spec.completions: Invalid value: 3: field is immutable" in str(err.value)
    assert err.value.status == 422


def test_scale_down_is_refused_for_a_jobset(make):
    """No API server can run here (and none is asked)."""
    with pytest.raises(DriverError, match="JobSet replicas are immutable"):
        make(workload="jobset").scale_down("llm", ["gpu-n01"], key=KEY)


# validate_node


def test_validate_node_runs_a_pinned_burn_in_and_labels_the_node(api, k8s, clock):
    """No API server can run here; these replay recorded responses. A burn-in pod
    pinned to the node (nodeName, every taint tolerated) is created and polled; it
    succeeds, its log's JSON is the result, the node is labelled validated and the pod
    deleted. A repeat of the same action only reads the node."""
    name = "rebound-burnin-gpu-n01-action-9"
    key = "rebound:action-9"
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01", "node-gpu-n01-validated-by-action-9")
    api.on("POST", ML_PODS, Reply("pod-burnin-created", status=201))
    api.on("GET", f"{ML_PODS}/{name}", "pod-burnin-running", "pod-burnin-succeeded")
    api.on("GET", f"{ML_PODS}/{name}/log", "log-burnin-succeeded.txt")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-validated-by-action-9")
    api.on("DELETE", f"{ML_PODS}/{name}", "pod-burnin-succeeded")
    out = k8s.validate_node("gpu-n01", key=key)
    assert api.calls() == [
        ("GET", f"{NODES}/gpu-n01"),
        ("POST", ML_PODS),
        ("GET", f"{ML_PODS}/{name}"),
        ("GET", f"{ML_PODS}/{name}"),
        ("GET", f"{ML_PODS}/{name}/log", {"container": "burnin", "tailLines": "50"}),
        ("PATCH", f"{NODES}/gpu-n01"),
        ("DELETE", f"{ML_PODS}/{name}"),
    ]
    assert api.requests[1]["body"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"rebound.dev/burnin": "true"},
            "annotations": {"rebound.dev/action": key},
        },
        "spec": {
            "nodeName": "gpu-n01",
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 600,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "burnin",
                    "image": "registry.example.internal/infra/rebound-burnin:0.1.0",
                    "command": [
                        "python",
                        "-m",
                        "recovery.drivers.burnin",
                        "--seconds",
                        "60",
                        "--size",
                        "4096",
                        "--min-gflops",
                        "0",
                    ],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    stamp = str(int(T0 + 2))  # after one 2 s poll
    assert api.requests[5]["body"] == {
        "metadata": {
            "labels": {"rebound.dev/validated": stamp},
            "annotations": {"rebound.dev/validated-by": key},
        }
    }
    assert out["passed"] is True and out["validated"] == stamp and out["gflops"] == 10245.7
    assert clock.sleeps == [2.0]
    again = k8s.validate_node("gpu-n01", key=key)
    assert again["already"] is True and again["passed"] is True
    assert len(api.requests) == 8


def test_a_failed_burn_in_is_a_permanent_error_and_its_pod_is_kept(api, k8s):
    """No API server can run here; these replay recorded responses. The burn-in pod
    exists from an earlier run of the action (409 on create) and has failed: the
    error names the problem from its log; the node is not labelled, the pod stays for
    inspection."""
    name = "rebound-burnin-gpu-n01-action-9"
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("POST", ML_PODS, "status-409-pod-exists")
    api.on("GET", f"{ML_PODS}/{name}", "pod-burnin-failed")
    api.on("GET", f"{ML_PODS}/{name}/log", "log-burnin-failed.txt")
    with pytest.raises(DriverError, match="the same computation gave different results") as err:
        k8s.validate_node("gpu-n01", key="rebound:action-9")
    assert not isinstance(err.value, DriverTransientError)
    assert err.value.output["passed"] is False and err.value.output["exit_code"] == 1
    assert [c[0] for c in api.calls()] == ["GET", "POST", "GET", "GET"]


def test_a_burn_in_still_running_at_its_deadline_is_transient(api, make):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("POST", ML_PODS, Reply("pod-burnin-created", status=201))
    api.on("GET", f"{ML_PODS}/rebound-burnin-gpu-n01-action-9", "pod-burnin-running")
    with pytest.raises(DriverTransientError, match="still Running after 10s"):
        make(burnin_timeout_s=10).validate_node("gpu-n01", key="rebound:action-9")


def test_validate_without_an_image_is_refused(api, make):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    with pytest.raises(DriverError, match="no burnin_image"):
        make(burnin_image="").validate_node("gpu-n01", key=KEY)


# errors


@pytest.mark.parametrize(
    ("reply", "transient", "words"),
    [
        (Reply("status-403-patch-node"), False, 'cannot patch resource "nodes"'),
        (Reply("status-404-node"), False, 'nodes "gpu-n99" not found'),
        (Reply("status-422-job-completions"), False, "field is immutable"),
        (Reply("status-500-etcd"), True, "etcdserver: request timed out"),
        (Reply("status-409-conflict-node"), True, "the object has been modified"),
        (Reply("status-429-throttled"), True, "Too many requests"),
    ],
    ids=["403", "404", "422", "500", "409", "429"],
)
def test_api_errors_map_to_the_two_error_classes(api, k8s, reply, transient, words):
    """No API server can run here; these replay recorded responses. 403/404/422 are
    permanent, 5xx, 409 and 429 transient; each carries the API's own message and
    its HTTP status."""
    api.on("GET", f"{NODES}/gpu-n01", reply)
    with pytest.raises(DriverError) as err:
        k8s.cordon("gpu-n01", key=KEY)
    assert isinstance(err.value, DriverTransientError) is transient
    assert words in str(err.value) and "read node gpu-n01" in str(err.value)
    assert err.value.status == reply.status


def test_an_unreachable_or_slow_api_server_is_transient(api, make):
    """No API server can run here; these replay recorded responses. A port nobody
    listens on, and an answer slower than request_timeout_s: both worth a retry."""
    api.on("GET", f"{NODES}/gpu-n01", Reply("node-gpu-n01", delay=1.0))
    with pytest.raises(DriverTransientError, match="read node gpu-n01"):
        make(request_timeout_s=0.1).cordon("gpu-n01", key=KEY)
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    with pytest.raises(DriverTransientError, match="read node gpu-n01"):
        make(host=f"http://127.0.0.1:{port}").cordon("gpu-n01", key=KEY)


# status, configuration, registry


def test_node_and_job_status_read_the_cluster(api, k8s):
    """No API server can run here; these replay recorded responses."""
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    api.on("GET", "/api/v1/pods", "pods-on-gpu-n01")
    api.on("GET", f"{NODES}/gpu-n99", "status-404-node")
    node = k8s.node_status("gpu-n01")
    assert node["ready"] is True and node["unschedulable"] is True
    assert node["cordoned_by"] == KEY and node["gpus"] == "8"
    assert node["taints"] == ["node.kubernetes.io/unschedulable:NoSchedule"]
    assert node["pods"] == [f"ml/{POD[0]}", f"ml/{TB}"]
    assert k8s.node_status("gpu-n99") == {"node": "gpu-n99", "exists": False, "state": "unknown"}
    api.on("GET", ML_PODS, "pods-of-llm")
    api.on("GET", JOBS, "jobs-llm")
    job = k8s.job_status("llm")
    assert job["state"] == "running" and job["workload"] == "Job/llm-pretrain"
    assert job["nodes"] == ["gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04"]
    assert (job["parallelism"], job["completions"]) == (4, 4)


def test_a_kubeconfig_brings_the_server_and_the_token(api, tmp_path):
    """No API server can run here; these replay recorded responses. The kubeconfig
    path and context options go through the client's own loader: the request reaches
    the replay server with the kubeconfig user's bearer token."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": api.url}}],
                "users": [{"name": "rebound", "user": {"token": "t0ken-abc"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "rebound"}}],
                "current-context": "lab",
            }
        )
    )
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    driver = KubernetesDriver(kubeconfig=str(kubeconfig), context="lab", namespace="ml")
    assert driver.cordon("gpu-n01", key=KEY)["changed"] is False
    assert api.requests[0]["authorization"] == "Bearer t0ken-abc"
    with pytest.raises(DriverError, match="kubernetes configuration"):
        KubernetesDriver(kubeconfig=str(tmp_path / "missing")).cordon("gpu-n01", key=KEY)


@pytest.mark.django_db
def test_the_driver_is_registered_and_drives_a_cordon_action(api, cluster):
    """No API server can run here; these replay recorded responses. The cluster's
    settings choose the kubernetes driver with its options; a cordon action runs
    through the services and marks the node with the action's own key."""
    assert DRIVERS["kubernetes"] == "recovery.drivers.kubernetes.KubernetesDriver"
    ClusterRecoverySettings.objects.create(
        cluster=cluster,
        driver="kubernetes",
        driver_options={"host": api.url, "namespace": "ml", "eviction_retries": 2},
    )
    driver = get_driver(cluster)
    assert isinstance(driver, KubernetesDriver) and isinstance(driver, Driver)
    assert (driver.options.namespace, driver.options.eviction_retries) == ("ml", 2)
    node = Node.objects.create(cluster=cluster, name="gpu-n01", gpus=8)
    api.on("GET", f"{NODES}/gpu-n01", "node-gpu-n01")
    api.on("PATCH", f"{NODES}/gpu-n01", "node-gpu-n01-cordoned-by-rebound")
    action = services.action_propose(
        cluster=cluster,
        kind="cordon_node",
        node=node,
        reason="xid 79",
        requested_by="policy:hardware",
        mode="auto",
    )
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    action.refresh_from_db()
    assert action.state == "succeeded" and action.output["changed"] is True
    annotations = api.sent("PATCH", f"{NODES}/gpu-n01")[0]["body"]["metadata"]["annotations"]
    assert annotations["rebound.dev/cordoned-by"] == f"rebound:action-{action.pk}"
    assert Node.objects.get(pk=node.pk).state == Node.State.CORDONED


def test_options_are_read_once_into_a_frozen_dataclass():
    """No API server is asked. The cluster's driver_options (JSON: numbers may
    arrive as strings) become typed, frozen options; unknown keys are ignored
    and a bad choice is refused when the driver is built, before any request."""
    import dataclasses

    opts = KubernetesDriver(
        namespace="ml",
        eviction_retries="3",
        drain_wait_s=0,
        burnin_command=["dcgmi", "diag", "-r", "2"],
        something_else=1,
    ).options
    assert isinstance(opts, KubernetesOptions)
    assert (opts.eviction_retries, opts.drain_wait_s) == (3, 0.0)
    assert opts.burnin_namespace == "ml" and opts.burnin_command == ("dcgmi", "diag", "-r", "2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.namespace = "other"
    with pytest.raises(DriverError, match="workload must be job, jobset or none"):
        KubernetesDriver(workload="deployment")
    with pytest.raises(DriverError, match="restart_with must be delete or evict"):
        KubernetesDriver(restart_with="kill")
