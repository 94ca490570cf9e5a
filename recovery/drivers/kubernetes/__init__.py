"""The `kubernetes` driver: actions carried out through the Kubernetes API with
the official Python client (`pip install 'rebound[k8s]'`). Tested against
recorded API responses only.

What each operation does in Kubernetes terms, its options, errors and the RBAC
it needs: docs/drivers-kubernetes.md. One module per concern: `options`,
`marks`, `client` (connection, error translation), `pods`, `nodes`,
`workloads`, `validation` (the burn-in) and `driver` (the Driver interface).
"""

from recovery.drivers.kubernetes.driver import KubernetesDriver
from recovery.drivers.kubernetes.options import KubernetesOptions

__all__ = ["KubernetesDriver", "KubernetesOptions"]
