"""GPU telemetry: what each device measured, when, and whose work it held then.

Samples are kept at three resolutions (apps/telemetry/record.py): every `PORTAL_TELEMETRY_EVERY_S`
(10 s) for a day, one a minute for 30 days, one an hour for a year; older ones are folded into the
next resolution or dropped, so a GPU costs a bounded number of rows whatever the cluster's age.
"""

from __future__ import annotations

from django.db import models


class GpuSample(models.Model):
    gpu = models.ForeignKey("inventory.GPU", on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()  # the sample's time, or its bucket's start once folded
    resolution_s = models.PositiveIntegerField()  # 0: as measured; 60 or 3600 once folded
    utilisation = models.FloatField()  # percent of the time a kernel ran, 0 to 100
    memory_used_mb = models.PositiveIntegerField()
    memory_total_mb = models.PositiveIntegerField()
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    # The work holding the device when it was measured (one of them where several share it).
    workload = models.ForeignKey(
        "workloads.Workload", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            models.Index(fields=["gpu", "resolution_s", "at"]),
            models.Index(fields=["workload", "at"], name="telemetry_sample_workload_at"),
            models.Index(fields=["workspace", "at"]),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} at {self.at}: {self.utilisation:.0f}%"
