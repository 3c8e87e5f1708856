"""A workspace's dashboard: my queue and my running work (every kind's), GPU use over time against
the quota, and its disk against its disk quota."""

from __future__ import annotations

from django.db.models import Count, F, Q
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.web.common import is_fragment, page, signed_in, workspace_for
from apps.web.usage import DEFAULT_WINDOW, WINDOWS, gpu_series, measured_series, quota_use
from apps.web.worklist import work_rows
from apps.workloads import listing
from apps.workloads.models import Workload
from apps.workspaces import disks
from apps.workspaces.access import MANAGE, can
from apps.workspaces.models import GPUQuota, WorkspaceDisk

SHOWN = 20


@signed_in
def dashboard(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws)
    everything = Workload.objects.filter(workspace=workspace)
    waiting, running = listing.in_states(listing.waiting), listing.in_states(listing.running)
    mine = Q(created_by=request.user)
    counts = everything.aggregate(
        running=Count("pk", filter=running),
        queued=Count("pk", filter=listing.in_states(listing.queued)),
        my_running=Count("pk", filter=running & mine),
        my_waiting=Count("pk", filter=waiting & mine),
    )
    queue = everything.filter(waiting & mine).order_by(F("workspace_queue_position").asc(nulls_last=True), "created_at")
    context = {
        "workspace": workspace,
        "queue": work_rows(queue, SHOWN),
        "queue_count": counts["my_waiting"],
        "running": work_rows(everything.filter(running & mine).order_by("started_at"), SHOWN),
        "running_count": counts["my_running"],
        "workspace_counts": counts,
        "usage": quota_use([workspace]),
        "windows": list(WINDOWS),
        "window": request.GET.get("window", DEFAULT_WINDOW),
        "may_manage": can(request.user, workspace, MANAGE),  # its owners see its GPU-hours report
        # Its disk as the scheduler loop last measured it (apps/workspaces/disks.py): no walk here.
        "disk": WorkspaceDisk.objects.filter(workspace=workspace).first(),
        "disk_enforced": disks.enforced(),
    }
    template = "web/_dashboard_body.html" if is_fragment(request) else "web/dashboard.html"
    return page(request, template, context)


@signed_in
def usage_data(request: HttpRequest, ws: str) -> JsonResponse:
    """The chart's data: average GPUs held per bucket, per type, and the quota of each type."""
    workspace = workspace_for(request, ws)
    data = gpu_series([workspace.pk], request.GET.get("window", DEFAULT_WINDOW))
    quotas = {q.gpu_type: float(q.gpus) for q in GPUQuota.objects.filter(workspace=workspace)}
    for gpu_type in quotas:
        data["series"].setdefault(gpu_type, [0.0] * len(data["labels"]))
    data["limits"] = quotas
    data["limit_label"] = "quota"
    data["measured"] = measured_series([workspace.pk], request.GET.get("window", DEFAULT_WINDOW))
    return JsonResponse(data)
