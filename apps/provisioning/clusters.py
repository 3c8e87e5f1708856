"""Requests held on clusters with a scheduler of their own: on Slurm, a real Slurm reservation; on
Kubernetes, reserved nodes (labelled and tainted: workers/backends/kubernetes_reservations.py).

The portal's engine holds an approved request's devices on every cluster. A Slurm cluster
schedules its jobs itself, so there the request is also a Slurm reservation (whole nodes, for the
workspace's Slurm account, ``Flags=IGNORE_JOBS``), made once approved, changed when its end or nodes
change, and deleted when it ends, is released or cancelled. The workspace's work the engine places in
the reservation is submitted with ``--reservation`` (apps/jobs/hosting.py, apps/compute/hosting.py).
Slurm stops the jobs still in a reservation when it ends (the holder is warned before).

Run from the scheduler's loop; a failure is kept on the request (shown on its page) and tried again.
"""

from __future__ import annotations

import logging
import time

from django.db.models import Q

from apps.inventory.models import Cluster
from apps.provisioning.models import ProvisioningEvent, ProvisioningRequest
from apps.workspaces.unix import run_as_for
from workers.backends import slurm_reservations
from workers.backends.base import BackendError
from workers.backends.registry import backend_for
from workers.backends.slurm import SlurmBackend

logger = logging.getLogger(__name__)

#: A failed request is tried again at most this often.
RETRY_S = 30.0
_failed_at: dict[int, float] = {}


def keep_up() -> None:
    """Make, change and delete the clusters' own reservations of the requests that need it: those
    that ended first (a request that follows another on the same nodes is then made in one pass)."""
    elsewhere = Q(held_cluster__kind__in=(Cluster.Kind.SLURM, Cluster.Kind.KUBERNETES))
    done = ProvisioningRequest.objects.filter(elsewhere, state__in=ProvisioningRequest.FINAL_STATES).filter(
        ~Q(slurm_reservation="") | Q(backend_synced__isnull=False)
    )
    holding = ProvisioningRequest.objects.filter(elsewhere, state__in=ProvisioningRequest.HOLDING_STATES)
    for gpr in [*done.select_related("held_cluster"), *holding.select_related("workspace", "held_cluster")]:
        if time.monotonic() - _failed_at.get(gpr.pk, -RETRY_S) < RETRY_S:
            continue
        try:
            if gpr.held_cluster is not None and gpr.held_cluster.kind == Cluster.Kind.KUBERNETES:
                _keep_on_kubernetes(gpr)
            else:
                _keep(gpr)
        except BackendError as error:
            _failed_at[gpr.pk] = time.monotonic()
            logger.warning("the cluster's reservation of GPR %s: %s", gpr.pk, error)
            if gpr.backend_error != str(error)[:1000]:
                ProvisioningRequest.objects.filter(pk=gpr.pk).update(backend_error=str(error)[:1000])
                message = (
                    f"{gpr.held_cluster.get_kind_display() if gpr.held_cluster else 'The cluster'} refused: {error}"
                )
                ProvisioningEvent.objects.create(request=gpr, kind="error", message=message[:1000])
        else:
            _failed_at.pop(gpr.pk, None)


def _keep_on_kubernetes(gpr: ProvisioningRequest) -> None:
    """On Kubernetes the reserved nodes are labelled and tainted for the request while it is active
    (before, other work still runs there until the portal's engine evicts it)."""
    from workers.backends import kubernetes_reservations  # the client is loaded only where it is used
    from workers.backends.kubernetes import KubernetesBackend

    backend = backend_for(gpr.held_cluster)
    assert isinstance(backend, KubernetesBackend)
    name = kubernetes_reservations.reservation_name(gpr.pk)
    rows = ProvisioningRequest.objects.filter(pk=gpr.pk)
    if gpr.state in ProvisioningRequest.FINAL_STATES:
        kubernetes_reservations.remove_reservation(backend, name)
        rows.update(backend_error="", backend_synced=None)
        ProvisioningEvent.objects.create(request=gpr, kind="kubernetes", message=f"Nodes freed of {name}.")
        return
    if gpr.state != ProvisioningRequest.State.ACTIVE:
        return
    nodes = sorted({gpu.node.name for gpu in gpr.devices.select_related("node")})
    wanted = {"nodes": nodes}
    if gpr.backend_synced == wanted:
        return
    kubernetes_reservations.apply_reservation(backend, name, nodes=nodes)
    rows.update(backend_error="", backend_synced=wanted)
    said = f"Nodes {', '.join(nodes)} labelled and tainted {name}: only the workspace's pods run there."
    ProvisioningEvent.objects.create(request=gpr, kind="kubernetes", message=said)


def _keep(gpr: ProvisioningRequest) -> None:
    backend = backend_for(gpr.held_cluster)
    assert isinstance(backend, SlurmBackend)
    tools = {"scontrol_path": backend.scontrol_path, "timeout": backend.command_timeout_s}
    if gpr.state in ProvisioningRequest.FINAL_STATES:
        slurm_reservations.delete_reservation(gpr.slurm_reservation, **tools)
        rows = ProvisioningRequest.objects.filter(pk=gpr.pk)
        rows.update(slurm_reservation="", backend_error="", backend_synced=None)
        said = f"Slurm reservation {gpr.slurm_reservation} deleted."
        ProvisioningEvent.objects.create(request=gpr, kind="slurm", message=said)
        return
    assert gpr.held_start is not None and gpr.held_end is not None
    nodes = sorted({gpu.node.name for gpu in gpr.devices.select_related("node")})
    wanted = {"end": gpr.held_end.isoformat(), "nodes": nodes}
    if gpr.slurm_reservation and gpr.backend_synced == wanted:
        return
    name = gpr.slurm_reservation or slurm_reservations.reservation_name(gpr.pk)
    if gpr.slurm_reservation:
        slurm_reservations.update_reservation(name, end=gpr.held_end, nodes=nodes, **tools)
        said = f"Slurm reservation {name} changed: nodes {', '.join(nodes)} until {gpr.held_end:%Y-%m-%d %H:%M} UTC."
    else:
        account = backend.ensure_account(gpr.workspace.name, run_as_for(gpr.workspace, gpr.held_cluster))
        if not account:
            raise BackendError(
                "the portal does not submit as the workspace's account here (it is not root): a Slurm reservation "
                "needs one",
                permanent=True,
            )
        slurm_reservations.create_reservation(
            name, account=account, nodes=nodes, start=gpr.held_start, end=gpr.held_end, **tools
        )
        said = f"Slurm reservation {name} made for account {account} on {', '.join(nodes)}."
    rows = ProvisioningRequest.objects.filter(pk=gpr.pk)
    rows.update(slurm_reservation=name, backend_error="", backend_synced=wanted)
    ProvisioningEvent.objects.create(request=gpr, kind="slurm", message=said)
