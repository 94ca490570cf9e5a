"""The kubernetes driver's connection to an API server and its one way of
calling it: `KubeClient.call` turns the client's failures into the driver's
errors (DriverTransientError for 5xx, 408, 409, 429, timeouts and connection
failures; DriverError with the API's own message for the rest). The client
also holds the clock the other modules read, a seam for the tests."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from functools import cached_property

from recovery.drivers import DriverError, DriverTransientError
from recovery.drivers.kubernetes.options import KubernetesOptions

try:  # the optional extra `k8s`
    import urllib3
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
except ImportError:  # pragma: no cover - exercised only without the extra
    k8s = k8s_config = urllib3 = None

    class ApiException(Exception):  # a stand-in so `except` clauses still work
        status = 0


TRANSIENT_STATUSES = {0, 408, 409, 429}


def api_message(exc) -> tuple[str, dict]:
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


class KubeClient:
    """One API server, reached lazily: a bad configuration is a DriverError at the
    first request, not when the driver is built."""

    def __init__(self, options: KubernetesOptions, configuration=None):
        self.options = options
        self._configuration = configuration
        # Seams for the tests (and nothing else): the clock and the sleep.
        self.now = time.time
        self.sleep = time.sleep

    def stamp(self) -> str:
        """The current time as the annotations carry it (UTC, seconds)."""
        return datetime.fromtimestamp(self.now(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

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
                self._configure(cfg)
            except (k8s_config.ConfigException, OSError, ValueError) as exc:
                raise DriverError(f"kubernetes configuration: {exc}") from exc
        return k8s.ApiClient(cfg)

    def _configure(self, cfg) -> None:
        """An explicit host; else the pod's service account (asked for, or found
        when no kubeconfig is given); else a kubeconfig file and context."""
        o = self.options
        if o.host:
            cfg.host = o.host.rstrip("/")
            cfg.verify_ssl = o.verify_ssl
            if o.ca_cert:
                cfg.ssl_ca_cert = o.ca_cert
            if o.token:
                cfg.api_key = {"authorization": o.token}
                cfg.api_key_prefix = {"authorization": "Bearer"}
        elif o.in_cluster or (
            o.in_cluster is None and not o.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")
        ):
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(
                config_file=o.kubeconfig, context=o.context, client_configuration=cfg
            )

    @cached_property
    def core(self):
        return k8s.CoreV1Api(self.api_client)

    @cached_property
    def batch(self):
        return k8s.BatchV1Api(self.api_client)

    @cached_property
    def custom(self):
        return k8s.CustomObjectsApi(self.api_client)

    def call(self, what: str, fn, *args, **kwargs):
        """One API request; its failure as the driver's error (transient or not).
        The error carries `.status` (the HTTP status; 0 without an answer) and, for
        an API answer, `.api_reason`, `.api_status` (the Status body), `.headers`."""
        # (connect, read): a lone float is ignored by the older clients (< 30).
        timeout = self.options.request_timeout_s
        kwargs.setdefault("_request_timeout", (timeout, timeout))
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            status = int(getattr(exc, "status", 0) or 0)
            message, body = api_message(exc)
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

    # the requests more than one module makes

    def read_node(self, node: str):
        return self.call(f"read node {node}", self.core.read_node, node)

    def patch_node(self, node: str, body: dict):
        return self.call(f"patch node {node}", self.core.patch_node, node, body)
