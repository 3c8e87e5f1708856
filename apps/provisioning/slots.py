"""The calendar's view of the portal: which whole devices a request could hold, and from when.

The engine's calendar (apps/scheduling/calendar.py) is pure; this loads what it needs from the
database (every ready device of the type, the other approved reservations, the running work that
may not be evicted) and maps the devices it chooses back to the inventory's GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Q

from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.provisioning.models import ProvisioningRequest
from apps.scheduling import calendar
from apps.scheduling.adapter import _node_name, as_reservation
from apps.scheduling.types import Device, NodeInfo, ReplicaPlacement, Workload
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload as Row

_ONE = Decimal("1")


@dataclass(frozen=True)
class Found:
    start: datetime
    cluster: Cluster
    gpu_ids: tuple[int, ...]  # the GPUs it would hold

    @property
    def gpus(self) -> int:
        return len(self.gpu_ids)


def find_slot(
    *,
    gpu_type: str,
    gpus: int,
    duration_s: float,
    not_before: datetime,
    cluster: Cluster | None = None,
    ignoring: ProvisioningRequest | None = None,
) -> Found | None:
    """The earliest start at or after `not_before` at which `gpus` whole devices of `gpu_type` (in
    `cluster`, or any one cluster) are free of other reservations for `duration_s` and of work that
    may not be evicted; None if no cluster could ever hold them. `ignoring`: a request being
    changed, whose own devices do not stand in its way."""
    clusters = Cluster.objects.filter(enabled=True, **({"pk": cluster.pk} if cluster else {}))
    best: Found | None = None
    for each in clusters.order_by("-is_default", "name"):
        found = _find_in(each, gpu_type, gpus, duration_s, not_before, ignoring)
        if found is not None and (best is None or found.start < best.start):
            best = found
    return best


def _find_in(
    cluster: Cluster, gpu_type: str, gpus: int, duration_s: float, not_before: datetime,
    ignoring: ProvisioningRequest | None,
) -> Found | None:  # fmt: skip
    devices: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)  # (node, type) -> (index, gpu id)
    for gpu_id, node_id, index in GPU.objects.filter(
        node__pool__cluster=cluster, node__state=Node.State.READY, gpu_type=gpu_type
    ).values_list("pk", "node_id", "index"):
        devices[node_id, gpu_type].append((index, gpu_id))
    if not devices:
        return None
    by_name = {_node_name(node_id, t): dict(held) for (node_id, t), held in devices.items()}
    nodes = [
        NodeInfo(
            name=_node_name(node_id, t),
            cluster=cluster.name,
            gpu_type=t,
            devices=tuple(Device(index, _ONE) for index, _ in sorted(held)),
        )  # fmt: skip
        for (node_id, t), held in sorted(devices.items())
    ]
    others = ProvisioningRequest.objects.filter(
        state__in=ProvisioningRequest.HOLDING_STATES, held_cluster=cluster, gpu_type=gpu_type,
        held_end__gt=not_before,
    ).select_related("workspace", "held_cluster").prefetch_related("devices")  # fmt: skip
    if ignoring is not None and ignoring.pk:
        others = others.exclude(pk=ignoring.pk)
    slot = calendar.earliest_start(
        gpus=gpus,
        gpu_type=gpu_type,
        cluster=cluster.name,
        duration_s=float(duration_s),
        not_before=not_before.timestamp(),
        nodes=nodes,
        reservations=[as_reservation(gpr) for gpr in others],
        running=_unevictable(cluster, gpu_type),
        whole_nodes=cluster.kind != Cluster.Kind.LOCAL,  # Slurm and Kubernetes reserve whole nodes
    )
    if slot is None:
        return None
    gpu_ids = tuple(by_name[node][index] for node, index in slot.devices)
    return Found(datetime.fromtimestamp(slot.start, tz=UTC), cluster, gpu_ids)


def _unevictable(cluster: Cluster, gpu_type: str) -> list[Workload]:
    """Running work on the cluster's devices of the type that the scheduler may not evict, with its
    placement and declared end: it keeps its devices until then (forever, without one)."""
    kinds = scheduled()
    holding = Q(pk__in=[])
    for kind, traits in kinds.items():
        holding |= Q(kind=kind, state__in=traits.holding)
    rows = {row.pk: row for row in Row.objects.filter(holding, cluster=cluster).select_related("workspace")}
    placements: dict[int, dict[str, list[tuple[int, Decimal]]]] = defaultdict(lambda: defaultdict(list))
    for workload_id, node_id, index, fraction in Allocation.objects.filter(
        workload_id__in=rows, gpu__gpu_type=gpu_type
    ).values_list("workload_id", "gpu__node_id", "gpu__index", "fraction"):
        placements[workload_id][_node_name(node_id, gpu_type)].append((index, fraction))
    details: dict[int, tuple[bool, float | None]] = {}
    for kind, traits in kinds.items():
        if traits.details is not None:
            details.update(traits.details(pk for pk, row in rows.items() if row.kind == kind))
    found = []
    for pk, by_node in placements.items():
        row = rows[pk]
        if kinds[row.kind].preempt is not None and row.preemptible:
            continue  # evicted in time for the reservation: see the engine
        started = row.started_at or row.admitted_at
        found.append(
            Workload(
                key=f"{row.kind}:{pk}",
                workspace=row.workspace.name,
                gpu_type=gpu_type,
                gpus_per_replica=_ONE,
                preemptible=False,
                max_runtime_s=details.get(pk, (False, None))[1],
                started_at=started.timestamp() if started else None,
                cluster=cluster.name,
                placement=tuple(ReplicaPlacement(node, tuple(held)) for node, held in sorted(by_node.items())),
            )
        )
    return found
