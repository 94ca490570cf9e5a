"""The kubernetes driver's options: one frozen dataclass, built once from a
cluster's `driver_options` by `KubernetesOptions.from_settings` (types coerced,
unknown keys ignored, bad choices refused). What each option means:
docs/drivers-kubernetes.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from recovery.drivers import DriverError
from recovery.drivers.kubernetes.marks import PREFIX

WORKLOADS = ("job", "jobset", "none")
RESTART_WITH = ("delete", "evict")


@dataclass(frozen=True)
class KubernetesOptions:
    # connection
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool | None = None
    host: str | None = None
    token: str | None = None
    ca_cert: str | None = None
    verify_ssl: bool = True
    request_timeout_s: float = 30.0
    # where the jobs live and how they are found and restarted
    namespace: str = "default"
    job_label: str = f"{PREFIX}/job"
    workload: str = "job"
    resume_annotation: str = f"{PREFIX}/resume-step"
    restart_with: str = "delete"
    # eviction (drain)
    eviction_retries: int = 5
    eviction_backoff_s: float = 5.0
    eviction_backoff_max_s: float = 60.0
    eviction_grace_period_s: int | None = None
    drain_wait_s: float = 120.0
    poll_interval_s: float = 2.0
    # burn-in (validate_node)
    burnin_image: str = ""
    burnin_command: tuple[str, ...] | None = None
    burnin_gpus: int = 1
    burnin_seconds: float = 60.0
    burnin_size: int = 4096
    burnin_min_gflops: float = 0.0
    burnin_timeout_s: float = 600.0
    burnin_namespace: str | None = None  # None: `namespace`

    @classmethod
    def from_settings(cls, settings: dict) -> KubernetesOptions:
        """The options from a cluster's `driver_options` (JSON: numbers may come as
        strings or ints); keys the driver does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in settings.items() if k in known}
        opts = cls(**given)
        if opts.workload not in WORKLOADS:
            raise DriverError(f"workload must be job, jobset or none, not {opts.workload!r}")
        if opts.restart_with not in RESTART_WITH:
            raise DriverError(f"restart_with must be delete or evict, not {opts.restart_with!r}")
        return dataclasses.replace(
            opts,
            verify_ssl=bool(opts.verify_ssl),
            request_timeout_s=float(opts.request_timeout_s),
            eviction_retries=int(opts.eviction_retries),
            eviction_backoff_s=float(opts.eviction_backoff_s),
            eviction_backoff_max_s=float(opts.eviction_backoff_max_s),
            drain_wait_s=float(opts.drain_wait_s),
            poll_interval_s=float(opts.poll_interval_s),
            burnin_command=tuple(opts.burnin_command) if opts.burnin_command else None,
            burnin_gpus=int(opts.burnin_gpus),
            burnin_seconds=float(opts.burnin_seconds),
            burnin_size=int(opts.burnin_size),
            burnin_min_gflops=float(opts.burnin_min_gflops),
            burnin_timeout_s=float(opts.burnin_timeout_s),
            burnin_namespace=opts.burnin_namespace or opts.namespace,
        )

    @property
    def workload_kind(self) -> str:
        """The workload object's kind as the API names it ("none" without one)."""
        return {"job": "Job", "jobset": "JobSet"}.get(self.workload, "none")
