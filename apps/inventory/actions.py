"""Keeping the inventory of clusters, nodes and GPUs in step with what is really there."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict
from apps.inventory.discovery import GPUInfo, gpus_by_node, local_gpus
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.names import validate_dns_label
from apps.scheduling.trigger import request_cycle
from workers.backends.base import BackendError, NodeInfo, PolicyRefusal
from workers.backends.registry import backend_for

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
            Event.CLUSTER_DISCOVER,
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
            Event.CLUSTER_CREATE if created else Event.CLUSTER_UPDATE,
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
        do_log_event(Event.CLUSTER_DELETE, cluster, acting_user=acting_user, origin=origin)
        try:
            with transaction.atomic():
                cluster.delete()
        except ProtectedError:
            raise Conflict(f"Workloads still refer to cluster {cluster.name}; disable it instead.") from None


# --- Clusters with their own scheduler: Slurm, Kubernetes ----------------------------------------


class ClusterUnavailable(ActionError):
    """The cluster did not answer, or answered with an error, when asked what it has."""

    status_code = HTTPStatus.SERVICE_UNAVAILABLE
    code = "cluster_unavailable"


@dataclass(frozen=True)
class Discovered:
    """What a cluster reported: its nodes (all of the pool's, GPUs or not) and their GPUs by node."""

    pool: str
    nodes: list[NodeInfo]
    gpus: dict[str, list[GPUInfo]]

    @property
    def gpu_count(self) -> int:
        return sum(len(gpus) for gpus in self.gpus.values())


def _pool_name(pool: str) -> str:
    """The node pool the backend files its nodes in (a Slurm partition), named after it (as a DNS label)."""
    return re.sub(r"[^a-z0-9-]+", "-", pool.lower()).strip("-")[:63].strip("-") or "default"


def discover_cluster(cluster: Cluster) -> Discovered:
    """Ask a cluster's backend for its nodes and GPUs (its ``nodes()`` and ``discover()``: for Slurm,
    the nodes of the partition named in ``cluster.connection``; for Kubernetes, the API server's).
    Writes nothing, so it is called outside any transaction. ``ClusterUnavailable`` when the
    cluster does not answer; ``ActionError`` for connection settings the backend refuses or that
    name nothing to discover (a partition without nodes), or a backend that cannot discover."""
    if cluster.kind == Cluster.Kind.LOCAL:
        raise ActionError("This machine is the cluster 'local': sync_inventory discovers it.", field="kind")
    try:
        backend = backend_for(cluster)
    except BackendError as exc:  # connection settings the backend refuses
        raise ActionError(exc.message, field="connection") from None
    try:
        nodes = backend.nodes()
        gpus = gpus_by_node(backend.discover())
    except PolicyRefusal as exc:
        raise ActionError(str(exc), field="connection") from None
    except BackendError as exc:
        kind = cluster.get_kind_display()
        raise ClusterUnavailable(f"Could not reach {kind} cluster {cluster.name}: {exc.message}") from None
    return Discovered(_pool_name(nodes[0].pool) if nodes else "default", nodes, gpus)


def _apply_discovery(cluster: Cluster, found: Discovered) -> None:
    """Make the cluster's nodes and GPUs what `found` says. A node or GPU that vanished is removed
    unless a workload holds one of its GPUs: that node is then marked down, for reconcile to resolve."""
    pool, _ = NodePool.objects.get_or_create(cluster=cluster, name=found.pool)
    gone = {node.name: node for node in Node.objects.filter(pool__cluster=cluster)}
    for facts in found.nodes:
        node = gone.pop(facts.name, None) or Node(name=facts.name)
        node.pool = pool
        node.cpu_cores, node.memory_gb, node.state = facts.cpu_cores, facts.memory_mb // 1024, facts.state
        # Only what the cluster reports: a cordon made meanwhile (apps/inventory/maintenance.py) stays.
        node.save(update_fields=["pool", "cpu_cores", "memory_gb", "state", "updated_at"] if node.pk else None)
        gpus = found.gpus.get(facts.name, [])
        for info in gpus:
            GPU.objects.update_or_create(
                node=node,
                index=info.index,
                defaults={"uuid": info.uuid, "gpu_type": info.gpu_type, "model": info.model,
                          "memory_mb": info.memory_mb, "architecture": info.architecture, "declared": False},
            )  # fmt: skip
        node.gpus.exclude(index__in=[g.index for g in gpus]).filter(allocations__isnull=True).delete()
    for node in gone.values():
        node.gpus.filter(allocations__isnull=True).delete()
        if node.gpus.exists():
            node.state = Node.State.DOWN
            node.save(update_fields=["state", "updated_at"])
        else:
            node.delete()
    NodePool.objects.filter(cluster=cluster, nodes__isnull=True).exclude(pk=pool.pk).delete()


def _record_discovery(
    cluster: Cluster, found: Discovered, *, created: bool, acting_user: Any, origin: Origin
) -> Cluster:
    _apply_discovery(cluster, found)
    cluster.discovered_at = timezone.now()
    cluster.save(update_fields=["discovered_at"])
    do_log_event(
        Event.CLUSTER_DISCOVER,
        cluster,
        acting_user=acting_user,
        origin=origin,
        data={"nodes": len(found.nodes), "gpus": found.gpu_count, "created": created},
    )
    request_cycle()
    return cluster


def do_discover_cluster(cluster: Cluster, *, acting_user: Any = None, origin: Origin = SYSTEM) -> Cluster:
    """Refresh a registered cluster's nodes and GPUs from what it reports (local: NVML or the
    declared inventory; Slurm: its partition's nodes; Kubernetes: the API server's nodes).
    ``ClusterUnavailable`` if it does not answer."""
    if cluster.kind == Cluster.Kind.LOCAL:
        return do_sync_local_cluster(acting_user=acting_user, origin=origin)
    found = discover_cluster(cluster)
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        return _record_discovery(cluster, found, created=False, acting_user=acting_user, origin=origin)


def do_register_cluster(
    name: str,
    *,
    kind: str,
    connection: dict[str, Any],
    acting_user: Any = None,
    origin: Origin = SYSTEM,
) -> Cluster:
    """Register a cluster with its own scheduler (Slurm, Kubernetes) and the nodes and GPUs it reports, or
    refresh one registered before (its connection settings are updated with `connection`).

    The cluster is asked first: if it does not answer (``ClusterUnavailable``) nothing is written.
    A Slurm cluster's partition is ``gpu`` unless `connection` names one. A new cluster becomes the
    default only where there is none.
    """
    try:
        validate_dns_label(name)
    except ValidationError as exc:
        raise ActionError(f"{name!r}: {exc.messages[0]}", field="name") from None
    existing = Cluster.objects.filter(name=name).first()
    if existing is not None and existing.kind != kind:
        raise ActionError(f"Cluster {name} is a {existing.kind} cluster, not {kind}.", field="kind")
    merged = {**(existing.connection if existing else {}), **connection}
    if kind == Cluster.Kind.SLURM:
        merged.setdefault("partition", "gpu")
    found = discover_cluster(Cluster(name=name, kind=kind, connection=merged))
    with transaction.atomic():
        if existing is None:
            fields = {"name": name, "kind": kind, "connection": merged,
                      "is_default": not Cluster.objects.filter(is_default=True).exists()}  # fmt: skip
            cluster = do_save_cluster(Cluster(), fields, acting_user=acting_user, origin=origin)
        else:
            cluster = Cluster.objects.select_for_update().get(pk=existing.pk)
            if cluster.connection != merged:
                cluster = do_save_cluster(cluster, {"connection": merged}, acting_user=acting_user, origin=origin)
        return _record_discovery(cluster, found, created=existing is None, acting_user=acting_user, origin=origin)
