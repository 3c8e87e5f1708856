"""What the scheduler keeps of its own: each workspace's decayed past use, for fair share.

The workloads it schedules are apps/workloads/models.py's ``Workload`` and ``PodSet`` rows; the
scheduling engine itself (engine.py) knows nothing of models: the adapter turns rows into the
engine's plain data and writes its decisions back.
"""

from __future__ import annotations

from django.db import models

from apps.names import validate_gpu_type


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
