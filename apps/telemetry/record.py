"""Taking, keeping and reading GPU samples (apps/telemetry/models.py).

The scheduler loop calls `upkeep()`: every `PORTAL_TELEMETRY_EVERY_S` (10 s) it reads each
cluster's source (apps/telemetry/collectors.py) and stores one sample per device, with the work
that held it; every hour it folds samples older than a day into one a minute, those older than
30 days into one an hour, and drops those older than a year. A GPU thus keeps at most 8,640 +
43,200 + 8,760 rows (a day at 10 s, a month of minutes, a year of hours), about 60,600, whatever
the cluster's age.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Max, QuerySet
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from apps.inventory.models import GPU, Allocation, Cluster
from apps.telemetry.collectors import NoTelemetry, Reading, collector_for
from apps.telemetry.models import GpuSample

logger = logging.getLogger(__name__)

RAW = 0
# (resolution, kept for, folded into) from the finest.
TIERS = ((RAW, timedelta(days=1), 60), (60, timedelta(days=30), 3600), (3600, timedelta(days=365), None))
FOLD_EVERY_S = 3600.0
FRESH_S = 60.0  # a device's last sample tells its state now for this long

_last_sample = 0.0
_last_fold = 0.0


def upkeep() -> dict[str, int]:
    """Sample and fold when they are due (from the scheduler loop, whose cycle never waits on a
    failure here: it is logged, and tried again when next due)."""
    global _last_sample, _last_fold
    counts: dict[str, int] = {}
    now = time.monotonic()
    try:
        if now - _last_sample >= settings.PORTAL_TELEMETRY_EVERY_S:
            _last_sample = now
            counts["gpu_samples"] = sample()
        if now - _last_fold >= FOLD_EVERY_S:
            _last_fold = now
            counts["gpu_samples_folded"] = fold()
    except Exception:
        logger.exception("GPU telemetry failed")
    return counts


def sample(now: datetime | None = None) -> int:
    """Read every cluster that has a source; store one sample per device it reports."""
    now = now or timezone.now()
    stored = 0
    for cluster in Cluster.objects.filter(enabled=True):
        collector = collector_for(cluster)
        if collector is None:
            continue
        try:
            readings = collector.readings()
        except NoTelemetry as exc:
            logger.info("no GPU telemetry from %s this time: %s", cluster.name, exc)
            continue
        rows = _rows(cluster, readings, now)
        GpuSample.objects.bulk_create(rows)
        stored += len(rows)
    return stored


def _rows(cluster: Cluster, readings: list[Reading], now: datetime) -> list[GpuSample]:
    gpus = list(GPU.objects.filter(node__pool__cluster=cluster).select_related("node"))
    by_uuid = {gpu.uuid: gpu for gpu in gpus if gpu.uuid}
    by_place = {(gpu.node.name, gpu.index): gpu for gpu in gpus}
    by_index = {gpu.index: gpu for gpu in gpus} if len({gpu.node_id for gpu in gpus}) == 1 else {}
    holders: dict[int, tuple[int | None, int | None]] = {}
    held = Allocation.objects.filter(gpu__in=gpus).values_list("gpu_id", "workload_id", "workload__workspace_id")
    for gpu_id, workload_id, workspace_id in held.order_by("id"):
        holders.setdefault(gpu_id, (workload_id, workspace_id))
    rows = []
    for reading in readings:
        gpu = by_uuid.get(reading.uuid) or by_place.get((reading.node, reading.index))
        if gpu is None and not reading.node:
            gpu = by_index.get(reading.index)
        if gpu is None:  # not in the inventory (yet): discovery adds it
            continue
        workload_id, workspace_id = holders.get(gpu.pk, (None, None))
        rows.append(
            GpuSample(
                gpu=gpu,
                at=now,
                resolution_s=RAW,
                utilisation=max(0.0, min(100.0, reading.utilisation)),
                memory_used_mb=max(0, reading.memory_used_mb),
                memory_total_mb=max(0, reading.memory_total_mb),
                temperature_c=reading.temperature_c,
                power_w=reading.power_w,
                workload_id=workload_id,
                workspace_id=workspace_id,
            )
        )
    return rows


def fold(now: datetime | None = None) -> int:
    """Fold each tier's samples older than its span into the next tier's buckets (their average;
    the work of one of them), and drop the coarsest tier's past a year. How many rows went."""
    now = now or timezone.now()
    gone = 0
    for resolution, span, into in TIERS:
        old = GpuSample.objects.filter(resolution_s=resolution, at__lt=now - span)
        if into is None:
            gone += old.delete()[0]
            continue
        bucket = TruncMinute("at") if into == 60 else TruncHour("at")
        # Whole buckets only: the one the cut falls in waits for its last samples to be old too.
        cut = now - span
        cut = cut.replace(second=0, microsecond=0) if into == 60 else cut.replace(minute=0, second=0, microsecond=0)
        old = old.filter(at__lt=cut)
        folded = (
            old.annotate(bucket=bucket)
            .values("gpu_id", "bucket")
            .annotate(
                utilisation=Avg("utilisation"),
                memory_used_mb=Avg("memory_used_mb"),
                memory_total_mb=Max("memory_total_mb"),
                temperature_c=Avg("temperature_c"),
                power_w=Avg("power_w"),
                workload_id=Max("workload_id"),
                workspace_id=Max("workspace_id"),
            )
            .order_by()
        )
        with transaction.atomic():
            made = [
                GpuSample(
                    gpu_id=row["gpu_id"],
                    at=row["bucket"],
                    resolution_s=into,
                    utilisation=row["utilisation"],
                    memory_used_mb=round(row["memory_used_mb"]),
                    memory_total_mb=row["memory_total_mb"],
                    temperature_c=row["temperature_c"],
                    power_w=row["power_w"],
                    workload_id=row["workload_id"],
                    workspace_id=row["workspace_id"],
                )
                for row in folded
            ]
            gone += old.delete()[0]
            GpuSample.objects.bulk_create(made, batch_size=1000)
    return gone


def latest(gpus: QuerySet[GPU] | list[GPU], now: datetime | None = None) -> dict[int, GpuSample]:
    """Each GPU's last sample, where it is fresh (taken in the last minute): its state now."""
    now = now or timezone.now()
    ids = [gpu.pk for gpu in gpus]
    fresh = GpuSample.objects.filter(gpu_id__in=ids, resolution_s=RAW, at__gte=now - timedelta(seconds=FRESH_S))
    found: dict[int, GpuSample] = {}
    for row in fresh.order_by("gpu_id", "-at"):
        found.setdefault(row.gpu_id, row)
    return found


@dataclass
class Series:
    """A chart's data, in the shape the pages' chart reads (static/web/live.js)."""

    labels: list[str]
    series: dict[str, list[float | None]]

    def as_json(self, **extra: Any) -> dict[str, Any]:
        return {"labels": self.labels, "series": self.series, **extra}


WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}
POINTS = 120


def utilisation_series(samples: QuerySet[GpuSample], window: str, now: datetime | None = None) -> Series | None:
    """Utilisation per device over the window, in at most `POINTS` buckets (their averages); None
    where there is no sample at all (no telemetry)."""
    now = now or timezone.now()
    span = WINDOWS.get(window, WINDOWS["1h"])
    start = now - span
    step = span.total_seconds() / POINTS
    rows = samples.filter(at__gte=start).select_related("gpu__node").order_by("at")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * POINTS)
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * POINTS)
    any_row = False
    for row in rows.iterator(chunk_size=2000):
        any_row = True
        name = f"GPU {row.gpu.node.name}:{row.gpu.index}"
        slot = min(POINTS - 1, math.floor((row.at - start).total_seconds() / step))
        sums[name][slot] += row.utilisation
        counts[name][slot] += 1
    if not any_row:
        return None
    labels = [(start + timedelta(seconds=step * (i + 1))).isoformat() for i in range(POINTS)]
    series: dict[str, list[float | None]] = {
        name: [round(s / c, 1) if c else None for s, c in zip(sums[name], counts[name], strict=True)]
        for name in sorted(sums)
    }
    return Series(labels, series)
