"""A workload's GPU utilisation over time (apps/telemetry), for the chart on its page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from apps.compute.models import Instance, Notebook
from apps.jobs.models import Job
from apps.telemetry.models import GpuSample
from apps.telemetry.record import WINDOWS, utilisation_series
from apps.web.common import get_for, shared_for, signed_in, workspace_for

NO_TELEMETRY = (
    "No telemetry: the GPUs it holds report no measurements here (no NVIDIA driver on the machine, "
    "a declared inventory, or a cluster without a source of them)."
)


def has_telemetry(**holder: Any) -> bool:
    """Whether any sample was taken of the GPUs this workload held (`workload_id=`)."""
    return GpuSample.objects.filter(**holder).exists()


def gpu_panel(*, url: str, **holder: Any) -> dict[str, Any]:
    """What a workload's page needs for its GPU panel (templates/web/_gpu_panel.html)."""
    return {"gpu_panel": True, "has_telemetry": has_telemetry(**holder), "gpu_url": url, "no_telemetry": NO_TELEMETRY}


def gpu_answer(request: HttpRequest, **holder: Any) -> JsonResponse:
    window = request.GET.get("window", "1h")
    series = utilisation_series(GpuSample.objects.filter(**holder), window if window in WINDOWS else "1h")
    if series is None:
        return JsonResponse({"labels": [], "series": {}, "telemetry": False, "why": NO_TELEMETRY})
    return JsonResponse(series.as_json(telemetry=True, suffix="", y_title="GPU utilisation (%)", y_max=100, digits=0))


@signed_in
def job_gpu(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    workspace = workspace_for(request, ws)
    job = get_for(request, Job.objects.all(), pk=pk, workspace=workspace)
    return gpu_answer(request, workload_id=job.pk)


@signed_in
def instance_gpu(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    _workspace, instance = shared_for(request, ws, Instance.objects.select_related("workspace"), pk)
    return gpu_answer(request, workload_id=instance.pk)


@signed_in
def notebook_gpu(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    """A notebook's GPUs are its instance's: the same samples, to whoever may see the notebook."""
    _workspace, notebook = shared_for(request, ws, Notebook.objects.select_related("workspace"), pk)
    return gpu_answer(request, workload_id=notebook.instance_id)
