"""What the scheduler keeps of its own: each workspace's decayed past use, for fair share.

The workloads it schedules are apps/workloads/models.py's ``Workload`` and ``PodSet`` rows; the
scheduling engine itself (engine.py) knows nothing of models: the adapter turns rows into the
engine's plain data and writes its decisions back.
"""

from __future__ import annotations

from django.conf import settings
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


class WhatIfReplay(models.Model):
    """An admin's what-if replay: a window of the portal's recorded workloads replayed in simulated
    time under today's settings and under the admin's changes (apps/scheduling/whatif.py).

    It runs in the background (a Celery task) and never touches live state: it reads history and
    settings, and writes only this row.
    """

    class State(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        RUNNING = "RUNNING", "Running"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    since = models.DateTimeField()
    until = models.DateTimeField()
    # The admin's changes, as validated (whatif.Changes.as_json): quotas, cohorts, policy, cluster size.
    changes = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0)  # 0..1, both replays together
    message = models.CharField(max_length=500, blank=True)  # why it failed
    # Both replays' figures side by side, per workspace (whatif.run_replay writes it once done).
    result = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Written with its progress while it runs (a running replay whose worker stopped is seen by it),
    # and when a queued one is sent again (whatif.upkeep).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"what-if replay {self.pk}"

    @property
    def is_final(self) -> bool:
        return self.state in (self.State.SUCCEEDED, self.State.FAILED)
