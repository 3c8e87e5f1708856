"""State changes of Ray clusters.

``check_create_cluster`` validates a request and queues it; the scheduler admits it as a whole
(head and workers at once, apps/scheduling); the workload host (apps/workloads/host.py, through
apps/rayclusters/hosting.py) starts it and calls the ``record_*`` actions on the row it locked.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict, LimitExceeded
from apps.inventory.models import Allocation, Cluster
from apps.jobs.actions import check_cluster_fits, read_policies
from apps.jobs.models import Artifact
from apps.rayclusters.models import MAX_WORKERS, RayCluster
from apps.scheduling.limits import check_request_size, check_runtime_limit, gpu_ceiling
from apps.scheduling.trigger import request_cycle, request_workload
from apps.workspaces.live import notify
from apps.workspaces.models import Workspace
from workers.backends.base import Artifacts

KIND = "raycluster"


def _live(cluster: RayCluster, **extra: Any) -> None:
    notify(cluster.workspace_id, KIND, {"id": cluster.pk, "state": cluster.state, **extra})


def check_create_cluster(
    workspace: Workspace,
    *,
    name: str,
    acting_user: Any,
    origin: Origin = SYSTEM,
    workers: int = 1,
    gpu_type: str = "",
    head_gpus: Decimal = Decimal("0"),
    head_cpu_cores: int = 1,
    head_memory_gb: int = 4,
    worker_gpus: Decimal = Decimal("0"),
    worker_cpu_cores: int = 1,
    worker_memory_gb: int = 4,
    entrypoint: str = "",
    image: str = "",
    env: dict[str, str] | None = None,
    artifact_paths: list[str] | None = None,
    max_runtime_s: int | None = None,
    priority: int = 0,
    preemptible: bool = True,
    description: str = "",
    requested_cluster: Cluster | None = None,
) -> RayCluster:
    """Validate a Ray cluster against the workspace's policies and hard limits, and queue it: it
    waits until the scheduler admits its head and all its workers at once."""
    if not 0 <= workers <= MAX_WORKERS:
        raise ActionError(f"A cluster has 0 to {MAX_WORKERS} workers.", field="workers")
    if head_cpu_cores < 1:
        raise ActionError("The head needs at least one CPU core: it runs Ray's own services.", field="head_cpu_cores")
    if workers and worker_cpu_cores < 1:
        raise ActionError("Each worker needs at least one CPU core.", field="worker_cpu_cores")
    if (head_gpus or worker_gpus) and not gpu_type:
        raise ActionError("Name the GPU type of a cluster with GPUs.", field="gpu_type")
    if RayCluster.objects.filter(workspace=workspace, name=name, state__in=RayCluster.LIVE_STATES).exists():
        raise Conflict(f"Workspace {workspace.name} already has a live cluster named {name}.", field="name")
    with transaction.atomic():
        workspace = read_policies(workspace)
        max_runtime_s = check_runtime_limit(workspace, max_runtime_s)
        _check_size(
            workspace,
            gpu_type=gpu_type,
            head=(head_gpus, head_cpu_cores, head_memory_gb),
            workers=workers,
            worker=(worker_gpus, worker_cpu_cores, worker_memory_gb),
        )
        if requested_cluster is not None:
            for gpus, replicas, cpu, memory in (
                (head_gpus, 1, head_cpu_cores, head_memory_gb),
                (worker_gpus, workers, worker_cpu_cores, worker_memory_gb),
            ):
                if replicas:
                    check_cluster_fits(
                        requested_cluster,
                        gpu_type=gpu_type,
                        gpus_per_replica=gpus,
                        replicas=replicas,
                        cpu_cores=cpu,
                        memory_gb=memory,
                    )
        cluster = RayCluster.objects.create(
            workspace=workspace,
            name=name,
            description=description,
            gpu_type=gpu_type if (head_gpus or worker_gpus) else "",
            head_gpus=head_gpus,
            head_cpu_cores=head_cpu_cores,
            head_memory_gb=head_memory_gb,
            workers=workers,
            worker_gpus=worker_gpus,
            worker_cpu_cores=worker_cpu_cores,
            worker_memory_gb=worker_memory_gb,
            entrypoint=entrypoint,
            image=image,
            env=env or {},
            artifact_paths=artifact_paths or [],
            max_runtime_s=max_runtime_s,
            priority=priority,
            preemptible=preemptible,
            requested_cluster=requested_cluster,
            created_by=acting_user if acting_user.is_authenticated else None,
        )
        do_log_event(
            Event.RAY_CREATE,
            cluster,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"workers": workers, "gpus": f"{cluster.total_gpus.normalize():f} {gpu_type}".strip()},
        )
        _live(cluster)
        request_cycle()
    return cluster


def _check_size(
    workspace: Workspace,
    *,
    gpu_type: str,
    head: tuple[Decimal, int, int],
    workers: int,
    worker: tuple[Decimal, int, int],
) -> None:
    """Refuse a cluster larger than the workspace could ever be given: each role's shape, and the
    whole cluster's GPUs, CPU and memory together."""
    (head_gpus, head_cpu, head_memory), (worker_gpus, worker_cpu, worker_memory) = head, worker
    for role, gpus, replicas, cpu, memory in (
        ("head", head_gpus, 1, head_cpu, head_memory),
        ("worker", worker_gpus, workers, worker_cpu, worker_memory),
    ):
        if not replicas:
            continue
        try:
            check_request_size(
                workspace, gpu_type=gpu_type, gpus_per_replica=gpus, replicas=replicas, cpu_cores=cpu, memory_gb=memory
            )
        except ActionError as refused:  # named by the cluster's own fields
            names = {"gpus_per_replica": f"{role}_gpus", "replicas": "workers", "cpu_cores": f"{role}_cpu_cores",
                     "memory_gb": f"{role}_memory_gb"}  # fmt: skip
            refused.field = names.get(refused.field or "", refused.field)
            raise
    # Together: as one replica of everything, against the workspace's totals and GPU ceiling.
    total_gpus = head_gpus + worker_gpus * workers
    cpu, memory = head_cpu + worker_cpu * workers, head_memory + worker_memory * workers
    if cpu > workspace.cpu_cores or memory > workspace.memory_gb or total_gpus:
        if cpu > workspace.cpu_cores:
            raise LimitExceeded(
                f"The cluster asks for {cpu} CPU cores in all; workspace {workspace.name} may use at most "
                f"{workspace.cpu_cores}.",
                field="workers",
            )
        if memory > workspace.memory_gb:
            raise LimitExceeded(
                f"The cluster asks for {memory} GB of memory in all; workspace {workspace.name} may use at most "
                f"{workspace.memory_gb} GB.",
                field="workers",
            )
        ceiling, how = gpu_ceiling(workspace, gpu_type)
        if total_gpus > ceiling:
            raise LimitExceeded(
                f"The cluster asks for {total_gpus.normalize():f} {gpu_type} GPUs in all; workspace "
                f"{workspace.name} can never hold more than {ceiling.normalize():f} ({how}).",
                field="workers",
            )


def do_delete_cluster(cluster: RayCluster, *, acting_user: Any, origin: Origin = SYSTEM) -> RayCluster:
    """Stop a cluster that has not ended (its Ray jobs with it) and give its devices back."""
    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update().get(pk=cluster.pk)
        if cluster.is_final:
            raise Conflict(f"Cluster {cluster.name} has already ended ({cluster.get_state_display().lower()}).")
        previous = cluster.state
        Allocation.objects.filter(workload=cluster).delete()
        cluster.wait_reason = ""
        cluster.workspace_queue_position = cluster.cluster_queue_position = None
        cluster.estimated_start_at = None
        if cluster.backend_state is None:  # nothing runs: it ends here
            cluster.state = RayCluster.State.STOPPED
            cluster.finished_at = timezone.now()
            cluster.start_claim = None
        else:
            cluster.state = RayCluster.State.STOPPING
        cluster.save()
        do_log_event(
            Event.RAY_DELETE,
            cluster,
            acting_user=acting_user,
            origin=origin,
            workspace=cluster.workspace,
            data={"previous_state": previous},
        )
        _live(cluster)
        request_cycle()
        if cluster.state == RayCluster.State.STOPPING:
            request_workload(KIND, cluster.pk)  # the worker stops its processes
    return cluster


def do_preempt_cluster(cluster: RayCluster, *, reason: str) -> RayCluster:
    """Evict an admitted or running cluster for other work (the scheduler's decision): its devices
    go back at once; one that never started goes back in line at once, a running one once its
    backend stopped it."""
    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update().get(pk=cluster.pk)
        if cluster.state not in (RayCluster.State.ADMITTED, RayCluster.State.RUNNING, RayCluster.State.DEGRADED):
            return cluster
        previous = cluster.state
        Allocation.objects.filter(workload=cluster).delete()
        if cluster.backend_state is None and cluster.start_claim is None:
            back_in_line(cluster, f"requeued after preemption: {reason}")
        else:
            cluster.state = RayCluster.State.PREEMPTED
            cluster.wait_reason = reason[:500]
        cluster.save()
        do_log_event(
            Event.RAY_PREEMPT,
            cluster,
            workspace=cluster.workspace,
            data={"reason": reason, "previous_state": previous},
        )
        _live(cluster, wait_reason=cluster.wait_reason)
        if cluster.state == RayCluster.State.PREEMPTED:
            request_workload(KIND, cluster.pk)
        else:
            request_cycle()
    return cluster


def back_in_line(cluster: RayCluster, wait_reason: str) -> None:
    """Back to QUEUED (the caller saves it), keeping its place: its devices, cluster, run and
    nodes forgotten."""
    Allocation.objects.filter(workload=cluster).delete()
    cluster.state = RayCluster.State.QUEUED
    cluster.admitted_at = cluster.started_at = None
    cluster.cluster = None
    cluster.wait_reason = wait_reason[:500]
    cluster.backend_state = cluster.start_claim = None
    cluster.backend_stopped = False
    cluster.nodes = []
    cluster.proxy_target = ""


def record_cluster_ready(cluster: RayCluster, *, target: str, nodes: list[dict[str, Any]]) -> None:
    """Every node joined (the host set its backend state)."""
    cluster.state = RayCluster.State.RUNNING
    cluster.started_at = timezone.now()
    cluster.attempts += 1
    cluster.wait_reason = ""
    cluster.proxy_target = target
    cluster.nodes = nodes
    cluster.save()
    do_log_event(Event.RAY_READY, cluster, workspace=cluster.workspace, data={"attempt": cluster.attempts})
    _live(cluster)


def is_degraded(cluster: RayCluster, nodes: list[dict[str, Any]]) -> bool:
    """A node is dead, or fewer than its head and workers reported."""
    return any(not node.get("alive") for node in nodes) or len(nodes) < 1 + cluster.workers


def record_cluster_nodes(cluster: RayCluster, nodes: list[dict[str, Any]]) -> None:
    """What its backend says of its nodes while it runs: a missing or dead one makes it degraded
    (never "running" with missing workers), all alive again repaired."""
    degraded = is_degraded(cluster, nodes)
    if nodes == cluster.nodes and degraded == (cluster.state == RayCluster.State.DEGRADED):
        return
    cluster.nodes = nodes
    previous = cluster.state
    if cluster.state in (RayCluster.State.RUNNING, RayCluster.State.DEGRADED):
        cluster.state = RayCluster.State.DEGRADED if degraded else RayCluster.State.RUNNING
    cluster.save(update_fields=["nodes", "state"])
    if cluster.state != previous:
        gone = [node["name"] for node in nodes if not node.get("alive")]
        event = Event.RAY_DEGRADED if degraded else Event.RAY_REPAIRED
        do_log_event(event, cluster, workspace=cluster.workspace, data={"missing": gone})
    _live(cluster, nodes=nodes)


def record_cluster_end(cluster: RayCluster, state: str, *, exit_code: int | None, reason: str) -> None:
    """It ended: by itself (its entrypoint's exit, a failure) or stopped on request."""
    Allocation.objects.filter(workload=cluster).delete()
    cluster.state = state
    cluster.exit_code = exit_code
    cluster.finished_at = timezone.now()
    cluster.failure_reason = reason[:2000] if state == RayCluster.State.FAILED else ""
    cluster.proxy_target = ""
    cluster.save()
    event = {
        RayCluster.State.SUCCEEDED: Event.RAY_SUCCEEDED,
        RayCluster.State.FAILED: Event.RAY_FAILED,
        RayCluster.State.STOPPED: Event.RAY_STOPPED,
    }[RayCluster.State(state)]
    do_log_event(event, cluster, workspace=cluster.workspace, data={"exit_code": exit_code, "reason": reason})
    _live(cluster, exit_code=exit_code, failure_reason=cluster.failure_reason)
    request_cycle()


def record_cluster_stop(cluster: RayCluster) -> None:
    """Its backend stopped it: a preempted cluster goes back in line, a deleted one has ended."""
    if cluster.state == RayCluster.State.PREEMPTED:
        reason = cluster.wait_reason or "preempted"
        back_in_line(cluster, f"requeued: {reason}")
        cluster.save()
        do_log_event(Event.RAY_REQUEUE, cluster, workspace=cluster.workspace, data={"reason": reason})
        _live(cluster, wait_reason=cluster.wait_reason)
        request_cycle()
        return
    record_cluster_end(cluster, RayCluster.State.STOPPED, exit_code=None, reason="deleted")


def record_artifacts(cluster: RayCluster, found: Artifacts) -> None:
    """What a cluster that ran left under its artifact paths (read off any transaction)."""
    with transaction.atomic():
        Artifact.objects.filter(job_id=cluster.pk).delete()
        Artifact.objects.bulk_create(
            Artifact(job_id=cluster.pk, path=a.path, size_bytes=a.size, sha256=a.sha256) for a in found.files
        )
