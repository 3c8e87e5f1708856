"""State changes the scheduler makes: admitting a workload where the engine placed it."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.inventory.models import Allocation, Cluster
from apps.scheduling.trigger import request_workload
from apps.workloads.kinds import kind, scheduled
from apps.workloads.models import PodSet, Workload
from apps.workspaces.live import notify


@dataclass(frozen=True)
class AdmittedDevice:
    index: int  # on its node, as the audit names it
    gpu_id: int
    share: Decimal


@dataclass(frozen=True)
class AdmittedReplica:
    node: str  # as the audit names it
    devices: tuple[AdmittedDevice, ...]
    podset_id: int = 0  # the pod set it is a replica of
    index: int = 0  # its index within its pod set


@dataclass(frozen=True)
class Admission:
    """Where a workload is admitted: its cluster (None: none is known), the GPU shares of each of
    its replicas (none for work without GPUs), and how many GPUs of it are borrowed from its cohort."""

    cluster_id: int | None
    replicas: tuple[AdmittedReplica, ...] = ()
    borrowed: Decimal = Decimal("0")
    reservation_id: int | None = None  # the provisioning request whose reserved devices it runs on

    def placement(self) -> list[dict[str, object]]:
        """The placement as the audit event records it."""
        return [
            {"node": replica.node, "devices": [[d.index, str(d.share)] for d in replica.devices]}
            for replica in self.replicas
        ]


def do_admit_workload(row: Workload, admission: Admission) -> bool:
    """Admit a queued workload (to its kind's admitted state: a job ADMITTED, an instance
    PROVISIONING) on the GPUs of `admission` (the scheduler's decision: no acting user), and ask
    the worker to start it once committed.

    Returns False, changing nothing else, if the workload is no longer queued (cancelled or deleted
    since the cycle's snapshot), or if its cluster is disabled: then it stays queued, saying so. Its
    allocations are checked by the database: an `IntegrityError` (a GPU shared above one) undoes
    the whole admission, and the caller's transaction goes on."""
    traits = scheduled()[row.kind]
    new_state = traits.admitted
    with transaction.atomic():
        if _waits_for_disabled_cluster(row, admission.cluster_id):
            return False
        claimed = Workload.objects.filter(pk=row.pk, state=traits.queued).update(
            state=new_state,
            admitted_at=timezone.now(),
            cluster_id=admission.cluster_id,
            wait_reason="",
            workspace_queue_position=None,
            cluster_queue_position=None,
            estimated_start_at=None,
            reservation_id=admission.reservation_id,
        )
        if not claimed:
            return False
        # Replicas that do not name their pod set are the GPU pod sets' replicas, in order.
        places = [
            (podset.pk, index)
            for podset in PodSet.objects.filter(workload_id=row.pk, gpus__gt=0).order_by("position")
            for index in range(podset.replicas)
        ]
        Allocation.objects.bulk_create(
            Allocation(
                gpu_id=device.gpu_id,
                fraction=device.share,
                workload_id=row.pk,
                podset_id=replica.podset_id or places[n][0],
                replica=replica.index if replica.podset_id else places[n][1],
            )
            for n, replica in enumerate(admission.replicas)
            for device in replica.devices
        )
        do_log_event(
            Event(traits.admit_event),
            kind(row.kind).model.objects.get(pk=row.pk),  # the event names the kind's own row
            workspace=row.workspace,
            data={
                "placement": admission.placement(),
                "borrowed": str(admission.borrowed),
                **({"reservation": admission.reservation_id} if admission.reservation_id else {}),
            },
        )
        notify(row.workspace_id, row.kind, {"id": row.pk, "state": new_state})
        request_workload(row.kind, row.pk)
    return True


def _waits_for_disabled_cluster(row: Workload, cluster_id: int | None) -> bool:
    """Work without GPUs is placed on no node, so its cluster may be off: it waits, saying why."""
    disabled = Cluster.objects.filter(pk=cluster_id, enabled=False).values_list("name", flat=True).first()
    if disabled is None:
        return False
    reason = f"Cluster {disabled} is disabled: waiting until an admin enables it."
    Workload.objects.filter(pk=row.pk, state=scheduled()[row.kind].queued).update(wait_reason=reason)
    return True
