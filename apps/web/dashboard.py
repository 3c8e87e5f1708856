"""A workspace's dashboard: my queue, GPU use over time against the quota, my jobs' progress, and
its disk against its disk quota."""

from __future__ import annotations

from django.db.models import Count, F
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.jobs.models import Job
from apps.web.common import is_fragment, page, signed_in, workspace_for
from apps.web.usage import DEFAULT_WINDOW, WINDOWS, gpu_series, measured_series, quota_use
from apps.workspaces import disks
from apps.workspaces.access import MANAGE, can
from apps.workspaces.models import GPUQuota, WorkspaceDisk

SHOWN = 20


@signed_in
def dashboard(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws)
    mine = Job.objects.filter(workspace=workspace, created_by=request.user)
    queue = mine.filter(state__in=[Job.State.QUEUED, Job.State.ADMITTED, Job.State.PREEMPTED]).order_by(
        F("workspace_queue_position").asc(nulls_last=True), "created_at"
    )
    running = mine.filter(state=Job.State.RUNNING).order_by("started_at")
    states = dict(
        Job.objects.filter(workspace=workspace, state__in=Job.ACTIVE_STATES)
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    context = {
        "workspace": workspace,
        "queue": queue[:SHOWN],
        "queue_count": queue.count(),
        "running": running[:SHOWN],
        "running_count": running.count(),
        "workspace_states": states,
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
