"""Elastic pools' size over time, from their samples (``PoolSizeSample``): the cluster dashboard's charts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from apps.elastic.models import PoolScaling, PoolSizeSample
from apps.inventory.models import Node

# What each line shows, from a sample's counts; the limits are drawn against the first.
LINES = (("nodes up", "ready"), ("starting", "starting"), ("stopping", "stopping"), ("failed to start", "failed"))


def size_series(scaling: PoolScaling, span: timedelta, buckets: int, now: datetime | None = None) -> dict[str, Any]:
    """The pool's nodes per state over ``span`` in ``buckets`` steps, each the most nodes in that state at any
    time in the step (a node that started and stopped within one still shows), against the pool's minimum and
    maximum. A step before the first sample is None (not known). Lines that stayed at 0 are left out, except
    the nodes up. In the form the console's charts read (static/web/live.js)."""
    now = now or timezone.now()
    start = now - span
    step = span / buckets
    samples = list(PoolSizeSample.objects.filter(pool_id=scaling.pool_id, at__gt=start, at__lte=now).order_by("at"))
    before = PoolSizeSample.objects.filter(pool_id=scaling.pool_id, at__lte=start).order_by("-at").first()
    current = before
    values: dict[str, list[int | None]] = {label: [] for label, _ in LINES}
    index = 0
    for i in range(buckets):
        end = start + step * (i + 1)
        seen = [current] if current is not None else []
        while index < len(samples) and samples[index].at <= end:
            seen.append(samples[index])
            index += 1
        current = seen[-1] if seen else None
        for label, field in LINES:
            values[label].append(max(getattr(s, field) for s in seen) if seen else None)
    series = {label: v for label, v in values.items() if label == LINES[0][0] or any(v)}
    nodes = Node.objects.filter(pool_id=scaling.pool_id).count()
    return {
        "labels": [(start + step * (i + 1)).isoformat() for i in range(buckets)],
        "series": series,
        "limits": {LINES[0][0]: scaling.max_nodes},
        "limit_label": "maximum",
        "floors": {LINES[0][0]: scaling.min_nodes},
        "floor_label": "minimum",
        "suffix": "",
        "y_title": "nodes",
        "y_max": max(nodes, scaling.max_nodes, 1),
        "digits": 0,
    }
