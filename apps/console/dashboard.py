"""The cluster-wide dashboard and the GPU inventory, for platform admins."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404

from apps.elastic.models import PoolScaling
from apps.elastic.sizes import size_series
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.telemetry.models import GpuSample
from apps.telemetry.record import WINDOWS as SAMPLE_WINDOWS
from apps.telemetry.record import latest, utilisation_series
from apps.web.common import admin_only, is_fragment, page
from apps.web.usage import DEFAULT_WINDOW, WINDOWS, gpu_series, quota_use
from apps.web.worklist import queue_order, work_rows
from apps.workloads import listing
from apps.workloads.models import Workload
from apps.workspaces.models import Workspace

SHOWN = 50


def cluster_use() -> list[dict[str, Any]]:
    """Per cluster and GPU type: devices, GPUs allocated (shares add up), and the percentage."""
    totals = (
        GPU.objects.values("node__pool__cluster__name", "gpu_type")
        .annotate(devices=Count("id"))
        .order_by("node__pool__cluster__name", "gpu_type")
    )
    held = defaultdict(Decimal)
    for row in Allocation.objects.values("gpu__node__pool__cluster__name", "gpu__gpu_type").annotate(
        used=Sum("fraction")
    ):
        held[(row["gpu__node__pool__cluster__name"], row["gpu__gpu_type"])] = row["used"] or Decimal("0")
    out = []
    for row in totals:
        key = (row["node__pool__cluster__name"], row["gpu_type"])
        used = held.get(key, Decimal("0"))
        out.append(
            {
                "cluster": key[0],
                "gpu_type": key[1],
                "devices": row["devices"],
                "used": used,
                "percent": min(100, int(used * 100 / row["devices"])) if row["devices"] else 0,
            }
        )
    return out


def type_use(per_cluster: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_type: dict[str, dict[str, Any]] = {}
    for row in per_cluster:
        entry = by_type.setdefault(row["gpu_type"], {"gpu_type": row["gpu_type"], "devices": 0, "used": Decimal("0")})
        entry["devices"] += row["devices"]
        entry["used"] += row["used"]
    for entry in by_type.values():
        entry["percent"] = min(100, int(entry["used"] * 100 / entry["devices"])) if entry["devices"] else 0
    return sorted(by_type.values(), key=lambda e: e["gpu_type"])


@admin_only
def dashboard(request: HttpRequest) -> HttpResponse:
    """The queue of every kind the scheduler admits (waiting, or admitted and starting), what runs,
    and utilisation per cluster, workspace and GPU type."""
    kinds = listing.scheduled_kinds()
    workloads = Workload.objects.all()
    waiting, running = listing.in_states(listing.waiting, kinds), listing.in_states(listing.running, kinds)
    counts = workloads.aggregate(
        pending=Count("pk", filter=listing.in_states(listing.queued, kinds)),
        waiting=Count("pk", filter=waiting),
        running=Count("pk", filter=running),
    )
    per_cluster = cluster_use()
    context = {
        "queue": work_rows(workloads.filter(waiting).order_by(*queue_order(kinds)), SHOWN),
        "pending_count": counts["pending"],
        "starting_count": counts["waiting"] - counts["pending"],
        "per_cluster": per_cluster,
        "per_type": type_use(per_cluster),
        "per_workspace": [row for row in quota_use(list(Workspace.objects.order_by("name"))) if row.quota or row.used],
        "running": work_rows(workloads.filter(running).order_by("started_at"), SHOWN),
        "running_count": counts["running"],
        "windows": list(WINDOWS),
        "window": request.GET.get("window", DEFAULT_WINDOW),
        "elastic_pools": elastic_pools(),
        "live_workspaces": [],
    }
    template = "console/_dashboard_body.html" if is_fragment(request) else "console/dashboard.html"
    return page(request, template, context)


@admin_only
def usage_data(request: HttpRequest) -> JsonResponse:
    """GPUs held over time across every cluster, per type, against the devices of that type."""
    data = gpu_series(None, request.GET.get("window", DEFAULT_WINDOW))
    devices = {row["gpu_type"]: float(row["devices"]) for row in type_use(cluster_use())}
    for gpu_type in devices:
        data["series"].setdefault(gpu_type, [0.0] * len(data["labels"]))
    data["limits"] = devices
    data["limit_label"] = "devices"
    return JsonResponse(data)


def elastic_pools() -> list[dict[str, Any]]:
    """Each elastic pool, with its limits and its nodes up now, for its size chart."""
    pools = PoolScaling.objects.select_related("pool__cluster").order_by("pool__cluster__name", "pool__name")
    up = dict(
        Node.objects.filter(state=Node.State.READY, pool__scaling__isnull=False)
        .values("pool_id").annotate(n=Count("id")).values_list("pool_id", "n")
    )  # fmt: skip
    return [{"pk": s.pool_id, "label": f"{s.pool.cluster.name} / {s.pool.name}", "min": s.min_nodes,
             "max": s.max_nodes, "up": up.get(s.pool_id, 0), "enabled": s.enabled} for s in pools]  # fmt: skip


@admin_only
def pool_size_data(request: HttpRequest, pk: int) -> JsonResponse:
    """An elastic pool's nodes per state over the window, against its minimum and maximum."""
    scaling = get_object_or_404(PoolScaling, pool_id=pk)
    window = request.GET.get("window", DEFAULT_WINDOW)
    span, buckets = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    return JsonResponse(size_series(scaling, span, buckets))


@admin_only
def inventory(request: HttpRequest) -> HttpResponse:
    """Every GPU of every registered cluster, and which workload holds it."""
    allocations = Allocation.objects.select_related("workload__workspace", "podset").order_by("replica")
    gpus = (
        GPU.objects.select_related("node__pool__cluster")
        .prefetch_related(Prefetch("allocations", queryset=allocations))
        .order_by("node__pool__cluster__name", "node__name", "index")
    )
    clusters = Cluster.objects.annotate(
        nodes=Count("pools__nodes", distinct=True), devices=Count("pools__nodes__gpus", distinct=True)
    ).order_by("name")
    page_obj = Paginator(gpus, 200).get_page(request.GET.get("page"))
    measured = latest(list(page_obj))
    for gpu in page_obj:
        gpu.measured = measured.get(gpu.pk)  # type: ignore[attr-defined]
    context = {"clusters": clusters, "page_obj": page_obj, "live_workspaces": []}
    return page(request, "console/inventory.html", context)


@admin_only
def gpu_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One GPU: what it is, who holds it, and its measured utilisation over a window, or "no
    telemetry" where nothing measures it."""
    gpu = get_object_or_404(GPU.objects.select_related("node__pool__cluster"), pk=pk)
    window = request.GET.get("window", "24h")
    context = {
        "gpu": gpu,
        "measured": latest([gpu]).get(gpu.pk),
        "has_telemetry": GpuSample.objects.filter(gpu=gpu).exists(),
        "windows": list(SAMPLE_WINDOWS),
        "window": window if window in SAMPLE_WINDOWS else "24h",
        "live_workspaces": [],
    }
    return page(request, "console/gpu.html", context)


@admin_only
def gpu_samples(request: HttpRequest, pk: int) -> JsonResponse:
    """The GPU's utilisation over the window, for its chart."""
    gpu = get_object_or_404(GPU, pk=pk)
    window = request.GET.get("window", "24h")
    series = utilisation_series(GpuSample.objects.filter(gpu=gpu), window if window in SAMPLE_WINDOWS else "24h")
    if series is None:
        return JsonResponse({"labels": [], "series": {}, "telemetry": False})
    return JsonResponse(series.as_json(telemetry=True, suffix="", y_title="GPU utilisation (%)", y_max=100, digits=0))
