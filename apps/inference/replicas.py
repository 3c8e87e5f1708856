"""Making and stopping an endpoint's replicas, and telling open pages: what the endpoint's actions
(apps/inference/actions.py) and the autoscaler (apps/inference/scaling.py) both do."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.inference.models import Endpoint, Replica
from apps.inventory.models import Allocation
from apps.scheduling.trigger import request_cycle, request_workload
from apps.workloads.models import PriorityClass
from apps.workspaces.live import notify

KIND = "endpoint"


def live(endpoint: Endpoint, **extra: Any) -> None:
    """Tell the workspace's open pages how the endpoint stands (after commit)."""
    notify(endpoint.workspace_id, KIND, {"id": endpoint.pk, "state": endpoint.state, **extra})


def new_replica(endpoint: Endpoint, *, baseline: bool) -> Replica:
    profile = endpoint.profile
    serial = Replica.objects.filter(endpoint=endpoint).count() + 1
    replica = Replica.objects.create(
        workspace_id=endpoint.workspace_id,
        name=f"{endpoint.name}-{serial}"[:63],
        endpoint=endpoint,
        version=endpoint.version,
        baseline=baseline,
        gpu_type=profile.gpu_type if profile.gpus else "",
        gpus=profile.gpus,
        cpu_cores=profile.cpu_cores,
        memory_gb=profile.memory_gb,
        requested_cluster=endpoint.requested_cluster,
        created_by=endpoint.created_by,
        # The minimum serves in its profile's class (inference unless an admin says otherwise); what
        # is above it is unattended work of the lowest priority, which gives way first.
        priority_class=profile.priority_class if baseline else PriorityClass.UNATTENDED,
        priority=0 if baseline else settings.PORTAL_INFERENCE_EXTRA_PRIORITY,
        preemptible=not baseline,
    )
    request_cycle()
    return replica


def stop_replica(replica: Replica, reason: str) -> None:
    """Stop a replica (the caller holds the endpoint's lock): one that never started ends here, a
    started one is stopped by its backend (the proxy sends it nothing more from now on)."""
    replica = Replica.objects.select_for_update().get(pk=replica.pk)
    if replica.state in Replica.FINAL_STATES or replica.state == Replica.State.STOPPING:
        return
    Allocation.objects.filter(workload=replica).delete()
    replica.reason = reason[:4000]
    replica.wait_reason = ""
    if replica.backend_state is None and replica.start_claim is None:
        replica.state = Replica.State.STOPPED
        replica.finished_at = timezone.now()
        replica.save()
        request_cycle()
        return
    replica.state = Replica.State.STOPPING
    replica.save()
    request_cycle()
    request_workload("replica", replica.pk)


def do_preempt_replica(replica: Replica, *, reason: str) -> None:
    """The scheduler evicts a replica for other work: its devices go back at once; the autoscaler
    asks for another if the endpoint still needs it."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().get(pk=replica.pk)
        if replica.state not in Replica.HOLDING_STATES:
            return
        Allocation.objects.filter(workload=replica).delete()
        replica.reason = f"preempted: {reason}"[:4000]
        if replica.backend_state is None and replica.start_claim is None:
            replica.state = Replica.State.STOPPED
            replica.finished_at = timezone.now()
        else:
            replica.state = Replica.State.PREEMPTED
        replica.save()
        do_log_event(Event.ENDPOINT_PREEMPT, replica.endpoint, workspace=replica.endpoint.workspace,
                     data={"replica": replica.pk, "reason": reason})  # fmt: skip
        if replica.state == Replica.State.PREEMPTED:
            request_workload("replica", replica.pk)
        request_cycle()
