"""Cluster drivers: what carries an action out on the cluster's own scheduler.

One small interface (`Driver`); a cluster picks its driver by name in its
ClusterRecoverySettings (blank: the REBOUND_RECOVERY_DRIVER setting, default
"local"). Drivers name things as the cluster does: job keys and node names.

Every call must be idempotent: a worker may die mid-call and the reconciler
runs the action again. A driver checks the state first and does only what is
still missing (cordoning a cordoned node is a success that changes nothing).
`key` identifies the action ("rebound:action-<id>"): a driver marks what it
does with it (a drain reason, a label) and undoes only what carries its mark.

Errors: DriverTransientError (worth retrying: a timeout, a busy scheduler) and
DriverError (permanent: the action fails). Methods return a small JSON-able dict
describing what was done, kept as the action's output.

Drivers: `local` (recovery.drivers.local, the machine's own LocalCluster of
real processes), `noop` (records calls; for dry runs and tests) and `slurm`
(the recovery.drivers.slurm package: scontrol, sbatch, squeue on a Slurm
cluster; docs/drivers-slurm.md). `kubernetes` (the recovery.drivers.kubernetes
package) acts through the official client; it is tested against recorded API
responses only (docs/drivers-kubernetes.md). `burnin` is the GPU burn-in that
validate_node runs, and how every driver builds its command and reads its answer.
"""

from __future__ import annotations

from importlib import import_module
from typing import Protocol, runtime_checkable

from django.conf import settings


class DriverError(Exception):
    """The cluster refused or failed the operation; retrying will not help.
    `output`: what the driver found, kept on the action beside the error."""

    def __init__(self, message: str, *, output: dict | None = None):
        super().__init__(message)
        self.output = output or {}


class DriverTransientError(DriverError):
    """The operation may succeed if tried again later."""


@runtime_checkable
class Driver(Protocol):
    name: str

    def cordon(self, node: str, *, key: str) -> dict:
        """No new work is placed on the node; running work stays."""

    def uncordon(self, node: str, *, key: str) -> dict:
        """Undo our cordon (never another's)."""

    def drain(self, node: str, *, key: str) -> dict:
        """Cordon, and stop the work on the node (a training gang restarts elsewhere)."""

    def restart_job(
        self, job: str, from_step: int | None, nodes: list[str] | None, *, key: str
    ) -> dict:
        """Relaunch the job from `from_step`'s checkpoint (None: the latest complete one),
        on `nodes` (None: where it ran)."""

    def replace_node(self, job: str, node: str, spare: str, *, key: str) -> dict:
        """Relaunch the job with `node` swapped for `spare`, from the latest checkpoint."""

    def scale_down(self, job: str, nodes: list[str], *, key: str) -> dict:
        """Relaunch the job without `nodes`, on fewer ranks."""

    def validate_node(self, node: str, *, key: str) -> dict:
        """A burn-in before the node may return to the spare pool; raises DriverError
        when the node fails it."""

    def checkpoint_job(self, job: str, *, key: str) -> dict:
        """Ask the running job to save a checkpoint now (at its next step); done once
        the request is delivered: the save itself is the job's (docs/checkpoint-now.md).
        A repeat with the same key delivers nothing new."""

    def node_status(self, node: str) -> dict: ...

    def job_status(self, job: str) -> dict: ...


DRIVERS = {
    "local": "recovery.drivers.local.LocalDriver",
    "noop": "recovery.drivers.noop.NoopDriver",
    "slurm": "recovery.drivers.slurm.SlurmDriver",
    "kubernetes": "recovery.drivers.kubernetes.KubernetesDriver",
}


def driver_name(cluster) -> str:
    from recovery.models import ClusterRecoverySettings

    row = ClusterRecoverySettings.objects.filter(cluster=cluster).first()
    return (row.driver if row else "") or getattr(settings, "REBOUND_RECOVERY_DRIVER", "local")


def get_driver(cluster) -> Driver:
    """The cluster's driver, built with its options (ClusterRecoverySettings.driver_options)."""
    from recovery.models import ClusterRecoverySettings

    row = ClusterRecoverySettings.objects.filter(cluster=cluster).first()
    name = driver_name(cluster)
    path = DRIVERS.get(name)
    if path is None:
        raise DriverError(f"unknown driver {name!r}; one of {', '.join(sorted(DRIVERS))}")
    module, _, cls = path.rpartition(".")
    return getattr(import_module(module), cls)(**((row.driver_options if row else None) or {}))
