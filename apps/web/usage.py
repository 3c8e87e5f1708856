"""GPU use now and over time, read from the workloads' own admission and run times.

Nothing is sampled: a job's attempts say when it ran, another kind's admission and end (an
instance's, a Ray cluster's) say when its pod sets held their GPUs. The series are the average
GPUs held in each time bucket.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Q
from django.utils import timezone

from apps.jobs.models import Job, JobAttempt
from apps.workloads.kinds import scheduled
from apps.workloads.models import PodSet
from apps.workspaces.api import gpus_in_use
from apps.workspaces.models import GPUQuota

WINDOWS = {"1h": (timedelta(hours=1), 60), "24h": (timedelta(hours=24), 96), "7d": (timedelta(days=7), 84)}
DEFAULT_WINDOW = "1h"


@dataclass
class QuotaUse:
    workspace_id: int
    workspace: str
    gpu_type: str
    used: Decimal
    quota: Decimal | None

    @property
    def percent(self) -> int:
        if not self.quota:
            return 100 if self.used else 0
        return min(100, int(self.used * 100 / self.quota))

    @property
    def over(self) -> bool:
        return self.quota is not None and self.used > self.quota


def quota_use(workspaces: list[Any]) -> list[QuotaUse]:
    """GPUs in use against the quota, per workspace and GPU type (types in use without a quota too)."""
    ids = [w.pk for w in workspaces]
    names = {w.pk: w.name for w in workspaces}
    used = gpus_in_use(ids)
    rows: dict[tuple[int, str], QuotaUse] = {}
    for quota in GPUQuota.objects.filter(workspace_id__in=ids).order_by("gpu_type"):
        key = (quota.workspace_id, quota.gpu_type)
        rows[key] = QuotaUse(
            quota.workspace_id, names[quota.workspace_id], quota.gpu_type, used.get(key, Decimal("0")), quota.gpus
        )
    for (workspace_id, gpu_type), total in used.items():
        rows.setdefault((workspace_id, gpu_type), QuotaUse(workspace_id, names[workspace_id], gpu_type, total, None))
    return sorted(rows.values(), key=lambda r: (ids.index(r.workspace_id), r.gpu_type))


def held_intervals(
    workspace_ids: list[int] | None, start: datetime, now: datetime
) -> list[tuple[str, float, Any, Any]]:
    """(gpu type, GPUs, from, to) for everything that held GPUs during [start, now]: a job's
    attempts (a job may run several times), and every other kind the scheduler admits from its
    admission to its end, with what its pod sets hold (the kind registry says which states hold)."""

    def mine(prefix: str = "") -> Q:
        return Q(**{f"{prefix}workspace_id__in": workspace_ids}) if workspace_ids is not None else Q()

    out: list[tuple[str, float, Any, Any]] = []
    attempts = JobAttempt.objects.filter(
        mine("job__"),
        Q(finished_at__isnull=True) | Q(finished_at__gt=start),
        job__gpus_per_replica__gt=0,
        started_at__isnull=False,
        started_at__lt=now,
    ).values_list("job__gpu_type", "job__gpus_per_replica", "job__replicas", "started_at", "finished_at")
    for gpu_type, per_replica, replicas, began, ended in attempts:
        out.append((gpu_type, float(per_replica * replicas), began, ended or now))
    admitted = Job.objects.filter(mine(), state=Job.State.ADMITTED, gpus_per_replica__gt=0, admitted_at__isnull=False)
    for gpu_type, per_replica, replicas, began in admitted.values_list(
        "gpu_type", "gpus_per_replica", "replicas", "admitted_at"
    ):
        out.append((gpu_type, float(per_replica * replicas), began, now))
    holding = Q()
    for name, scheduling in scheduled().items():
        if name != "job":  # jobs: their attempts, above
            holding |= Q(workload__kind=name, workload__state__in=scheduling.holding)
    if not holding:
        return out
    held = PodSet.objects.filter(
        mine("workload__"),
        Q(workload__finished_at__isnull=True) & holding | Q(workload__finished_at__gt=start),
        gpus__gt=0,
        workload__admitted_at__isnull=False,
        workload__admitted_at__lt=now,
    ).values_list("gpu_type", "gpus", "replicas", "workload__admitted_at", "workload__finished_at")
    for gpu_type, per_replica, replicas, began, ended in held:
        out.append((gpu_type, float(per_replica * replicas), began, ended or now))
    return out


def gpu_series(workspace_ids: list[int] | None, window: str = DEFAULT_WINDOW) -> dict[str, Any]:
    """Average GPUs held per bucket over the window, per GPU type: {"labels": [...], "series": {type: [...]}}."""
    span, buckets = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    now = timezone.now()
    start = now - span
    step = span.total_seconds() / buckets
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * buckets)
    t0 = start.timestamp()
    for gpu_type, gpus, began, ended in held_intervals(workspace_ids, start, now):
        a = max(began.timestamp(), t0) - t0
        b = min(ended.timestamp(), now.timestamp()) - t0
        if b <= a:
            continue
        first, last = int(a // step), min(int(b // step), buckets - 1)
        values = series[gpu_type]
        for i in range(first, last + 1):
            overlap = min(b, (i + 1) * step) - max(a, i * step)
            if overlap > 0:
                values[i] += gpus * overlap / step
    labels = [(start + timedelta(seconds=step * (i + 1))).isoformat() for i in range(buckets)]
    return {
        "window": window if window in WINDOWS else DEFAULT_WINDOW,
        "labels": labels,
        "series": {k: [round(v, 3) for v in vs] for k, vs in sorted(series.items())},
    }


def measured_series(workspace_ids: list[int], window: str = DEFAULT_WINDOW) -> dict[str, list[float | None]]:
    """GPUs busy per bucket over the window, per GPU type, as measured (apps/telemetry): in each
    bucket, each device's mean utilisation, summed over the workspace's devices ("1.5": one and
    a half GPUs' worth of work). Empty where there is no telemetry; a bucket without a sample is
    None, not 0."""
    from apps.telemetry.models import GpuSample  # measured use, beside what is held

    span, buckets = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    now = timezone.now()
    start = now - span
    step = span.total_seconds() / buckets
    sums: dict[tuple[str, int, int], list[float]] = defaultdict(lambda: [0.0, 0])  # (type, gpu, bucket)
    rows = GpuSample.objects.filter(workspace_id__in=workspace_ids, at__gte=start).values_list(
        "gpu__gpu_type", "gpu_id", "at", "utilisation"
    )
    for gpu_type, gpu_id, at, utilisation in rows.iterator(chunk_size=2000):
        bucket = min(buckets - 1, int((at - start).total_seconds() // step))
        total = sums[(gpu_type, gpu_id, bucket)]
        total[0] += utilisation
        total[1] += 1
    series: dict[str, list[float | None]] = {}
    for (gpu_type, _gpu, bucket), (total, count) in sums.items():
        values = series.setdefault(gpu_type, [None] * buckets)
        values[bucket] = round((values[bucket] or 0.0) + total / count / 100, 3)
    return dict(sorted(series.items()))
