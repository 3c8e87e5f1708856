"""Ray clusters as a kind of workload of the host (apps/workloads/host.py).

An admitted cluster is started (its backend returns once every node joined); a running one is
watched: its nodes as its backend reports them (a dead or missing one makes it degraded), and its
end (an entrypoint's exit, a failure); a deleted or preempted one is stopped, and a preempted one
then goes back in line. Its backend state is kept once it stopped, so that its logs and artifacts
stay readable.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q

from apps.accounts.tokens import workload_env
from apps.inventory.models import Allocation
from apps.jobs.artifacts import limits
from apps.rayclusters import actions
from apps.rayclusters.models import RayCluster
from apps.workloads import host
from apps.workloads.host import Kind, Phase
from apps.workspaces.disks import disk_for
from apps.workspaces.unix import run_as_for
from workers.backends.base import Backend, BackendError, Endpoint, NodeGroup, Progress, RayClusterSpec, Status

logger = logging.getLogger(__name__)

State = RayCluster.State


def node_states(backend: Backend) -> list[dict[str, Any]]:
    """Each node of the cluster a backend holds, as ``{"name", "role", "alive"}``: the head first.
    Backends say it in their own words (a dict per node on this machine, Ray's node states on
    Slurm); one that cannot say gives ``[]``."""
    read = getattr(backend, "ray_nodes", None)
    if read is None:
        return []
    try:
        nodes = read()
    except BackendError:
        return []
    found = []
    for node in nodes:
        if isinstance(node, dict):
            name, alive = str(node.get("name", "")), bool(node.get("alive")) and node.get("joined", True) is not False
        else:
            name, alive = str(getattr(node, "name", "")), getattr(node, "state", "") == "ALIVE"
        found.append({"name": name, "role": "head" if name == "head" else "worker", "alive": alive})
    return found


class RayClusterKind(Kind):
    name = "raycluster"
    model = RayCluster
    start_states = (State.ADMITTED,)
    live_states = RayCluster.LIVE_STATES
    keeps_state_after_stop = True

    def phase(self, row: RayCluster) -> Phase | None:
        if row.state == State.ADMITTED:
            return Phase.START
        if row.backend_state is None or row.backend_stopped:
            return None
        if row.state in (State.RUNNING, State.DEGRADED):
            return Phase.WATCH
        if row.state in (State.STOPPING, State.PREEMPTED):
            return Phase.STOP
        return None

    def due(self, lost_before: datetime) -> Iterable[int]:
        live = Q(
            state__in=[State.RUNNING, State.DEGRADED, State.STOPPING, State.PREEMPTED],
            backend_stopped=False,
            backend_state__isnull=False,
        )
        lost = Q(state=State.ADMITTED, admitted_at__lt=lost_before)
        return RayCluster.objects.filter(live | lost).values_list("pk", flat=True)

    def start_timeout_s(self) -> float:
        return float(settings.PORTAL_RAY_START_TIMEOUT_S)

    def spec(self, row: RayCluster) -> RayClusterSpec:
        devices: dict[tuple[str, int], list[str]] = defaultdict(list)
        held = Allocation.objects.filter(workload=row).order_by("podset__position", "replica", "gpu__index")
        for role, replica, index in held.values_list("podset__role", "replica", "gpu__index"):
            devices[role, replica].append(str(index))
        return RayClusterSpec(
            key=self.key(row.pk),
            workspace=row.workspace.name,
            name=row.name,
            work_dir=str(Path(settings.PORTAL_WORK_DIR) / row.workspace.name),
            auth_token=row.auth_token,
            head=NodeGroup(
                "head",
                replicas=1,
                gpu_type=row.gpu_type if row.head_gpus else "",
                gpus=float(row.head_gpus),
                cpu_cores=float(row.head_cpu_cores),
                memory_gb=float(row.head_memory_gb),
                devices=[devices.get(("head", 0), [])] if row.head_gpus else [],
            ),
            workers=NodeGroup(
                "worker",
                replicas=row.workers,
                gpu_type=row.gpu_type if row.worker_gpus else "",
                gpus=float(row.worker_gpus),
                cpu_cores=float(row.worker_cpu_cores),
                memory_gb=float(row.worker_memory_gb),
                devices=[devices.get(("worker", r), []) for r in range(row.workers)] if row.worker_gpus else [],
            ),
            entrypoint=row.entrypoint,
            image=row.image,
            env=dict(row.env),
            artifact_paths=list(row.artifact_paths),
            max_runtime_s=float(row.max_runtime_s) if row.max_runtime_s else None,
            run_as=run_as_for(row.workspace, row.cluster),
            disk=disk_for(row.workspace, row.cluster),
            portal_env=workload_env(row),  # the SDK and CLI work on its nodes, acting for its creator
        )

    def record_start(self, row: RayCluster, endpoint: Endpoint, *, restarted: bool) -> None:
        nodes = [{"name": "head", "role": "head", "alive": True}]
        nodes += [{"name": f"worker-{i}", "role": "worker", "alive": True} for i in range(row.workers)]
        actions.record_cluster_ready(row, target=endpoint.url, nodes=nodes)

    def record_start_failure(self, row: RayCluster, reason: str, *, timed_out: bool) -> None:
        actions.record_cluster_end(row, State.FAILED, exit_code=None, reason=reason)

    def observe(self, row: RayCluster, backend: Backend) -> list[dict[str, Any]]:
        return node_states(backend)

    def changes(self, row: RayCluster, progress: Progress | None, observed: Any) -> bool:
        """Only a change of its nodes, or of whether one is missing, is written."""
        return bool(observed) and (
            observed != row.nodes or actions.is_degraded(row, observed) != (row.state == State.DEGRADED)
        )

    def record_observed(self, row: RayCluster, observed: Any) -> None:
        if observed:
            actions.record_cluster_nodes(row, observed)

    def record_exit(self, row: RayCluster, status: Status, progress: Progress | None) -> None:
        code = status.exit_code
        if row.entrypoint and code == 0:
            actions.record_cluster_end(row, State.SUCCEEDED, exit_code=0, reason="")
            return
        if row.entrypoint:
            reason = f"its entrypoint exited with {code}" if code is not None else "its entrypoint did not finish"
        else:
            reason = "the cluster ended by itself: " + (status.message or f"its head exited with {code}")
        actions.record_cluster_end(row, State.FAILED, exit_code=code, reason=reason)

    def record_stop(self, row: RayCluster, ran: bool) -> None:
        actions.record_cluster_stop(row)

    def ended(self, row: RayCluster) -> None:
        """What it left under its artifact paths is recorded, read here with no transaction open."""
        if row.backend_state is None or not row.artifact_paths or row.cluster is None:
            return
        try:
            found = host.backend_of(self, row).artifacts(limits())
        except BackendError:
            logger.warning("could not read the artifacts of Ray cluster %s", row.pk, exc_info=True)
            return
        actions.record_artifacts(row, found)

    def record_host_stop(self, row: RayCluster) -> None:
        row.save()
        if not row.is_final:  # it runs again at the next start
            actions.back_in_line(row, "requeued: the portal stopped")
            row.save()


def register() -> None:
    host.register(RayClusterKind())
