"""`KubernetesDriver`: the `Driver` interface (recovery.drivers) over the
kubernetes modules: built from a cluster's `driver_options`, each call handed
to the module that owns it (nodes, workloads, validation)."""

from __future__ import annotations

from recovery.drivers.kubernetes import nodes, validation, workloads
from recovery.drivers.kubernetes.client import KubeClient
from recovery.drivers.kubernetes.options import KubernetesOptions


class KubernetesDriver:
    name = "kubernetes"

    def __init__(self, *, configuration=None, **settings):
        """`settings`: the cluster's driver_options (docs/drivers-kubernetes.md);
        `configuration`: a ready `kubernetes.client.Configuration` instead."""
        self.options = KubernetesOptions.from_settings(settings)
        self.kube = KubeClient(self.options, configuration)

    def cordon(self, node, *, key):
        return nodes.cordon(self.kube, node, key=key)

    def uncordon(self, node, *, key):
        return nodes.uncordon(self.kube, node, key=key)

    def drain(self, node, *, key):
        return nodes.drain(self.kube, node, key=key)

    def restart_job(self, job, from_step, nodes, *, key):
        return workloads.restart_job(self.kube, job, from_step, nodes, key=key)

    def replace_node(self, job, node, spare, *, key):
        return workloads.replace_node(self.kube, job, node, spare, key=key)

    def scale_down(self, job, nodes, *, key):
        return workloads.scale_down(self.kube, job, nodes, key=key)

    def validate_node(self, node, *, key):
        return validation.validate_node(self.kube, node, key=key)

    def checkpoint_job(self, job, *, key):
        return workloads.checkpoint_job(self.kube, job, key=key)

    def node_status(self, node):
        return nodes.node_status(self.kube, node)

    def job_status(self, job):
        return workloads.job_status(self.kube, job)
