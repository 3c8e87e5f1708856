"""GPU provisioning requests (GPRs): a workspace asks for GPUs ahead of time, for a while.

A ``ProvisioningRequest`` names a GPU type and count (in one cluster, or any), a start (as soon as
possible, or a time), a duration, a priority and a justification. On submission the portal's
calendar (apps/scheduling/calendar.py) finds its earliest feasible start; the workspace's policy
(``ProvisioningPolicy``) approves it at once or leaves it to an admin. Once approved it holds whole
devices (``devices``) from ``held_start`` to ``held_end``: the scheduler's engine keeps other work
off them from then on, and the holder's work runs there first, uncounted against its quota. On
Slurm it is also a real Slurm reservation (``slurm_reservation``). Every step is written down
(``ProvisioningEvent``): the page's timeline.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.names import validate_gpu_type

MAX_GPUS = 4096


class ProvisioningPolicy(models.Model):
    """How one workspace's requests are decided; a workspace without a row has the portal's defaults
    (settings PORTAL_GPR_AUTO_APPROVE_MAX_S and PORTAL_GPR_MAX_DURATION_S)."""

    workspace = models.OneToOneField(
        "workspaces.Workspace", on_delete=models.CASCADE, primary_key=True, related_name="provisioning_policy"
    )
    # Approved at once when it fits the workspace's nominal quota and lasts at most this long;
    # None: an admin decides every request.
    auto_approve_max_s = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(366 * 86400)])
    max_duration_s = models.PositiveIntegerField(validators=[MinValueValidator(600), MaxValueValidator(366 * 86400)])
    # The most GPUs of a type its requests may hold at one moment, all together; None: no cap of its own.
    max_gpus = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(MAX_GPUS)])
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"policy of {self.workspace}"


class ProvisioningRequest(models.Model):
    class State(models.TextChoices):
        REQUESTED = "REQUESTED", "Requested"  # waits for an admin's decision
        APPROVED = "APPROVED", "Approved"  # scheduled: its devices are held from held_start
        ACTIVE = "ACTIVE", "Active"  # between held_start and held_end
        ENDED = "ENDED", "Ended"  # reached its end
        REJECTED = "REJECTED", "Rejected"
        CANCELLED = "CANCELLED", "Cancelled"  # withdrawn before it began
        RELEASED = "RELEASED", "Released early"

    OPEN_STATES = (State.REQUESTED, State.APPROVED, State.ACTIVE)
    HOLDING_STATES = (State.APPROVED, State.ACTIVE)
    FINAL_STATES = (State.ENDED, State.REJECTED, State.CANCELLED, State.RELEASED)

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="gprs")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.REQUESTED, db_index=True)
    # What was asked.
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_GPUS)])
    cluster = models.ForeignKey("inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    asap = models.BooleanField(default=True)
    start_at = models.DateTimeField(help_text="The start asked for (for 'as soon as possible': when it was asked).")
    duration_s = models.PositiveIntegerField(validators=[MinValueValidator(600), MaxValueValidator(366 * 86400)])
    priority = models.SmallIntegerField(default=0, validators=[MinValueValidator(-100), MaxValueValidator(100)])
    justification = models.CharField(max_length=2000)
    # The calendar's earliest feasible start when it was asked for (or last changed).
    earliest_start = models.DateTimeField(null=True, blank=True)
    # What is held, once approved: whole devices of one cluster, from held_start to held_end.
    held_cluster = models.ForeignKey(
        "inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    held_start = models.DateTimeField(null=True, blank=True)
    held_end = models.DateTimeField(null=True, blank=True)
    devices = models.ManyToManyField("inventory.GPU", blank=True, related_name="reservations")
    # The decision.
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")  # fmt: skip
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=1000, blank=True)
    auto_approved = models.BooleanField(default=False)
    # A change asked for after approval that needs a new one (a longer reservation): {"held_end": iso}.
    pending_change = models.JSONField(null=True, blank=True, default=None)
    # On Slurm: the reservation's name there once made ("" before, and after it is deleted).
    slurm_reservation = models.CharField(max_length=100, blank=True)
    # What the cluster's own reservation was last made to say ({"end": iso, "nodes": [...]}): upkeep
    # changes it where the request changed since.
    backend_synced = models.JSONField(null=True, blank=True, default=None)
    backend_error = models.CharField(max_length=1000, blank=True)
    # Upkeep's marks: the warning before the end was sent; since when the holder has run nothing there.
    warned_at = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    idle_reported_at = models.DateTimeField(null=True, blank=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "held_end"])]

    def __str__(self) -> str:
        return f"GPR {self.pk} ({self.gpus} {self.gpu_type}, {self.workspace})"

    @property
    def key(self) -> str:
        """The engine's name of its reservation."""
        return f"gpr:{self.pk}"

    @property
    def end_at(self) -> datetime:
        """The end asked for."""
        return self.start_at + timedelta(seconds=self.duration_s)

    @property
    def held_gpus(self) -> int:
        return self.devices.count()


class ProvisioningEvent(models.Model):
    """One step of a request's life, for its timeline: asked, approved, changed, began, warned,
    idle, ended..."""

    request = models.ForeignKey(ProvisioningRequest, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32)
    message = models.CharField(max_length=1000)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")  # fmt: skip

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def backend_reservation(workload: Any) -> str:
    """The cluster's own name of the reservation a workload placed on a request's devices is sent
    into: on Slurm its Slurm reservation (``--reservation``; "" until made), on Kubernetes the
    reserved nodes' label (nodeSelector and toleration); "" if none, or elsewhere."""
    if not workload.reservation_id:
        return ""
    found = (
        ProvisioningRequest.objects.filter(pk=workload.reservation_id)
        .values_list("slurm_reservation", "held_cluster__kind")
        .first()
    )
    if found is None:
        return ""
    slurm, kind = found
    if kind == "slurm":
        return str(slurm)
    if kind == "kubernetes":
        return f"gpr-{workload.reservation_id}"
    return ""
