"""`SlurmDriver`: the `Driver` interface (recovery.drivers) over the slurm
modules. Built from a cluster's `driver_options`; each call gets a `Commands`
recorder of its own and is handed to the module that owns it."""

from __future__ import annotations

from recovery.drivers.slurm import nodes, validation, workloads
from recovery.drivers.slurm.client import Commands, SlurmClient
from recovery.drivers.slurm.options import SlurmOptions


class SlurmDriver:
    name = "slurm"

    def __init__(self, **settings):
        """`settings`: the cluster's driver_options (docs/drivers-slurm.md)."""
        self.options = SlurmOptions.from_settings(settings)
        self.client = SlurmClient(self.options)

    def _commands(self) -> Commands:
        return Commands(self.client)

    def cordon(self, node, *, key):
        return nodes.cordon(self._commands(), node, key=key)

    def uncordon(self, node, *, key):
        return nodes.uncordon(self._commands(), node, key=key)

    def drain(self, node, *, key):
        return nodes.drain(self._commands(), node, key=key)

    def restart_job(self, job, from_step, nodes, *, key):
        return workloads.restart_job(self._commands(), job, from_step, nodes, key=key)

    def replace_node(self, job, node, spare, *, key):
        return workloads.replace_node(self._commands(), job, node, spare, key=key)

    def scale_down(self, job, nodes, *, key):
        return workloads.scale_down(self._commands(), job, nodes, key=key)

    def checkpoint_job(self, job, *, key):
        return workloads.checkpoint_job(self._commands(), job, key=key)

    def validate_node(self, node, *, key):
        return validation.validate_node(self._commands(), node, key=key)

    def node_status(self, node):
        return nodes.node_status(self.client, node)

    def job_status(self, job):
        return workloads.job_status(self.client, job)

    # reads and the runner, for operators and tests

    def nodes(self) -> dict[str, dict]:
        return self.client.nodes()

    def jobs(self) -> list[dict]:
        return self.client.jobs()

    def run(self, *args: str, check: bool = True, stdin: str | None = None):
        """Run one Slurm command (recorded by no call)."""
        return self.client.run(*args, check=check, stdin=stdin)
