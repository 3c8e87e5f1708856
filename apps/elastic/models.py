"""Elastic node pools: a pool that grows (nodes powered up) when pending work fits none of its
running nodes, and shrinks (nodes powered down) when nodes stay empty, between a minimum and a
maximum, within a monthly budget of GPU-hours.

``PoolScaling`` holds a pool's limits and how its nodes are started and stopped (``provider``:
Slurm's own power saving, the operator's command, or the Kubernetes cluster autoscaler).
``ScalingDecision`` records every decision with its reason, and its outcome. ``NodePower`` keeps
when each node last changed power state and since when it has been empty: the start timeout and the
scale-down delay are measured from them.
``PoolSizeSample`` keeps the pool's size by node state over time, for the cluster dashboard's chart.
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class PoolScaling(models.Model):
    class Provider(models.TextChoices):
        SLURM = "slurm", "Slurm power saving"
        COMMAND = "command", "The operator's command"
        KUBERNETES = "kubernetes", "The cluster autoscaler (Kubernetes ProvisioningRequest)"

    pool = models.OneToOneField("inventory.NodePool", on_delete=models.CASCADE, primary_key=True,
                                related_name="scaling")  # fmt: skip
    enabled = models.BooleanField(default=True)
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.SLURM)
    # The operator's program for provider "command": run as `<command> up|down <cluster> <pool> <node>...`.
    command = models.CharField(max_length=500, blank=True)
    min_nodes = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(10_000)])
    max_nodes = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(10_000)])
    scale_down_delay_s = models.PositiveIntegerField(default=600, validators=[MaxValueValidator(7 * 86400)])
    start_timeout_s = models.PositiveIntegerField(default=600, validators=[MinValueValidator(10),
                                                                            MaxValueValidator(3600)])  # fmt: skip
    # GPU-hours a calendar month its nodes may run above the minimum; None: no budget.
    budget_gpu_hours = models.PositiveIntegerField(null=True, blank=True)
    used_gpu_hours = models.FloatField(default=0.0)
    budget_month = models.CharField(max_length=7, blank=True)  # "2026-11": the month used_gpu_hours counts
    counted_at = models.DateTimeField(null=True, blank=True)
    # Pending workloads the last decision started nodes for: {"job:12": {"nodes": 2, "ready_by": iso}},
    # for their queue reason ("waiting for 2 nodes to start").
    starting_for = models.JSONField(default=dict, blank=True)
    # What the provider keeps to find its requests again (Kubernetes: each slot's ProvisioningRequest and
    # the Kubernetes node it was bound to); the portal's own bookkeeping is in the columns above.
    provider_state = models.JSONField(default=dict, db_default={}, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"scaling of {self.pool}"


class ScalingDecision(models.Model):
    class Action(models.TextChoices):
        UP = "up", "Powered up"
        DOWN = "down", "Powered down"
        FAILED = "failed", "Failed to start"
        REFUSED = "refused", "Refused"

    pool = models.ForeignKey("inventory.NodePool", on_delete=models.CASCADE, related_name="scaling_decisions")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    nodes = models.JSONField(default=list)
    reason = models.CharField(max_length=1000)
    error = models.CharField(max_length=1000, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.action} {', '.join(self.nodes)}: {self.reason}"


class NodePower(models.Model):
    node = models.OneToOneField("inventory.Node", on_delete=models.CASCADE, primary_key=True, related_name="power")
    changed_at = models.DateTimeField()
    idle_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"power of {self.node}"


class PoolSizeSample(models.Model):
    """How many of a pool's nodes were in each power state at ``at``: written by the autoscaler's run when the
    counts change, and at most once a minute otherwise; pruned after the telemetry's retention."""

    pool = models.ForeignKey("inventory.NodePool", on_delete=models.CASCADE, related_name="size_samples")
    at = models.DateTimeField(db_index=True)
    ready = models.PositiveIntegerField(default=0)
    starting = models.PositiveIntegerField(default=0)
    stopping = models.PositiveIntegerField(default=0)
    powered_down = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["pool", "at"]
        indexes = [models.Index(fields=["pool", "at"])]

    def __str__(self) -> str:
        return f"{self.pool} at {self.at:%Y-%m-%d %H:%M}: {self.ready} ready"

    @property
    def counts(self) -> tuple[int, int, int, int, int]:
        return (self.ready, self.starting, self.stopping, self.powered_down, self.failed)
