"""What the scheduler loop did, for the metrics (apps/monitoring/metrics.py): cycles run in the
scheduler's process and the metrics are served by the web process, so the loop keeps its running
totals in the database, one row, updated once a cycle."""

from __future__ import annotations

from django.db import models


class SchedulerStats(models.Model):
    ROW = 1  # the one row

    cycles = models.BigIntegerField(default=0)
    cycle_seconds = models.FloatField(default=0.0)  # their time, summed
    last_cycle_seconds = models.FloatField(default=0.0)
    last_cycle_at = models.DateTimeField(null=True, blank=True)
    failures = models.BigIntegerField(default=0)  # cycles that raised

    def __str__(self) -> str:
        return f"{self.cycles} cycles"
