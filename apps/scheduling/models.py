"""Fields every schedulable workload (instance or job) carries.

The scheduling engine itself (engine.py) knows nothing of these models; the adapter turns
rows into the engine's plain data and writes its decisions back here.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.names import validate_gpu_type
from apps.workloads.models import Hosted


class Workload(Hosted):
    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="+")
    # Where it runs once admitted (None while it waits); set by the scheduler.
    cluster = models.ForeignKey("inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # Where its submitter asked it to run (None: any cluster). Kept across preemption and requeues.
    requested_cluster = models.ForeignKey(
        "inventory.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # What it asks for, per replica; a gang of `replicas` is admitted all at once or not at all.
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    gpus_per_replica = models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )
    replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(1024)])
    cpu_cores = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(4096)])
    memory_gb = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(65536)])
    priority = models.IntegerField(default=0, validators=[MinValueValidator(-1000), MaxValueValidator(1000)])

    # Why it waits, where it stands, when it should start: written by the scheduler.
    wait_reason = models.CharField(max_length=500, blank=True)
    workspace_queue_position = models.PositiveIntegerField(null=True, blank=True)
    cluster_queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    # Requeued with backoff (a gang that did not become ready in time): not admitted before this.
    eligible_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(Hosted.Meta):
        abstract = True

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus_per_replica * self.replicas


class FairShareUsage(models.Model):
    """A workspace's decayed past GPU use of one type, in GPU-seconds, for fair share.

    Each scheduling cycle multiplies it by 2^(-elapsed/half-life) and adds what ran meanwhile,
    as Slurm's PriorityDecayHalfLife does.
    """

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="+")
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpu_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "gpu_type"], name="fair_share_usage_unique")]
