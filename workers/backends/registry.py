"""Which backend runs a cluster's workloads, chosen by the cluster's kind: the one place where a
backend is built from a Cluster row (its ``connection`` settings and the portal's) and reattached to
a workload's saved state."""

from __future__ import annotations

from typing import Any

from workers.backends.base import Backend, BackendError
from workers.backends.local import LocalBackend
from workers.backends.slurm import SlurmBackend


def backend_for(cluster: Any, state: dict[str, Any] | None = None) -> Backend:
    """The backend object for one workload on ``cluster`` (an inventory Cluster row), reattached to
    ``state`` where given: what its ``get_state()`` returned, as saved on the workload's row.

    ``BackendError(permanent=True)`` for a kind no backend runs, connection settings the backend
    refuses, or a state it cannot read."""
    backend = _build(cluster)
    if state is not None:
        backend.load_state(state)
    return backend


def _build(cluster: Any) -> Backend:
    kind = getattr(cluster, "kind", None)
    if kind == "local":
        from django.conf import settings

        return LocalBackend(
            env_root=str(settings.PORTAL_NOTEBOOK_ENV_DIR),
            notebook_start_timeout_s=float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S),
            owner=str(settings.PORTAL_WORK_DIR),
            sandbox=str(settings.PORTAL_SANDBOX),
            run_dir=str(settings.PORTAL_RUN_DIR),
            log_max_bytes=int(settings.PORTAL_LOG_MAX_MB) << 20,
            resource_limits=str(settings.PORTAL_RESOURCE_LIMITS),
            cgroup_root=str(settings.PORTAL_CGROUP_ROOT),
            pids_max=int(settings.PORTAL_WORKLOAD_PIDS_MAX),
            ray_start_timeout_s=float(settings.PORTAL_RAY_START_TIMEOUT_S),
        )
    if kind == "slurm":
        from django.conf import settings

        return SlurmBackend(
            partition=str(getattr(cluster, "connection", {}).get("partition", "gpu")),
            env_root=str(settings.PORTAL_NOTEBOOK_ENV_DIR),
            notebook_start_timeout_s=float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S),
            owner=str(settings.PORTAL_WORK_DIR),
            python=str(settings.PORTAL_NOTEBOOK_PYTHON),
            ray_start_timeout_s=float(settings.PORTAL_RAY_START_TIMEOUT_S),
        )
    if kind == "kubernetes":
        from workers.backends.kubernetes import KubernetesBackend  # the client is loaded only where it is used

        return KubernetesBackend.from_connection(getattr(cluster, "connection", None) or {})
    raise BackendError(f"the {kind} backend does not run workloads yet", permanent=True)
