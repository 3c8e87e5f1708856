"""Loads the engine's snapshot from the database and applies its decisions in one transaction."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from apps.audit.actions import do_log_event
from apps.compute.models import Instance
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.jobs.models import Job
from apps.scheduling import engine
from apps.workspaces.live import notify
from apps.workspaces.models import GPUQuota, Workspace

logger = logging.getLogger(__name__)

# Any fixed number: it names the advisory lock that keeps two cycles from running at once.
_CYCLE_LOCK_ID = 7_400_113


@dataclass
class CycleResult:
    admitted: list[str] = field(default_factory=list)
    pending: int = 0


def _key(row: Instance | Job) -> str:
    return f"{'job' if isinstance(row, Job) else 'instance'}:{row.pk}"


def _as_workload(row: Instance | Job) -> engine.Workload:
    return engine.Workload(
        key=_key(row),
        workspace=row.workspace.name,
        gpu_type=row.gpu_type,
        gpus_per_replica=row.gpus_per_replica,
        replicas=row.replicas,
        priority=row.priority,
        seq=int(row.created_at.timestamp() * 1_000_000),
    )


def _load_nodes() -> tuple[tuple[engine.NodeInfo, ...], dict[tuple[int, int], int]]:
    """Nodes as (node pk/gpu type) entries with each device's free share, and a GPU-id lookup."""
    used = dict(Allocation.objects.values("gpu_id").annotate(total=Sum("fraction")).values_list("gpu_id", "total"))
    gpus = GPU.objects.filter(node__state=Node.State.READY, node__pool__cluster__enabled=True).values_list(
        "pk", "node_id", "index", "gpu_type", "node__pool__cluster__name"
    )
    devices: dict[tuple[int, str, str], list[engine.Device]] = {}
    lookup: dict[tuple[int, int], int] = {}
    for gpu_pk, node_pk, index, gpu_type, cluster in gpus.order_by("node_id", "index"):
        free = max(Decimal("0"), Decimal("1") - used.get(gpu_pk, Decimal("0")))
        devices.setdefault((node_pk, gpu_type, cluster), []).append(engine.Device(index, free))
        lookup[node_pk, index] = gpu_pk
    nodes = tuple(
        engine.NodeInfo(name=f"{node_pk}/{gpu_type}", cluster=cluster, gpu_type=gpu_type, devices=tuple(devs))
        for (node_pk, gpu_type, cluster), devs in devices.items()
    )
    return nodes, lookup


def _load_workspaces() -> tuple[engine.WorkspaceInfo, ...]:
    quotas: dict[int, list[engine.Quota]] = {}
    for q in GPUQuota.objects.all():
        quotas.setdefault(q.workspace_id, []).append(
            engine.Quota(q.gpu_type, q.gpus, q.borrowing_limit, q.lending_limit)
        )
    # Names, not ids: the engine's reasons name the workspace and cohort to the user.
    return tuple(
        engine.WorkspaceInfo(name=name, quotas=tuple(quotas.get(pk, ())), cohort=cohort, can_borrow=can_borrow)
        for pk, name, cohort, can_borrow in Workspace.objects.values_list("pk", "name", "cohort__name", "can_borrow")
    )


def load_snapshot() -> tuple[engine.Snapshot, dict[str, Instance | Job], dict[tuple[int, int], int]]:
    instances, jobs = Instance.objects.select_related("workspace"), Job.objects.select_related("workspace")
    pending_rows: list[Instance | Job] = [
        *instances.filter(state=Instance.State.QUEUED),
        *jobs.filter(state=Job.State.QUEUED),
    ]
    running_rows: list[Instance | Job] = [
        *instances.filter(state__in=[Instance.State.PROVISIONING, Instance.State.RUNNING, Instance.State.DELETING]),
        *jobs.filter(state__in=[Job.State.ADMITTED, Job.State.RUNNING]),
    ]
    nodes, gpu_lookup = _load_nodes()
    snapshot = engine.Snapshot(
        workspaces=_load_workspaces(),
        nodes=nodes,
        running=tuple(_as_workload(r) for r in running_rows if r.gpus_per_replica > 0),
        pending=tuple(_as_workload(r) for r in pending_rows),
    )
    return snapshot, {_key(r): r for r in pending_rows}, gpu_lookup


def _admit(row: Instance | Job, decision: engine.Admit, gpu_lookup: dict[tuple[int, int], int]) -> bool:
    now = timezone.now()
    model = type(row)
    new_state = Job.State.ADMITTED if isinstance(row, Job) else Instance.State.PROVISIONING
    cluster_id = Cluster.objects.filter(name=decision.cluster).values_list("pk", flat=True).first()
    if cluster_id is None:
        cluster_id = Cluster.objects.filter(is_default=True).values_list("pk", flat=True).first()
    claimed = model.objects.filter(pk=row.pk, state=model.State.QUEUED).update(
        state=new_state,
        admitted_at=now,
        cluster_id=cluster_id,
        wait_reason="",
        workspace_queue_position=None,
        cluster_queue_position=None,
        estimated_start_at=None,
    )
    if not claimed:  # cancelled or deleted since the snapshot
        return False
    holder = {"job_id": row.pk} if isinstance(row, Job) else {"instance_id": row.pk}
    Allocation.objects.bulk_create(
        Allocation(gpu_id=gpu_lookup[int(replica.node.split("/")[0]), index], fraction=share, replica=r, **holder)
        for r, replica in enumerate(decision.placement)
        for index, share in replica.devices
    )
    placement = [{"node": p.node, "devices": [[i, str(s)] for i, s in p.devices]} for p in decision.placement]
    do_log_event(
        f"{row._meta.model_name}.admit",
        row,
        workspace=row.workspace,
        data={"placement": placement, "borrowed": str(decision.borrowed)},
    )
    notify(row.workspace_id, row._meta.model_name or "", {"id": row.pk, "state": new_state})
    return True


def _record_pending(row: Instance | Job, decision: engine.Pending) -> bool:
    values: dict[str, Any] = {
        "wait_reason": decision.reason,
        "workspace_queue_position": decision.workspace_position,
        "cluster_queue_position": decision.cluster_position,
    }
    if all(getattr(row, k) == v for k, v in values.items()):
        return False
    type(row).objects.filter(pk=row.pk, state=type(row).State.QUEUED).update(**values)
    notify(row.workspace_id, row._meta.model_name or "", {"id": row.pk, "state": row.state, **values})
    return True


def run_cycle() -> CycleResult:
    """One scheduling cycle: snapshot, decide, apply. Safe to run concurrently: cycles serialise."""
    result = CycleResult()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CYCLE_LOCK_ID])
        snapshot, rows, gpu_lookup = load_snapshot()
        if not snapshot.pending:
            return result
        decisions = engine.schedule(snapshot)
        for admit in decisions.admitted:
            if _admit(rows[admit.key], admit, gpu_lookup):
                result.admitted.append(admit.key)
        for pending in decisions.pending:
            _record_pending(rows[pending.key], pending)
        result.pending = len(decisions.pending)
    if result.admitted:
        logger.info("admitted %s", ", ".join(result.admitted))
    return result
