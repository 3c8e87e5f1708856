from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from apps.names import validate_dns_label, validate_gpu_type


class Cluster(models.Model):
    class Kind(models.TextChoices):
        LOCAL = "local", "This machine"
        SLURM = "slurm", "Slurm"
        KUBERNETES = "kubernetes", "Kubernetes"

    class Placement(models.TextChoices):
        BINPACK = "binpack", "Bin-pack"
        SPREAD = "spread", "Spread"

    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    kind = models.CharField(max_length=16, choices=Kind.choices)
    connection = models.JSONField(default=dict, blank=True, help_text="Backend settings: endpoints, partition...")
    placement = models.CharField(max_length=16, choices=Placement.choices, default=Placement.BINPACK)
    is_default = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    discovered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_cluster")
        ]

    def __str__(self) -> str:
        return self.name


class NodePool(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=63, validators=[validate_dns_label])

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_pool_unique")]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"


class Node(models.Model):
    class State(models.TextChoices):
        READY = "ready", "Ready"
        DRAINED = "drained", "Drained"
        DOWN = "down", "Down"
        # An elastic pool's nodes (apps/elastic): stopped to save power, starting, stopping, or
        # not started within the pool's timeout. No work is placed on any of them.
        POWERED_DOWN = "powered_down", "Powered down"
        POWERING_UP = "powering_up", "Powering up"
        POWERING_DOWN = "powering_down", "Powering down"
        FAILED = "failed", "Failed to start"

    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_gb = models.PositiveIntegerField(default=0)
    # What the cluster reports (discovery, the elastic autoscaler): never the portal's maintenance.
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    updated_at = models.DateTimeField(auto_now=True)

    # The portal's own maintenance of the node (apps/inventory/maintenance.py), apart from `state`
    # so that discovery never undoes it: cordoned, no new work is placed there; with a drain asked
    # for, its work is also moved off or waited out, and the drain is done once it is empty.
    cordoned_at = models.DateTimeField(null=True, blank=True)
    cordoned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    maintenance_reason = models.CharField(max_length=300, blank=True, default="", db_default="")
    drain_requested_at = models.DateTimeField(null=True, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)
    # The window that drained it: the window's end brings it back.
    maintenance_window = models.ForeignKey(
        "MaintenanceWindow", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The workloads the drain evicted that may still be stopping there (a job in its grace).
    drain_evicted = models.ManyToManyField("workloads.Workload", blank=True, related_name="+")

    class Meta:
        ordering = ["pool__cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["pool", "name"], name="node_unique")]

    def __str__(self) -> str:
        return self.name

    @property
    def maintenance(self) -> str:
        """'' (in service), 'cordoned', 'draining' or 'drained'."""
        if self.cordoned_at is None:
            return ""
        if self.drain_requested_at is None:
            return "cordoned"
        return "drained" if self.drained_at is not None else "draining"

    @property
    def schedulable(self) -> bool:
        """Whether the scheduler may place new work here: the cluster says it is ready and the
        portal has not cordoned it."""
        return self.state == self.State.READY and self.cordoned_at is None


class MaintenanceWindow(models.Model):
    """Maintenance announced ahead: `nodes` of `cluster` (none named: all of its nodes) are drained
    at `start_at` and brought back at `end_at`. The users whose work it affects are mailed when it
    is announced, and their pages show it until it ends (`workspaces`: the workspaces of that work)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="maintenance_windows")
    nodes = models.ManyToManyField(Node, blank=True, related_name="maintenance_windows")
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    reason = models.CharField(max_length=300)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    announced_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    workspaces = models.ManyToManyField("workspaces.Workspace", blank=True, related_name="+")

    class Meta:
        ordering = ["start_at", "id"]
        constraints = [models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="maintenance_window_order")]

    def __str__(self) -> str:
        return f"{self.cluster} {self.start_at:%Y-%m-%d %H:%M}-{self.end_at:%Y-%m-%d %H:%M}"

    @property
    def state(self) -> str:
        """'scheduled', 'active' or 'ended'."""
        if self.ended_at is not None:
            return "ended"
        return "active" if self.started_at is not None else "scheduled"

    def target_nodes(self) -> models.QuerySet[Node]:
        """The nodes it covers: those named, or every node of its cluster."""
        named = self.nodes.all()
        return named if named.exists() else Node.objects.filter(pool__cluster=self.cluster)


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    model = models.CharField(max_length=200)
    memory_mb = models.PositiveIntegerField(default=0)
    architecture = models.CharField(max_length=50, blank=True)
    declared = models.BooleanField(default=False, help_text="Declared in settings rather than found on the hardware.")

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique")]

    def __str__(self) -> str:
        return f"{self.node}:{self.index} ({self.model})"


class Allocation(models.Model):
    """A share of one GPU held by one replica of one pod set of a workload."""

    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="allocations")
    fraction = models.DecimalField(
        max_digits=4, decimal_places=3, validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(1)]
    )
    workload = models.ForeignKey("workloads.Workload", on_delete=models.CASCADE, related_name="allocations")
    podset = models.ForeignKey("workloads.PodSet", on_delete=models.CASCADE, related_name="allocations")
    replica = models.PositiveIntegerField(default=0)  # within its pod set
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_id", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(fraction__gt=0) & Q(fraction__lte=1), name="allocation_fraction"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.podset_id is None and self.workload_id is not None:  # a kind with one pod set: that one
            self.podset = self.workload.podsets.order_by("position").first()
        super().save(*args, **kwargs)
