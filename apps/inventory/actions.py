"""Keeping the inventory of clusters, nodes and GPUs in step with what is really there."""

from __future__ import annotations

import socket
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from apps.api.errors import ActionError, Conflict
from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.inventory.discovery import GPUInfo, local_gpus
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.scheduling.trigger import request_cycle

LOCAL_CLUSTER = "local"


def do_sync_local_cluster(
    gpus: list[GPUInfo] | None = None, *, acting_user: Any = None, origin: Origin = SYSTEM
) -> Cluster:
    """Register this machine as the 'local' cluster with the GPUs NVML finds (or those declared).

    GPUs that disappeared are removed unless a workload holds them; they are then left for the
    reconcile loop to resolve.
    """
    gpus = local_gpus(settings.PORTAL_DECLARED_GPUS) if gpus is None else gpus
    with transaction.atomic():
        cluster, created = Cluster.objects.get_or_create(
            name=LOCAL_CLUSTER,
            defaults={"kind": Cluster.Kind.LOCAL, "is_default": not Cluster.objects.filter(is_default=True).exists()},
        )
        pool, _ = NodePool.objects.get_or_create(cluster=cluster, name="default")
        node, _ = Node.objects.update_or_create(
            pool=pool,
            name=socket.gethostname(),
            defaults={
                "cpu_cores": settings.PORTAL_LOCAL_CPU_CORES,
                "memory_gb": settings.PORTAL_LOCAL_MEMORY_GB,
                "state": Node.State.READY,
            },
        )
        for info in gpus:
            GPU.objects.update_or_create(
                node=node,
                index=info.index,
                defaults={
                    "uuid": info.uuid,
                    "gpu_type": info.gpu_type,
                    "model": info.model,
                    "memory_mb": info.memory_mb,
                    "architecture": info.architecture,
                    "declared": info.declared,
                },
            )
        node.gpus.exclude(index__in=[g.index for g in gpus]).filter(allocations__isnull=True).delete()
        cluster.discovered_at = timezone.now()
        cluster.save(update_fields=["discovered_at"])
        do_log_event(
            "cluster.discover",
            cluster,
            acting_user=acting_user,
            origin=origin,
            data={"gpus": len(gpus), "declared": any(g.declared for g in gpus), "created": created},
        )
        request_cycle()
    return cluster


def do_save_cluster(cluster: Cluster, fields: dict[str, Any], *, acting_user: Any, origin: Origin = SYSTEM) -> Cluster:
    """Register a cluster (an unsaved one) or change one; at most one is the default."""
    with transaction.atomic():
        created = cluster.pk is None
        changed = apply_changes(cluster, fields)
        if cluster.is_default:
            Cluster.objects.exclude(pk=cluster.pk).filter(is_default=True).update(is_default=False)
        try:
            with transaction.atomic():
                cluster.save()
        except IntegrityError:
            raise ActionError(f"A cluster named {cluster.name} already exists.", field="name") from None
        changed.pop("connection", None)  # may hold credentials: never in the audit trail
        do_log_event(
            "cluster.create" if created else "cluster.update",
            cluster,
            acting_user=acting_user,
            origin=origin,
            data=changed,
        )
    return Cluster.objects.annotate(
        gpu_count=Count("pools__nodes__gpus", distinct=True), node_count=Count("pools__nodes", distinct=True)
    ).get(pk=cluster.pk)


def do_delete_cluster(cluster: Cluster, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Remove a cluster nothing runs on and no workload refers to."""
    with transaction.atomic():
        if Allocation.objects.filter(gpu__node__pool__cluster=cluster).exists():
            raise Conflict(f"Cluster {cluster.name} has GPUs in use; drain it first.")
        do_log_event("cluster.delete", cluster, acting_user=acting_user, origin=origin)
        try:
            with transaction.atomic():
                cluster.delete()
        except ProtectedError:
            raise Conflict(f"Workloads still refer to cluster {cluster.name}; disable it instead.") from None
